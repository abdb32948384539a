"""Root pytest configuration: applies to the tests and to the doctests of every package.

Each xdist worker compiles thousands of XLA programs over a run. Kept alive, their
executables pile up in the JIT caches (each holds its own memory mappings), and late in
a long run a worker has crashed inside XLA's CPU compiler (a segfault, an abort) while
compiling an unrelated small program. Dropping the caches after every module keeps a
worker's footprint that of one module; programs shared within a module stay cached.

The measure registry is process-wide state: a test that registers (or, with
``overwrite=True``, replaces) a measure would change what later tests on the same worker
see, in an order that depends on how xdist distributes them. Each test gets the registry
back as it found it.
"""

import gc
import os
import pathlib
import sys

import pytest

# JAX's persistent compilation cache, shared by the xdist workers (set before jax is imported:
# JAX reads these variables when it loads). A second run of the suite loads most of its programs
# instead of compiling them. A user's own JAX_COMPILATION_CACHE_DIR is kept;
# FUNSIM_TEST_COMPILE_CACHE=off runs without a cache. The directory is in .gitignore.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("FUNSIM_TEST_COMPILE_CACHE", "").lower() != "off":
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(pathlib.Path(__file__).resolve().parent / ".jax_cache" / "tests")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # jaxlib logs harmless warnings per cached program


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs_after_each_module():
    yield
    jax = sys.modules.get("jax")  # never import jax just for this
    if jax is not None:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True)
def _restore_the_measure_registry():
    reg = sys.modules.get("funsim.similarity.registry")
    saved = (dict(reg._REGISTRY), dict(reg._FAMILIES)) if reg is not None else None
    yield
    reg = sys.modules.get("funsim.similarity.registry")
    if reg is None:
        return
    if saved is None:  # first imported during this test: keep what the import registered
        return
    for live, old in zip((reg._REGISTRY, reg._FAMILIES), saved):
        if live.keys() != old.keys() or any(live[k] is not v for k, v in old.items()):
            live.clear()
            live.update(old)
