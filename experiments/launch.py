"""``funsim launch``: N local processes of one multi-process run, for development and CI.

The command line over :mod:`funsim.runtime.launcher`, which starts and watches the processes.

Run::

    funsim launch -n 2 similarity-study --config smoke    # a funsim subcommand, on 2 processes
    funsim launch -n 3 my_grid.py --out results/grid      # your own script (it calls initialize())
    funsim launch -n 2 -m my_package.my_module --flag     # a module, like python -m

Each process gets the same command line and, in its environment,
``FUNSIM_COORDINATOR`` (``127.0.0.1:<free port>``; the coordination service
binds to the loopback address only), ``FUNSIM_NUM_PROCESSES`` and
``FUNSIM_PROCESS_ID``; the program joins the run by calling
:func:`funsim.runtime.distributed.initialize` first. Every line a process
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
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from funsim.experiments.cli import SUBCOMMANDS
from funsim.runtime import launcher, processes

__all__ = ["subcommand_argv", "add_arguments", "main"]

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
    previous = signal.signal(signal.SIGTERM, launcher.raise_on_sigterm)  # a stopped launcher stops its processes
    try:
        res = launcher.run_processes(argv, n, cpu_devices=args.cpu_devices, heartbeat_timeout_s=args.heartbeat_timeout,
                            timeout_s=args.timeout, grace_s=args.grace, echo=sys.stdout)
    except KeyboardInterrupt:
        print("funsim launch: interrupted; stopped every process.", file=sys.stderr)
        return 130
    except launcher.Terminated:
        print("funsim launch: terminated; stopped every process.", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not res.ok:
        print(f"funsim launch: {res.describe(tail_lines=0)}", file=sys.stderr)
    return res.exit_status
