"""Files on disk for models and runs: atomic writes, JSON, and orbax checkpoints.

Everything here writes atomically (a temp file in the same directory, then
``os.replace``), so a reader never sees a partial file even if the writer is
killed, and every file gets the usual permissions (``0666 & ~umask``, e.g.
``0644``), not the ``0600`` of the temp file. :mod:`experiments.io` re-exports
these names; :mod:`models.train` uses them, so the layering runs
``similarity <- models <- experiments``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

__all__ = [
    "to_jsonable",
    "write_atomic",
    "write_json_atomic",
    "read_json",
    "checkpoint_manager",
]


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


def _file_mode() -> int:
    """``0o666`` less the process umask: what ``open(path, "w")`` would have given."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> pathlib.Path:
    """Write ``path`` atomically: ``write(f)`` fills a binary temp file, which replaces ``path``.

    The file gets the usual mode (``0666 & ~umask``) and is fsynced before the rename.

    Examples:
      >>> import tempfile, pathlib, stat
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.bin"
      >>> _ = write_atomic(p, lambda f: f.write(b"ok"))
      >>> p.read_bytes(), oct(stat.S_IMODE(p.stat().st_mode)) == oct(_file_mode())
      (b'ok', True)
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any) -> pathlib.Path:
    """Write ``obj`` as JSON to ``path`` atomically (see :func:`write_atomic`).

    Examples:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.json"
      >>> _ = write_json_atomic(p, {"acc": np.float32(0.5)})
      >>> read_json(p)
      {'acc': 0.5}
    """
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n"
    return write_atomic(path, lambda f: f.write(text.encode()))


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    with open(path) as f:
        return json.load(f)


def checkpoint_manager(workdir: str | os.PathLike):
    """An orbax ``CheckpointManager`` for ``workdir/checkpoints`` (synchronous, keeps every step)."""
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(
        (pathlib.Path(workdir) / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=None, create=True, enable_async_checkpointing=False),
    )
