"""The report's statistics against NumPy/SciPy references (similarity/statistics.py)."""

import jax
import numpy as np
import pytest
import scipy.stats

from funsim.similarity import statistics as st


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    return x, 0.7 * x + rng.normal(scale=0.8, size=300)


def test_r2_is_the_least_squares_r2(xy):
    x, y = xy
    ref = scipy.stats.linregress(x, y).rvalue ** 2
    np.testing.assert_allclose(float(st.r2(x, y)), ref, rtol=1e-5)
    # the R^2 of the fitted line, computed from its residuals
    slope, icept = np.polyfit(x, y, 1)
    res = y - (slope * x + icept)
    np.testing.assert_allclose(float(st.r2(x, y)), 1 - res @ res / np.sum((y - y.mean()) ** 2), rtol=1e-5)


def test_frequency_weights_equal_repeated_rows(xy):
    x, y = xy
    w = np.random.default_rng(1).integers(0, 4, size=x.size)
    np.testing.assert_allclose(float(st.r2(x, y, weights=w)), scipy.stats.pearsonr(np.repeat(x, w), np.repeat(y, w))[0] ** 2,
                               rtol=1e-5)
    np.testing.assert_allclose(float(st.excess_kurtosis(x, weights=w)), scipy.stats.kurtosis(np.repeat(x, w)), rtol=1e-4)


def test_excess_kurtosis_matches_scipy():
    d = np.random.default_rng(2).standard_t(4, size=2000)
    np.testing.assert_allclose(float(st.excess_kurtosis(d)), scipy.stats.kurtosis(d), rtol=1e-4)


def test_bootstrap_equals_a_numpy_loop_over_the_same_resamples(xy):
    x, y = xy
    key = jax.random.key(3)
    ci = st.bootstrap(st.r2, (x, y), key=key, n_resamples=300)
    w = np.asarray(st.resample_weights(key, x.size, n_resamples=300)).astype(int)
    ref = [scipy.stats.pearsonr(np.repeat(x, wi), np.repeat(y, wi))[0] ** 2 for wi in w]
    np.testing.assert_allclose([ci.low, ci.high], np.quantile(ref, [0.025, 0.975]), rtol=1e-4)
    assert ci.low < ci.estimate < ci.high


def test_bootstrap_of_the_mean_has_the_textbook_width():
    # for the mean of n iid N(0, 1) values the 95% interval is about +-1.96/sqrt(n);
    # with 4000 resamples its half-width is within 5% of that (Monte Carlo error about 1.5%)
    x = np.random.default_rng(4).normal(size=400)

    def mean(v, *, weights=None):
        return st.weighted_moments(v, weights=weights)[0]

    ci = st.bootstrap(mean, (x,), key=jax.random.key(5), n_resamples=4000)
    half = (ci.high - ci.low) / 2
    assert abs(half / (1.96 * x.std() / np.sqrt(x.size)) - 1) < 0.05


def test_cluster_weights_move_whole_clusters():
    clusters = np.array([0, 0, 0, 1, 1, 2])
    w = np.asarray(st.resample_weights(jax.random.key(6), 6, n_resamples=50, clusters=clusters))
    assert np.all(w[:, 0] == w[:, 1]) and np.all(w[:, 1] == w[:, 2]) and np.all(w[:, 3] == w[:, 4])
    np.testing.assert_array_equal(w[:, [0, 3, 5]].sum(axis=1), 3)  # 3 clusters drawn per resample
    with pytest.raises(ValueError, match=r"clusters must be \(n,\) = \(6,\)"):
        st.resample_weights(jax.random.key(0), 6, n_resamples=2, clusters=clusters[:5])


