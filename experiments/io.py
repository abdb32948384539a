"""Results on disk: ``results/<experiment>/<run>/`` directories, their configs and locks, and the atomic writers.

* **Writers and readers.** The atomic JSON/file writers and the JSON reader live in
  :mod:`funsim.models.io` (so that :mod:`funsim.models.train` need not import
  :mod:`funsim.experiments`: the layering is similarity <- models <- experiments);
  they are forwarded here, imported on first use, so that ``funsim <command> --help``
  never waits for jax and flax.
* **Configs.** Read by :mod:`funsim.experiments.config` (a name or a JSON file, then
  ``--set`` overrides, every field checked against the annotations); its
  :class:`ConfigError` is forwarded here.
* **Runs.** :func:`open_run` creates ``root/experiment/run``, takes its lock
  (:func:`acquire_run_lock`: a second run into the same folder is refused before it
  writes anything) and, given a config, refuses a rerun with a changed config
  (:func:`check_run_config`, the one such check of the drivers). A driver's ``run``
  is decorated with :func:`releases_run_locks`, which releases the lock when it
  returns or raises.
* **Damaged files.** Every reader names the file it cannot read
  (``DamagedFileError``, from :func:`read_json` and :func:`read_npz`); tables are
  written with a manifest (row count, size, SHA-256: :func:`write_table_atomic`)
  and checked against it before they are used (:func:`verify_table`).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import hashlib
import json
import os
import pathlib
import socket
import sys
import time
import warnings
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from funsim.experiments.config import ConfigError
from funsim.models.io import (
    DamagedFileError,
    SetupMismatchError,
    check_setup,
    fingerprint,
    read_json,
    setup_diff,
    to_jsonable,
    write_atomic,
    write_json_atomic,
)
from funsim.runtime import distributed

__all__ = ["to_jsonable", "write_atomic", "write_json_atomic", "write_text_atomic", "read_json", "results_dir",
           "ConfigError", "check_run_config",
           "RunLockedError", "LOCK_FILE", "acquire_run_lock", "release_run_lock", "releases_run_locks", "open_run",
           "DamagedFileError", "SetupMismatchError", "fingerprint", "setup_diff", "read_npz", "table_manifest_path",
           "write_table_atomic", "verify_table"]


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


def results_dir(experiment: str, run: str | None = None, *, root: str | os.PathLike = "results") -> pathlib.Path:
    """Create and return ``root/experiment/run`` (run defaults to a UTC timestamp)."""
    run = run or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    d = pathlib.Path(root) / experiment / run
    d.mkdir(parents=True, exist_ok=True)
    return d


# ----------------------------------------------------------------------------- configs


def _config_defaults(cfg: Any) -> dict:
    """The JSON form of the defaults of a config dataclass's fields (what a config saved before a field existed means)."""
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        return {}
    out = {}
    for f in dataclasses.fields(cfg):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return to_jsonable(out)


def check_run_config(out: str | os.PathLike, cfg: Any) -> bool:
    """Write ``out/config.json``, or refuse a rerun whose config differs from the saved one.

    The drivers' one "refuse a changed config" check (built on
    :func:`funsim.models.io.check_setup`, which :func:`funsim.models.train.train`
    uses for its own ``train_config.json``). Fields added to the config class since
    the run was saved count as their defaults.

    Returns:
      True if ``config.json`` was written (a new run), False if it matched.

    Raises:
      SetupMismatchError: (a ``ValueError``) the saved config differs; every difference is listed.
    """
    out = pathlib.Path(out)
    return check_setup(
        out / "config.json", to_jsonable(cfg), defaults=_config_defaults(cfg),
        refusal=f"Refusing to resume {out} with a different config; the run there has another config",
        fix="Use another --run name, or restore the original config to resume it.",
    )


# ----------------------------------------------------------------------------- run locks


