"""Change-point segmentation of similarity matrices against brute-force enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from funsim import similarity
from funsim.similarity import change_points, segment_costs


def _segment_cost_ref(s, a, b, cost):
    """Float64 NumPy cost of the segment [a, b), straight from the definition."""
    s = np.asarray(s, np.float64)
    idx = range(a, b)
    if cost == "kernel":
        return sum(s[i, i] for i in idx) - sum(s[i, j] for i in idx for j in idx) / (b - a)
    return sum(1.0 - 0.5 * (s[i, j] + s[j, i]) for i in idx for j in idx if i < j)


def _brute_force(s, cost):
    """{k: (best cost, best starts)} over all C(n-1, k-1) segmentations, by enumeration."""
    n = len(s)
    table = {(a, b): _segment_cost_ref(s, a, b, cost) for a in range(n) for b in range(a + 1, n + 1)}
    out = {}
    for k in range(1, n + 1):
        best = (np.inf, None)
        for cuts in itertools.combinations(range(1, n), k - 1):
            starts = (0, *cuts)
            total = sum(table[a, b] for a, b in zip(starts, (*cuts, n)))
            if total < best[0] - 1e-12:
                best = (total, starts)
        out[k] = best
    return out


def _random_similarity(rng, n, kind):
    if kind == "gram":  # a normalised Gram matrix: a genuine similarity (cosine) matrix
        z = rng.normal(size=(n, 3)) + np.linspace(0, 2, n)[:, None] * rng.normal(size=(1, 3))
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        return z @ z.T
    a = rng.uniform(-1, 1, size=(n, n))  # indefinite, non-symmetric
    return a


@pytest.mark.parametrize("cost", similarity.SEGMENT_COSTS)
@pytest.mark.parametrize("kind", ["gram", "general"])
def test_matches_brute_force_enumeration(cost, kind):
    rng = np.random.default_rng(0)
    for n in (1, 3, 8):  # every k for each n; few sizes keep the compiles down
        s = _random_similarity(rng, n, kind)
        ref = _brute_force(s, cost)
        for k in range(1, n + 1):
            seg = change_points(s, n_segments=k, cost=cost)
            assert tuple(np.asarray(seg.starts).tolist()) == ref[k][1], (n, k)
            np.testing.assert_allclose(float(seg.cost), ref[k][0], rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(np.asarray(seg.costs), [ref[j][0] for j in range(1, k + 1)], rtol=1e-10, atol=1e-10)
            assert seg.starts.dtype == jnp.int32 and seg.starts.shape == (k,)


@pytest.mark.parametrize("cost", similarity.SEGMENT_COSTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_costs_against_definition(cost, dtype, tol):
    rng = np.random.default_rng(1)
    n = 7
    s = _random_similarity(rng, n, "general").astype(dtype)
    c = np.asarray(segment_costs(s, cost=cost))
    assert c.shape == (n, n + 1) and c.dtype == dtype
    for a in range(n):
        for b in range(n + 1):
            if b <= a:
                assert c[a, b] == np.inf
            else:
                np.testing.assert_allclose(c[a, b], _segment_cost_ref(s, a, b, cost), rtol=50 * tol[np.dtype(dtype)], atol=50 * tol[np.dtype(dtype)])


def _planted(sizes, within_noise, across, seed):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    n = len(labels)
    s = np.where(labels[:, None] == labels[None, :], 1.0, across)
    noise = rng.uniform(0, within_noise, size=(n, n))
    s = s - 0.5 * (noise + noise.T)
    np.fill_diagonal(s, 1.0)
    return s, np.concatenate([[0], np.cumsum(sizes)[:-1]])


@given(
    cuts=st.sets(st.integers(1, 11), max_size=4),
    across=st.floats(-0.5, 0.5),
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(similarity.SEGMENT_COSTS),
)
def test_block_diagonal_structure_is_recovered_exactly(cuts, across, seed, cost):
    # n = 12 items in len(cuts) + 1 blocks. Within-block similarity >= 0.999, across <= 0.5:
    # any segment that straddles a block boundary costs more than the whole planted segmentation.
    starts = np.array([0, *sorted(cuts)])
    s, planted = _planted(np.diff([*starts, 12]), 1e-3, across, seed)
    np.testing.assert_array_equal(planted, starts)
    seg = change_points(s, n_segments=len(starts), cost=cost)
    np.testing.assert_array_equal(np.asarray(seg.starts), starts)


@given(n=st.sampled_from([5, 9]), k=st.sampled_from([2, 4]), seed=st.integers(0, 2**16),
       cost=st.sampled_from(similarity.SEGMENT_COSTS))
def test_reversing_the_order_mirrors_the_boundaries(n, k, seed, cost):
    s = _random_similarity(np.random.default_rng(seed), n, "gram")
    fwd = np.asarray(change_points(s, n_segments=k, cost=cost).starts)
    rev = change_points(s[::-1, ::-1].copy(), n_segments=k, cost=cost)
    # segment boundaries b (0 < b < n) map to n - b
    np.testing.assert_array_equal(sorted(n - fwd[1:]), np.asarray(rev.starts)[1:])
    np.testing.assert_allclose(float(rev.cost), float(change_points(s, n_segments=k, cost=cost).cost), rtol=1e-10, atol=1e-12)


@given(n=st.sampled_from([5, 9]), k=st.sampled_from([2, 4]), seed=st.integers(0, 2**16),
       shift=st.floats(-3, 3), scale=st.floats(0.1, 10))
def test_kernel_cost_invariant_to_shift_and_scale(n, k, seed, shift, scale):
    s = _random_similarity(np.random.default_rng(seed), n, "gram")
    a = change_points(s, n_segments=k, cost="kernel")
    b = change_points(scale * s + shift, n_segments=k, cost="kernel")
    np.testing.assert_array_equal(np.asarray(a.starts), np.asarray(b.starts))
    np.testing.assert_allclose(float(b.cost), scale * float(a.cost), rtol=1e-8, atol=1e-9)


def test_pairwise_cost_is_not_scale_invariant():
    # blocks {0,1,2} and {3}: pairwise prefers the balanced split once similarities shrink
    s = np.array([[1.0, 0.9, 0.8, 0.4], [0.9, 1.0, 0.9, 0.4], [0.8, 0.9, 1.0, 0.4], [0.4, 0.4, 0.4, 1.0]])
    assert change_points(s, n_segments=2, cost="kernel").starts.tolist() == [0, 3]
    assert change_points(s, n_segments=2, cost="pairwise").starts.tolist() == [0, 3]
    assert change_points(0.3 * s, n_segments=2, cost="pairwise").starts.tolist() == [0, 2]
    assert change_points(0.3 * s, n_segments=2, cost="kernel").starts.tolist() == [0, 3]


def test_symmetric_part_only_and_extreme_k():
    rng = np.random.default_rng(3)
    s = _random_similarity(rng, 6, "general")
    for cost in similarity.SEGMENT_COSTS:
        a, b = change_points(s, n_segments=3, cost=cost), change_points(0.5 * (s + s.T), n_segments=3, cost=cost)
        np.testing.assert_array_equal(np.asarray(a.starts), np.asarray(b.starts))
        one = change_points(s, n_segments=1, cost=cost)
        assert one.starts.tolist() == [0]
        np.testing.assert_allclose(float(one.cost), _segment_cost_ref(s, 0, 6, cost), rtol=1e-10)
        every = change_points(s, n_segments=6, cost=cost)
        assert every.starts.tolist() == list(range(6)) and float(every.cost) == 0.0
        # on a genuine similarity matrix (PSD, entries <= 1) more segments never cost more
        gram = change_points(_random_similarity(rng, 6, "gram"), n_segments=6, cost=cost)
        assert np.all(np.diff(np.asarray(gram.costs)) <= 1e-12) and float(gram.costs[0]) > 0


def test_jit_and_vmap_agree_with_single_calls():
    rng = np.random.default_rng(4)
    stack = np.stack([_random_similarity(rng, 7, "gram") for _ in range(5)])
    f = lambda s: change_points(s, n_segments=3)
    batched = jax.vmap(f)(stack)
    jitted = jax.jit(f)(stack[0])
    for i, s in enumerate(stack):
        single = f(s)
        np.testing.assert_array_equal(np.asarray(batched.starts[i]), np.asarray(single.starts))
        np.testing.assert_allclose(np.asarray(batched.costs[i]), np.asarray(single.costs), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(jitted.starts), np.asarray(f(stack[0]).starts))


def test_float32_input():
    s, starts = _planted([3, 4, 2], 1e-3, 0.2, 0)
    seg = change_points(s.astype(np.float32), n_segments=3)
    assert seg.cost.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(seg.starts), starts)


def test_bad_input_raises_clear_errors():
    s = np.eye(4)
    with pytest.raises(ValueError, match=r"square \(n, n\) matrix.*got shape \(4, 3\)"):
        change_points(s[:, :3], n_segments=2)
    with pytest.raises(ValueError, match=r"square.*got shape \(4,\)"):
        change_points(s[0], n_segments=1)
    with pytest.raises(ValueError, match=r"n_segments must be an integer in \[1, n\] = \[1, 4\].*got 5"):
        change_points(s, n_segments=5)
    assert change_points(s, n_segments=np.int64(2)).starts.shape == (2,)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="n_segments must be an integer"):
            change_points(s, n_segments=bad)
    with pytest.raises(ValueError, match="Unknown segment cost 'kernal'. Did you mean 'kernel'"):
        change_points(s, n_segments=2, cost="kernal")
    bad = s.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="similarity of shape \\(4, 4\\) contains 1 NaN"):
        change_points(bad, n_segments=2)
    with pytest.raises(ValueError, match="square"):
        segment_costs(np.ones((2, 3)))
