"""The ``funsim`` console script.

``SUBCOMMANDS`` is the one place to add a subcommand: ``"name": ("module", "one-line
help")``. The module defines ``add_arguments(parser)`` and ``main(args) -> int``. It is
imported only when its subcommand runs (or shows its own ``--help``), so ``funsim
--help`` answers without importing jax or flax; the driver modules import jax and
flax inside their functions, so ``funsim COMMAND --help`` does not either.

Mistakes a user can fix are printed as one line, ``funsim COMMAND: error: ...``,
without a traceback: a bad ``--config`` or ``--set`` (exit status 2, as argparse's own errors),
a run folder in use by another run, or a damaged result file or checkpoint (exit
status 1); each message names the file and the fix. Ctrl-C prints one line with the command
that resumes the run, and exits with status 130.

A subcommand whose module sets ``SUPPORTS_MULTIPROCESS = True`` first joins the
multi-process run it belongs to (``distributed.initialize()``: ``funsim launch``,
or ``FUNSIM_DISTRIBUTED=1`` on a cluster), unless the module also sets
``JOINS_JAX_RUNTIME = False`` (its processes share no computation and split the
work by ``FUNSIM_PROCESS_ID`` alone: the zoo). In such a run a process that ends
with an error status ends at once, so that the others stop too.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from funsim.experiments import compile_cache

# name -> (module, one-line help). Each module defines its own arguments.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("funsim.experiments.compare", "compare two saved representation matrices (.npy/.npz)"),
    "quickstart": ("funsim.experiments.quickstart", "train small models offline and compare them end to end"),
    "grokking": ("funsim.experiments.grokking", "modular addition with one bilinear layer: phases from checkpoint similarity"),
    "forgetting": ("funsim.experiments.forgetting", "catastrophic forgetting through a curriculum, localised by tensor similarity"),
    "backdoor": ("funsim.experiments.backdoor", "detect a backdoor from the weights and clean data only"),
    "zoo": ("funsim.experiments.zoo", "train a model zoo (data sets x architectures x seeds) for the similarity study"),
    "language": ("funsim.experiments.language", "2-layer bilinear-attention transformer on Shakespeare: checkpoint similarity"),
    "similarity-study": ("funsim.experiments.similarity_study", "every measure on every layer pair of every model pair of a zoo"),
    "report": ("funsim.experiments.report", "reports over finished runs, e.g. `funsim report usable-information --run DIR`"),
    "launch": ("funsim.experiments.launch", "run a subcommand or script as N local processes of one multi-process run"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (to add its arguments)."""
    parser = argparse.ArgumentParser(
        prog="funsim",
        description="Are these two networks, or these two representations, the same?",
    )
    compile_cache.add_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        compile_cache.add_option(p, subcommand=True)
        if name == command:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_main=mod.main)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv``: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _user_error_status(e: BaseException) -> int | None:
    """The exit status of an error the user can fix (printed without a traceback), or None."""
    from funsim.experiments.config import ConfigError
    from funsim.experiments.io import RunLockedError

    if isinstance(e, ConfigError):
        return 2
    if isinstance(e, RunLockedError):
        return 1
    models_io = sys.modules.get("funsim.models.io")  # imported if and only if it can have raised
    if models_io is not None and isinstance(e, models_io.DamagedFileError):
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
    module = importlib.import_module(SUBCOMMANDS[name][0])
    multiprocess = getattr(module, "SUPPORTS_MULTIPROCESS", False)
    if multiprocess and getattr(module, "JOINS_JAX_RUNTIME", True):  # join the run of N processes (or nothing)
        from funsim.experiments import distributed

        distributed.initialize()
    try:
        status = int(args._main(args) or 0)
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
    import os

    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized() or jax.process_count() == 1:
        return
    from funsim.experiments import distributed

    print(f"{distributed.log_prefix()}funsim: ending this process with status {status} so that the other "
          "processes of the run stop too.", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
