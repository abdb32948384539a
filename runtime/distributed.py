"""One process or many: the multi-process set-up every driver calls first.

JAX's multi-controller runtime runs one Python process per host (or per
accelerator), all executing the same program; ``jax.distributed.initialize``
connects them, after which ``jax.devices()`` lists every process's devices and a
jitted computation over a global mesh spans all of them. :func:`initialize` is
the one call a driver makes, before any other JAX call, to join such a run:

* started by ``funsim launch -n N``: the launcher sets :data:`ENV_COORDINATOR`,
  :data:`ENV_NUM_PROCESSES` and :data:`ENV_PROCESS_ID` (and a loopback bind
  address); :func:`initialize` passes them to ``jax.distributed.initialize``;
* on a SLURM job step (``srun``) or a Cloud TPU pod slice, with
  ``FUNSIM_DISTRIBUTED=1`` in the environment: ``jax.distributed.initialize()``
  with no arguments (JAX reads the cluster's own environment);
* otherwise (one process): nothing happens, and the driver runs as before.

On the CPU the processes exchange data through gloo
(``jax_cpu_collectives_implementation="gloo"``), which :func:`initialize` turns on.

A process that dies is noticed by the others through the coordination
service's heartbeats: after ``heartbeat_timeout_s`` seconds without one the
survivors stop with an error naming the missing task, instead of waiting
forever in a collective. ``funsim launch`` also stops the other processes as
soon as one exits with an error.

:func:`is_main_process` (process 0) is the one that shows progress bars and
writes shared files; :func:`log_prefix` labels each process's log lines.

See ``docs/distributed.md`` for the commands (``funsim launch``, ``srun``,
``gcloud compute tpus tpu-vm ssh --worker=all``).
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from funsim.runtime.processes import (
    ENV_BIND_ADDRESS,
    ENV_CLUSTER,
    ENV_COORDINATOR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_INIT_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_SHUTDOWN_TIMEOUT,
    ENV_WAIT_TIMEOUT,
    HEARTBEAT_TIMEOUT_S,
    INIT_TIMEOUT_S,
    SHUTDOWN_TIMEOUT_S,
    WAIT_TIMEOUT_S,
    Setup,
    env_int,
    setup_from_env,
)

__all__ = [
    "ENV_COORDINATOR",
    "ENV_BIND_ADDRESS",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_HEARTBEAT_TIMEOUT",
    "ENV_INIT_TIMEOUT",
    "ENV_SHUTDOWN_TIMEOUT",
    "ENV_CLUSTER",
    "HEARTBEAT_TIMEOUT_S",
    "INIT_TIMEOUT_S",
    "SHUTDOWN_TIMEOUT_S",
    "Setup",
    "setup_from_env",
    "initialize",
    "is_initialized",
    "process_index",
    "process_count",
    "is_main_process",
    "log_prefix",
    "show_progress",
    "rows_across_processes",
    "ENV_WAIT_TIMEOUT",
    "WAIT_TIMEOUT_S",
    "my_units",
    "owner",
    "wait_for_files",
    "barrier",
    "all_agree",
]

def initialize(env: Mapping[str, str] | None = None) -> Setup:
    """Join the multi-process run this process belongs to, or do nothing for a single process.

    Call it once, first thing, before any other JAX call (JAX fixes its device
    list on first use). A second call is a no-op. On the CPU it turns on gloo
    collectives, so that jitted programs over the global mesh work across processes.
    In a multi-process run an uncaught exception ends the process at once
    (status 1) instead of waiting at JAX's shutdown barrier for the others, so
    that they stop too.

    Args:
      env: the environment to read (default ``os.environ``); see :func:`setup_from_env`.

    Returns:
      The :class:`Setup` that was applied.

    Raises:
      ValueError: inconsistent environment variables.
      RuntimeError: (from JAX) JAX computed something before this call, or the
        other processes did not connect within ``init_timeout_s``.
    """
    setup = setup_from_env(env)
    if setup.mode == "single" or jax.distributed.is_initialized():
        return setup
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = dict(initialization_timeout=setup.init_timeout_s,
                    heartbeat_timeout_seconds=setup.heartbeat_timeout_s,
                    shutdown_timeout_seconds=setup.shutdown_timeout_s)
    _exit_at_once_on_uncaught_exceptions()
    if setup.mode == "explicit":
        jax.distributed.initialize(coordinator_address=setup.coordinator, num_processes=setup.num_processes,
                                   process_id=setup.process_id, coordinator_bind_address=setup.bind_address,
                                   **timeouts)
    else:
        jax.distributed.initialize(**timeouts)
    return setup


def _exit_at_once_on_uncaught_exceptions() -> None:
    """After an uncaught exception, print it and end the process at once.

    At exit JAX waits at a shutdown barrier until every process gets there (up to
    ``shutdown_timeout_s``): a process that crashed would sit there while the
    others keep computing, and neither ``funsim launch`` nor the others would
    notice. Ending it at once (status 1; 130 for Ctrl-C) lets the launcher stop
    the others and the coordination service tell them that a process died.
    Results are written atomically, so nothing half-written is left behind.
    """
    previous = sys.excepthook
    if getattr(previous, "_funsim_exits_at_once", False):
        return

    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
            print(f"{log_prefix()}funsim: this process failed with {kind.__name__}; ending it now so that the "
                  "other processes of the run stop too.", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    hook._funsim_exits_at_once = True
    sys.excepthook = hook


def is_initialized() -> bool:
    """Whether this process has joined a multi-process run (``jax.distributed.is_initialized()``)."""
    return jax.distributed.is_initialized()


def process_index() -> int:
    """This process's index: ``jax.process_index()`` after :func:`initialize`, else :data:`ENV_PROCESS_ID` or 0.

    Before :func:`initialize` it reads the environment instead of JAX, so that
    logging early does not fix JAX's device list.
    """
    if jax.distributed.is_initialized():
        return jax.process_index()
    return env_int(os.environ, ENV_PROCESS_ID, 0, minimum=0)


def process_count() -> int:
    """The number of processes: ``jax.process_count()`` after :func:`initialize`, else the environment's or 1."""
    if jax.distributed.is_initialized():
        return jax.process_count()
    return env_int(os.environ, ENV_NUM_PROCESSES, 1, minimum=1)


