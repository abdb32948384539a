"""CCA, R^2_CCA, SVCCA and PWCCA against float64 references written from the papers' definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from similarity import cca, cca_mean, cca_r2, pwcca, svcca


def _inv_sqrt(c):
    w, v = np.linalg.eigh(c)
    return v @ np.diag(w**-0.5) @ v.T


def ref_cca(x, y):
    """Covariance form: rho = svd(Sxx^-1/2 Sxy Syy^-1/2); returns rho, x-side directions."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    sxx_h, syy_h = _inv_sqrt(xc.T @ xc), _inv_sqrt(yc.T @ yc)
    u, rho, _ = np.linalg.svd(sxx_h @ xc.T @ yc @ syy_h)
    k = min(x.shape[1], y.shape[1])
    return rho[:k], sxx_h @ u[:, :k]


def ref_pwcca(x, y):
    """Morcos et al. (2018): alpha_i ∝ sum_j |<h_i, x_j>|, h_i the canonical variates of x."""
    rho, a = ref_cca(x, y)
    xc = x - x.mean(0)
    h = xc @ a
    h = h / np.linalg.norm(h, axis=0)
    alpha = np.abs(h.T @ xc).sum(axis=1)
    alpha = alpha / alpha.sum()
    return float(alpha @ rho)


def ref_svcca(x, y, keep=0.99):
    def reduce(a):
        u, s, _ = np.linalg.svd(a - a.mean(0), full_matrices=False)
        frac = np.cumsum(s**2) / np.sum(s**2)
        k = int(np.searchsorted(frac, keep) + 1)
        return u[:, :k] * s[:k]

    rho, _ = ref_cca(reduce(x), reduce(y))
    return float(rho.mean())


def _data(kind, rng):
    if kind == "random":
        x = rng.normal(size=(30, 3))
        return x, np.tanh(x @ rng.normal(size=(3, 5))) + 0.5 * rng.normal(size=(30, 5))
    if kind == "structured":  # anisotropic (the covariance reference squares the condition number), offset
        z = rng.normal(size=(30, 2))
        x = np.c_[z, rng.normal(size=(30, 2)) * 0.1] * [100.0, 1.0, 1.0, 1.0] + 50.0
        # distinct canonical correlations: near-equal ones make the variates (and so
        # PWCCA's weights) ill-determined in any implementation
        y = np.c_[z + rng.normal(size=(30, 2)) * [0.2, 1.0], rng.normal(size=(30, 4))]
        return x, y
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_cca_matches_reference(kind):
    x, y = _data(kind, np.random.default_rng(0))
    rho, _ = ref_cca(x, y)
    np.testing.assert_allclose(cca(x, y), rho, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cca(y, x), rho, rtol=1e-9, atol=1e-12)
    assert float(cca_r2(x, y)) == pytest.approx(np.mean(rho**2), rel=1e-9)
    assert float(cca_mean(x, y)) == pytest.approx(np.mean(rho), rel=1e-9)


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_pwcca_both_orders_and_widths(kind):
    x, y = _data(kind, np.random.default_rng(1))
    assert x.shape[1] != y.shape[1]
    a, b = float(pwcca(x, y)), float(pwcca(y, x))
    assert a == pytest.approx(ref_pwcca(x, y), rel=1e-9)
    assert b == pytest.approx(ref_pwcca(y, x), rel=1e-9)
    assert abs(a - b) > 1e-4  # asymmetric, as declared


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_svcca_matches_reference(kind):
    x, y = _data(kind, np.random.default_rng(2))
    assert float(svcca(x, y)) == pytest.approx(ref_svcca(x, y), rel=1e-9)
    assert float(svcca(x, y, keep_variance=0.5)) == pytest.approx(ref_svcca(x, y, 0.5), rel=1e-9)


def test_svcca_wide_and_rank_deficient():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 4)) @ rng.normal(size=(4, 40))  # d > n, rank 4
    y = np.tanh(x[:, :20]) + 0.1 * rng.normal(size=(12, 20))
    assert float(svcca(x, y)) == pytest.approx(ref_svcca(x, y), rel=1e-8)


def test_identities():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(20, 3))
    a = rng.normal(size=(3, 3))
    np.testing.assert_allclose(cca(x, x @ a + 7.0), np.ones(3), atol=1e-10)
    assert float(pwcca(x, x @ a)) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_jit_vmap(dtype):
    rng = np.random.default_rng(5)
    xs = rng.normal(size=(3, 16, 4)).astype(dtype)
    ys = (xs[..., :3] + rng.normal(size=(3, 16, 3))).astype(dtype)
    stack = np.stack([np.asarray(cca(a, b)) for a, b in zip(xs, ys)])
    got = jax.jit(jax.vmap(cca))(xs, ys)
    assert got.dtype == dtype and got.shape == (3, 3)
    np.testing.assert_allclose(got, stack, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    ref = np.stack([ref_cca(a.astype(float), b.astype(float))[0] for a, b in zip(xs, ys)])
    np.testing.assert_allclose(stack, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3))
def test_properties(seed, log_scale):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, 4)) * 10.0**log_scale
    y = x[:, :3] @ rng.normal(size=(3, 4)) + rng.normal(size=(16, 4))
    rho = np.asarray(cca(x, y))
    assert np.all(np.diff(rho) <= 1e-12) and rho.min() >= 0.0 and rho.max() <= 1.0
    np.testing.assert_allclose(rho, ref_cca(x, y)[0], rtol=1e-8, atol=1e-10)
    for f in (cca_r2, svcca, pwcca):
        assert 0.0 <= float(f(x, y)) <= 1.0


X8 = np.random.default_rng(9).normal(size=(8, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cca(X8, X8[:6]), r"same number of samples.*\(8, 3\).*\(6, 3\)"),
        (lambda: cca(X8[None], X8), r"x must be 2-D"),
        (lambda: cca(X8, np.random.default_rng(0).normal(size=(8, 8))), r"y has shape \(8, 8\): CCA needs more samples than features"),
        (lambda: pwcca(np.c_[X8, X8[:, :1]], X8), r"x of shape \(8, 4\) has centred rank 3 < 4"),
        (lambda: cca_r2(X8, np.c_[X8[:, :2], np.ones(8)]), r"y of shape \(8, 3\) has centred rank 2 < 3"),
        (lambda: cca(np.where(np.eye(8, 3) > 0, np.inf, X8), X8), r"x of shape \(8, 3\) contains 0 NaN and 3 Inf"),
        (lambda: svcca(X8, np.ones((8, 2))), r"y of shape \(8, 2\) is constant"),
        (lambda: svcca(X8, X8, keep_variance=1.5), r"keep_variance must be in \(0, 1\]"),
        (lambda: cca(X8[:2], X8[:2]), r"x has 2 samples.*at least 3"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
