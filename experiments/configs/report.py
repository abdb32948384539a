"""``funsim report``'s arguments: the kinds of report (``REPORTS``) and ``add_arguments``. No JAX:
``funsim report --help`` imports only this; the run module is :mod:`funsim.experiments.report`.
"""

from __future__ import annotations

import argparse

__all__ = ["REPORTS", "add_arguments"]

REPORTS = {"usable-information": "the five usable-information claims from a similarity-study run"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=list(REPORTS), help="; ".join(f"{k}: {v}" for k, v in REPORTS.items()))
    parser.add_argument("--run", required=True, help="the run directory, e.g. results/similarity_study/default")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.9, 0.95, 0.99],
                        help="relative accuracies counted as high functional similarity (default 0.9 0.95 0.99)")
    parser.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--n-permutations", type=int, default=2000, help="permutations of the null (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resamples (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="accepted for symmetry with the drivers")
