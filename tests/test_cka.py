"""CKA, HSIC and minibatch CKA against float64 NumPy references and published values."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from scipy.spatial.distance import pdist, squareform

from funsim.similarity import (
    cka,
    cka_accumulate,
    cka_finalize,
    cka_init,
    cka_merge,
    hsic,
    linear_cka_from_stats,
    linear_gram,
    linear_stats,
    minibatch_cka,
    rbf_gram,
)
from tests.conftest import TOL

# ----------------------------------------------------------------- float64 references


def ref_hsic(K, L, debiased):
    n = K.shape[0]
    if not debiased:
        H = np.eye(n) - np.ones((n, n)) / n
        return np.trace(K @ H @ L @ H) / (n - 1) ** 2
    Kt, Lt = K.copy(), L.copy()
    np.fill_diagonal(Kt, 0.0)
    np.fill_diagonal(Lt, 0.0)
    one = np.ones(n)
    return (
        np.trace(Kt @ Lt)
        + (one @ Kt @ one) * (one @ Lt @ one) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * one @ Kt @ Lt @ one
    ) / (n * (n - 3))


def ref_gram(x, kernel, scale=0.5):
    x = np.asarray(x, np.float64)
    if kernel == "linear":
        return x @ x.T  # raw, uncentred Gram: the estimators must not care
    d2 = squareform(pdist(x, "sqeuclidean"))
    return np.exp(-d2 / (2 * scale**2 * np.median(d2)))


def ref_cka(x, y, kernel="linear", debiased=False):
    K, L = ref_gram(x, kernel), ref_gram(y, kernel)
    return ref_hsic(K, L, debiased) / np.sqrt(ref_hsic(K, K, debiased) * ref_hsic(L, L, debiased))


def _data(kind, rng):
    if kind == "random":
        x = rng.normal(size=(16, 4))
        return x, x[:, :3] @ rng.normal(size=(3, 3)) + rng.normal(size=(16, 3))
    if kind == "low_rank":  # rank-2 x in 6 features, y nonlinear in it
        x = rng.normal(size=(20, 2)) @ rng.normal(size=(2, 6))
        return x, np.tanh(x[:, :4]) + 0.1 * rng.normal(size=(20, 4))
    if kind == "duplicated":  # duplicated features and a duplicated sample
        x = rng.normal(size=(12, 3))
        x = np.concatenate([x, x[:, :2]], axis=1)
        x[5] = x[4]
        return x, x[:, ::-1] ** 2 + 0.5 * rng.normal(size=x.shape)
    if kind == "wide":  # d > n: the Gram path
        x = rng.normal(size=(10, 15))
        return x, rng.normal(size=(10, 25)) + np.repeat(x, 2, axis=1)[:, :25]
    if kind == "offset":  # a large mean: centring first must avoid cancellation
        x = rng.normal(size=(16, 4)) + 1e4
        return x, x * 3 + rng.normal(size=(16, 4)) - 5e4
    raise ValueError(kind)


DATA_KINDS = ["random", "low_rank", "duplicated", "wide", "offset"]


def _ref_for(kind, x, y, kernel, debiased):
    """The raw-Gram reference itself cancels at a 1e4 offset; CKA is translation
    invariant, so the offset case is referenced on the (float64) centred data."""
    if kind == "offset":
        x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    return ref_cka(x, y, kernel, debiased)


# ------------------------------------------------------------------- published values


def _kornblith():
    np.random.seed(1337)
    X = np.random.randn(100, 10)
    Y = np.random.randn(100, 10) + X
    return X, Y


def test_kornblith_published_values():
    """Kornblith et al.'s CKA demo notebook prints 0.55761, 0.65483 and 0.51346."""
    X, Y = _kornblith()
    assert float(cka(X, Y)) == pytest.approx(0.55761, abs=5e-6)
    assert float(cka(X, Y, kernel="rbf", rbf_scale=0.5)) == pytest.approx(0.65483, abs=5e-6)
    assert float(cka(X, Y, debiased=True)) == pytest.approx(0.51346, abs=5e-6)
    assert float(minibatch_cka(X, Y, batch_size=100)) == pytest.approx(0.51346, abs=5e-6)


# --------------------------------------------------------------------- vs references


@pytest.mark.parametrize("kind", ["random", "duplicated", "wide"])
@pytest.mark.parametrize("debiased", [False, True])
def test_rbf_cka_matches_reference(kind, debiased):
    """(The linear kernel on every data kind: test_feature_and_gram_paths_agree.)"""
    kernel = "rbf"
    x, y = _data(kind, np.random.default_rng(0))
    got = float(cka(x, y, kernel=kernel, debiased=debiased))
    assert got == pytest.approx(_ref_for(kind, x, y, kernel, debiased), rel=1e-9, abs=1e-10)


