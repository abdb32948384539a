"""Results on disk: atomic JSON writes and ``results/<experiment>/<run>/`` directories."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import tempfile
from typing import Any

import numpy as np

__all__ = ["to_jsonable", "write_json_atomic", "read_json", "results_dir"]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/jax scalars and arrays, tuples, paths and dataclasses to JSON types."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        if isinstance(obj, float) and not np.isfinite(obj):
            return None if np.isnan(obj) else str(obj)  # JSON has no NaN: undefined -> null
        return obj
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        arr = np.asarray(obj)
        return to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    raise TypeError(f"Cannot write {type(obj).__name__} to JSON.")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> pathlib.Path:
    """Write ``obj`` as JSON to ``path`` atomically (temp file in the same directory, then ``os.replace``).

    A reader never sees a partial file, even if the writer is killed.

    Examples:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.json"
      >>> _ = write_json_atomic(p, {"acc": np.float32(0.5)})
      >>> read_json(p)
      {'acc': 0.5}
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    with open(path) as f:
        return json.load(f)


def results_dir(experiment: str, run: str | None = None, *, root: str | os.PathLike = "results") -> pathlib.Path:
    """Create and return ``root/experiment/run`` (run defaults to a UTC timestamp)."""
    run = run or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    d = pathlib.Path(root) / experiment / run
    d.mkdir(parents=True, exist_ok=True)
    return d
