"""The device plan: the pair axis sharded over a 1-D mesh of devices (every process's, after
``jax.distributed.initialize()``); layer statistics replicated. Results equal the one-device run."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class Plan(NamedTuple):
    mesh: Mesh | None
    ndev: int

    def sharding(self, *spec):
        return None if self.mesh is None else NamedSharding(self.mesh, P(*spec))


def make_plan(devices) -> Plan:
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) <= 1:
        return Plan(None, 1)
    return Plan(Mesh(np.array(devices), ("pairs",)), len(devices))


DEFAULT_STATS_BUDGET = 2.0 * 2**30
"""Bytes for one measure's per-layer statistics where the devices do not report their memory (the CPU)."""


def default_stats_budget(devices=None) -> float:
    """:func:`compare_grid`'s default ``stats_budget``: a quarter of the smallest free memory among
    ``devices`` (default ``jax.devices()``) where every one reports it (``memory_stats()`` on a GPU or TPU:
    ``bytes_limit - bytes_in_use``), else :data:`DEFAULT_STATS_BUDGET` (2 GiB; the CPU reports none).

    A quarter leaves room for the pair program's own work and the user's arrays: the grid keeps one measure's
    statistics at a time (the measures of the same per-layer function run one after the other). Across
    processes (``jax.distributed``), each reads its own devices and all take the least, so that every
    process computes the same blocks.

    Examples:
      >>> class Gpu:
      ...     def memory_stats(self):
      ...         return {"bytes_limit": 8 * 2**30, "bytes_in_use": 2**30}
      >>> default_stats_budget([Gpu()]) / 2**30
      1.75
    """
    devices = list(jax.devices() if devices is None else devices)
    local = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()]
    budget = _local_budget(local)
    # devices of several processes: every process must choose the same blocks (each decides this from the
    # same list, so all of them take part in the collective or none does)
    if len({getattr(d, "process_index", 0) for d in devices}) > 1:
        from jax.experimental import multihost_utils

        budget = float(np.min(multihost_utils.process_allgather(np.float64(budget))))
    return budget


def _local_budget(devices) -> float:
    """The budget from this process's devices (only these report their memory)."""
    free = []
    for d in devices:
        stats = d.memory_stats()
        if not stats or "bytes_limit" not in stats:
            return DEFAULT_STATS_BUDGET
        free.append(max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))))
    return min(free) / 4 if free else DEFAULT_STATS_BUDGET


def put_pairs(plan: Plan, *arrs):
    """Shard pair-axis arrays over the mesh (first axis), padding to a device multiple (repeats)."""
    out = []
    for a in arrs:
        a = np.asarray(a)
        if plan.mesh is not None:
            pad = (-a.shape[0]) % plan.ndev
            if pad:
                a = np.concatenate([a, np.repeat(a[-1:], pad, axis=0)])
            a = jax.device_put(a, plan.sharding("pairs"))
        out.append(a)
    return out


def replicate(plan: Plan, tree):
    """Inputs every process holds (equal values are checked across processes by ``device_put``)."""
    if plan.mesh is None:
        return tree
    return jax.device_put(tree, plan.sharding())


def replicate_computed(plan: Plan, tree):
    """Replicate values every process computed from the same checked inputs.

    Across processes, ``jax.device_put`` onto a global mesh first checks that every
    process passes equal values; NaN (the statistic of an undefined cell) never equals
    itself and fails that check, and so would last-bit differences between hosts. Each
    process places its own copy of what it derived instead.
    """
    if plan.mesh is None or jax.process_count() == 1:
        return replicate(plan, tree)
    sharding = plan.sharding()

    def place(t):
        if isinstance(t, jax.Array) and not t.is_fully_addressable:  # already global: reshard, no value check
            return jax.device_put(t, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(t), np.shape(t))

    return jax.tree.map(place, tree)


def to_host(x) -> np.ndarray:
    """A (possibly global) array as a NumPy array in every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def tree_to_host(tree):
    return jax.tree.map(to_host, tree)
