"""Run a test function in N real local processes of one JAX multi-process run.

:func:`run_in_processes` starts N Python processes on this machine with
``funsim.runtime.launcher.run_processes`` (a fresh loopback port, the
``FUNSIM_*`` variables). Each process runs this module as ``__main__``:

1. ``funsim.runtime.distributed.initialize()`` (gloo collectives on the CPU,
   the coordination service bound to 127.0.0.1), then the test suite's strict
   JAX settings (x64 as in the parent, rank promotion raises);
2. the given module-level function, ``fn(*args, **kwargs)``, which returns a
   dict of arrays (or strings) or None;
3. the dict saved atomically as ``result_<i>.npz`` in a fresh folder.

The parent returns the N dicts in process order. Anything else (a process that
exits with an error, one that does not write its result, the hard timeout) raises
:class:`MultiprocessError` naming the process, with every status and each failing
process's last output lines. A process that exits with an error makes the
launcher stop the others at once; on the timeout all are stopped (SIGTERM, then
SIGKILL). Each child also stops itself when its parent dies or when its own
deadline (the timeout plus a margin) passes, so a crashed test run leaves no
process behind.

The function must live in an importable module under the repository (a test
module is fine: it is imported as ``tests.<name>``) and must not touch JAX
at import time (JAX fixes its devices on first use, before ``initialize``).
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# The machine is shared and loaded: starting N processes, importing JAX and
# compiling can take minutes. Bounded, never open-ended.
DEFAULT_TIMEOUT_S = 300.0
CHILD_MARGIN_S = 60.0  # a child's own deadline is the timeout plus this


class MultiprocessError(AssertionError):
    """A multi-process run did not finish cleanly; the message says which process and why."""


def _module_name(fn: Callable) -> tuple[str, str]:
    """``(importable module, qualified name)`` of a module-level function under the repository."""
    if not callable(fn) or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        raise TypeError(f"fn must be a module-level function (the child imports it by name), got {fn!r}.")
    path = Path(inspect.getfile(fn)).resolve()
    try:
        rel = path.relative_to(REPO).with_suffix("")
    except ValueError:
        raise TypeError(f"fn {fn.__qualname__} lives in {path}, outside the repository {REPO}.") from None
    return ".".join(rel.parts), fn.__qualname__


def launch_processes(fn: Callable, num_processes: int, *args, workdir: str | os.PathLike | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S, cpu_devices: int | None = None,
                     heartbeat_timeout_s: int | None = None, stop_on_failure: bool = True,
                     on_start=None, grace_s: float = 10.0, **kwargs):
    """Start the processes and wait for them; returns ``(LaunchResult, result folder)``, never raises for a failure.

    For tests that expect a failure (a killed process); :func:`run_in_processes` is the usual entry point.
    """
    from funsim.runtime.launcher import run_processes

    module, qualname = _module_name(fn)
    out = Path(tempfile.mkdtemp(prefix="mp-", dir=workdir))
    with open(out / "call.pkl", "wb") as f:
        pickle.dump((args, kwargs), f)
    import jax

    config = {"x64": bool(jax.config.jax_enable_x64), "deadline": time.time() + timeout_s + CHILD_MARGIN_S,
              "parent": os.getpid()}
    argv = [sys.executable, "-m", "tests._multiprocess", module, qualname, str(out), json.dumps(config)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("JAX_PLATFORMS", "cpu")
    res = run_processes(argv, num_processes, env=env, cwd=REPO, cpu_devices=cpu_devices,
                        heartbeat_timeout_s=heartbeat_timeout_s, timeout_s=timeout_s, grace_s=grace_s,
                        stop_on_failure=stop_on_failure, on_start=on_start)
    return res, out


def run_in_processes(fn: Callable, num_processes: int, *args, workdir: str | os.PathLike | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S, cpu_devices: int | None = None,
                     heartbeat_timeout_s: int | None = None, **kwargs) -> list[dict]:
    """``fn(*args, **kwargs)`` in each of ``num_processes`` processes of one run; their results, in process order.

    Args:
      fn: a module-level function returning ``{name: array}`` (or None).
      num_processes: how many processes (2 or 3 here; the machine has 2 cores).
      *args, **kwargs: picklable arguments, the same for every process (each
        can read ``jax.process_index()``).
      workdir: where to make the result folder (default: the system's temp dir).
      timeout_s: hard limit for the whole run, start-up included.
      cpu_devices: CPU devices per process (default one).
      heartbeat_timeout_s: how long a dead process goes unnoticed by the others.

    Raises:
      MultiprocessError: a process failed, did not write its result, or the run timed out.
    """
    res, out = launch_processes(fn, num_processes, *args, workdir=workdir, timeout_s=timeout_s,
                                cpu_devices=cpu_devices, heartbeat_timeout_s=heartbeat_timeout_s, **kwargs)
    name = f"{fn.__qualname__} on {num_processes} processes"
    if not res.ok:
        raise MultiprocessError(f"{name}: {res.describe(tail_lines=25)}")
    results = []
    for i in range(num_processes):
        path = out / f"result_{i}.npz"
        if not path.is_file():
            raise MultiprocessError(f"{name}: process {i} exited with 0 but wrote no {path.name}.\n"
                                    + res.describe(tail_lines=25))
        with np.load(path, allow_pickle=False) as z:
            results.append({k: z[k] for k in z.files})
    return results


# ----------------------------------------------------------------------------- child


def _watchdog(parent: int, deadline: float) -> None:
    """Stop this process when its parent is gone or its deadline has passed (no stragglers)."""
    while True:
        if os.getppid() != parent:
            os.write(2, b"_multiprocess: the parent process is gone; stopping.\n")
            os.kill(os.getpid(), signal.SIGKILL)
        if time.time() > deadline:
            os.write(2, b"_multiprocess: past this process's deadline; stopping.\n")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1.0)


def _save(path: Path, result: dict) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in result.items()})
    os.replace(tmp, path)


def _child(module: str, qualname: str, out: str, config: str) -> None:
    cfg = json.loads(config)
    # The launcher's process is the parent: the child lives in its own session, so check its pid.
    threading.Thread(target=_watchdog, args=(cfg["parent"], cfg["deadline"]), daemon=True).start()
    from funsim.runtime import distributed

    distributed.initialize()
    import importlib

    import jax

    jax.config.update("jax_enable_x64", cfg["x64"])
    jax.config.update("jax_numpy_rank_promotion", "raise")
    fn = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    with open(Path(out) / "call.pkl", "rb") as f:
        args, kwargs = pickle.load(f)
    result = fn(*args, **kwargs)
    _save(Path(out) / f"result_{jax.process_index()}.npz", result or {})


if __name__ == "__main__":
    _child(*sys.argv[1:5])
