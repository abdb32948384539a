"""``funsim report KIND --run DIR``: reports over finished runs.

Kinds (``REPORTS``):

* ``usable-information``: the five claims of the usable-information paper from a
  ``funsim similarity-study`` run (:func:`experiments.usable_information.report`).
"""

from __future__ import annotations

import argparse
import pathlib

from funsim.experiments import usable_information as ui
from funsim.experiments.configs.report import REPORTS, add_arguments

__all__ = ["REPORTS", "add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    opts = ui.ReportOptions(thresholds=tuple(args.thresholds), n_resamples=args.n_resamples,
                            n_permutations=args.n_permutations, seed=args.seed)
    try:
        ui.report(pathlib.Path(args.run), options=opts)
    except FileNotFoundError as e:
        print(f"funsim report: {e}")
        return 1
    return 0
