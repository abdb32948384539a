"""Run folders locked for one writing process: a second run into the same folder is refused (no JAX).

:func:`acquire_run_lock` takes an OS lock (``flock``) on ``FOLDER/run.lock`` and writes who holds it
(pid, host, start time, command, and the launched run it belongs to: :func:`run_identity`); it ends
with the process however that ends, and a lock left by a killed process is taken over with a warning.
:func:`releases_run_locks` decorates a function so that the locks it takes are released when it returns
or raises. The drivers take them through ``funsim.experiments.io.open_run``; a user's own script that
writes one folder from several launches can take them too.
"""

from __future__ import annotations

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

from funsim.runtime.processes import INIT_TIMEOUT_S

__all__ = ["LOCK_FILE", "RunLockedError", "acquire_run_lock", "release_run_lock", "releases_run_locks",
           "run_identity", "wait_for_lock_holder"]

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
        me = {"pid": os.getpid(), "host": socket.gethostname(), **run_identity(),
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


def run_identity() -> dict:
    """What tells the processes of one launched run apart from another run's: the coordinator's address."""
    run = os.environ.get("FUNSIM_COORDINATOR") or (
        f"slurm:{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}" if "SLURM_JOB_ID" in os.environ
        else None)
    return {"launch": run} if run else {}


def wait_for_lock_holder(out: pathlib.Path, count: int) -> None:
    """Process ``i > 0`` of a launched run of ``count`` processes: wait until process 0 of the same run
    (:func:`run_identity`) holds the folder's lock.

    Raises:
      RunLockedError: it did not within ``INIT_TIMEOUT_S``, or another run holds it.
    """
    path, me = out / LOCK_FILE, run_identity()
    limit = INIT_TIMEOUT_S
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
