"""``funsim compare``'s command-line options (imports no JAX); the run is :mod:`funsim.experiments.compare`."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["EXAMPLE_DIR", "add_arguments"]

EXAMPLE_DIR = Path("results") / "compare" / "example"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", nargs="?", help="first representation: A.npy, A.npz (one array) or A.npz:name")
    parser.add_argument("b", nargs="?", help="second representation, same rows as the first")
    parser.add_argument("--key", help="array name inside .npz files (for both, unless given as file.npz:name)")
    parser.add_argument(
        "--measures", nargs="+", metavar="NAME",
        help="measure names (see `--list`); commas also separate names. Default: all.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--list", action="store_true", help="list the registered measures and exit")
    parser.add_argument(
        "--example", action="store_true",
        help="build two views of scikit-learn's digits (pixels vs random features of a PCA), "
        "save them as .npy and compare them",
    )
    parser.add_argument("--out", type=Path, default=EXAMPLE_DIR, help=f"where --example writes (default {EXAMPLE_DIR})")
    parser.add_argument("--float32", action="store_true", help="compute in float32 (default float64)")
