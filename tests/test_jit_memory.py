"""The guard against XLA:CPU's JIT code reaching the kernel's memory-mapping limit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity as sim
from funsim.similarity import _jit_memory as M
from tests._compiles import compiles


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setitem(M._state, "floor", 0)
    monkeypatch.setitem(M._state, "last", float("-inf"))
    monkeypatch.setattr(M, "_MIN_INTERVAL_S", 0.0)  # every call counts (the throttle has its own test)


def _program():
    return jax.jit(lambda v: jnp.sin(v) * 3.0 + 1.0)


def test_reads_this_process_mappings_and_the_kernel_limit():
    n, limit = M._mappings(), M._limit()
    if limit is None:
        pytest.skip("no /proc/sys/vm/max_map_count here")
    assert n is not None and 10 < n < limit  # a running Python process maps its libraries


def test_below_the_threshold_nothing_is_released(monkeypatch):
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: 499)
    f = _program()
    compiles(f, jnp.ones(3))
    assert not M.release_if_near_limit()
    assert compiles(f, jnp.ones(3))[0] == 0  # still compiled


def test_past_the_threshold_the_programs_are_released_and_recompiled_to_the_same_value(monkeypatch):
    counts = iter([600, 100, 200, 360])  # before, after the release; then two later counts
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: next(counts))
    f = _program()
    _, before = compiles(f, jnp.arange(4.0))
    assert M.release_if_near_limit()
    assert M._state["floor"] == 100
    n, after = compiles(f, jnp.arange(4.0))
    assert n == 1  # dropped by the release, compiled again
    np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
    # below max(0.5 * limit, floor + 0.25 * limit) = 500: nothing; the floor only raises the bar
    assert not M.release_if_near_limit()
    assert not M.release_if_near_limit()


def test_mappings_the_release_cannot_return_do_not_release_again_and_again(monkeypatch):
    counts = iter([700, 690, 700, 960, 100])  # the process's own mappings, not JIT code
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: next(counts))
    assert M.release_if_near_limit()
    assert not M.release_if_near_limit()  # 700 < 690 + 250
    assert M.release_if_near_limit()  # 960: grown again by a quarter of the limit


def test_without_a_readable_limit_nothing_happens(monkeypatch):
    monkeypatch.setattr(M, "_limit", lambda: None)
    monkeypatch.setattr(M, "_mappings", lambda: pytest.fail("counted without a limit"))
    assert not M.release_if_near_limit()


def test_compare_grid_releases_during_its_pairwise_fallbacks_and_its_values_do_not_change(monkeypatch):
    """A grid whose rank-deficient layers send one measure's cells to the pairwise call, with the
    limit made tiny: the grid releases the compiled programs on its way, and every value is the same."""
    from funsim.similarity import grid as G

    r = np.random.default_rng(3)
    x = r.normal(size=(40, 4))
    a = [x @ r.normal(size=(4, w)) for w in (6, 7, 9)]  # rank 4: the held-out orthogonal map is not unique
    b = [r.normal(size=(40, w)) for w in (5, 8)]
    names = ["cka/linear", "stitch/orthogonal", "svcca"]
    want = sim.compare_grid(a, b, measures=names, reverse=True)
    released = []
    monkeypatch.setattr(G, "_RELEASE_EVERY", 2)
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: 900)
    clear = jax.clear_caches
    monkeypatch.setattr(M.jax, "clear_caches", lambda: released.append(1) or clear())
    got = sim.compare_grid(a, b, measures=names, reverse=True)
    assert len(released) >= 1
    for k in names:
        np.testing.assert_array_equal(np.asarray(got.tables[k]), np.asarray(want.tables[k]), err_msg=k)
        np.testing.assert_array_equal(np.asarray(got.reverse[k]), np.asarray(want.reverse[k]), err_msg=k)
    assert got.undefined == want.undefined and got.reverse_undefined == want.reverse_undefined


def test_pairwise_fallbacks_run_one_pair_of_widths_at_a_time(monkeypatch):
    """The fallback cells are visited grouped by their pair of widths, so a release between two groups
    never drops a program that is needed again (each pair of widths compiles once)."""
    from funsim.similarity import grid as G

    r = np.random.default_rng(5)
    x = r.normal(size=(40, 3))
    widths = (6, 4, 6, 5, 4)
    a = [x @ r.normal(size=(3, w)) for w in widths]  # rank 3 each: every cell goes to the pairwise call
    b = [r.normal(size=(40, w)) for w in (7, 5, 7)]
    seen = []
    real = G._pairwise_cell
    monkeypatch.setattr(G, "_pairwise_cell", lambda m, x, y, dt: seen.append((x.shape[1], y.shape[1])) or real(m, x, y, dt))
    sim.compare_grid(a, b, measures=["stitch/orthogonal"], reverse=True)
    assert len(seen) == 2 * len(a) * len(b)
    runs = [k for k in range(len(seen)) if k == 0 or seen[k] != seen[k - 1]]
    assert len(runs) == len(set(seen[: len(seen) // 2])) + len(set(seen[len(seen) // 2:]))


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, True, "0.5", None])
def test_a_bad_fraction_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"fraction must be a number in \(0, 1\]"):
        sim.release_if_near_limit(bad)


def test_counts_at_most_once_per_interval(monkeypatch):
    counted = []
    monkeypatch.setattr(M, "_MIN_INTERVAL_S", 60.0)
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: counted.append(1) or 100)
    assert not M.release_if_near_limit()
    assert not M.release_if_near_limit()  # within the interval: not counted
    assert len(counted) == 1
    monkeypatch.setitem(M._state, "last", M._state["last"] - 61.0)
    assert not M.release_if_near_limit()
    assert len(counted) == 2
