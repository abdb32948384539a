"""A function of every listed pair of one stack, over the device plan: ``pair(tree[i], tree[j])``.

For pair lists that are not a grid of two sides' layers, e.g. the upper triangle of a
checkpoint x checkpoint matrix (:func:`similarity.checkpoints.tensor_matrices`). The list
is sharded over the plan's 1-D ``"pairs"`` mesh (:func:`.devices.make_plan`: by default
every device of every process, as :func:`similarity.compare_grid`); each device maps its
share in batches (``lax.map``: a pair's intermediates, not all pairs', are held at once)
and every process gets every value, equal to one device's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from funsim.similarity.grid.devices import Plan, put_pairs, replicate, to_host

__all__ = ["PAIR_BATCH", "map_pairs"]

#: Pairs each device evaluates at once (the ``lax.map`` batch).
PAIR_BATCH = 8


@functools.lru_cache(maxsize=32)
def _program(mesh, pair: Callable, batch_size: int):
    """One compiled program per (mesh, pair function, batch): each device maps its share of the pairs."""

    def local(tree, ii, jj):
        def one(ij):
            return pair(*(jax.tree.map(lambda x: x[k], tree) for k in ij))

        return jax.lax.map(one, (ii, jj), batch_size=batch_size)

    if mesh is None:
        return jax.jit(local)
    # check_vma=False: a pair function may scan with a replicated carry (tensor_inner's), which the
    # varying-axes check refuses although each device's values are its own pairs'
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("pairs"), P("pairs")), out_specs=P("pairs"),
                                 check_vma=False))


def map_pairs(plan: Plan, pair: Callable, tree, ii, jj, /, *, batch_size: int = PAIR_BATCH) -> np.ndarray:
    """``pair(tree[i], tree[j])`` for every ``(i, j)`` of ``zip(ii, jj)``, the list sharded over ``plan``'s devices.

    Args:
      plan: the device plan (:func:`.devices.make_plan`); without a mesh (one device) one compiled call.
      pair: ``(item_a, item_b) -> (o,)`` array, jit-able. Pass the same function object for the
        same computation (its program is cached by identity).
      tree: a pytree whose leaves have a leading item axis ``(n, ...)``; every process passes the same values.
      ii, jj: ``(p,)`` int item indices of the pairs.
      batch_size: pairs each device evaluates at once.

    Returns:
      ``(p, o)`` NumPy array, in every process.
    """
    count = len(ii)
    ii, jj = put_pairs(plan, np.asarray(ii, np.int32), np.asarray(jj, np.int32))  # padded to a device multiple
    tree = replicate(plan, jax.tree.map(np.asarray, tree))
    return to_host(_program(plan.mesh, pair, int(batch_size))(tree, ii, jj))[:count]
