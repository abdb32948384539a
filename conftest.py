"""Root pytest configuration: applies to the tests and to the doctests of every package.

Each xdist worker compiles thousands of XLA programs over a run. Kept alive, their
executables pile up in the JIT caches (each holds its own memory mappings), and late in
a long run a worker has crashed inside XLA's CPU compiler (a segfault, an abort) while
compiling an unrelated small program. Dropping the caches after every module keeps a
worker's footprint that of one module; programs shared within a module stay cached.
"""

import gc
import sys

import pytest


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs_after_each_module():
    yield
    jax = sys.modules.get("jax")  # never import jax just for this
    if jax is not None:
        jax.clear_caches()
        gc.collect()