@pytest.mark.parametrize("n", [37, 64])  # 37 is padded to 48 rows of the ladder, 64 is on it
@pytest.mark.parametrize("how", ["models", "clusters", "rows"])
def test_padded_resamples_equal_the_unpadded_ones(n, how):
    """The resampling program pads rows with weight-0 copies: every resample equals the statistic computed in
    NumPy (float64) on the unpadded rows, weighted by the public weights of the same key."""
    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = 0.5 * x + rng.standard_t(3, size=n)
    a, b = rng.integers(0, 6, n), rng.integers(0, 6, n)
    ids = np.array([f"m{i}" for i in range(6)])
    key = jax.random.key(7)
    if how == "models":
        kw = {"models": (ids[a], ids[b])}
        w = st.model_resample_weights(key, ids[a], ids[b], n_resamples=200)
    elif how == "clusters":
        kw = {"clusters": a}
        w = st.resample_weights(key, n, n_resamples=200, clusters=a)
    else:
        kw = {}
        w = st.resample_weights(key, n, n_resamples=200)
    est, samples = st.bootstrap_distribution(st.r2, (x, y), key=key, n_resamples=200, **kw)
    w = np.asarray(w, np.float64)

    def ref(wi):
        m = wi > 0
        return scipy.stats.pearsonr(np.repeat(x[m], wi[m].astype(int)), np.repeat(y[m], wi[m].astype(int)))[0] ** 2

    np.testing.assert_allclose(est, scipy.stats.pearsonr(x, y)[0] ** 2, rtol=1e-10)
    ok = (w > 0).sum(1) > 2  # resamples with at least 3 distinct rows (fewer: R^2 is 1 or undefined)
    np.testing.assert_allclose(samples[ok], [ref(wi) for wi in w[ok]], rtol=1e-8)
    kurt, ks = st.bootstrap_distribution(st.excess_kurtosis, (y,), key=key, n_resamples=200, **kw)
    np.testing.assert_allclose(kurt, scipy.stats.kurtosis(y), rtol=1e-10)
    np.testing.assert_allclose(ks[ok], [scipy.stats.kurtosis(np.repeat(y, wi.astype(int))) for wi in w[ok]],
                               rtol=1e-8)


def test_more_models_than_rows():
    """Four pairs of eight distinct models: more clusters than rows, the draws wider than the padded rows."""
    ids = [f"m{i}" for i in range(8)]
    a, b = ids[:4], ids[4:]
    x = np.array([0.1, 0.5, 0.2, 0.9])
    key = jax.random.key(1)
    _, samples = st.bootstrap_distribution(st.weighted_mean, (x,), key=key, n_resamples=50, models=(a, b))
    w = np.asarray(st.model_resample_weights(key, a, b, n_resamples=50), np.float64)
    ok = w.sum(1) > 0
    np.testing.assert_allclose(samples[ok], (w[ok] @ x) / w[ok].sum(1), rtol=1e-6)
    assert np.all(np.isnan(samples[~ok]))


def test_padding_copies_a_finite_row():
    """A row with a NaN (an undefined comparison) is never the padding: 0 x NaN would poison every resample."""
    x = np.array([np.nan, 1.0, 2.0, 4.0, 3.0])
    y = np.array([1.0, np.nan, 2.0, 3.0, 5.0])
    padded = st._pad_rows((x, y), 6)
    np.testing.assert_array_equal(padded[0][5:], [2.0])
    np.testing.assert_array_equal(padded[1][5:], [2.0])


def test_subsets_of_one_size_class_share_one_program():
    """Bootstraps of subsets of 37-48 rows over the same 6 models compile nothing after the first (the
    shape policy: rows padded to the ladder's 48, the draws' shape fixed by the number of models)."""
    from funsim.runtime.compile_count import CompileCounter

    rng = np.random.default_rng(0)
    ids = np.array([f"m{i}" for i in range(6)])
    a, b = np.arange(48) % 6, (np.arange(48) // 6 + 1) % 6  # every model in the first 37 rows
    x, y = rng.normal(size=48), rng.normal(size=48)
    st.bootstrap_distribution(st.r2, (x[:37], y[:37]), key=jax.random.key(0), n_resamples=100,
                              models=(ids[a[:37]], ids[b[:37]]))
    with CompileCounter() as c:
        for n in (40, 44, 48):
            st.bootstrap_distribution(st.r2, (x[:n], y[:n]), key=jax.random.key(n), n_resamples=100,
                                      models=(ids[a[:n]], ids[b[:n]]))
    assert c.count == 0, c.names


def test_permutation_null_is_the_exact_permutation_distribution():
    """On 6 points every one of the 720 permutations is enumerated (scipy's R^2 of each): the drawn null
    holds only values of that set, and its mean and 95th percentile match the exact distribution's
    within their Monte Carlo error (20,000 draws: the mean's standard error is sd / sqrt(20000))."""
    import itertools

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=6), rng.normal(size=6)
    exact = np.array([scipy.stats.pearsonr(x, y[list(p)])[0] ** 2 for p in itertools.permutations(range(6))])
    null = st._permuted_r2(x, y, jax.random.key(4), 20000)
    assert np.all(np.min(np.abs(null[:, None] - np.unique(exact)[None, :]), axis=1) < 1e-12)
    assert abs(null.mean() - exact.mean()) < 4 * exact.std() / np.sqrt(len(null))
    np.testing.assert_allclose(exact.mean(), 1 / (len(x) - 1), rtol=1e-12)  # E r^2 = 1 / (n - 1) exactly
    # the drawn null's 95th percentile sits between the exact distribution's 94th and 96th
    assert np.quantile(exact, 0.94) <= np.quantile(null, 0.95) <= np.quantile(exact, 0.96)