@pytest.mark.parametrize("kind", DATA_KINDS)
@pytest.mark.parametrize("debiased", [False, True])
def test_feature_and_gram_paths_agree(kind, debiased):
    x, y = _data(kind, np.random.default_rng(1))
    a = float(cka(x, y, debiased=debiased, method="features"))
    b = float(cka(x, y, debiased=debiased, method="gram"))
    assert a == pytest.approx(b, rel=1e-10, abs=1e-12)
    assert a == pytest.approx(_ref_for(kind, x, y, "linear", debiased), rel=1e-9, abs=1e-10)


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_float32(kernel, debiased):
    x, y = _kornblith()
    got = cka(x.astype(np.float32), y.astype(np.float32), kernel=kernel, debiased=debiased)
    assert got.dtype == jnp.float32
    assert float(got) == pytest.approx(ref_cka(x, y, kernel, debiased), rel=10 * TOL[np.dtype(np.float32)])


@pytest.mark.parametrize("debiased", [False, True])
def test_hsic_on_grams(debiased):
    x, y = _data("random", np.random.default_rng(2))
    K, L = ref_gram(x, "linear"), ref_gram(y, "rbf")
    assert float(hsic(K, L, debiased=debiased)) == pytest.approx(ref_hsic(K, L, debiased), rel=1e-10)


def test_grams_match_reference():
    x, _ = _data("duplicated", np.random.default_rng(3))
    np.testing.assert_allclose(linear_gram(x), ref_gram(x, "linear"), rtol=1e-12)
    np.testing.assert_allclose(rbf_gram(x, scale=0.7), ref_gram(x, "rbf", 0.7), rtol=1e-10, atol=1e-14)


# -------------------------------------------------------------- statistics for grids


def test_stats_reuse_and_vmap():
    rng = np.random.default_rng(4)
    layers = jnp.asarray(rng.normal(size=(3, 16, 4)))
    stats = jax.vmap(functools.partial(linear_stats, debiased=True))(layers)
    pair = jax.vmap(
        jax.vmap(functools.partial(linear_cka_from_stats, debiased=True), (None, 0)), (0, None)
    )
    grid = np.asarray(pair(stats, stats))
    ref = np.array([[ref_cka(a, b, "linear", True) for b in np.asarray(layers)] for a in np.asarray(layers)])
    np.testing.assert_allclose(grid, ref, rtol=1e-9)


# ------------------------------------------------------------------ minibatch CKA


def test_minibatch_matches_average_of_batch_hsics():
    x, y = _kornblith()
    bs = 30  # 3 batches of 30 and a remainder batch of 10
    batches = [slice(i, min(i + bs, 100)) for i in range(0, 100, bs)]
    terms = np.array(
        [[ref_hsic(ref_gram(a[s], "linear"), ref_gram(b[s], "linear"), True) for a, b in ((x, y), (x, x), (y, y))]
         for s in batches]
    ).mean(axis=0)
    ref = terms[0] / np.sqrt(terms[1] * terms[2])
    assert float(minibatch_cka(x, y, batch_size=bs)) == pytest.approx(ref, rel=1e-10)


def test_streaming_merge_and_psum():
    x, y = _kornblith()
    xs, ys = x.reshape(4, 25, 10), y.reshape(4, 25, 10)
    s = cka_init()
    for a, b in zip(xs, ys):
        s = cka_accumulate(s, a, b)
    seq = float(cka_finalize(s))
    assert seq == pytest.approx(float(minibatch_cka(x, y, batch_size=25)), rel=1e-12)
    # two "hosts" merged
    h1 = cka_accumulate(cka_accumulate(cka_init(), xs[0], ys[0]), xs[1], ys[1])
    h2 = cka_accumulate(cka_accumulate(cka_init(), xs[2], ys[2]), xs[3], ys[3])
    assert float(cka_finalize(cka_merge(h1, h2))) == pytest.approx(seq, rel=1e-12)

    # four "devices" summed with psum under a named axis
    def per_device(a, b):
        return jax.lax.psum(cka_accumulate(cka_init(), a, b), "dev")

    states = jax.vmap(per_device, axis_name="dev")(xs, ys)
    one = jax.tree.map(lambda v: v[0], states)
    assert float(one.count) == 4
    assert float(cka_finalize(one)) == pytest.approx(seq, rel=1e-12)


