"""CCA, R^2_CCA, SVCCA and PWCCA against float64 references written from the papers' definitions."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim.similarity import cca, cca_mean, cca_r2, pwcca, svcca


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


def _sqrt_pinv(c):
    """Square root of the pseudo-inverse through eigh, as svcca's cca_core does it."""
    w, v = np.linalg.eigh(np.linalg.pinv(c))
    return (v * np.sqrt(w)) @ v.T


def ref_pwcca(x, y, epsilon=0.0, add_means=False, flip=None):
    """google/svcca ``compute_pwcca(x.T, y.T, epsilon)`` transcribed for ``(n, d)`` arrays.

    Steps of cca_core.get_cca_similarity / compute_ccas / remove_small and
    pwcca.compute_pwcca: covariances (ddof 1) scaled by each side's largest
    entry; neurons with scaled variance < epsilon dropped; epsilon added to the
    diagonals; rho, u, v from the SVD of Sxx^-1/2 Sxy Syy^-1/2; the side with
    fewer kept neurons (x on a tie) gives directions coef (A - mean), which are
    QR-orthonormalised and weighted by sum_j |<p_i, a_j>| over its kept neurons.
    ``add_means`` adds each neuron's mean back to the direction of the same index
    before the QR, as the reference does (sign-dependent, see the test below);
    ``flip`` multiplies the directions by signs. Where the reference indexes x's
    activations with y's mask (a crash when the widths differ), y's are used.
    """
    d1 = x.shape[1]
    cov = np.cov(x.T, y.T)
    sxx, sxy, syy = cov[:d1, :d1], cov[:d1, d1:], cov[d1:, d1:]
    xmax, ymax = np.max(np.abs(sxx)), np.max(np.abs(syy))
    sxx, syy, sxy = sxx / xmax, syy / ymax, sxy / np.sqrt(xmax * ymax)
    kx, ky = np.abs(np.diag(sxx)) >= epsilon, np.abs(np.diag(syy)) >= epsilon
    sxx = sxx[np.ix_(kx, kx)] + epsilon * np.eye(kx.sum())
    syy = syy[np.ix_(ky, ky)] + epsilon * np.eye(ky.sum())
    u, rho, vh = np.linalg.svd(_sqrt_pinv(sxx) @ sxy[np.ix_(kx, ky)] @ _sqrt_pinv(syy))
    coef, acts = (u.T, x[:, kx]) if kx.sum() <= ky.sum() else (vh, y[:, ky])
    if flip is not None:
        coef = coef * flip[:, None]
    mean = acts.mean(axis=0)
    dirns = coef @ (acts - mean).T + (mean[:, None] if add_means else 0.0)
    p, _ = np.linalg.qr(dirns.T)
    w = np.sum(np.abs(p.T @ acts), axis=1)
    return float(np.sum(w / w.sum() * np.abs(rho)))


def _centred(a):
    return a - a.mean(axis=0)


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


def _pwcca_data(kind, d1, d2, rng):
    if kind == "uniform":  # plain uniform data, no relation between the sides
        return rng.uniform(size=(80, d1)), rng.uniform(size=(80, d2))
    # related sides with distinct canonical correlations, offset and anisotropic
    z = rng.normal(size=(60, min(d1, d2)))
    x = np.c_[z, rng.normal(size=(60, d1 - z.shape[1]))] @ rng.normal(size=(d1, d1)) + 3.0
    noise = np.geomspace(0.1, 3.0, d2)
    y = np.c_[z, rng.normal(size=(60, d2 - z.shape[1]))] + noise * rng.normal(size=(60, d2))
    return x, y


@pytest.mark.parametrize("kind", ["uniform", "related"])
@pytest.mark.parametrize("d1, d2", [(5, 5), (3, 7), (7, 3)])
def test_pwcca_matches_the_reference(kind, d1, d2):
    """Equal and unequal widths, both argument orders, against the transcription of google/svcca."""
    x, y = _pwcca_data(kind, d1, d2, np.random.default_rng(d1 * 10 + d2))
    xc, yc = _centred(x), _centred(y)
    assert float(pwcca(x, y)) == pytest.approx(ref_pwcca(xc, yc), rel=1e-9)
    assert float(pwcca(y, x)) == pytest.approx(ref_pwcca(yc, xc), rel=1e-9)
    if d1 != d2:  # the narrower side's weights, whatever the order
        assert float(pwcca(x, y)) == pytest.approx(float(pwcca(y, x)), rel=1e-9)
    else:  # a tie: the first argument's weights
        assert abs(float(pwcca(x, y)) - float(pwcca(y, x))) > 1e-4


