"""The benchmarks' timers: one place for first-call, warm and alternating-round timings.

Every function blocks on its callable's result (``jax.block_until_ready``, which passes
NumPy values and other non-JAX results through), so a time covers the work, not just
its dispatch. Wall time is ``time.perf_counter``; CPU time is ``time.process_time``
(summed over the process's threads, and less inflated than wall time by other jobs on
a shared machine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["alternating", "first_and_warm", "fmt_seconds", "median_time", "timed"]


def timed(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, float]:
    """``(result, wall seconds)`` of one call ``fn(*args, **kwargs)``."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - t0


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall seconds of ``repeats`` calls of ``fn()``."""
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def first_and_warm(fn: Callable[[], Any], repeats: int = 5) -> tuple[float, float]:
    """``(first call seconds, median of repeats warm calls)``: the first call compiles, the rest run."""
    first = timed(fn)[1]
    return first, median_time(fn, repeats)


def alternating(fns: dict[str, Callable[[], Any]], rounds: int, *,
                reduce: Callable[[list[float]], float] = min) -> dict[str, tuple[float, float]]:
    """``{name: (wall s, CPU s)}`` over ``rounds`` rounds that call every function once, in turn.

    Alternating the functions in one process exposes them to the same load; ``reduce``
    (``min`` by default, or ``statistics.median``) summarises each one's rounds.
    """
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            c0 = time.process_time()
            wall[k].append(timed(f)[1])
            cpu[k].append(time.process_time() - c0)
    return {k: (reduce(wall[k]), reduce(cpu[k])) for k in fns}


def fmt_seconds(t: float, ms_digits: int = 2) -> str:
    """``t`` seconds as ``"12.34 ms"`` below a second, else ``"1.23 s"``."""
    return f"{t * 1e3:.{ms_digits}f} ms" if t < 1 else f"{t:.2f} s"
