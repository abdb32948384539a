"""Files on disk for models and runs: atomic writes, JSON, run setups, checksums and orbax checkpoints.

Everything here writes atomically (a temp file in the same directory, then
``os.replace``), so a reader never sees a partial file even if the writer is
killed, and every file gets the usual permissions (``0666 & ~umask``, e.g.
``0644``), not the ``0600`` of the temp file. Readers name the file they cannot
read (:class:`DamagedFileError`, from :func:`read_json` and :func:`read_npz`); tables are written
with a manifest (row count, size, SHA-256: :func:`write_table_atomic`) and checked against it
before they are used (:func:`verify_table`). Checkpoints carry a checksum manifest, written
before they become visible and verified before they are restored
(:class:`CheckpointManager`). :mod:`experiments.io` re-exports these names;
:mod:`models.train` uses them, so the layering runs ``similarity <- models <- experiments``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

__all__ = [
    "to_jsonable",
    "write_atomic",
    "write_json_atomic",
    "write_text_atomic",
    "read_json",
    "DamagedFileError",
    "SetupMismatchError",
    "fingerprint",
    "setup_diff",
    "check_setup",
    "SOURCE_PACKAGES",
    "source_version",
    "merge_units",
    "read_npz",
    "table_manifest_path",
    "write_table_atomic",
    "verify_table",
    "CHECKSUMS",
    "sha256_file",
    "directory_checksums",
    "write_directory_checksums",
    "directory_problem",
    "has_checksums",
    "CheckpointManager",
    "checkpoint_manager",
    "checkpoint_problem",
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


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`), e.g. a run's ``summary.md``.

    Examples:
      >>> import tempfile, pathlib
      >>> p = write_text_atomic(pathlib.Path(tempfile.mkdtemp()) / "s.md", "# Ω")
      >>> p.read_text(encoding="utf-8"), sorted(x.name for x in p.parent.iterdir())
      ('# Ω', ['s.md'])
    """
    data = text.encode()
    return write_atomic(path, lambda f: f.write(data))


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


# ----------------------------------------------------------------------------- checksums


CHECKSUMS = "funsim_checksums.json"
"""The name of the checksum manifest inside a checkpoint directory (and beside result files)."""


