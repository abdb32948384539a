"""N local processes of one multi-process run: the launcher behind ``funsim launch``.

:func:`run_processes` starts the processes of a command line, each with the
environment :func:`process_environ` gives it (``FUNSIM_COORDINATOR`` on a free loopback
port, ``FUNSIM_NUM_PROCESSES``, ``FUNSIM_PROCESS_ID``), echoes every line they print
prefixed with their index, stops the others as soon as one fails (SIGTERM, then SIGKILL
after a grace period), and returns a :class:`LaunchResult`. The program joins the run
by calling :func:`funsim.runtime.distributed.initialize` first. It imports no JAX.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from funsim.runtime import processes

__all__ = ["LOOPBACK", "TIMEOUT_STATUS", "LaunchResult", "free_port", "process_environ", "run_processes",
           "Terminated", "raise_on_sigterm"]

LOOPBACK = "127.0.0.1"
TIMEOUT_STATUS = 124


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it; another program may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_environ(
    process_id: int,
    num_processes: int,
    coordinator: str,
    *,
    base: Mapping[str, str] | None = None,
    cpu_devices: int | None = None,
    heartbeat_timeout_s: int | None = None,
) -> dict[str, str]:
    """The environment of process ``process_id`` of a local run (``base`` defaults to ``os.environ``).

    Sets the ``FUNSIM_*`` variables read by :func:`distributed.initialize`
    (the coordination service binds to ``coordinator`` itself, i.e. the loopback
    address), unbuffered Python output, and with ``cpu_devices`` the number of
    CPU devices per process (``JAX_NUM_CPU_DEVICES``).

    Examples:
      >>> env = process_environ(1, 2, "127.0.0.1:4000", base={})
      >>> env["FUNSIM_PROCESS_ID"], env["FUNSIM_NUM_PROCESSES"], env["FUNSIM_COORDINATOR_BIND"]
      ('1', '2', '127.0.0.1:4000')
    """
    env = dict(os.environ if base is None else base)
    env.pop(processes.ENV_CLUSTER, None)  # the coordinator variables decide, not cluster detection
    env.update({
        processes.ENV_COORDINATOR: coordinator,
        processes.ENV_BIND_ADDRESS: coordinator,
        processes.ENV_NUM_PROCESSES: str(num_processes),
        processes.ENV_PROCESS_ID: str(process_id),
        "PYTHONUNBUFFERED": "1",
    })
    if cpu_devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(cpu_devices)
    if heartbeat_timeout_s is not None:
        env[processes.ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout_s)
    return env


@dataclasses.dataclass
class LaunchResult:
    """What happened to the processes of one :func:`run_processes` call.

    Attributes:
      returncodes: each process's exit status (negative: killed by that signal).
      tails: each process's last output lines (stdout and stderr together).
      failed: the index of the first process that exited with an error, or None.
      stopped: the processes the launcher stopped (after a failure or the timeout).
      timed_out: whether ``timeout_s`` ran out.
      seconds: wall time from the first start to the last exit.
    """

    returncodes: list[int]
    tails: list[list[str]]
    failed: int | None
    stopped: list[int]
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    @property
    def exit_status(self) -> int:
        """0, :data:`TIMEOUT_STATUS`, or the first failing process's status (128 + signal for a signal)."""
        if self.timed_out:
            return TIMEOUT_STATUS
        if self.failed is None:
            return 0
        rc = self.returncodes[self.failed]
        return 128 - rc if rc < 0 else rc

    def describe(self, *, tail_lines: int = 20) -> str:
        """A multi-line account: who failed or timed out, every status, and the failing processes' last lines.

        ``tail_lines=0`` leaves the lines out (e.g. when they were shown as they came).
        """
        n = len(self.returncodes)
        if self.ok:
            return f"all {n} processes exited with status 0 in {self.seconds:.1f} s."
        lines = []
        if self.timed_out:
            lines.append(f"the run timed out after {self.seconds:.1f} s; stopped processes {self.stopped}.")
        if self.failed is not None:
            lines.append(f"process {self.failed} of {n} exited with {_status_words(self.returncodes[self.failed])}"
                         + (f"; stopped processes {self.stopped}." if self.stopped else "."))
        lines.append("exit statuses: " + ", ".join(f"[{i}] {_status_words(rc)}"
                                                   for i, rc in enumerate(self.returncodes)))
        show = [i for i, rc in enumerate(self.returncodes) if rc != 0 and i not in self.stopped]
        show += [i for i in self.stopped if i not in show] if self.timed_out else []
        for i in (show or range(n)) if tail_lines > 0 else ():
            tail = self.tails[i][-tail_lines:]
            lines.append(f"--- last {len(tail)} lines of process {i} ---")
            lines.extend(line.rstrip("\n") for line in tail)
        return "\n".join(lines)


