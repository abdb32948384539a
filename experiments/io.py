"""Results on disk: ``results/<experiment>/<run>/`` directories, their configs and locks.

* **Files.** The atomic writers and the readers that name a damaged file (JSON, ``.npz``,
  tables with a manifest: :func:`write_table_atomic`, :func:`verify_table`) live in
  :mod:`funsim.models.io` and are re-exported here.
* **Configs.** Read by :mod:`funsim.experiments.config`; its :class:`ConfigError` is re-exported here.
* **Runs.** :func:`open_run` creates ``root/experiment/run``, takes its lock
  (:func:`acquire_run_lock`: a second run into the same folder is refused before it
  writes anything) and, given a config, refuses a rerun with a changed config
  (:func:`check_run_config`, the one such check of the drivers). A driver's ``run``
  is decorated with :func:`releases_run_locks`, which releases the lock when it
  returns or raises.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import json
import os
import pathlib
import socket
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from funsim.experiments.config import ConfigError
from funsim.models.io import (
    DamagedFileError,
    SetupMismatchError,
    check_setup,
    fingerprint,
    read_json,
    read_npz,
    setup_diff,
    table_manifest_path,
    to_jsonable,
    verify_table,
    write_atomic,
    write_json_atomic,
    write_table_atomic,
    write_text_atomic,
)
from funsim.runtime import distributed

__all__ = ["to_jsonable", "write_atomic", "write_json_atomic", "write_text_atomic", "read_json", "results_dir",
           "ConfigError", "check_run_config",
           "RunLockedError", "LOCK_FILE", "acquire_run_lock", "release_run_lock", "releases_run_locks", "open_run",
           "DamagedFileError", "SetupMismatchError", "fingerprint", "setup_diff", "read_npz", "table_manifest_path",
           "write_table_atomic", "verify_table"]


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
