"""The ``funsim`` console script.

Subcommands register themselves here; each lives in its own module and
exposes ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module defines its own arguments.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("experiments.compare", "compare two saved representation matrices (.npy/.npz)"),
    "quickstart": ("experiments.quickstart", "train small models offline and compare them end to end"),
    "language": ("experiments.language", "2-layer bilinear-attention transformer on Shakespeare: checkpoint similarity"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="funsim",
        description="Are these two networks, or these two representations, the same?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:  # subcommand not built yet
            if e.name != module:
                raise
            p.set_defaults(_missing=module)
            continue
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"funsim {args.command}: not available ({args._missing} is missing).", file=sys.stderr)
        return 2
    return int(args._main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