def test_pwcca_epsilon_drops_near_constant_neurons():
    """The reference's rule: a neuron below epsilon x the largest variance is dropped (and counts no
    more for the choice of side); epsilon is added to the normalised covariances."""
    rng = np.random.default_rng(11)
    x, y = _pwcca_data("related", 6, 5, rng)
    x[:, 2] = 4.0  # a dead unit
    x[:, 4] = 0.5 + 1e-7 * rng.normal(size=x.shape[0])  # variance 1e-14 of the largest
    xc, yc = _centred(x), _centred(y)
    for eps in (1e-10, 1e-3):
        want = ref_pwcca(xc, yc, epsilon=eps)
        assert float(pwcca(x, y, epsilon=eps)) == pytest.approx(want, rel=1e-9)
        # x keeps 4 neurons, fewer than y's 5: x's weights in both orders
        assert float(pwcca(y, x, epsilon=eps)) == pytest.approx(ref_pwcca(yc, xc, epsilon=eps), rel=1e-9)
        assert float(pwcca(y, x, epsilon=eps)) == pytest.approx(want, rel=1e-9)
    assert float(pwcca(x, y, epsilon=1e-10)) != pytest.approx(float(pwcca(x, y, epsilon=1e-3)), rel=1e-6)
    with pytest.raises(ValueError, match=r"x of shape \(60, 6\) has centred rank 5 < 6"):
        pwcca(x, y)  # epsilon = 0 keeps the dead unit: CCA is undefined
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\)"):
        pwcca(x, y, epsilon=1.0)


def test_reference_mean_term_depends_on_svd_signs():
    """Why we centre: on uncentred data the reference adds neuron means to the directions before the QR,
    and its value then changes with the (arbitrary) signs of the singular vectors; on centred data it
    does not, and that is the value we compute."""
    x, y = _pwcca_data("uniform", 5, 5, np.random.default_rng(3))
    flips = [np.array(f) for f in ([1.0] * 5, [-1.0, 1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0, 1.0])]
    raw = [ref_pwcca(x, y, add_means=True, flip=f) for f in flips]
    assert max(raw) - min(raw) > 1e-4
    centred = [ref_pwcca(_centred(x), _centred(y), add_means=True, flip=f) for f in flips]
    np.testing.assert_allclose(centred, float(pwcca(x, y)), rtol=1e-9)


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_svcca_matches_reference(kind):
    x, y = _data(kind, np.random.default_rng(2))
    assert float(svcca(x, y)) == pytest.approx(ref_svcca(x, y), rel=1e-9)
    assert float(svcca(x, y, keep_variance=0.5)) == pytest.approx(ref_svcca(x, y, 0.5), rel=1e-9)


def test_svcca_wide_and_rank_deficient():
    """Rank-deficient sides are fine (directions without variance are never kept); d >= n is
    refused as for cca (it used to give values near 1 even on pure noise)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 4)) @ rng.normal(size=(4, 40))  # d > n, rank 4
    y = np.tanh(x[:, :20]) + 0.1 * rng.normal(size=(12, 20))
    with pytest.raises(ValueError, match=r"x has shape \(12, 40\): CCA needs more samples than features"):
        svcca(x, y)
    x8, y6 = x[:, :8], y[:, :6]  # rank 4 in 8 features, d < n
    assert float(svcca(x8, y6)) == pytest.approx(ref_svcca(x8, y6), rel=1e-8)


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


def test_new_epsilon_and_keep_variance_compile_nothing():
    """pwcca's epsilon and svcca's keep_variance are traced data (counted through jax.monitoring)."""
    from funsim.runtime.compile_count import compiles

    rng = np.random.default_rng(13)
    x = rng.normal(size=(31, 5)) * np.array([5.0, 2.0, 1.0, 0.5, 0.01])
    y = np.tanh(x[:, :3]) + 0.2 * rng.normal(size=(31, 3))
    pwcca(x, y, epsilon=0.0)
    n, got = compiles(pwcca, x, y, epsilon=1e-3)  # drops x's last neuron (variance 4e-6 of the largest)
    assert n == 0
    assert float(got) != float(pwcca(x, y))
    svcca(x, y, keep_variance=0.99)
    n, got = compiles(svcca, x, y, keep_variance=0.5)
    assert n == 0
    assert float(got) == pytest.approx(ref_svcca(x, y, 0.5), rel=1e-9)
