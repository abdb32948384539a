"""The environment of a multi-process run: its variables, timeouts and :func:`setup_from_env`.

``funsim launch`` sets these variables for each process it starts, and
:func:`funsim.runtime.distributed.initialize` reads them to join the run. This
module imports no JAX, so that the launcher (and ``funsim launch --help``) stays light;
``funsim.runtime.distributed`` re-exports every name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = ["ENV_COORDINATOR", "ENV_BIND_ADDRESS", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID", "ENV_HEARTBEAT_TIMEOUT",
           "ENV_INIT_TIMEOUT", "ENV_SHUTDOWN_TIMEOUT", "ENV_WAIT_TIMEOUT", "ENV_CLUSTER", "HEARTBEAT_TIMEOUT_S",
           "INIT_TIMEOUT_S", "SHUTDOWN_TIMEOUT_S", "WAIT_TIMEOUT_S", "Setup", "env_int", "setup_from_env"]

ENV_COORDINATOR = "FUNSIM_COORDINATOR"
"""``host:port`` of process 0's coordination service (set by ``funsim launch``)."""
ENV_BIND_ADDRESS = "FUNSIM_COORDINATOR_BIND"
"""``host:port`` process 0's coordination service binds to (default: the coordinator's own address)."""
ENV_NUM_PROCESSES = "FUNSIM_NUM_PROCESSES"
"""The number of processes of the run."""
ENV_PROCESS_ID = "FUNSIM_PROCESS_ID"
"""This process's index, ``0 .. N - 1``."""
ENV_HEARTBEAT_TIMEOUT = "FUNSIM_HEARTBEAT_TIMEOUT"
"""Seconds without a heartbeat after which a process counts as dead (default :data:`HEARTBEAT_TIMEOUT_S`)."""
ENV_INIT_TIMEOUT = "FUNSIM_INIT_TIMEOUT"
"""Seconds to wait for every process to connect (default :data:`INIT_TIMEOUT_S`)."""
ENV_SHUTDOWN_TIMEOUT = "FUNSIM_SHUTDOWN_TIMEOUT"
"""Seconds a finished process waits at exit for the others to finish (default :data:`SHUTDOWN_TIMEOUT_S`)."""
ENV_WAIT_TIMEOUT = "FUNSIM_WAIT_TIMEOUT"
"""Seconds a process waits for the other processes' unit files without any new one appearing (default :data:`WAIT_TIMEOUT_S`)."""
ENV_CLUSTER = "FUNSIM_DISTRIBUTED"
"""``1``: call ``jax.distributed.initialize()`` with no arguments (SLURM, Cloud TPU pods)."""

# JAX's defaults are 100 s (heartbeat) and 300 s (connect, shutdown). The
# heartbeat bound is how long the survivors of a dead process wait before they
# stop; a minute is long enough for a busy host to keep sending heartbeats.
HEARTBEAT_TIMEOUT_S = 60
INIT_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 300
# How long the processes of a driver wait for each other's units (zoo models,
# study pairs) with no new unit appearing: a backstop for a process that hangs
# (a dead one is noticed within the heartbeat timeout). One unit can be a long
# training run on a cluster, so the default is generous.
WAIT_TIMEOUT_S = 6 * 3600

_TRUE = {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """How this process joins a run, as read from the environment.

    Attributes:
      mode: ``"single"`` (one process, nothing to do), ``"explicit"``
        (coordinator, count and index given, e.g. by ``funsim launch``) or
        ``"cluster"`` (``jax.distributed.initialize()`` detects them).
      coordinator: ``host:port`` of the coordination service (``"explicit"`` only).
      bind_address: ``host:port`` the service binds to on process 0 (``"explicit"`` only).
      num_processes, process_id: the run's size and this process's index (``"explicit"`` only).
      heartbeat_timeout_s, init_timeout_s, shutdown_timeout_s: the coordination timeouts in seconds.
    """

    mode: str
    coordinator: str | None = None
    bind_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S
    init_timeout_s: int = INIT_TIMEOUT_S
    shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S


def env_int(env: Mapping[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    """``env[name]`` as an integer >= ``minimum``, or ``default`` when it is unset or empty.

    Raises:
      ValueError: not an integer, or below ``minimum`` (the message names the variable).
    """
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; set it to an integer "
                         f">= {minimum} or unset it.") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={value} must be >= {minimum}.")
    return value


def setup_from_env(env: Mapping[str, str] | None = None) -> Setup:
    """Read how this process joins a run from ``env`` (default ``os.environ``); no side effects.

    Raises:
      ValueError: an incomplete or inconsistent set of variables (the message names them and the fix).

    Examples:
      >>> setup_from_env({}).mode
      'single'
      >>> s = setup_from_env({"FUNSIM_COORDINATOR": "127.0.0.1:4000", "FUNSIM_NUM_PROCESSES": "2",
      ...                     "FUNSIM_PROCESS_ID": "1"})
      >>> s.mode, s.num_processes, s.process_id, s.bind_address
      ('explicit', 2, 1, '127.0.0.1:4000')
      >>> setup_from_env({"FUNSIM_DISTRIBUTED": "1"}).mode
      'cluster'
    """
    env = os.environ if env is None else env
    timeouts = dict(
        heartbeat_timeout_s=env_int(env, ENV_HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_S, minimum=1),
        init_timeout_s=env_int(env, ENV_INIT_TIMEOUT, INIT_TIMEOUT_S, minimum=1),
        shutdown_timeout_s=env_int(env, ENV_SHUTDOWN_TIMEOUT, SHUTDOWN_TIMEOUT_S, minimum=1),
    )
    explicit = {k: env.get(k) for k in (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)}
    given = [k for k, v in explicit.items() if v]
    if given:
        missing = [k for k, v in explicit.items() if not v]
        if missing:
            raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} not: a multi-process run needs all "
                             f"three of {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} (funsim launch "
                             "sets them), or none.")
        coord = explicit[ENV_COORDINATOR]
        host, sep, port = coord.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{ENV_COORDINATOR}={coord!r} must be host:port, e.g. 127.0.0.1:12345.")
        n = env_int(env, ENV_NUM_PROCESSES, None, minimum=1)
        i = env_int(env, ENV_PROCESS_ID, None, minimum=0)
        if i >= n:
            raise ValueError(f"{ENV_PROCESS_ID}={i} must be below {ENV_NUM_PROCESSES}={n}.")
        if env.get(ENV_CLUSTER, "").lower() in _TRUE:
            raise ValueError(f"both {ENV_COORDINATOR} and {ENV_CLUSTER} are set; set the coordinator variables "
                             f"(funsim launch) or {ENV_CLUSTER}=1 (SLURM, Cloud TPU), not both.")
        return Setup("explicit", coord, env.get(ENV_BIND_ADDRESS) or coord, n, i, **timeouts)
    flag = env.get(ENV_CLUSTER, "").lower()
    if flag in _TRUE:
        return Setup("cluster", **timeouts)
    if flag not in ("", "0", "false", "no", "off"):
        raise ValueError(f"{ENV_CLUSTER}={env[ENV_CLUSTER]!r}: use 1 (join the cluster's run) or 0.")
    return Setup("single", **timeouts)