def test_permutation_test_counts_the_observed_value_and_is_keyed(xy):
    x, y = xy
    key = jax.random.key(7)
    res = st.permutation_test(x, y, key=key, n_permutations=200)
    null = st._permuted_r2(x, y, key, 200)
    np.testing.assert_allclose(res.null_mean, null.mean(), rtol=1e-12)
    assert res.p_value == (1 + np.sum(null >= res.observed)) / 201 == 1 / 201
    assert abs(res.null_mean - 1 / (len(x) - 1)) < 4 * null.std() / np.sqrt(200)  # E r^2 under permutation
    assert st.permutation_test(x, y, key=key, n_permutations=200) == res  # the same key, the same null
    assert st.permutation_test(x, y, key=jax.random.key(8), n_permutations=200).null_mean != res.null_mean
    long = st._permuted_r2(x, y, key, 600)  # more than one chunk of permutations
    np.testing.assert_array_equal(long[:200], null)  # drawn in the same order
    # independent data: p is uniform under the null, so p < 0.05 in about 1 of 20 draws
    # (at least 6 of 20 has binomial probability 3e-4)
    rng = np.random.default_rng(8)
    ps = [st.permutation_test(x, rng.normal(size=300), key=jax.random.fold_in(key, i), n_permutations=200).p_value
          for i in range(20)]
    assert sum(p < 0.05 for p in ps) <= 5 and max(ps) > 0.5


def test_tail_statistics_separate_normal_from_heavy_tails():
    rng = np.random.default_rng(9)
    normal, heavy = st.tail_statistics(rng.normal(size=20000)), st.tail_statistics(rng.standard_t(3, size=20000))
    assert abs(normal["excess_kurtosis"]) < 0.2 and abs(normal["quantile_ratio"] / st.NORMAL_TAIL["quantile_ratio"] - 1) < 0.05
    assert abs(normal["beyond_3sd"] - st.NORMAL_TAIL["beyond_3sd"]) < 0.002
    assert heavy["excess_kurtosis"] > 2 and heavy["quantile_ratio"] > 4
    np.testing.assert_allclose(st.NORMAL_TAIL["beyond_3sd"], 2 * scipy.stats.norm.sf(3))
    q = scipy.stats.norm.ppf
    np.testing.assert_allclose(st.NORMAL_TAIL["quantile_ratio"], (q(0.99) - q(0.01)) / (q(0.75) - q(0.25)))


def test_binned_probability_matches_histograms():
    rng = np.random.default_rng(10)
    x, hit = rng.uniform(size=500), rng.uniform(size=500) < 0.5
    edges = np.linspace(0, 1, 6)
    counts, prob = st.binned_probability(x, hit, edges=edges)
    np.testing.assert_array_equal(counts, np.histogram(x, edges)[0])
    ref = [hit[(x >= lo) & ((x < hi) | (hi == 1))].mean() for lo, hi in zip(edges[:-1], edges[1:])]
    np.testing.assert_allclose(prob, ref)
    _, p = st.binned_probability([0.1], [True], edges=[0, 0.5, 1])
    assert p[0] == 1 and np.isnan(p[1])
    with pytest.raises(ValueError, match="increasing"):
        st.binned_probability(x, hit, edges=[0, 0])


def test_count_violations_and_bad_input():
    assert st.count_violations([0, 1, 2], [0, 1, 2], [0, 1, 2]) == 0
    assert st.count_violations([0.1, 0.2], [0.0, 0.3], tol=0.05) == 1
    with pytest.raises(ValueError, match="one shape"):
        st.count_violations([0, 1], [0])
    with pytest.raises(ValueError, match=r"y must be a 1-D array.*shape \(2, 2\)"):
        st.r2(np.zeros(4), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="same length"):
        st.r2(np.zeros(4), np.zeros(5))


def test_constant_data_is_refused_not_a_nan_interval():
    x, const = np.arange(10.0), np.full(10, 3.0)
    assert np.isnan(float(st.r2(x, const)))  # the statistic itself: NaN, documented
    with pytest.raises(ValueError, match=r"r2 is nan on the data itself \(arrays of length 10\)"):
        st.bootstrap(st.r2, (x, const), key=jax.random.key(0), n_resamples=10)
    with pytest.raises(ValueError, match=r"excess_kurtosis is nan"):
        st.bootstrap(st.excess_kurtosis, (const,), key=jax.random.key(0), n_resamples=10)
    with pytest.raises(ValueError, match=r"R\^2 is undefined: x or y \(length 10\) is constant"):
        st.permutation_test(const, x, key=jax.random.key(0), n_permutations=10)
