"""RDMs and RSA against SciPy references; the RSA = linear CKA identity."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist, squareform
from scipy.stats import kendalltau, pearsonr, rankdata, spearmanr

from funsim.similarity import cka, rank_average, rdm, rsa
from funsim.similarity.rsa import COMPARISONS, RDM_METRICS


def ref_rdm(x, metric):
    return squareform(pdist(np.asarray(x, np.float64), metric))


def ref_compare(a, b, compare):
    if compare == "spearman":
        return spearmanr(a, b).statistic
    if compare == "pearson":
        return pearsonr(a, b).statistic
    if compare == "kendall":  # tau-a from its definition: ties count 0, all pairs in the denominator
        m = len(a)
        s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
        return s.sum() / (m * (m - 1))
    if compare == "cosine":
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    raise ValueError(compare)


def ref_rsa(x, y, metric, compare):
    dx, dy = ref_rdm(x, metric), ref_rdm(y, metric)
    if compare == "cosine_cov":
        n = len(dx)
        H = np.eye(n) - 1.0 / n
        cx, cy = H @ dx @ H, H @ dy @ H
        return np.sum(cx * cy) / np.linalg.norm(cx) / np.linalg.norm(cy)
    iu = np.triu_indices(len(dx), 1)
    return ref_compare(dx[iu], dy[iu], compare)


def _data(kind, rng):
    if kind == "random":
        x = rng.normal(size=(16, 4))
        return x, np.tanh(x) + 0.3 * rng.normal(size=(16, 4))
    if kind == "ties":  # integer features: many exactly tied Euclidean distances
        x = rng.integers(0, 3, size=(12, 4)).astype(float)
        return x, np.abs(x - 1.0) + rng.integers(0, 2, size=(12, 4))
    if kind == "duplicated":  # duplicated samples: tied distances under every metric
        x = rng.normal(size=(16, 4))
        x[3], x[7] = x[2], x[6]
        return x, np.tanh(x) + 0.3 * rng.normal(size=(16, 4))
    raise ValueError(kind)


@pytest.mark.parametrize("metric", RDM_METRICS)
def test_rdm_matches_scipy(metric):
    x, _ = _data("random", np.random.default_rng(0))
    x = x + 2.0
    np.testing.assert_allclose(rdm(x, metric=metric), ref_rdm(x, metric), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kind, compare",
    [("random", c) for c in COMPARISONS] + [("duplicated", c) for c in ("spearman", "kendall")],
)
@pytest.mark.parametrize("metric", RDM_METRICS)
def test_rsa_matches_reference(metric, compare, kind):
    x, y = _data(kind, np.random.default_rng(1))
    got = float(rsa(x, y, rdm_metric=metric, compare=compare))
    assert got == pytest.approx(ref_rsa(x, y, metric, compare), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("compare", ["spearman", "kendall"])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_rank_comparisons_with_many_ties(metric, compare):
    kind = "ties"
    x, y = _data(kind, np.random.default_rng(1))
    got = float(rsa(x, y, rdm_metric=metric, compare=compare))
    assert got == pytest.approx(ref_rsa(x, y, metric, compare), rel=1e-9, abs=1e-12)


def test_rank_average_matches_scipy():
    v = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0, 7.0])
    np.testing.assert_array_equal(rank_average(v), rankdata(v, method="average"))
    np.testing.assert_array_equal(jax.jit(rank_average)(v), rankdata(v))


def test_kendall_tau_a_differs_from_tau_b_with_ties():
    a = np.array([1.0, 1.0, 2.0, 3.0, 3.0])
    b = np.array([1.0, 2.0, 2.0, 3.0, 4.0])
    x, y = a[:, None], b[:, None]
    # RSA on 1-feature euclidean RDMs; the reference is the tau-a definition, not scipy's tau-b
    got = float(rsa(x, y, rdm_metric="euclidean", compare="kendall"))
    iu = np.triu_indices(5, 1)
    da, db = ref_rdm(x, "euclidean")[iu], ref_rdm(y, "euclidean")[iu]
    assert got == pytest.approx(ref_compare(da, db, "kendall"), abs=1e-12)
    assert abs(got - kendalltau(da, db).statistic) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_sqeuclidean_cosine_cov_is_linear_cka(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(16, 4)), rng.normal(size=(16, 6)) + 2.0
    y[:, :4] += x
    a = float(rsa(x, y, rdm_metric="sqeuclidean", compare="cosine_cov"))
    assert a == pytest.approx(float(cka(x, y)), rel=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_and_jit_vmap(dtype):
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(3, 16, 4)).astype(dtype)
    ys = (xs + rng.normal(size=xs.shape)).astype(dtype)
    f = lambda a, b: rsa(a, b, rdm_metric="euclidean", compare="spearman")
    stack = np.array([float(f(a, b)) for a, b in zip(xs, ys)])
    got = jax.jit(jax.vmap(f))(xs, ys)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, stack, rtol=1e-5 if dtype == np.float32 else 1e-12)
    ref = np.array([ref_rsa(a, b, "euclidean", "spearman") for a, b in zip(xs, ys)])
    np.testing.assert_allclose(stack, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3))
def test_properties(seed, log_scale):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, 4)) * 10.0**log_scale
    y = rng.normal(size=(16, 4))
    for compare in ("spearman", "kendall", "cosine_cov"):
        v = float(rsa(x, y, rdm_metric="euclidean", compare=compare))
        assert -1.0 - 1e-12 <= v <= 1.0 + 1e-12
        assert v == pytest.approx(float(rsa(y, x, rdm_metric="euclidean", compare=compare)), abs=1e-12)
        assert v == pytest.approx(ref_rsa(x, y, "euclidean", compare), rel=1e-8, abs=1e-12)


X8 = np.random.default_rng(9).normal(size=(8, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rsa(X8, X8[:6]), r"same number of samples.*\(8, 3\).*\(6, 3\)"),
        (lambda: rsa(X8[None], X8), r"x must be 2-D.*\(1, 8, 3\)"),
        (lambda: rsa(X8[:2], X8[:2]), r"x has 2 samples.*at least 3"),
        (lambda: rsa(np.where(np.eye(8, 3) > 0, np.nan, X8), X8), r"x of shape \(8, 3\) contains 3 NaN"),
        (lambda: rsa(X8, np.ones((8, 3)), rdm_metric="euclidean"), r"y of shape \(8, 3\) is constant"),
        (lambda: rsa(X8, np.vstack([np.ones((1, 3)), X8[1:]])), r"y of shape \(8, 3\) has 1 rows that are constant across features"),
        (lambda: rsa(X8, np.vstack([np.zeros((1, 3)), X8[1:]]), rdm_metric="cosine"), r"y .* has 1 rows that are all zero"),
        (lambda: rsa(X8[:, :1], X8), r"correlation distance needs at least 2 features"),
        (lambda: rdm(X8[:, :1]), r"correlation distance needs at least 2 features"),
        (lambda: rsa(X8, X8, compare="spearmann"), r"Unknown compare 'spearmann'\. Did you mean 'spearman'"),
        (lambda: rdm(X8, metric="sqeucl"), r"Unknown metric 'sqeucl'\. Did you mean 'sqeuclidean'"),
        (lambda: rsa(np.eye(4), np.random.default_rng(0).normal(size=(4, 3)), rdm_metric="euclidean",
                     compare="pearson"), r"has no spread"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_kendall_refuses_huge_rdms():
    """Kendall's tau-a is O(m^2) in the RDM entries: past the limit it raises instead of hanging."""
    from funsim.similarity.rsa import KENDALL_MAX_ENTRIES, compare_vectors

    v = np.zeros((KENDALL_MAX_ENTRIES + 1,))
    with pytest.raises(ValueError, match="spearman"):
        compare_vectors(v, v, compare="kendall")


