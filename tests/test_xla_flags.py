"""funsim's one XLA flag (runtime.xla_flags): set only before the backend starts, never over the user's."""

import os
import subprocess
import sys

import jax

from funsim.runtime import xla_flags


def test_not_set_once_the_backend_runs_and_never_over_the_users_level(monkeypatch):
    jax.numpy.zeros(1).block_until_ready()  # the backend runs: the flag would be ignored, so it is not set
    monkeypatch.setenv("XLA_FLAGS", "")
    assert xla_flags.compile_fast() is False
    assert os.environ["XLA_FLAGS"] == ""
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
    assert xla_flags.compile_fast() is False  # the user's choice wins
    assert os.environ["XLA_FLAGS"] == "--xla_backend_optimization_level=2"
    monkeypatch.setenv("XLA_FLAGS", xla_flags.SMOKE_XLA_FLAG)
    assert xla_flags.compile_fast() is True  # already in effect


def test_a_fresh_process_gets_it_appended_to_the_users_other_flags():
    """As `funsim quickstart --tiny` is: set before the backend starts (jax not even imported yet)."""
    code = ("import os; from funsim.runtime import xla_flags; ok = xla_flags.compile_fast(); "
            "import jax; jax.numpy.zeros(1).block_until_ready(); print(ok, os.environ['XLA_FLAGS'])")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "--xla_force_host_platform_device_count=1", xla_flags.SMOKE_XLA_FLAG]


def test_the_quickstart_smoke_run_uses_it():
    import inspect

    from funsim.experiments import quickstart

    assert "compile_fast()" in inspect.getsource(quickstart.main)
