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
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

__all__ = [
    "to_jsonable",
    "write_atomic",
    "write_json_atomic",
    "read_json",
    "DamagedFileError",
    "SetupMismatchError",
    "fingerprint",
    "setup_diff",
    "check_setup",
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


class DamagedFileError(ValueError):
    """A result file or checkpoint that is truncated, corrupted or unreadable.

    The message names the file and says how to recover (what to delete, or what
    to rerun). A :class:`ValueError`, so code that catches bad input catches it too.
    """


class SetupMismatchError(ValueError):
    """A resume refused because the saved setup (config, model or data) differs; the message lists the differences."""


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a truncated or damaged one is a :class:`DamagedFileError` naming it.

    Examples:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "cut.json"
      >>> _ = p.write_text('{"rows": [1, 2')
      >>> try:
      ...     read_json(p)
      ... except DamagedFileError as e:
      ...     print(str(e).split(" is ")[0] == str(p), "not valid JSON" in str(e))
      True True
    """
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedFileError(
            f"{path} is not valid JSON: it is truncated or damaged ({e}). Delete it and rerun the command that "
            "wrote it (a rerun recomputes what is missing)."
        ) from None


# ----------------------------------------------------------------------------- run identity


def fingerprint(*arrays: Any) -> str:
    """SHA-1 of arrays' shapes, dtypes and bytes: the identity of data or parameters in a run's setup.

    Examples:
      >>> fingerprint(np.arange(3)) == fingerprint(np.arange(3)) != fingerprint(np.arange(3.0))
      True
    """
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def setup_diff(saved: Mapping, now: Mapping, prefix: str = "") -> list[str]:
    """The differences between two setups (JSON-like dicts), one line per differing key, nested keys dotted.

    Examples:
      >>> setup_diff({"config": {"lr": 0.1, "steps": 5}}, {"config": {"lr": 0.2, "steps": 5}, "seed": 1})
      ['config.lr: saved 0.1, now 0.2', "seed: saved '<absent>', now 1"]
    """
    out = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k, "<absent>"), now.get(k, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += setup_diff(a, b, prefix + k + ".")
        elif a != b:
            out.append(f"{prefix}{k}: saved {a!r}, now {b!r}")
    return out


def _with_defaults(saved: Any, defaults: Any) -> Any:
    """``saved`` with the keys of ``defaults`` it lacks added (recursively): settings introduced after it was saved."""
    if not isinstance(saved, Mapping) or not isinstance(defaults, Mapping):
        return saved
    out = dict(saved)
    for k, v in defaults.items():
        out[k] = _with_defaults(out[k], v) if k in out else v
    return out


def check_setup(path: str | os.PathLike, now: Mapping, *, refusal: str, fix: str,
                defaults: Mapping | None = None) -> bool:
    """Write the setup ``now`` to ``path`` (JSON), or refuse if ``path`` holds a different one.

    The one "refuse a changed setup" check: :func:`models.train.train` uses it for
    its ``train_config.json``, the drivers (through ``experiments.io``) for their
    ``config.json``. Keys of ``defaults`` missing from the saved setup (options
    added since it was written) count as their default values.

    Args:
      path: the saved setup.
      now: this run's setup (JSON-like: see :func:`to_jsonable`).
      refusal: the error's first line, e.g. ``"Refusing to resume the run in W"``.
      fix: the error's last line: what the user can do.
      defaults: values of settings that older saved setups may lack.

    Returns:
      True if the setup was written (a fresh run), False if it matched the saved one.

    Raises:
      SetupMismatchError: the saved setup differs; every difference is listed.
      DamagedFileError: the saved setup is not valid JSON.

    Examples:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "config.json"
      >>> check_setup(p, {"a": 1}, refusal="No", fix="Fix it."), check_setup(p, {"a": 1}, refusal="No", fix="Fix it.")
      (True, False)
      >>> try:
      ...     check_setup(p, {"a": 2}, refusal="No", fix="Fix it.")
      ... except SetupMismatchError as e:
      ...     print(e)
      No:
        a: saved 1, now 2
      Fix it.
    """
    path = pathlib.Path(path)
    now = to_jsonable(now)
    if not path.exists():
        write_json_atomic(path, now)
        return True
    saved = read_json(path)
    diffs = setup_diff(_with_defaults(saved, to_jsonable(defaults or {})), now)
    if diffs:
        raise SetupMismatchError(f"{refusal}:\n  " + "\n  ".join(diffs) + f"\n{fix}")
    return False


def checkpoint_manager(workdir: str | os.PathLike):
    """An orbax ``CheckpointManager`` for ``workdir/checkpoints`` (synchronous, keeps every step)."""
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(
        (pathlib.Path(workdir) / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=None, create=True, enable_async_checkpointing=False),
    )