def _status_words(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def _stop(procs: Sequence[subprocess.Popen], which: Sequence[int], grace_s: float) -> None:
    """SIGTERM the process groups of ``which``, then SIGKILL whatever still runs after ``grace_s``."""
    for i in which:
        _signal_group(procs[i], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for i in which:
        try:
            procs[i].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for i in which:
        if procs[i].poll() is None:
            _signal_group(procs[i], signal.SIGKILL)
    for i in which:
        procs[i].wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # each process leads its own group (start_new_session)
    except ProcessLookupError:
        pass


def run_processes(
    argv: Sequence[str],
    num_processes: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    cpu_devices: int | None = None,
    heartbeat_timeout_s: int | None = None,
    timeout_s: float | None = None,
    grace_s: float = 10.0,
    stop_on_failure: bool = True,
    echo: TextIO | None = None,
    tail_lines: int = 200,
    on_start: Callable[[list[subprocess.Popen]], None] | None = None,
) -> LaunchResult:
    """Run ``argv`` as ``num_processes`` local processes of one run and wait for them.

    Every process gets :func:`process_environ` (a fresh loopback port for the
    coordinator). It never hangs: with ``stop_on_failure`` the first process that
    exits with an error makes the launcher stop the others; with ``timeout_s`` all
    are stopped when it runs out. Each process runs in its own process group, so
    stopping it also stops what it started.

    Args:
      argv: the command line of every process, e.g. ``[sys.executable, "script.py"]``.
      num_processes: how many processes (>= 1).
      env: the base environment (default ``os.environ``).
      cwd: the processes' working directory (default: this one's).
      cpu_devices: CPU devices per process (default: JAX's default, one).
      heartbeat_timeout_s: seconds without a heartbeat before the others count a process as dead.
      timeout_s: stop every process after this many seconds (None: no limit).
      grace_s: seconds between SIGTERM and SIGKILL when stopping a process.
      stop_on_failure: stop the others as soon as one exits with an error.
      echo: where to print each output line, prefixed with ``[i] `` (None: nowhere).
      tail_lines: how many last lines of each process to keep in the result.
      on_start: called with the started ``Popen`` objects (e.g. to signal one of them).

    Returns:
      A :class:`LaunchResult`.
    """
    if not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive int, got {num_processes!r}.")
    if not argv:
        raise ValueError("argv is empty; pass the command every process runs, e.g. [sys.executable, 'script.py'].")
    coordinator = f"{LOOPBACK}:{free_port()}"
    tails = [collections.deque(maxlen=tail_lines) for _ in range(num_processes)]
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    readers = []
    t0 = time.monotonic()

    echoing = [echo is not None]

    def pump(i: int, stream) -> None:
        # Keep reading until the process closes its output, so that it never blocks on a full pipe.
        for line in stream:
            tails[i].append(line)
            if echoing[0]:
                with lock:
                    try:
                        echo.write(f"[{i}] {line if line.endswith(chr(10)) else line + chr(10)}")
                        echo.flush()
                    except (OSError, ValueError):  # e.g. `funsim launch ... | head`: stop echoing, keep draining
                        echoing[0] = False
        stream.close()

    failed, stopped, timed_out = None, [], False
    try:
        for i in range(num_processes):
            p = subprocess.Popen(
                list(argv), env=process_environ(i, num_processes, coordinator, base=env, cpu_devices=cpu_devices,
                                                heartbeat_timeout_s=heartbeat_timeout_s),
                cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", bufsize=1, start_new_session=True)
            procs.append(p)
            th = threading.Thread(target=pump, args=(i, p.stdout), daemon=True)
            th.start()
            readers.append(th)
        if on_start is not None:
            on_start(procs)
        while True:
            codes = [p.poll() for p in procs]
            if failed is None:
                bad = [i for i, rc in enumerate(codes) if rc not in (None, 0)]
                if bad:
                    failed = bad[0]
                    if stop_on_failure:
                        stopped = [i for i, rc in enumerate(codes) if rc is None]
                        _stop(procs, stopped, grace_s)
            if all(p.poll() is not None for p in procs):
                break
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                timed_out = True
                stopped = sorted(set(stopped) | {i for i, p in enumerate(procs) if p.poll() is None})
                _stop(procs, [i for i in stopped if procs[i].poll() is None], grace_s)
                break
            time.sleep(0.05)
    except BaseException:  # KeyboardInterrupt, or a failure to start: leave nothing running
        _stop(procs, [i for i, p in enumerate(procs) if p.poll() is None], grace_s)
        raise
    finally:
        for th in readers:
            th.join(timeout=5.0)
    codes = [p.wait() for p in procs]
    if failed is None:  # a process stopped by the timeout does not count as the failure
        bad = [i for i, rc in enumerate(codes) if rc != 0 and i not in stopped]
        failed = bad[0] if bad else None
    return LaunchResult(codes, [list(t) for t in tails], failed, stopped, timed_out, time.monotonic() - t0)


# ----------------------------------------------------------------------------- command line


class Terminated(Exception):
    """The launcher received SIGTERM."""


def raise_on_sigterm(signum, frame):
    raise Terminated()
