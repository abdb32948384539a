"""Counting XLA compilations through ``jax.monitoring`` (not private cache sizes)."""

from __future__ import annotations

import jax

# Recorded once per program handed to the backend, including persistent-cache hits
# (jax's compile_or_get_cached runs inside this timer), so it counts every program
# that missed the in-memory caches.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compilations while active (``with CompileCounter() as c: ...``)."""

    EVENT = BACKEND_COMPILE_EVENT

    def __init__(self):
        self.count = 0
        self.names: list[str] = []  # the compiled programs' names, e.g. "jit_fit_loop"

    def _listen(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.count += 1
            self.names.append(str(kwargs.get("fun_name", "")))

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)
        return False


def compiles(fn, *args, **kwargs) -> tuple[int, object]:
    """``(number of compilations, result)`` of one call ``fn(*args, **kwargs)`` (blocked until ready)."""
    with CompileCounter() as c:
        out = jax.block_until_ready(fn(*args, **kwargs))
    return c.count, out
