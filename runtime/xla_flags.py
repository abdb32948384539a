"""The one place funsim sets an XLA flag: compile fast for small runs.

At the size of a smoke run (``funsim quickstart --tiny``) or of the test suite, most of
the time goes to XLA compiling many small programs on the CPU, not to running them, and
LLVM's backend optimisation passes are most of each compile. :func:`compile_fast` turns
them off (``--xla_backend_optimization_level=0``) for this process, which cuts the
compile time by about a quarter and leaves the arithmetic unchanged within every
tolerance the tests use. Full-size runs keep XLA's default pipeline.

The flag is read when JAX starts its backend (at the first computation, not at
``import jax``), so it must be set before then; later it is not set at all, and a level
the user already chose in ``XLA_FLAGS`` always wins.
"""

from __future__ import annotations

import os
import sys

__all__ = ["SMOKE_XLA_FLAG", "compile_fast"]

#: XLA's flag for small runs: no LLVM backend optimisation.
SMOKE_XLA_FLAG = "--xla_backend_optimization_level=0"


def _backend_started() -> bool:
    """Whether JAX's backend has started; False when this JAX cannot say (then setting the flag is harmless)."""
    if "jax" not in sys.modules:
        return False
    try:  # a private helper of JAX, the only way to ask; its absence is handled
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        return False
    return bool(backends_are_initialized())


def compile_fast() -> bool:
    """Turn XLA's backend optimisation off for this process, if its backend has not started yet.

    Returns:
      Whether the flag is in effect: True when this call set it (or the user's
      ``XLA_FLAGS`` already holds exactly this level), False when the user chose another
      level or the backend had started.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" in flags:
        return SMOKE_XLA_FLAG in flags
    if _backend_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {SMOKE_XLA_FLAG}".strip()
    return True
