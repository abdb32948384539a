"""Results on disk: ``results/<experiment>/<run>/`` directories, and the atomic writers.

The atomic JSON/file writers live in :mod:`models.io` (so that :mod:`models.train`
need not import :mod:`experiments`: the layering is similarity <- models <- experiments);
they are re-exported here.
"""

from __future__ import annotations

import datetime
import os
import pathlib

from models.io import read_json as read_json
from models.io import to_jsonable as to_jsonable
from models.io import write_atomic as write_atomic
from models.io import write_json_atomic as write_json_atomic

__all__ = ["to_jsonable", "write_atomic", "write_json_atomic", "read_json", "results_dir"]


def results_dir(experiment: str, run: str | None = None, *, root: str | os.PathLike = "results") -> pathlib.Path:
    """Create and return ``root/experiment/run`` (run defaults to a UTC timestamp)."""
    run = run or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    d = pathlib.Path(root) / experiment / run
    d.mkdir(parents=True, exist_ok=True)
    return d