def _near_ties(rng, m, dtype, *, long_run):
    """Exact ties, near-ties one ulp apart, +-0 and negatives; optionally 12 values within 12 ulps."""
    v = rng.normal(size=m).astype(dtype)
    v[: m // 4] = v[m // 4 : m // 2]  # exact ties
    v[m // 2 : m // 2 + 40] = np.nextafter(v[:40], np.inf)  # one ulp above an existing value
    if long_run:
        v[200:212] = v[100] + np.arange(12) * np.spacing(v[100])
    v[300], v[301] = 0.0, -0.0
    return rng.permutation(v)


@pytest.mark.parametrize("long_run", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rank_average_exact_on_ties_and_near_ties(dtype, long_run):
    """Every path of the rank transform equals scipy's average ranks, including values one ulp
    apart: float32 keys sort exactly; float64 near-ties are resolved in a window, and a run of
    12 (> _WINDOW) distinct values sharing a coarse key takes the sort-and-search fallback."""
    from funsim.similarity.rsa import _WINDOW, _order_key, _ranks_by_search

    assert _WINDOW < 12
    v = _near_ties(np.random.default_rng(3), 5000, dtype, long_run=long_run)
    want = rankdata(v, method="average")
    np.testing.assert_array_equal(np.asarray(rank_average(v)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(_ranks_by_search)(_order_key(jax.numpy.asarray(v)))), want)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), m=st.sampled_from([1, 2, 57, 300]), n_distinct=st.integers(1, 50))
def test_rank_average_property(seed, m, n_distinct):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=n_distinct)
    base = np.concatenate([base, np.nextafter(base, np.inf)])
    v = rng.choice(base, size=m)
    np.testing.assert_array_equal(np.asarray(rank_average(v)), rankdata(v, method="average"))