def read_npz(path: str | os.PathLike, *, fix: str = "Delete it and rerun the command that wrote it (it is "
                                                        "recomputed).") -> dict:
    """Every array of an ``.npz`` file, read now; a truncated or damaged file is a ``DamagedFileError`` naming it.

    ``np.savez`` stores a CRC-32 per array, so changed bytes are caught as well as a cut file.
    ``fix`` is the error's last sentence: what the user (or the caller) does about it.

    Examples:
      >>> import tempfile, pathlib, numpy as np
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.npz"
      >>> _ = write_atomic(p, lambda f: np.savez(f, x=np.arange(3)))
      >>> read_npz(p)["x"].tolist()
      [0, 1, 2]
      >>> _ = p.write_bytes(p.read_bytes()[:100])
      >>> try:
      ...     read_npz(p)
      ... except ValueError as e:
      ...     print(type(e).__name__, str(e).startswith(f"{p} is damaged"))
      DamagedFileError True
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, KeyError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DamagedFileError(
            f"{path} is damaged: it is not a complete .npz file ({type(e).__name__}: {e}). {fix}"
        ) from None


def table_manifest_path(path: str | os.PathLike) -> pathlib.Path:
    """Where the manifest of the table ``path`` is: ``comparisons.csv`` -> ``comparisons.manifest.json``."""
    path = pathlib.Path(path)
    return path.with_name(path.stem + ".manifest.json")


def write_table_atomic(path: str | os.PathLike, data: bytes, rows: int) -> pathlib.Path:
    """Write a table (e.g. a CSV) atomically, then its manifest: the row count, the size and the SHA-256.

    A reader checks the table against the manifest (:func:`verify_table`), so a
    table cut short, even at a line boundary, is refused instead of read.
    """
    path = pathlib.Path(path)
    write_atomic(path, lambda f: f.write(data))
    write_json_atomic(table_manifest_path(path), {"file": path.name, "rows": int(rows), "bytes": len(data),
                                                  "sha256": hashlib.sha256(data).hexdigest()})
    return path


def verify_table(path: str | os.PathLike, *, fix: str) -> dict:
    """The manifest of the table ``path``, after checking the table against it.

    Args:
      path: the table.
      fix: what the user can do about a damaged table (the error's last sentence).

    Raises:
      DamagedFileError: (a ``ValueError``) the manifest is missing or unreadable, or the
        table's size or SHA-256 differs from it (a truncated or changed table).
    """
    path = pathlib.Path(path)
    mpath = table_manifest_path(path)
    if not mpath.is_file():
        raise DamagedFileError(f"{path} has no manifest {mpath}, so its rows cannot be checked. {fix}")
    manifest = read_json(mpath)
    data = path.read_bytes()
    if len(data) != manifest.get("bytes") or hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise DamagedFileError(
            f"{path} does not match its manifest {mpath}: {len(data)} bytes where {manifest.get('bytes')} "
            f"({manifest.get('rows')} rows) were written" + (" with other contents" if len(data) == manifest.get("bytes")
                                                             else "") + f": it is truncated or changed. {fix}")
    return manifest


#: the packages whose sources make up :func:`source_version`
SOURCE_PACKAGES = ("similarity", "models", "experiments", "data", "runtime")


@functools.cache
def source_version() -> str:
    """SHA-256 (first 16 hex digits) of funsim's Python sources: the code that computed a result.

    Every ``.py`` file of :data:`SOURCE_PACKAGES`, by relative path and contents; the same
    tree gives the same version on any machine (no git needed), and any edit changes it.
    Read once per process, at its first call: the tree on disk then. A study makes that call
    when it starts (after importing its modules), so that a long run's results record the tree
    it started from even when the files are edited while it runs; a new process reads the tree
    again.
    """
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in SOURCE_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def merge_units(src: str | os.PathLike, dst: str | os.PathLike, *, globs: tuple[str, ...],
                version_key: str = "code", version: str | None = None,
                check: Callable[[pathlib.Path, Any], str | None] | None = None) -> dict[str, int]:
    """Copy the finished unit files of the run folder ``src`` (e.g. computed on another machine) into ``dst``.

    Nothing is copied unless every check passes: both folders' ``config.json`` are equal,
    and every unit of ``src`` reads back and records ``version_key == version`` (default
    :func:`source_version`: the code that will finish the run). Units ``dst`` already has
    are kept. Each copy is atomic, so an interrupted merge can be rerun.

    Args:
      src, dst: run folders (``dst`` is created, with ``src``'s config, if it does not exist).
      globs: the unit files, relative to the run folder (e.g. ``("pairs/*/*.json",)``).
      check: ``check(path, unit)`` (a unit of ``src`` and its contents, after the version check) returns why the
        unit must not be merged (e.g. computed from other inputs), or None.

    Returns:
      ``{"copied": k, "kept": j}``.

    Raises:
      SetupMismatchError: (a ``ValueError``) another config, or a unit of another code
        version; every difference is listed, and the fix.
      DamagedFileError: a unit of ``src`` does not read back (named).
    """
    src, dst = pathlib.Path(src), pathlib.Path(dst)
    version = source_version() if version is None else version
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a run folder: it has no config.json.")
    cfg = read_json(src / "config.json")
    if (dst / "config.json").is_file() and (diff := setup_diff(read_json(dst / "config.json"), cfg)):
        raise SetupMismatchError(f"Refusing to merge {src} into {dst}: another config (saved: {dst}, now: {src}):\n  "
                                 + "\n  ".join(diff) + "\nMerge into a run of the same config.")
    units = sorted({f for g in globs for f in src.glob(g) if f.is_file()})
    stale = [f"{f}: {version_key} {v!r}" for f in units if (v := read_json(f).get(version_key)) != version]
    if stale:
        raise SetupMismatchError(f"Refusing to merge {src} into {dst}: {len(stale)} units were computed by other "
                                 f"code than this tree's ({version_key} {version!r}):\n  " + "\n  ".join(stale[:10])
                                 + "\nRecompute them with this tree, or merge with the tree that computed them.")
    if check is not None and (other := [f"{f}: {why}" for f in units if (why := check(f, read_json(f)))]):
        raise SetupMismatchError(f"Refusing to merge {src} into {dst}: {len(other)} units were computed from other "
                                 "inputs than this run's:\n  " + "\n  ".join(other[:10])
                                 + "\nMerge into a run that reads the same inputs (e.g. the same trained zoo).")
    if not (dst / "config.json").is_file():
        write_json_atomic(dst / "config.json", cfg)
    copied = 0
    for f in units:
        target = dst / f.relative_to(src)
        if not target.is_file():
            data = f.read_bytes()
            write_atomic(target, lambda out, data=data: out.write(data))
            copied += 1
    return {"copied": copied, "kept": len(units) - copied}



def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def directory_checksums(directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` of every file under ``directory`` but :data:`CHECKSUMS`."""
    directory = pathlib.Path(directory)
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != CHECKSUMS:
            out[p.relative_to(directory).as_posix()] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    return out


def write_directory_checksums(directory: str | os.PathLike) -> pathlib.Path:
    """Hash every file of ``directory`` into ``directory/funsim_checksums.json`` (atomically)."""
    directory = pathlib.Path(directory)
    return write_json_atomic(directory / CHECKSUMS, {"format": 1, "files": directory_checksums(directory)})


def directory_problem(directory: str | os.PathLike) -> str | None:
    """Why ``directory`` does not match its checksum manifest (a missing, truncated or changed file), or None.

    A directory without a manifest (saved before checksums were recorded) has no
    problem that can be seen: None.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return f"{directory} is missing"
    manifest = directory / CHECKSUMS
    if not manifest.is_file():
        return None
    try:
        files = read_json(manifest)["files"]
    except (DamagedFileError, KeyError, TypeError):
        return f"its checksum manifest {manifest} is unreadable"
    for rel, want in files.items():
        p = directory / rel
        if not p.is_file():
            return f"{p} is missing"
        size = p.stat().st_size
        if size != want["bytes"]:
            return f"{p} is {size} bytes, {want['bytes']} when it was saved (truncated or overwritten)"
        if sha256_file(p) != want["sha256"]:
            return f"{p} does not match the SHA-256 recorded when it was saved (its bytes changed)"
    return None


def has_checksums(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` carries a checksum manifest (everything saved by this version does)."""
    return (pathlib.Path(directory) / CHECKSUMS).is_file()


# ----------------------------------------------------------------------------- checkpoints


def _fsync_dir(path: pathlib.Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)



def _one_process_options(ocp) -> dict:
    """In a run of several JAX processes: orbax options that keep a checkpoint to this process alone.

    Each process reads checkpoints on its own (e.g. every process of a similarity
    study loads the zoo); orbax's default would make every process take part in
    each one (its barriers wait for all of them).
    """
    import jax

    if jax.process_count() == 1:
        return {}
    me = jax.process_index()
    # orbax cannot create the folders itself then: CheckpointStore makes them
    return {"create": False, "multiprocessing_options": ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"process{me}")}


class CheckpointManager:
    """orbax checkpoints of one training workdir (``workdir/checkpoints/<step>/``), each with its checksums.

    * :meth:`save` writes the checkpoint with orbax into ``workdir/checkpoints.incoming/``,
      hashes its files into ``<step>/funsim_checksums.json`` and only then moves it
      to ``checkpoints/<step>`` (one rename): a checkpoint that is visible carries its
      checksums, even if the process is killed at any moment.
    * :meth:`restore` verifies the checksums first; a damaged checkpoint raises
      :class:`DamagedFileError` naming the file and what to delete, instead of
      loading wrong parameters (or failing deep inside orbax).
    * :meth:`latest_step` (what a resumed run starts from) is the newest checkpoint
      that verifies: newer damaged ones are moved to ``workdir/damaged_checkpoints/``
      with a warning naming them, and training redoes their steps.

    Checkpoints saved before checksums were recorded load as before, unverified.
    """

    def __init__(self, workdir: str | os.PathLike):
        import orbax.checkpoint as ocp

        self.workdir = pathlib.Path(workdir).absolute()
        self.directory = self.workdir / "checkpoints"
        self._ocp = ocp
        self._options = ocp.CheckpointManagerOptions(**{"max_to_keep": None, "create": True,
                                                        "enable_async_checkpointing": False,
                                                        **_one_process_options(ocp)})
        if not self._options.create:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._manager = self._open(self.directory)
        self._incoming = None
        self._verified: set[int] = set()

    def _open(self, directory: pathlib.Path):
        try:
            return self._ocp.CheckpointManager(directory, options=self._options)
        except Exception as e:  # orbax reads every step's metadata here
            raise DamagedFileError(
                f"The checkpoints in {directory} cannot be listed ({type(e).__name__}: {str(e)[:300]}). Move the "
                f"damaged step directory out of {directory} (or delete {self.workdir} to start this training afresh)."
            ) from None

    def step_dir(self, step: int) -> pathlib.Path:
        """The directory of checkpoint ``step``."""
        return self.directory / str(int(step))

    def all_steps(self) -> list[int]:
        """Every saved step (sorted), verified or not."""
        return sorted(int(s) for s in self._manager.all_steps())

    def problem(self, step: int) -> str | None:
        """Why checkpoint ``step`` is damaged, or None (unverifiable legacy checkpoints: None)."""
        if int(step) in self._verified:
            return None
        why = directory_problem(self.step_dir(step))
        if why is None and has_checksums(self.step_dir(step)):
            self._verified.add(int(step))
        return why

    def verify(self, step: int) -> None:
        """Raise :class:`DamagedFileError` (naming the file and the fix) if checkpoint ``step`` is damaged."""
        why = self.problem(step)
        if why is not None:
            d = self.step_dir(step)
            raise DamagedFileError(
                f"Checkpoint {d} is damaged: {why}. Delete {d} and rerun the training that wrote it (it resumes from "
                "the previous checkpoint and writes this one again), or restore it from a backup."
            )

    def set_aside(self, step: int) -> pathlib.Path:
        """Move checkpoint ``step`` to ``workdir/damaged_checkpoints/`` (kept for inspection); returns where."""
        dest_root = self.workdir / "damaged_checkpoints"
        dest_root.mkdir(parents=True, exist_ok=True)
        dest, k = dest_root / str(int(step)), 1
        while dest.exists():
            dest, k = dest_root / f"{int(step)}.{k}", k + 1
        os.replace(self.step_dir(step), dest)
        self._verified.discard(int(step))
        self._manager.reload()
        return dest

    def latest_step(self) -> int | None:
        """The newest checkpoint that verifies; newer damaged ones are set aside with a warning."""
        for step in reversed(self.all_steps()):
            why = self.problem(step)
            if why is None:
                return step
            d = self.step_dir(step)
            dest = self.set_aside(step)
            older = [s for s in self.all_steps() if s < step]
            then = f"resuming from step {older[-1]}" if older else "no earlier checkpoint: starting afresh"
            warnings.warn(f"Checkpoint {d} is damaged: {why}. Moved it to {dest}; {then}.", RuntimeWarning,
                          stacklevel=2)
        return None

    def save(self, step: int, *, args: Any) -> None:
        """Save checkpoint ``step`` (orbax ``args``), with its checksums, then make it visible."""
        import shutil

        step = int(step)
        incoming = self.workdir / "checkpoints.incoming"
        if (incoming / str(step)).exists():  # left by a process killed mid-save
            shutil.rmtree(incoming / str(step))
        if self._incoming is None:
            incoming.mkdir(parents=True, exist_ok=True)
            self._incoming = self._ocp.CheckpointManager(incoming, options=self._options)
        else:
            self._incoming.reload()
        self._incoming.save(step, args=args, force=True)
        self._incoming.wait_until_finished()
        write_directory_checksums(incoming / str(step))
        self.directory.mkdir(parents=True, exist_ok=True)
        os.replace(incoming / str(step), self.step_dir(step))
        _fsync_dir(self.directory)
        self._incoming.reload()
        self._manager.reload()
        self._verified.add(step)

    def restore(self, step: int, *, args: Any) -> Any:
        """Verify checkpoint ``step``, then restore it (orbax ``args``, e.g. ``StandardRestore(template)``)."""
        self.verify(step)
        try:
            return self._manager.restore(int(step), args=args)
        except Exception as e:
            d = self.step_dir(step)
            if has_checksums(d):  # the bytes are as saved: the template (the model) does not fit
                raise
            raise DamagedFileError(
                f"Checkpoint {d} cannot be read ({type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}); it was "
                f"saved without checksums, so it is damaged or of a different model. Delete {d} and rerun the training "
                "that wrote it (it resumes from the previous checkpoint)."
            ) from None

    def wait_until_finished(self) -> None:
        """Saves are synchronous: nothing to wait for (kept for orbax's interface)."""

    def close(self) -> None:
        self._manager.close()
        if self._incoming is not None:
            self._incoming.close()


def checkpoint_manager(workdir: str | os.PathLike) -> CheckpointManager:
    """The :class:`CheckpointManager` of ``workdir/checkpoints`` (synchronous, keeps every step, checksummed)."""
    return CheckpointManager(workdir)


def checkpoint_problem(workdir: str | os.PathLike, step: int | None = None) -> str | None:
    """Why checkpoint ``step`` (default: the newest) of ``workdir`` is damaged or missing, or None.

    Checkpoints saved before checksums were recorded cannot be verified: None.
    """
    directory = pathlib.Path(workdir) / "checkpoints"
    if step is None:
        steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit()] if directory.is_dir() else []
        if not steps:
            return f"{directory} holds no checkpoint"
        step = max(steps)
    return directory_problem(directory / str(int(step)))
