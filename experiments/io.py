"""Results on disk: ``results/<experiment>/<run>/`` directories, their configs and locks.

* **Files.** The atomic writers and the readers that name a damaged file (JSON, ``.npz``,
  tables with a manifest: :func:`write_table_atomic`, :func:`verify_table`) live in
  :mod:`funsim.models.io` and are re-exported here.
* **Configs.** Read by :mod:`funsim.experiments.config`; its :class:`ConfigError` is re-exported here.
* **Runs.** :func:`open_run` creates ``root/experiment/run``, takes its lock
  (:func:`acquire_run_lock`, from :mod:`funsim.runtime.locks`: a second run into the same
  folder is refused before it writes anything) and, given a config, refuses a rerun with a changed config
  (:func:`check_run_config`, the one such check of the drivers). A driver's ``run``
  is decorated with :func:`releases_run_locks`, which releases the lock when it
  returns or raises.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
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
from funsim.runtime.locks import (
    LOCK_FILE,
    RunLockedError,
    acquire_run_lock,
    release_run_lock,
    releases_run_locks,
    wait_for_lock_holder,
)

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
            wait_for_lock_holder(out, count)
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


def _lock_and_check(out: pathlib.Path, config: Any) -> None:
    acquire_run_lock(out)
    if config is not None:
        try:
            check_run_config(out, config)
        except BaseException:
            release_run_lock(out)
            raise