LOCK_FILE = "run.lock"
"""The lock file of a run folder: JSON with the pid, host, start time and command of the run holding it."""


class RunLockedError(RuntimeError):
    """Another live process is writing into the same run folder; the message names it and the lock file."""


# lock path -> (open file holding the OS lock, depth): re-entrant within this process
_HELD: dict[str, list] = {}


def _lock_key(out: pathlib.Path) -> str:
    return str((out / LOCK_FILE).resolve())


def _describe_holder(info: Any) -> str:
    if not isinstance(info, dict):
        return "an unknown process"
    cmd = " ".join(str(a) for a in info.get("argv", []))[:120]
    return (f"pid {info.get('pid')} on {info.get('host')}, since {info.get('since')}"
            + (f" ({cmd})" if cmd else ""))


def _read_lock_info(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def acquire_run_lock(out: str | os.PathLike) -> pathlib.Path:
    """Lock the run folder ``out`` for this process (``out/run.lock``, with the pid and host), or refuse.

    The lock is an OS lock (``flock``) on the file, so it ends with the process,
    however that ends; the file's JSON says who holds it. A lock left behind by a
    process that is gone (killed) is taken over with a warning naming it. Taking the
    lock again in the same process nests (see :func:`release_run_lock`).

    Returns:
      the lock file.

    Raises:
      RunLockedError: another live process holds the lock; nothing has been written.
    """
    out = pathlib.Path(out)
    key = _lock_key(out)
    if key in _HELD:
        _HELD[key][1] += 1
        return out / LOCK_FILE
    path = out / LOCK_FILE
    out.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        f = open(path, "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            info = _read_lock_info(path)
            raise RunLockedError(
                f"{out} is in use by another run ({_describe_holder(info)}): two runs writing into one folder would "
                f"mix their files. Wait for it to finish, or use another --run name. If no such run is alive, delete "
                f"{path}."
            ) from None
        except OSError as e:  # a file system without locks (some network mounts)
            warnings.warn(f"Cannot lock {path} ({e}): a second run into {out} would not be detected.", RuntimeWarning,
                          stacklevel=2)
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released it (deleting the file) between our open and lock: retry
            f.close()
            continue
        f.seek(0)
        old = f.read().strip()
        if old:
            info = _read_lock_info(path)
            alive = isinstance(info, dict) and info.get("host") == socket.gethostname() and _pid_alive(info.get("pid"))
            warnings.warn(
                f"Taking over the lock {path} left by a run that is no longer running ({_describe_holder(info)}"
                + ("; that pid is now another process" if alive else "") + "): it was interrupted, and this run "
                "resumes its work.", RuntimeWarning, stacklevel=2)
        me = {"pid": os.getpid(), "host": socket.gethostname(), **_run_identity(),
              "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "argv": [pathlib.Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []}
        f.seek(0)
        f.truncate()
        f.write(json.dumps(me) + "\n")
        f.flush()
        _HELD[key] = [f, 1]
        return path
    raise RunLockedError(f"Could not lock {path}: other processes keep taking it.")


def release_run_lock(out: str | os.PathLike) -> None:
    """Release this process's lock on the run folder ``out`` (the outermost release deletes ``run.lock``)."""
    out = pathlib.Path(out)
    key = _lock_key(out)
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] > 0:
        return
    del _HELD[key]
    f = held[0]
    try:
        os.unlink(out / LOCK_FILE)  # before unlocking: a waiting process then sees the file gone and retries
    except FileNotFoundError:
        pass
    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    f.close()


def releases_run_locks(fn: Callable) -> Callable:
    """Decorate a driver's ``run``: the run locks it takes (:func:`open_run`) are released when it returns or raises."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = {k: v[1] for k, v in _HELD.items()}
        try:
            return fn(*args, **kwargs)
        finally:
            for key, held in list(_HELD.items()):
                for _ in range(held[1] - before.get(key, 0)):
                    release_run_lock(pathlib.Path(key).parent)

    return wrapper


def open_run(experiment: str, run: str | None = None, *, root: str | os.PathLike = "results",
             config: Any = None) -> pathlib.Path:
    """Create ``root/experiment/run``, lock it, and (given ``config``) write or check its ``config.json``.

    The first thing a driver's ``run`` does: a second run into the same folder is
    refused here, before it writes anything (:func:`acquire_run_lock`), and a rerun
    with a changed config is refused before any work (:func:`check_run_config`).
    Decorate ``run`` with :func:`releases_run_locks`.

    In a run of N processes (``funsim launch``, SLURM, a TPU pod) every process
    calls it: process 0 takes the lock and writes or checks ``config.json`` for
    all of them, the others take no lock of their own and wait to hear that it
    did (a collective), so that every process refuses together. The processes
    then write only their own units, and process 0 the shared files.

    Raises:
      RunLockedError: another live run holds the folder (in every process of a multi-process run).
      SetupMismatchError: (a ``ValueError``) the folder holds a run with another config.
    """
    out = results_dir(experiment, run, root=root)
    count, index = _processes()
    if count == 1:
        count, index = _launched_processes()
        if count > 1 and index > 0:  # processes that do not join JAX's runtime: no collective to agree with
            _wait_for_the_first_process(out, count)
            return out
        _lock_and_check(out, config)
        return out
    # N processes of one run write into one folder: process 0 holds the lock (and
    # writes or checks config.json) for all of them; the others join once it has.
    # Every process learns whether it did, so all refuse together, none writes alone.
    error = None
    if index == 0:
        try:
            _lock_and_check(out, config)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others have been told
            error = e
    ok = distributed.all_agree(error is None)
    if error is not None:
        raise error
    if not ok[0]:
        raise RunLockedError(f"{out}: process 0 of this {count}-process run could not open the run folder (it is "
                             "in use by another run, or holds a run with another config); process 0's error says "
                             "which and the fix. Nothing was written.")
    return out


def _processes() -> tuple[int, int]:
    """``(process count, process index)`` of a multi-process JAX run, ``(1, 0)`` otherwise."""
    if not distributed.is_initialized():
        return 1, 0
    return distributed.process_count(), distributed.process_index()


def _launched_processes() -> tuple[int, int]:
    """``(count, index)`` from ``funsim launch``'s variables, for a driver that splits its units over the
    processes without joining JAX's runtime (the zoo); ``(1, 0)`` otherwise."""
    return distributed.process_count(), distributed.process_index()


def _run_identity() -> dict:
    """What tells the processes of one launched run apart from another run's: the coordinator's address."""
    run = os.environ.get("FUNSIM_COORDINATOR") or (
        f"slurm:{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}" if "SLURM_JOB_ID" in os.environ
        else None)
    return {"launch": run} if run else {}


def _wait_for_the_first_process(out: pathlib.Path, count: int) -> None:
    """Process ``i > 0`` of a launched run: wait until process 0 of the same run holds the folder's lock."""
    path, me = out / LOCK_FILE, _run_identity()
    limit = distributed.INIT_TIMEOUT_S
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        info = _read_lock_info(path) if path.is_file() else None
        if isinstance(info, dict) and me and info.get("launch") == me.get("launch"):
            return
        time.sleep(0.2)
    info = _read_lock_info(path) if path.is_file() else None
    raise RunLockedError(f"{out}: process 0 of this {count}-process run did not take the run folder's lock within "
                         f"{limit} s" + (f"; it is held by another run ({_describe_holder(info)})" if info else "")
                         + ". Process 0's error says why; nothing was written by this process.")


def _lock_and_check(out: pathlib.Path, config: Any) -> None:
    acquire_run_lock(out)
    if config is not None:
        try:
            check_run_config(out, config)
        except BaseException:
            release_run_lock(out)
            raise


# ----------------------------------------------------------------------------- result files


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
