"""Shape metrics, NBS and the Procrustes distance against a float64 transcription of netrep's LinearMetric."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import orthogonal_procrustes

from funsim.similarity import nbs, partial_whiten, procrustes_distance, shape_distance


def netrep_whiten(xc, alpha, eigval_tol=1e-7):
    """netrep.utils.whiten(X, alpha, preserve_variance=True) of centred (and already padded) data."""
    if alpha > 1 - eigval_tol:
        return xc
    lam, v = np.linalg.eigh(xc.T @ xc)
    lam = np.maximum(lam, eigval_tol)
    d = alpha + (1 - alpha) * lam**-0.5
    new_var = np.sum(alpha**2 * lam + 2 * alpha * (1 - alpha) * lam**0.5 + (1 - alpha) ** 2)
    d = d * np.sqrt(lam.sum() / new_var)
    return xc @ (v * d[None, :]) @ v.T


def ref_whiten(x, alpha, width=None):
    """netrep's LinearMetric.partial_fit: zero-pad to ``width`` columns, centre, whiten."""
    width = x.shape[1] if width is None else width
    xp = np.pad(x, ((0, 0), (0, width - x.shape[1])))
    return netrep_whiten(xp - xp.mean(0), alpha)


def ref_shape(x, y, alpha, distance):
    """netrep's LinearMetric(alpha, score_method=distance).fit_score(x, y)."""
    d = max(x.shape[1], y.shape[1])
    xw, yw = ref_whiten(x, alpha, d), ref_whiten(y, alpha, d)
    q, _ = orthogonal_procrustes(yw, xw)  # argmin_Q ||yw Q - xw||, Q orthogonal
    if distance == "angular":
        return np.arccos(np.clip(np.sum(xw * (yw @ q)) / np.linalg.norm(xw) / np.linalg.norm(yw), -1, 1))
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
    if kind == "equal":
        x = rng.normal(size=(20, 4)) * [3.0, 1.0, 1.0, 0.5]
        return x, np.tanh(x @ rng.normal(size=(4, 4))) + 0.2 * rng.normal(size=(20, 4))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "structured", "equal"])
@pytest.mark.parametrize("distance", ["angular", "euclidean"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_shape_matches_netrep(alpha, distance, kind):
    """Equal and unequal widths, both argument orders (netrep's metric is symmetric)."""
    x, y = _data(kind, np.random.default_rng(0))
    ref = ref_shape(x, y, alpha, distance)
    assert ref_shape(y, x, alpha, distance) == pytest.approx(ref, rel=1e-9)
    assert float(shape_distance(x, y, alpha=alpha, distance=distance)) == pytest.approx(ref, rel=1e-9)
    assert float(shape_distance(y, x, alpha=alpha, distance=distance)) == pytest.approx(ref, rel=1e-9)


def test_euclidean_padding_counts_in_the_variance():
    """The issue's shapes (50 samples, widths 8 and 6, alpha = 0): netrep preserves each side's
    variance over the padded width, which moves the distance by far more than the tolerance."""
    r = np.random.default_rng(7)
    x = r.normal(size=(50, 8))
    y = np.tanh(x[:, :6] @ r.normal(size=(6, 6))) + 0.3 * r.normal(size=(50, 6))
    ref = ref_shape(x, y, 0.0, "euclidean")
    # whitening each side in its own width, then padding (our earlier definition, before following netrep)
    xw, yw = ref_whiten(x, 0.0), np.pad(ref_whiten(y, 0.0), ((0, 0), (0, 2)))
    q, _ = orthogonal_procrustes(yw, xw)
    assert abs(np.linalg.norm(xw - yw @ q) - ref) > 1e-2 * ref
    assert float(shape_distance(x, y, alpha=0.0, distance="euclidean")) == pytest.approx(ref, rel=1e-9)


def test_tiny_eigenvalues_are_clipped_as_in_netrep():
    """netrep clips covariance eigenvalues at 1e-7 (an absolute floor): data at scale 1e-4 hits it."""
    x, y = _data("random", np.random.default_rng(3))
    x = x * 1e-4
    for alpha in (0.0, 0.5):
        ref = ref_shape(x, y, alpha, "euclidean")
        assert float(shape_distance(x, y, alpha=alpha, distance="euclidean")) == pytest.approx(ref, rel=1e-9)


def test_partial_whiten_reference():
    x, _ = _data("structured", np.random.default_rng(1))
    for alpha in (0.0, 0.3, 1.0):
        np.testing.assert_allclose(partial_whiten(x, alpha=alpha), ref_whiten(x, alpha), rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(partial_whiten(x, alpha=alpha, width=7), ref_whiten(x, alpha, 7), rtol=1e-9,
                                   atol=1e-10)
    with pytest.raises(ValueError, match="width=2 is smaller"):
        partial_whiten(x, width=2)


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


def test_a_new_alpha_compiles_nothing():
    """alpha is traced data: every alpha < 1 shares one program (counted through jax.monitoring)."""
    from funsim.runtime.compile_count import compiles

    rng = np.random.default_rng(12)
    x, y = rng.normal(size=(21, 3)), rng.normal(size=(21, 2))
    shape_distance(x, y, alpha=0.3, distance="euclidean")
    for alpha in (0.0, 0.6, 0.95):
        n, got = compiles(shape_distance, x, y, alpha=alpha, distance="euclidean")
        assert n == 0, alpha
        assert float(got) == pytest.approx(ref_shape(x, y, alpha, "euclidean"), rel=1e-9)