def test_minibatch_biased_option():
    x, y = _kornblith()
    assert float(minibatch_cka(x, y, batch_size=100, debiased=False)) == pytest.approx(0.55761, abs=5e-6)


def test_minibatch_float32():
    x, y = _kornblith()
    got = minibatch_cka(x.astype(np.float32), y.astype(np.float32), batch_size=50)
    assert got.dtype == jnp.float32
    ref = float(minibatch_cka(x, y, batch_size=50))
    assert float(got) == pytest.approx(ref, rel=10 * TOL[np.dtype(np.float32)])


# ------------------------------------------------------------------------- bad input

X8 = np.random.default_rng(9).normal(size=(8, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cka(X8, X8[:7]), r"same number of samples.*x\.shape=\(8, 3\) and y\.shape=\(7, 3\)"),
        (lambda: cka(X8[None], X8), r"x must be 2-D.*\(1, 8, 3\)"),
        (lambda: cka(X8[:, 0], X8), r"x must be 2-D.*\(8,\).*x\[:, None\]"),
        (lambda: cka(X8[:3], X8[:3], debiased=True), r"x has 3 samples.*at least 4.*debiased"),
        (lambda: cka(np.where(np.eye(8, 3) > 0, np.nan, X8), X8), r"x of shape \(8, 3\) contains 3 NaN"),
        (lambda: cka(X8, np.where(np.eye(8, 3) > 0, np.inf, X8)), r"y of shape \(8, 3\) contains 0 NaN and 3 Inf"),
        (lambda: cka(X8, np.ones((8, 2))), r"y of shape \(8, 2\) is constant across samples"),
        (lambda: cka(X8, X8, kernel="rfb"), r"Unknown kernel 'rfb'\. Did you mean 'rbf'"),
        (lambda: cka(X8, X8, method="fast"), r"Unknown method 'fast'"),
        (lambda: cka(X8, X8, kernel="rbf", method="features"), r"only available for kernel='linear'"),
        (lambda: cka(np.vstack([np.repeat(X8[:1], 7, axis=0), X8[1:2]]), X8, kernel="rbf"), r"x of shape \(8, 3\) has a zero median"),
        (lambda: minibatch_cka(X8, X8, batch_size=3), r"batch_size=3 must be in \[4, n=8\]"),
        (lambda: minibatch_cka(X8, X8, batch_size=9), r"batch_size=9 must be in \[4, n=8\]"),
        (lambda: minibatch_cka(np.vstack([X8, X8[:1]]), np.vstack([X8, X8[:1]]), batch_size=4),
         r"final batch of 1 rows"),
        (lambda: cka_accumulate(cka_init(), X8[:3], X8[:3]), r"x_batch has 3 samples.*at least 4"),
        (lambda: cka_finalize(cka_init()), r"empty state"),
        (lambda: hsic(np.ones((3, 4)), np.ones((3, 4))), r"k must be a square"),
        (lambda: hsic(np.eye(3), np.eye(3), debiased=True), r"needs n >= 4"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


KERNELS_MODULE = importlib.import_module("funsim.similarity._hsic")  # where the RBF kernel lives
DUP8 = np.vstack([np.repeat(X8[:1], 7, axis=0), X8[1:2]])  # 7 of 8 rows coincide: the median distance is 0


def _gram_summed_in_another_order(monkeypatch, ulps):
    """Replace the RBF distances by what a GEMM that sums in another order than the row norms gives
    (a GPU's): every off-diagonal entry ``ulps`` units of rounding of ``sq_i + sq_j`` above its value.
    Under ``jax.disable_jit`` (so that no compiled program from another test is reused)."""
    exact = KERNELS_MODULE._sq_dists

    def rounded(x):
        d2, sq = exact(x)
        bump = ulps * jnp.finfo(d2.dtype).eps * (sq[:, None] + sq[None, :])
        return jnp.where(jnp.eye(x.shape[0], dtype=bool), d2, d2 + bump), sq

    monkeypatch.setattr(KERNELS_MODULE, "_sq_dists", rounded)


@pytest.mark.parametrize("ulps", [1.0, 4.0])
def test_zero_median_is_found_when_the_distances_carry_rounding(monkeypatch, ulps):
    """On the H200 the repeated rows' distances came out a few ulps above 0, their median was a tiny
    positive number, and the zero-median check let the call through. Emulated here on the CPU."""
    _gram_summed_in_another_order(monkeypatch, ulps)
    with jax.disable_jit():
        d2, _ = KERNELS_MODULE._sq_dists(jnp.asarray(DUP8))
        assert float(np.median(np.asarray(d2))) > 0.0  # the bare "median > 0" check would pass
        for x, y, name in ((DUP8, X8, "x"), (X8, DUP8, "y")):
            with pytest.raises(ValueError, match=rf"{name} of shape \(8, 3\) has a zero median squared pairwise"):
                cka(x, y, kernel="rbf")
        # a defined pair stays defined, and the rounding moves its value by rounding only
        assert float(cka(X8, X8[:, ::-1] ** 2, kernel="rbf")) == pytest.approx(
            ref_cka(X8, X8[:, ::-1] ** 2, "rbf"), rel=1e-12)


@pytest.mark.parametrize("rel", [1e-6, 1e-3])
def test_a_small_but_resolved_median_is_not_rounding(rel):
    """Seven rows within ``rel`` of one another (relative distance), not equal: the median squared distance
    is ~rel^2 of the norms, far above float64 rounding, so RBF CKA is defined and matches float64 NumPy
    (to the digits that the distances' expansion ``sq_i + sq_j - 2 <x_i, x_j>`` keeps: about eps / rel^2)."""
    rng = np.random.default_rng(4)
    x = DUP8 + rel * np.abs(DUP8).max() * rng.normal(size=DUP8.shape) * (np.arange(8) < 7)[:, None]
    tol = max(1e-9, np.finfo(np.float64).eps / rel**2)
    assert float(cka(x, X8, kernel="rbf")) == pytest.approx(ref_cka(x, X8, "rbf"), rel=tol)


def test_under_user_jit_degenerate_input_gives_nan():
    """Documented: value checks need concrete arrays; under jit NaN propagates."""
    bad = np.array(X8)
    bad[0, 0] = np.nan
    assert np.isnan(float(jax.jit(cka)(bad, X8)))
    assert np.isnan(float(jax.jit(cka)(X8, np.ones((8, 2)))))


# ---------------------------------------------------------------- properties, grads


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3), debiased=st.booleans())
def test_properties(seed, log_scale, debiased):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(16, 4)) * 10.0**log_scale, rng.normal(size=(16, 4))
    for kernel in ("linear", "rbf"):
        v = float(cka(x, y, kernel=kernel, debiased=debiased))
        assert v <= 1.0 + 1e-12 and (debiased or v >= 0.0)
        assert v == pytest.approx(float(cka(y, x, kernel=kernel, debiased=debiased)), abs=1e-12)
        assert v == pytest.approx(ref_cka(x, y, kernel, debiased), rel=1e-8, abs=1e-12)


