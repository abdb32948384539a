"""Shape metrics, NBS and the Procrustes distance against a float64 reference of netrep's semantics."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import orthogonal_procrustes

from similarity import nbs, partial_whiten, procrustes_distance, shape_distance


def ref_whiten(x, alpha):
    xc = x - x.mean(0)
    if alpha == 1.0:
        return xc
    lam, v = np.linalg.eigh(xc.T @ xc)
    d = alpha + (1 - alpha) * lam**-0.5
    d = d * np.sqrt(lam.sum() / np.sum(d**2 * lam))  # keep the total variance
    return xc @ v @ np.diag(d) @ v.T


def ref_shape(x, y, alpha, distance):
    xw, yw = ref_whiten(x, alpha), ref_whiten(y, alpha)
    d = max(xw.shape[1], yw.shape[1])
    xw = np.pad(xw, ((0, 0), (0, d - xw.shape[1])))
    yw = np.pad(yw, ((0, 0), (0, d - yw.shape[1])))
    q, _ = orthogonal_procrustes(yw, xw)  # argmin_Q ||yw Q - xw||, Q orthogonal
    if distance == "angular":
        return np.arccos(np.sum(xw * (yw @ q)) / np.linalg.norm(xw) / np.linalg.norm(yw))
    return np.linalg.norm(xw - yw @ q)


def ref_nbs(x, y):
    xc, yc = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(xc.T @ yc, "nuc") / np.linalg.norm(xc) / np.linalg.norm(yc)


def _data(kind, rng):
    if kind == "random":
        x = rng.normal(size=(20, 3))
        return x, np.tanh(x @ rng.normal(size=(3, 5))) + 0.3 * rng.normal(size=(20, 5))
    if kind == "structured":  # anisotropic, offset, near low-rank y
        x = rng.normal(size=(20, 4)) * [10.0, 3.0, 1.0, 0.3] + 5.0
        y = np.outer(x[:, 0], [1.0, 2.0, -1.0]) + 0.5 * rng.normal(size=(20, 3))
        return x, y
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "structured"])
@pytest.mark.parametrize("distance", ["angular", "euclidean"])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_shape_matches_reference(alpha, distance, kind):
    x, y = _data(kind, np.random.default_rng(0))
    ref = ref_shape(x, y, alpha, distance)
    assert float(shape_distance(x, y, alpha=alpha, distance=distance)) == pytest.approx(ref, rel=1e-9)
    if distance == "angular" or x.shape[1] == y.shape[1]:
        assert float(shape_distance(y, x, alpha=alpha, distance=distance)) == pytest.approx(ref, rel=1e-9)


def test_partial_whiten_reference():
    x, _ = _data("structured", np.random.default_rng(1))
    for alpha in (0.0, 0.3, 1.0):
        np.testing.assert_allclose(partial_whiten(x, alpha=alpha), ref_whiten(x, alpha), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_nbs_procrustes_identities(kind):
    x, y = _data(kind, np.random.default_rng(2))
    b = ref_nbs(x, y)
    assert float(nbs(x, y)) == pytest.approx(b, rel=1e-10)
    # shape_distance(alpha=1, angular) == arccos(NBS)
    assert float(shape_distance(x, y)) == pytest.approx(np.arccos(b), rel=1e-9)
    # Ding et al.: min_Q ||X~ - Y~ Q||^2 on unit-norm centred data == 2 - 2 NBS
    xu = (x - x.mean(0)) / np.linalg.norm(x - x.mean(0))
    yu = (y - y.mean(0)) / np.linalg.norm(y - y.mean(0))
    assert float(procrustes_distance(x, y)) == pytest.approx(ref_shape(xu, yu, 1.0, "euclidean") ** 2, rel=1e-9)
    assert float(procrustes_distance(x, y)) == pytest.approx(2 - 2 * b, rel=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_jit_vmap(dtype):
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(3, 16, 4)).astype(dtype)
    ys = (xs @ rng.normal(size=(4, 4)) + rng.normal(size=(3, 16, 4))).astype(dtype)
    f = lambda a, b: shape_distance(a, b, alpha=0.5)
    stack = np.array([float(f(a, b)) for a, b in zip(xs, ys)])
    got = jax.jit(jax.vmap(f))(xs, ys)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, stack, rtol=1e-5 if dtype == np.float32 else 1e-12)
    ref = [ref_shape(a.astype(float), b.astype(float), 0.5, "angular") for a, b in zip(xs, ys)]
    np.testing.assert_allclose(stack, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3), alpha=st.sampled_from([0.0, 0.5, 1.0]))
def test_properties(seed, log_scale, alpha):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, 4)) * 10.0**log_scale
    y = rng.normal(size=(16, 4))
    d = float(shape_distance(x, y, alpha=alpha))
    assert 0.0 <= d <= np.pi / 2 + 1e-12
    assert d == pytest.approx(float(shape_distance(y, x, alpha=alpha)), abs=1e-10)
    assert d == pytest.approx(ref_shape(x, y, alpha, "angular"), rel=1e-8)
    assert 0.0 <= float(nbs(x, y)) <= 1.0


X8 = np.random.default_rng(9).normal(size=(8, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: shape_distance(X8, X8[:6]), r"same number of samples.*\(8, 3\).*\(6, 3\)"),
        (lambda: nbs(X8[None], X8), r"x must be 2-D"),
        (lambda: shape_distance(X8, X8, alpha=1.5), r"alpha must be in \[0, 1\]"),
        (lambda: shape_distance(X8, X8, distance="angle"), r"Unknown distance 'angle'\. Did you mean 'angular'"),
        (lambda: shape_distance(X8, np.random.default_rng(0).normal(size=(8, 9)), alpha=0.5),
         r"y has shape \(8, 9\): partial whitening \(alpha < 1\) needs a full-rank"),
        (lambda: shape_distance(np.c_[X8, X8[:, 0]], X8, alpha=0.0), r"x of shape \(8, 4\) has a singular covariance"),
        (lambda: nbs(X8, np.full((8, 2), 3.0)), r"y of shape \(8, 2\) is constant"),
        (lambda: procrustes_distance(np.where(np.eye(8, 3) > 0, np.nan, X8), X8), r"contains 3 NaN"),
        (lambda: shape_distance(X8[:1], X8[:1]), r"x has 1 samples"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_wide_procrustes_is_fine():
    """alpha = 1 needs no whitening, so d > n works (zero-padded SVD alignment)."""
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(6, 10)), rng.normal(size=(6, 14))
    assert float(shape_distance(x, y)) == pytest.approx(ref_shape(x, y, 1.0, "angular"), rel=1e-9)
