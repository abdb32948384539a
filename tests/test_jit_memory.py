"""The drivers' guard against XLA:CPU's JIT code reaching the kernel's memory-mapping limit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim.experiments import jit_memory as M
from funsim.runtime.compile_count import compiles


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


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, True, "0.5", None])
def test_a_bad_fraction_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"fraction must be a number in \(0, 1\]"):
        M.release_if_near_limit(bad)


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


def test_the_library_never_clears_caches_or_reads_proc():
    """The guard lives with the drivers: no module of funsim.similarity clears JAX's caches or reads /proc."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "similarity"
    found = [f"{p.relative_to(root)}: {needle}" for p in sorted(root.rglob("*.py"))
             for needle in ("clear_caches", "/proc") if needle in p.read_text()]
    assert not found, found