def test_gradients():
    rng = np.random.default_rng(5)
    x, y = jnp.asarray(rng.normal(size=(16, 4))), jnp.asarray(rng.normal(size=(16, 4)))
    check_grads(lambda a: cka(a, y), (x,), order=1, modes=["rev"])
    check_grads(lambda a: cka(a, y, debiased=True), (x,), order=1, modes=["rev"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rbf_median_by_integer_sort_equals_numpy(dtype):
    """The RBF bandwidth's median (sorted as integer bit patterns, for speed) is np.median exactly."""
    from funsim.similarity._hsic import _median_nonneg

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 101):
        a = np.abs(rng.normal(size=(n, 3))).astype(dtype)
        a[0, 0] = 0.0
        assert float(_median_nonneg(a)) == float(np.median(a)), n


def test_a_new_rbf_scale_compiles_nothing():
    """rbf_scale is traced data: a second value reuses the compiled program (counted through
    jax.monitoring's backend-compile events) and really changes the value."""
    from funsim.runtime.compile_count import compiles

    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(19, 3)), rng.normal(size=(19, 2))
    a = float(cka(x, y, kernel="rbf", rbf_scale=0.5))
    n, b = compiles(cka, x, y, kernel="rbf", rbf_scale=0.9)
    assert n == 0
    assert float(b) != a
    k, l = ref_gram(x, "rbf", 0.9), ref_gram(y, "rbf", 0.9)
    assert float(b) == pytest.approx(ref_hsic(k, l, False) / np.sqrt(ref_hsic(k, k, False) * ref_hsic(l, l, False)),
                                     rel=1e-9)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "0.5", True])
def test_rbf_scale_must_be_positive(bad):
    with pytest.raises(ValueError, match="rbf_scale must be a finite number > 0"):
        cka(X8, X8, kernel="rbf", rbf_scale=bad)
