"""``funsim launch``, ``runtime.distributed`` and the multi-process test harness.

The launcher tests run small scripts that do not import JAX (fast); the tests
that join a real JAX multi-process run are marked slow, except in
tests/test_multiprocess_grid.py's first test, which stays in ``make test``.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from funsim.experiments import cli
from funsim.runtime import distributed, launcher
from tests._multiprocess import MultiprocessError, launch_processes, run_in_processes
from tests.conftest import TOL

# ----------------------------------------------------------------------------- distributed.setup_from_env

FULL = {"FUNSIM_COORDINATOR": "127.0.0.1:4000", "FUNSIM_NUM_PROCESSES": "3", "FUNSIM_PROCESS_ID": "2"}


def test_setup_single_process_by_default():
    s = distributed.setup_from_env({})
    assert s.mode == "single" and s.coordinator is None
    assert (s.heartbeat_timeout_s, s.init_timeout_s, s.shutdown_timeout_s) == (
        distributed.HEARTBEAT_TIMEOUT_S, distributed.INIT_TIMEOUT_S, distributed.SHUTDOWN_TIMEOUT_S)
    assert distributed.setup_from_env({"FUNSIM_DISTRIBUTED": "0"}).mode == "single"


def test_setup_explicit_binds_where_it_connects_unless_told():
    s = distributed.setup_from_env(FULL)
    assert (s.mode, s.coordinator, s.bind_address, s.num_processes, s.process_id) == (
        "explicit", "127.0.0.1:4000", "127.0.0.1:4000", 3, 2)
    s = distributed.setup_from_env({**FULL, "FUNSIM_COORDINATOR_BIND": "[::]:4000", "FUNSIM_HEARTBEAT_TIMEOUT": "7"})
    assert s.bind_address == "[::]:4000" and s.heartbeat_timeout_s == 7


def test_setup_cluster():
    for v in ("1", "true", "YES"):
        assert distributed.setup_from_env({"FUNSIM_DISTRIBUTED": v}).mode == "cluster"


@pytest.mark.parametrize("env, match", [
    ({"FUNSIM_COORDINATOR": "127.0.0.1:4000"}, "FUNSIM_NUM_PROCESSES, FUNSIM_PROCESS_ID not"),
    ({**FULL, "FUNSIM_COORDINATOR": "localhost"}, "must be host:port"),
    ({**FULL, "FUNSIM_PROCESS_ID": "3"}, "FUNSIM_PROCESS_ID=3 must be below FUNSIM_NUM_PROCESSES=3"),
    ({**FULL, "FUNSIM_NUM_PROCESSES": "two"}, "FUNSIM_NUM_PROCESSES='two' is not an integer"),
    ({**FULL, "FUNSIM_NUM_PROCESSES": "0"}, "FUNSIM_NUM_PROCESSES=0 must be >= 1"),
    ({**FULL, "FUNSIM_DISTRIBUTED": "1"}, "not both"),
    ({"FUNSIM_DISTRIBUTED": "slurm"}, "use 1"),
    ({"FUNSIM_HEARTBEAT_TIMEOUT": "0"}, "FUNSIM_HEARTBEAT_TIMEOUT=0 must be >= 1"),
])
def test_setup_refuses_inconsistent_environments(env, match):
    with pytest.raises(ValueError, match=match):
        distributed.setup_from_env(env)


def test_single_process_helpers(monkeypatch):
    for k in ("FUNSIM_PROCESS_ID", "FUNSIM_NUM_PROCESSES", "FUNSIM_COORDINATOR", "FUNSIM_DISTRIBUTED"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.initialize().mode == "single"  # does nothing, touches no JAX state
    assert not distributed.is_initialized()
    assert (distributed.process_index(), distributed.process_count(), distributed.is_main_process()) == (0, 1, True)
    assert distributed.log_prefix() == "" and distributed.show_progress() and not distributed.show_progress(False)
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(np.asarray(distributed.rows_across_processes(x)), x)


def test_helpers_read_the_launchers_variables_before_initialize(monkeypatch):
    monkeypatch.setenv("FUNSIM_PROCESS_ID", "1")
    monkeypatch.setenv("FUNSIM_NUM_PROCESSES", "2")
    assert (distributed.process_index(), distributed.process_count()) == (1, 2)
    assert not distributed.is_main_process() and not distributed.show_progress(True)
    assert distributed.log_prefix() == "[p1/2] "


# ----------------------------------------------------------------------------- funsim launch (no JAX in the children)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    i = int(os.environ["FUNSIM_PROCESS_ID"])
    print(f"hello from {i} of {os.environ['FUNSIM_NUM_PROCESSES']} at {os.environ['FUNSIM_COORDINATOR']}")
    print(f"stderr of {i}", file=sys.stderr)
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "fail" and i == 1:
        time.sleep(0.5)
        sys.exit(3)
    if mode in ("fail", "sleep"):
        time.sleep(300)
""")


