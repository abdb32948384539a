"""A driver's guard that keeps a process's compiled JIT code inside the kernel's memory-mapping limit.

XLA:CPU keeps the machine code of every compiled program in its own memory mappings
(about 55 per program, measured on JAX 0.9). Linux caps the mappings of a process at
``vm.max_map_count`` (65,530 by default). A long driver that compiles a few thousand programs
(the similarity study's stitching stage over many targets and widths, in one process) could
reach it; LLVM then fails with "Cannot allocate memory" and the process dies with a segmentation
fault, with RAM to spare. The library itself compiles a handful of programs per call and never
clears caches; this guard belongs to the drivers in ``funsim.experiments``.

:func:`release_if_near_limit` counts the mappings and, past a fraction of the limit,
drops JAX's compiled programs (``jax.clear_caches()``), which returns them. Programs
needed again are compiled again: slower, never a different number. Where the count is
not readable (not Linux) it does nothing.
"""

from __future__ import annotations

import functools
import logging
import time

import jax

__all__ = ["release_if_near_limit"]

_log = logging.getLogger("funsim")
_FRACTION = 0.5  # of vm.max_map_count: leaves room for one more large batch of compilations
# Counting reads /proc/self/maps (about 13 ms at 30,000 mappings), so it runs at most this often: a
# second of compilations adds a few hundred mappings, far below the half of the limit kept free.
_MIN_INTERVAL_S = 1.0
# floor: mappings left after the last release (what clear_caches cannot return); last: time of the last count
_state = {"floor": 0, "last": float("-inf")}


@functools.lru_cache(maxsize=None)
def _limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _mappings() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def release_if_near_limit(fraction: float = _FRACTION) -> bool:
    """Drop JAX's compiled programs if this process's memory mappings are past ``fraction``
    of ``vm.max_map_count`` (and past what the last release left). Returns whether it did.
    Counts at most once a second; calls in between return ``False`` at once.

    Raises:
      ValueError: ``fraction`` not a number in (0, 1].
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be a number in (0, 1] (of vm.max_map_count), got {fraction!r}.")
    limit = _limit()
    now = time.monotonic()
    if not limit or now - _state["last"] < _MIN_INTERVAL_S:
        return False
    _state["last"] = now
    n = _mappings()
    threshold = max(fraction * limit, _state["floor"] + 0.25 * limit)
    if n is None or n < threshold:
        return False
    jax.clear_caches()
    after = _mappings() or 0
    _state["floor"] = after
    _log.info("released JAX's compiled programs: %d of %d memory mappings in use, %d after "
              "(vm.max_map_count; see funsim.experiments.jit_memory)", n, limit, after)
    return True
