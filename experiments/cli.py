"""The ``funsim`` console script.

``SUBCOMMANDS`` is the one place to add a subcommand: ``"name": Subcommand(arguments,
run, help)``. Each driver has two modules, as the flax examples do:

* its *arguments* module, ``funsim.experiments.configs.NAME``: the config (no JAX), its
  named configs and ``add_arguments(parser)``. ``funsim COMMAND --help`` imports only this
  one, so it answers without importing jax, flax or matplotlib;
* its *run* module, ``funsim.experiments.NAME``: ``main(args) -> int`` and the work, with
  its imports at the top. It is imported only when the subcommand runs.

A subcommand that needs no JAX (``launch``) is one module, named twice.

Mistakes a user can fix are printed as one line, ``funsim COMMAND: error: ...``,
without a traceback: a bad ``--config`` or ``--set`` (exit status 2, as argparse's own errors),
a run folder in use by another run, a damaged result file or checkpoint, or a resume refused
because the saved setup differs (exit status 1); each message names the file and the fix.
Ctrl-C prints one line with the command that resumes the run, and exits with status 130.

A subcommand whose arguments module sets ``SUPPORTS_MULTIPROCESS = True`` first joins the
multi-process run it belongs to (``distributed.initialize()``: ``funsim launch``,
or ``FUNSIM_DISTRIBUTED=1`` on a cluster), unless that module also sets
``JOINS_JAX_RUNTIME = False`` (its processes share no computation and split the
work by ``FUNSIM_PROCESS_ID`` alone: the zoo). In such a run a process that ends
with an error status ends at once, so that the others stop too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from typing import NamedTuple

from funsim.experiments.config import ConfigError
from funsim.runtime import compile_cache


class Subcommand(NamedTuple):
    """Where a subcommand lives: ``arguments`` (no JAX) defines ``add_arguments``, ``run`` defines ``main``."""

    arguments: str
    run: str
    help: str


def _driver(name: str, help_: str) -> Subcommand:
    """A driver's two modules: ``configs.NAME`` (arguments) and ``NAME`` (run), NAME with ``_`` for ``-``."""
    module = name.replace("-", "_")
    return Subcommand(f"funsim.experiments.configs.{module}", f"funsim.experiments.{module}", help_)


def _light(name: str, help_: str) -> Subcommand:
    """A subcommand that imports no JAX: one module for its arguments and its run."""
    module = f"funsim.experiments.{name.replace('-', '_')}"
    return Subcommand(module, module, help_)


SUBCOMMANDS: dict[str, Subcommand] = {
    "compare": _driver("compare", "compare two saved representation matrices (.npy/.npz)"),
    "quickstart": _driver("quickstart", "train small models offline and compare them end to end"),
    "grokking": _driver("grokking", "modular addition with one bilinear layer: phases from checkpoint similarity"),
    "forgetting": _driver("forgetting", "catastrophic forgetting through a curriculum, localised by tensor similarity"),
    "backdoor": _driver("backdoor", "detect a backdoor from the weights and clean data only"),
    "zoo": _driver("zoo", "train a model zoo (data sets x architectures x seeds) for the similarity study"),
    "language": _driver("language", "2-layer bilinear-attention transformer on Shakespeare: checkpoint similarity"),
    "similarity-study": _driver("similarity-study", "every measure on every layer pair of every model pair of a zoo"),
    "report": _driver("report", "reports over finished runs, e.g. `funsim report usable-information --run DIR`"),
    "launch": _light("launch", "run a subcommand or script as N local processes of one multi-process run"),
    "ledger": _light("ledger", "keep a long study's finished units in the repository across machines"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (to add its arguments)."""
    parser = argparse.ArgumentParser(
        prog="funsim",
        description="Are these two networks, or these two representations, the same?",
    )
    compile_cache.add_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (arguments, _, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        compile_cache.add_option(p, subcommand=True)
        if name == command:
            importlib.import_module(arguments).add_arguments(p)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv``: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _user_error_status(e: BaseException) -> int | None:
    """The exit status of an error the user can fix (printed without a traceback), or None."""
    if isinstance(e, ConfigError):
        return 2
    # each module is imported if and only if it can have raised its error
    xio, models_io = sys.modules.get("funsim.experiments.io"), sys.modules.get("funsim.models.io")
    if xio is not None and isinstance(e, xio.RunLockedError):
        return 1
    if models_io is not None and isinstance(e, (models_io.DamagedFileError, models_io.SetupMismatchError)):
        return 1
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    compile_cache.enable(argv)  # before a subcommand's module imports jax
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    name = _command(argv)  # args.command is launch's own command line for `funsim launch`
    arguments = importlib.import_module(SUBCOMMANDS[name].arguments)
    multiprocess = getattr(arguments, "SUPPORTS_MULTIPROCESS", False)
    if multiprocess and getattr(arguments, "JOINS_JAX_RUNTIME", True):  # join the run of N processes (or nothing)
        from funsim.runtime import distributed  # imports jax: only for a subcommand that runs

        distributed.initialize()
    try:
        status = int(importlib.import_module(SUBCOMMANDS[name].run).main(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line that says how to go on, not a traceback
        print(f"funsim {name}: interrupted. Rerun the same command to resume (a run continues from its "
              f"last checkpoint): {shlex.join(['funsim', *argv])}", file=sys.stderr)
        status = 130  # 128 + SIGINT, as a shell reports it
    except Exception as e:
        status = _user_error_status(e)
        if status is None:
            raise
        print(f"funsim {args.command}: error: {e}", file=sys.stderr)
    if status and multiprocess:
        _exit_now_if_one_of_many(status)
    return status


def _exit_now_if_one_of_many(status: int) -> None:
    """In a run of several processes, end this one now with ``status``.

    Returning would wait at JAX's shutdown barrier (up to ``FUNSIM_SHUTDOWN_TIMEOUT``
    seconds) for processes that may be waiting for this one's units; ending at
    once lets ``funsim launch`` (or the others' heartbeats) stop them too.
    """
    distributed = sys.modules.get("funsim.runtime.distributed")  # imported if and only if the run joined
    if distributed is None or not distributed.is_initialized() or distributed.process_count() == 1:
        return
    print(f"{distributed.log_prefix()}funsim: ending this process with status {status} so that the other "
          "processes of the run stop too.", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