@pytest.mark.slow
def test_float32_accuracy_at_digits_size():
    """n = 1,797 (1.6 M RDM entries): float32 RSA within 1e-6 of SciPy on the same data.

    A plain float32 running sum over the entries lost about 4e-4 here; the two-stage sums
    keep it near float32's resolution.
    """
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1797, 64)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=(64, 64)) / 8) + 0.3 * rng.normal(size=(1797, 64))).astype(np.float32)
    for metric, compare in (("euclidean", "spearman"), ("correlation", "pearson"), ("cosine", "cosine_cov")):
        got = float(rsa(x, y, rdm_metric=metric, compare=compare))
        assert got == pytest.approx(ref_rsa(x.astype(np.float64), y.astype(np.float64), metric, compare),
                                    abs=1e-6), (metric, compare)


def test_one_compiled_program_serves_every_rdm_metric():
    """The RDM metric is data, not a static argument: after the first metric, the others of the same
    shape and compare compile only their (tiny) comparison, never another RDM program."""
    from funsim.runtime.compile_count import CompileCounter

    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(23, 5)), rng.normal(size=(23, 3))  # shapes no other test uses
    for compare in ("pearson", "cosine_cov"):
        rsa(x, y, rdm_metric=RDM_METRICS[0], compare=compare)
        with CompileCounter() as c:
            got = {m: float(rsa(x, y, rdm_metric=m, compare=compare)) for m in RDM_METRICS[1:]}
        assert c.count == 0, f"{compare}: {c.count} new programs for the other RDM metrics"
        for m, v in got.items():
            assert v == pytest.approx(ref_rsa(x, y, m, compare), rel=1e-9, abs=1e-12)
    rdm(x, metric=RDM_METRICS[0])
    with CompileCounter() as c:
        for m in RDM_METRICS[1:]:
            np.testing.assert_allclose(rdm(x, metric=m), ref_rdm(x, m), rtol=1e-10, atol=1e-12)
    assert c.count == 0


@pytest.mark.parametrize("compare", ["spearman", "kendall"])
def test_cosine_rdm_of_one_feature_keeps_pdists_ties(compare):
    """On one feature every cosine distance is exactly 0 or 2 (pdist's two values). The RDM once scaled
    the products by reciprocal norms, and XLA rewrote ``x / sqrt(x^2)`` as ``x * rsqrt(x^2)``: both break
    the ties by rounding (9 distinct distances; Spearman 0.713 for scipy's 0.792)."""
    r = np.random.default_rng(0)
    x = r.normal(size=(40, 1)) + 0.3
    y = np.tanh(x @ r.normal(size=(1, 3))) + 0.3 * r.normal(size=(40, 3))
    d = np.asarray(jax.jit(lambda z: rdm(z, metric="cosine"))(x))
    iu = np.triu_indices(40, 1)
    assert set(np.unique(d[iu])) == set(np.unique(pdist(x, "cosine"))) == {0.0, 2.0}
    dx, dy = pdist(x, "cosine"), pdist(y, "cosine")
    if compare == "spearman":
        want = spearmanr(dx, dy)[0]
    else:  # tau-a: concordant minus discordant pairs over all pairs (ties count as neither)
        s = np.sign(dx[:, None] - dx[None, :]) * np.sign(dy[:, None] - dy[None, :])
        want = s[np.triu_indices(len(dx), 1)].mean()
    assert float(rsa(x, y, rdm_metric="cosine", compare=compare)) == pytest.approx(want, abs=1e-10)