def is_main_process() -> bool:
    """True on process 0 (and in a single-process run): the process that shows progress and writes shared files."""
    return process_index() == 0


def log_prefix() -> str:
    """``"[p<i>/<N>] "`` in a multi-process run, ``""`` in a single process: put it before each log line.

    Examples:
      >>> log_prefix()
      ''
    """
    n = process_count()
    return f"[p{process_index()}/{n}] " if n > 1 else ""


def show_progress(requested: bool = True) -> bool:
    """Whether to show a progress bar: ``requested`` and this is the main process.

    Examples:
      >>> show_progress(True), show_progress(False)
      (True, False)
    """
    return bool(requested) and is_main_process()


_MAX_NDIM = 8


def rows_across_processes(local: Any, /) -> Any:
    """One global array from each process's own rows: process 0's rows first, then process 1's, ...

    For a process that holds only its share of the samples: pass the result to
    :func:`funsim.similarity.compare_grid` (moment measures only). Each layer's
    means and second moments are summed across processes by XLA's collectives;
    the cross moments of layer pairs gather each chunk of rows onto every device
    (``chunk_size`` bounds it). In a single process it is the rows themselves,
    on the default device.

    Args:
      local: ``(n_local, ...)`` this process's rows (numpy or jax). Every process
        must pass the same number of rows, a multiple of its number of local
        devices, with the same trailing shape and dtype.

    Returns:
      ``(n_local * process_count(), ...)`` ``jax.Array`` sharded on its first
      axis over every device (ordered by process).

    Raises:
      ValueError: the processes' shapes differ or do not divide over the local
        devices (the message lists every process's shape and the fix).
    """
    local = np.asarray(local)
    if not 1 <= local.ndim <= _MAX_NDIM:
        raise ValueError(f"local must have 1 to {_MAX_NDIM} axes (rows first), got shape {local.shape}.")
    if jax.process_count() == 1:
        return jax.numpy.asarray(local)
    # A fixed-size description of every process's array, exchanged first: the
    # data exchange itself needs identical shapes and would fail obscurely otherwise.
    desc = np.zeros(_MAX_NDIM + 2, np.int64)
    desc[0], desc[1] = local.ndim, np.dtype(local.dtype).num
    desc[2:2 + local.ndim] = local.shape
    every = np.asarray(multihost_utils.process_allgather(desc)).reshape(jax.process_count(), -1)
    shapes = [tuple(int(v) for v in row[2:2 + row[0]]) for row in every]
    if any((row != every[0]).any() for row in every):
        names = {np.dtype(t).num: np.dtype(t).name for t in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                                             "uint16", "uint32", "uint64", "float16", "float32",
                                                             "float64", "complex64", "complex128")}
        listed = ", ".join(f"process {i}: {sh} {names.get(int(row[1]), 'dtype #' + str(int(row[1])))}"
                           for i, (sh, row) in enumerate(zip(shapes, every)))
        raise ValueError(f"rows_across_processes needs the same shape and dtype in every process; got {listed}. "
                         "Give every process the same number of rows (drop or pad the remainder) with the same "
                         "features and dtype.")
    ndev = jax.local_device_count()
    if local.shape[0] % ndev:
        raise ValueError(f"rows_across_processes: {local.shape[0]} rows per process do not divide over this "
                         f"process's {ndev} local devices; use a multiple of {ndev} rows per process.")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    sharding = NamedSharding(Mesh(np.array(devices), ("rows",)), PartitionSpec("rows"))
    return jax.make_array_from_process_local_data(sharding, local,
                                                  (local.shape[0] * jax.process_count(), *local.shape[1:]))