@pytest.fixture
def script(tmp_path) -> str:
    p = tmp_path / "job.py"
    p.write_text(SCRIPT)
    return str(p)


def _launch(capsys, *argv):
    rc = cli.main(["launch", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_launch_prefixes_every_line_and_sets_the_environment(capsys, script):
    rc, out, err = _launch(capsys, "-n", "3", script)
    assert rc == 0, err
    lines = out.splitlines()
    for i in range(3):
        hello = [ln for ln in lines if ln.startswith(f"[{i}] hello from {i} of 3 at 127.0.0.1:")]
        assert len(hello) == 1, out
        assert f"[{i}] stderr of {i}" in lines
    assert len({ln.rsplit(":", 1)[1] for ln in lines if "hello" in ln}) == 1  # one coordinator port for all


def test_launch_fails_fast_and_propagates_the_status(capsys, script):
    t0 = time.monotonic()
    rc, out, err = _launch(capsys, "-n", "3", "--grace", "5", script, "fail")
    elapsed = time.monotonic() - t0
    assert rc == 3
    assert elapsed < 60, f"the sleeping processes were not stopped promptly ({elapsed:.0f} s)"
    assert "process 1 of 3 exited with status 3; stopped processes [0, 2]" in err
    assert "[0] signal SIGTERM" in err and "[2] signal SIGTERM" in err


def test_launch_timeout(capsys, script):
    rc, out, err = _launch(capsys, "-n", "2", "--timeout", "3", "--grace", "2", script, "sleep")
    assert rc == launcher.TIMEOUT_STATUS
    assert "timed out" in err and "stopped processes [0, 1]" in err


@pytest.mark.parametrize("argv, match", [
    (["-n", "2"], "no command to launch"),
    (["-n", "0", "quickstart"], "-n must be at least 1"),
    (["-n", "2", "launch"], "cannot launch itself"),
    (["-n", "2", "quickstrat"], "unknown subcommand 'quickstrat'"),
    (["-n", "2", "grokking", "--config", "smoke"], "`funsim grokking` does not split its work over processes yet"),
    (["-n", "2", "missing_script.py"], "missing_script.py: no such script"),
    (["-n", "2", "--timeout", "0", "x.py"], "--timeout must be positive"),
])
def test_launch_refuses_bad_arguments(capsys, argv, match):
    rc, out, err = _launch(capsys, *argv)
    assert rc == 2 and match in err, err


def test_launch_runs_a_module(capsys, tmp_path):
    rc, out, err = _launch(capsys, "-n", "2", "-m", "json.tool", "--", "--help")
    assert rc == 0, err
    assert any(ln.startswith("[0] usage:") for ln in out.splitlines())
    assert any(ln.startswith("[1] usage:") for ln in out.splitlines())


def test_run_processes_leaves_nothing_running_when_the_launcher_fails(script):
    """An exception in the launcher (here from on_start; Ctrl-C takes the same path) stops every process."""
    started = []

    def boom(procs):
        started.extend(procs)
        time.sleep(0.5)
        raise RuntimeError("launcher interrupted")

    with pytest.raises(RuntimeError, match="launcher interrupted"):
        launcher.run_processes([sys.executable, script, "sleep"], 2, on_start=boom, grace_s=2)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


# ----------------------------------------------------------------------------- real JAX processes


def failing_worker() -> dict:
    import jax

    if jax.process_index() == 1:
        raise RuntimeError("worker 1 fails on purpose")
    import time as t

    t.sleep(300)
    return {}


@pytest.mark.slow
def test_harness_reports_a_failing_process_and_stops_the_others(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(MultiprocessError) as e:
        run_in_processes(failing_worker, 2, workdir=tmp_path, timeout_s=300)
    msg = str(e.value)
    assert time.monotonic() - t0 < 120  # not JAX's 300 s shutdown barrier
    assert "failing_worker on 2 processes: process 1 of 2 exited with status 1; stopped processes [0]" in msg
    assert "RuntimeError: worker 1 fails on purpose" in msg  # the failing process's last lines
    assert "failed with RuntimeError; ending it now" in msg


def index_worker(scale: float) -> dict:
    import jax
    from jax.experimental import multihost_utils

    every = multihost_utils.process_allgather(np.array([jax.process_index()]))
    return {"every": np.asarray(every).ravel() * scale, "devices": np.array(len(jax.devices()))}


@pytest.mark.slow
def test_harness_runs_three_processes_with_two_devices_each(tmp_path):
    results = run_in_processes(index_worker, 3, 10.0, cpu_devices=2, workdir=tmp_path, timeout_s=300)
    for r in results:
        np.testing.assert_array_equal(r["every"], [0.0, 10.0, 20.0])
        assert int(r["devices"]) == 6


def waiting_worker(ready_dir: str, *, victim: int, in_collective: bool) -> dict:
    """Signal readiness, then wait: the victim to be killed; the other in a collective or computing on its own."""
    import os
    import time as t

    import jax
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("started")  # both connected
    Path(ready_dir, f"ready_{jax.process_index()}").touch()
    if jax.process_index() == victim:
        t.sleep(300)
    elif in_collective:
        multihost_utils.sync_global_devices("never reached by the killed process")
    else:
        end = t.time() + 300
        while t.time() < end:
            sum(range(10000))  # busy, no JAX call
    os.write(2, b"waiting_worker: still alive\n")
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1], ids=["coordinator-dies", "worker-dies"])
@pytest.mark.parametrize("in_collective", [False, True], ids=["computing", "in-collective"])
def test_a_dead_process_makes_the_other_fail_fast(tmp_path, victim, in_collective):
    """SIGKILL one of two processes: the other exits with an error within the heartbeat bound, saying why.

    The launcher's own fail-fast is off here (``stop_on_failure=False``): the
    survivor must stop by itself, through JAX's coordination service.
    """
    heartbeat, bound = 5, 90.0  # bound: the heartbeat timeout plus slack for this loaded machine
    ready = tmp_path / "ready"
    ready.mkdir()
    killed = {}

    def killer(procs):
        def run():
            end = time.monotonic() + 240
            while not all((ready / f"ready_{i}").exists() for i in range(2)):
                if time.monotonic() > end or any(p.poll() is not None for p in procs):
                    return
                time.sleep(0.1)
            procs[victim].send_signal(signal.SIGKILL)
            killed["t"] = time.monotonic()
            try:
                procs[1 - victim].wait(timeout=bound + 60)
            except Exception:
                return
            killed["survivor_exit"] = time.monotonic()

        killed["thread"] = threading.Thread(target=run, daemon=True)
        killed["thread"].start()

    res, _ = launch_processes(waiting_worker, 2, str(ready), victim=victim, in_collective=in_collective,
                              workdir=tmp_path,
                              heartbeat_timeout_s=heartbeat, stop_on_failure=False, on_start=killer,
                              timeout_s=400)
    killed["thread"].join(timeout=bound + 60)
    assert "t" in killed, res.describe()
    assert res.returncodes[victim] == -signal.SIGKILL
    survivor = 1 - victim
    assert not res.timed_out, res.describe()
    assert res.returncodes[survivor] != 0, res.describe()
    took = killed["survivor_exit"] - killed["t"]
    print(f"survivor stopped {took:.1f} s after the kill, status {res.returncodes[survivor]}")
    assert took < bound, f"the survivor took {took:.0f} s to stop"
    tail = "".join(res.tails[survivor])
    assert "still alive" not in tail
    assert any(s in tail for s in ("another task died", "heartbeat", "Connection reset by peer",
                                   "Connection closed by peer")), tail[-3000:]


# ----------------------------------------------------------------------------- docs/distributed.md

DOC = Path(__file__).resolve().parent.parent / "docs" / "distributed.md"


def _fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(first code line, language, code)`` of every fenced block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, j = lines[i][3:].strip(), i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((i + 2, lang, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


def test_docs_code_blocks_are_bash_or_python():
    blocks = _fenced_blocks(DOC.read_text())
    assert [lang for _, lang, _ in blocks].count("python") == 2
    for line, lang, _ in blocks:
        assert lang in ("bash", "python"), f"docs/distributed.md:{line}: a ```{lang} block (bash or python only)"


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1])
def test_docs_python_blocks_give_one_process_tables_on_two(tmp_path, capsys, index):
    import os
    import subprocess

    line, _, code = [b for b in _fenced_blocks(DOC.read_text()) if b[1] == "python"][index]
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUNSIM_")}
    one = subprocess.run([sys.executable, str(script), str(tmp_path / "one.npz")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, f"docs/distributed.md:{line} in one process:\n{one.stderr[-3000:]}"
    rc, out, err = _launch(capsys, "-n", "2", "--timeout", "600", str(script), str(tmp_path / "two.npz"))
    assert rc == 0, f"docs/distributed.md:{line} on two processes:\n{out[-3000:]}\n{err[-2000:]}"
    if index == 0:
        assert "[0] [p0/2] 2 processes, 2 devices" in out.splitlines()
        assert not any(ln.startswith("[1] [p1/2]") for ln in out.splitlines())  # only process 0 prints
    with np.load(tmp_path / "one.npz") as a, np.load(tmp_path / "two.npz") as b:
        assert sorted(a.files) == sorted(b.files) and a.files
        for k in a.files:  # float32 here: the scripts do not enable x64
            assert b[k].dtype == a[k].dtype
            np.testing.assert_allclose(b[k], a[k], rtol=0, atol=TOL[a[k].dtype], err_msg=k)
