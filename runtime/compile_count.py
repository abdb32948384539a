"""Counting XLA compilations through ``jax.monitoring`` events (not private cache sizes).

``with CompileCounter() as c: ...`` counts the programs handed to XLA's backend while
the block runs (``c.count``), their names (``c.names``, e.g. ``"jit_fit_loop"``), the
seconds the backend spent on them (``c.seconds``) and the programs lowered to MLIR
(``c.lowered``). The tests use it to pin how many programs a call compiles; the
benchmarks to report the compilations beside the times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["BACKEND_COMPILE_EVENT", "LOWERING_EVENT", "CompileCounter", "compiles"]

# Recorded once per program handed to the backend, including persistent-cache hits
# (jax's compile_or_get_cached runs inside this timer), so it counts every program
# that missed the in-memory caches.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Recorded once per program lowered from its jaxpr to an MLIR module.
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


class CompileCounter:
    """Counts XLA backend compilations while active (``with CompileCounter() as c: ...``).

    Attributes:
      count: programs compiled by the backend (or loaded from the persistent cache).
      names: their names, in order.
      seconds: the backend's compile time summed over them.
      lowered: programs lowered to MLIR (about ``count``: a program is lowered before it compiles).
    """

    EVENT = BACKEND_COMPILE_EVENT

    def __init__(self):
        self.count = 0
        self.names: list[str] = []
        self.seconds = 0.0
        self.lowered = 0

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == self.EVENT:
            self.count += 1
            self.seconds += duration
            self.names.append(str(kwargs.get("fun_name", "")))
        elif event == LOWERING_EVENT:
            self.lowered += 1

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> bool:
        jax.monitoring.unregister_event_duration_listener(self._listen)
        return False


def compiles(fn: Callable[..., Any], *args, **kwargs) -> tuple[int, Any]:
    """``(number of compilations, result)`` of one call ``fn(*args, **kwargs)`` (blocked until ready)."""
    with CompileCounter() as c:
        out = jax.block_until_ready(fn(*args, **kwargs))
    return c.count, out