# ----------------------------------------------------------------------------- units of work


def owner(k: int, count: int | None = None) -> int:
    """The process that does unit ``k`` of a driver's unit list: ``k mod process_count()`` (round robin).

    Examples:
      >>> [owner(k, 3) for k in range(7)]
      [0, 1, 2, 0, 1, 2, 0]
    """
    return int(k) % (process_count() if count is None else int(count))


def my_units(units, /, index: int | None = None, count: int | None = None) -> list:
    """This process's share of ``units``: every unit ``k`` with ``owner(k) == process_index()``.

    Deterministic: every process computes the same unit list (in the same
    order) and takes its own share, so no process talks to another to split
    the work, and a rerun with another number of processes splits it afresh.

    Examples:
      >>> my_units(["a", "b", "c", "d", "e"], index=1, count=2)
      ['b', 'd']
      >>> my_units(["a", "b"])          # one process: everything
      ['a', 'b']
    """
    index = process_index() if index is None else int(index)
    count = process_count() if count is None else int(count)
    if not 0 <= index < count:
        raise ValueError(f"index={index} must be in 0 .. count - 1 = {count - 1}.")
    return [u for k, u in enumerate(units) if k % count == index]


def wait_for_files(paths, /, *, what: str, done=None, timeout_s: float | None = None, poll_s: float = 0.5,
                   log=None) -> None:
    """Wait until every file in ``paths`` is written (by this or another process of the run).

    The bound is on progress, not on the total: a :class:`TimeoutError` comes
    when no new file has appeared for ``timeout_s`` seconds (default
    :data:`ENV_WAIT_TIMEOUT` or :data:`WAIT_TIMEOUT_S`); its message lists the
    missing files. A process that dies is noticed sooner, by JAX's heartbeats.

    Args:
      paths: the files (``pathlib.Path``).
      what: what they are, for the messages (e.g. ``"zoo models"``).
      done: ``path -> bool`` (default: the file exists).
      timeout_s: seconds without progress before giving up.
      poll_s: seconds between looks.
      log: ``str -> None`` for one line while waiting (default: none).
    """
    paths = [pathlib.Path(p) for p in paths]
    done = done or (lambda p: p.is_file())
    if timeout_s is None:
        timeout_s = env_int(os.environ, ENV_WAIT_TIMEOUT, WAIT_TIMEOUT_S, minimum=1)
    missing = [p for p in paths if not done(p)]
    if missing and log is not None:
        log(f"waiting for {len(missing)} of {len(paths)} {what} from the other processes")
    last, t_last = len(missing), time.monotonic()
    while missing:
        if time.monotonic() - t_last > timeout_s:
            shown = ", ".join(str(p) for p in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                                               else "")
            raise TimeoutError(
                f"{log_prefix()}no new {what} for {timeout_s:g} s; still missing {len(missing)} of {len(paths)}: "
                f"{shown}. A process of the run is stuck or gone. Stop the run and rerun the same command (with any "
                f"number of processes): finished units are kept. ({ENV_WAIT_TIMEOUT} sets this bound.)")
        time.sleep(poll_s)
        missing = [p for p in missing if not done(p)]
        if len(missing) < last:
            last, t_last = len(missing), time.monotonic()


def barrier(name: str) -> None:
    """Wait until every process of the run gets here (nothing in a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def all_agree(ok: bool, /) -> list[bool]:
    """Every process's ``ok``, in process order (``[ok]`` in a single process); a collective: all must call it."""
    if jax.process_count() == 1:
        return [bool(ok)]
    every = multihost_utils.process_allgather(np.array([1 if ok else 0], np.int32))
    return [bool(v) for v in np.asarray(every).ravel()]
