"""``funsim launch``: N local processes of one multi-process run, for development and CI.

Run::

    funsim launch -n 2 similarity-study --config smoke    # a funsim subcommand, on 2 processes
    funsim launch -n 3 my_grid.py --out results/grid      # your own script (it calls initialize())
    funsim launch -n 2 -m my_package.my_module --flag     # a module, like python -m

Each process gets the same command line and, in its environment,
``FUNSIM_COORDINATOR`` (``127.0.0.1:<free port>``; the coordination service
binds to the loopback address only), ``FUNSIM_NUM_PROCESSES`` and
``FUNSIM_PROCESS_ID``; the program joins the run by calling
:func:`funsim.experiments.distributed.initialize` first. Every line a process
prints (stdout and stderr) is shown prefixed with its index, ``[1] ...``.

As soon as one process exits with an error, the others are stopped (SIGTERM,
then SIGKILL after ``--grace`` seconds) and the launcher exits with that
process's status, naming it, with the last lines it printed. With
``--timeout`` every process is stopped after that many seconds (status 124).
The exit status is 0 only when every process exits with 0.

A funsim subcommand runs under ``launch`` with more than one process only when
its module says it splits its work over processes (``SUPPORTS_MULTIPROCESS =
True``); the others would run N full copies of the same work, and are refused.

On a cluster, use its own launcher instead (``srun``, ``gcloud compute tpus
tpu-vm ssh --worker=all``): see ``docs/distributed.md``.

Exit status: 0 when every process succeeded; the first failing process's status
(128 + signal number for a signal) otherwise; 124 on ``--timeout``; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from funsim.experiments import processes
from funsim.experiments.cli import SUBCOMMANDS

__all__ = [
    "LaunchResult",
    "free_port",
    "process_environ",
    "run_processes",
    "subcommand_argv",
    "add_arguments",
    "main",
]

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


def subcommand_argv(command: Sequence[str], num_processes: int) -> list[str]:
    """The command line each process runs for ``funsim launch``'s ``command``.

    ``script.py args``: that script; ``-m module args``: that module; otherwise a
    funsim subcommand, which must split its work over processes when
    ``num_processes > 1`` (its module sets ``SUPPORTS_MULTIPROCESS = True``).

    Raises:
      ValueError: no command, an unknown subcommand, ``launch`` itself, or a
        subcommand that does not split its work.
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command to launch; e.g. funsim launch -n 2 similarity-study --config smoke, "
                         "or funsim launch -n 2 my_script.py.")
    head = command[0]
    if head == "-m":
        if len(command) < 2:
            raise ValueError("-m needs a module name, e.g. funsim launch -n 2 -m my_package.my_module.")
        return [sys.executable, *command]
    if head.endswith(".py"):
        if not os.path.isfile(head):
            raise ValueError(f"{head}: no such script.")
        return [sys.executable, *command]
    if head == "launch":
        raise ValueError("funsim launch cannot launch itself; name the subcommand to run, e.g. "
                         "funsim launch -n 2 similarity-study.")
    if head not in SUBCOMMANDS:
        raise ValueError(f"unknown subcommand {head!r}; valid: {', '.join(n for n in SUBCOMMANDS if n != 'launch')}, "
                         "or a script.py, or -m module.")
    if num_processes > 1 and not getattr(importlib.import_module(SUBCOMMANDS[head].arguments),
                                         "SUPPORTS_MULTIPROCESS", False):
        raise ValueError(f"`funsim {head}` does not split its work over processes yet: {num_processes} processes "
                         f"would each run all of it. Run `funsim {head}` alone (or with -n 1).")
    return [sys.executable, "-m", "funsim.experiments.cli", *command]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--num-processes", type=int, required=True, metavar="N",
                        help="how many local processes to start")
    parser.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                        help="CPU devices per process (JAX_NUM_CPU_DEVICES; default JAX's, one)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop every process after this many seconds (exit status 124)")
    parser.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL when stopping processes (default 10)")
    parser.add_argument("--heartbeat-timeout", type=int, default=None, metavar="SECONDS",
                        help=f"seconds without a heartbeat before a process counts as dead "
                             f"(default {processes.HEARTBEAT_TIMEOUT_S})")
    parser.add_argument("-m", dest="module", default=None, metavar="MODULE",
                        help="run this Python module (like python -m) instead of a subcommand or script")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="a funsim subcommand and its arguments, or a script.py and its arguments "
                             "(after -m MODULE: the module's arguments)")


def main(args: argparse.Namespace) -> int:
    n = args.num_processes
    try:
        if n < 1:
            raise ValueError(f"-n must be at least 1, got {n}.")
        for flag, v in (("--cpu-devices", args.cpu_devices), ("--heartbeat-timeout", args.heartbeat_timeout)):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be at least 1, got {v}.")
        for flag, v in (("--timeout", args.timeout), ("--grace", args.grace)):
            if v is not None and not v > 0:
                raise ValueError(f"{flag} must be positive, got {v}.")
        rest = args.command[1:] if args.command[:1] == ["--"] else args.command
        command = ["-m", args.module, *rest] if args.module else rest
        argv = subcommand_argv(command, n)
    except ValueError as e:
        print(f"funsim launch: error: {e}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # a stopped launcher stops its processes
    try:
        res = run_processes(argv, n, cpu_devices=args.cpu_devices, heartbeat_timeout_s=args.heartbeat_timeout,
                            timeout_s=args.timeout, grace_s=args.grace, echo=sys.stdout)
    except KeyboardInterrupt:
        print("funsim launch: interrupted; stopped every process.", file=sys.stderr)
        return 130
    except _Terminated:
        print("funsim launch: terminated; stopped every process.", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not res.ok:
        print(f"funsim launch: {res.describe(tail_lines=0)}", file=sys.stderr)
    return res.exit_status


class _Terminated(Exception):
    """The launcher received SIGTERM."""


def _raise_on_sigterm(signum, frame):
    raise _Terminated()
