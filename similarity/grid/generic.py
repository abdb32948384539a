"""Generic measures: each measure's compiled core (:class:`similarity.protocol.Core`) over every pair.

Per side, one program runs ``core.layer`` over the side's padded stack of layers
(``lax.map``: an RDM, a kernel matrix or a basis per layer), computed once per
layer and shared by every measure with the same layer function and options; one
program runs ``core.pair`` over all pairs (``lax.map`` over pair indices, sharded
over devices). When every layer's statistics together exceed ``stats_budget``
(e.g. ``n x n`` RDMs for large ``n``), they are computed a block of layers at a
time (a block of each side fits in the budget), and the pair program runs per
pair of blocks. A block spans width groups where the statistics have one shape at
every width (an RDM), and a side with itself holds each pair of blocks once,
computing its pairs in both orders; when not even one layer per side fits, the
pair program computes both sides' statistics per pair. A symmetric measure of a
side with itself computes each unordered pair of layers once and mirrors it
(:func:`_mirror`: the mirrored cells are computed where a value is undefined,
whose reason names its arguments in order).

A measure registered without a core (a user's ``fn``, or ``stats=LayerStats``) is
run through an adapter at its exact widths (one group per width): its code was not
written for zero padding. Such a measure has no reasons of its own: a constant layer
is undefined with a generic reason, and any other non-finite value is an error that
names the cell (register the measure with a core to name its undefined cells).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity import _validate as V
from funsim.similarity.grid import layers as L
from funsim.similarity.grid.devices import Plan, put_pairs, replicate, replicate_computed, tree_to_host
from funsim.similarity.grid.undefined import Table
from funsim.similarity.protocol import Core

# ----------------------------------------------------------------------------- adapters


def no_reason(measure_name: str):
    """The reasons of a measure registered without a core: a constant layer (which every measure refuses).
    Any other non-finite value has no reason, and the grid reports it as an error in the measure."""

    def reason(flags, shape_x, shape_y, opts):
        if flags is None:
            return None
        return V.pair_constant_reason(flags, shape_x, shape_y, what=f"measure {measure_name!r}")

    return reason


def _stats_layer(stats, z, width, opts):
    return stats.layer(z), V.rep_flags(z)


def _stats_pair(stats, sx, sy, opts):
    (ax, fx), (ay, fy) = sx, sy
    value = stats.pair(ax, ay)
    return value, {"x": fx, "y": fy, "result": jnp.isfinite(value)}


def _fn_layer(z, width, opts):
    return z, V.rep_flags(z)


def _fn_pair(fn, sx, sy, opts):
    (x, fx), (y, fy) = sx, sy
    value = fn(x, y)
    return value, {"x": fx, "y": fy, "result": jnp.isfinite(value)}


@functools.lru_cache(maxsize=None)
def _adapter(measure) -> Core:
    if measure.stats is not None:
        return Core(functools.partial(_stats_layer, measure.stats), functools.partial(_stats_pair, measure.stats),
                    no_reason(measure.name))
    return Core(_fn_layer, functools.partial(_fn_pair, measure.fn), no_reason(measure.name))


def core_of(measure) -> tuple[Core, bool]:
    """``(core, padded)``: the measure's own core (exact under zero padding), or an adapter (exact widths)."""
    if measure.core is not None:
        return measure.core, True
    return _adapter(measure), False


# ----------------------------------------------------------------------------- programs


@functools.lru_cache(maxsize=None)
def _layers_jit(layer):
    """``layer`` on each layer of a stack ``(L, n, W)`` (``lax.map``), once per function and shape."""
    return jax.jit(lambda z, widths, opts: jax.lax.map(lambda zw: layer(zw[0], zw[1], opts), (z, widths)))


@functools.lru_cache(maxsize=None)
def _pairs_jit(pair):
    """``pair(sa[i], sb[j])`` for every index pair, ``lax.map`` (not ``vmap``: a generic measure works on
    ``(n, d)``-sized statistics, and vmapping it over every pair would hold all pairs' intermediates)."""

    def run(sa, sb, ia, jb, opts):
        return jax.lax.map(lambda ij: pair(_pick(sa, ij[0]), _pick(sb, ij[1]), opts), (ia, jb))

    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _raw_pairs_jit(layer, pair):
    """Both sides' statistics computed per pair (when all layers' statistics would not fit in memory)."""

    def run(za, wa, zb, wb, ia, jb, opts):
        def one(ij):
            i, j = ij
            return pair(layer(za[i], wa[i], opts), layer(zb[j], wb[j], opts), opts)

        return jax.lax.map(one, (ia, jb))

    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _fill_jit(layer):
    """``layer`` on the layers ``idx[:m]`` of a stack ``(L, n, W)``, written into the slots ``dest[:m]`` of a
    block's statistics ``buf`` (donated: filled in place). ``idx``, ``dest`` are ``(B,)``, padded; one program
    per function, stack shape and block size (the stack is passed whole, never sliced)."""

    def fill(buf, z, widths, idx, dest, m, opts):
        def one(k, buf):
            st = layer(z[idx[k]], widths[idx[k]], opts)
            return jax.tree.map(lambda b, t: jax.lax.dynamic_update_index_in_dim(b, t.astype(b.dtype), dest[k], 0),
                                buf, st)

        return jax.lax.fori_loop(0, m, one, buf)

    return jax.jit(fill, donate_argnums=0)


@functools.lru_cache(maxsize=None)
def _zeros_jit(treedef, leaves: tuple, sharding):
    """A block's statistics, zeros: ``leaves`` are ``(shape, dtype)``, made on the devices (not on the host)."""
    return jax.jit(lambda: jax.tree.unflatten(treedef, [jnp.zeros(s, d) for s, d in leaves]),
                   out_shardings=sharding)


def _pick(tree, k):
    return jax.tree.map(lambda t: t[k], tree)


def _stats_shapes(core: Core, n: int, width: int, dtype):
    """One layer's statistics: a pytree of ``jax.ShapeDtypeStruct`` (nothing is computed)."""
    opts = tuple(jax.ShapeDtypeStruct((), dtype) for _ in core.opts)
    return jax.eval_shape(core.layer, jax.ShapeDtypeStruct((n, width), dtype), jax.ShapeDtypeStruct((), jnp.int32),
                          opts)


def _stats_bytes(core: Core, n: int, width: int, count: int, dtype) -> int:
    shapes = _stats_shapes(core, n, width, dtype)
    return count * sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(shapes))


class Stacks:
    """Each group's padded layers ``(L, n, W)`` on the devices, built once per call (on the host: no program
    is compiled per width), and the real widths ``(L,)``."""

    def __init__(self, lay: L.Layers, plan: Plan):
        self.lay, self.plan, self._cache = lay, plan, {}

    def __call__(self, side: str, g: L.Group):
        if self.lay.same:
            side = "a"
        key = (side, g.width, g.pidx)
        if key not in self._cache:
            if L.global_layers(*((self.lay.va, None) if side == "a" else (self.lay.vb, None))):
                z = L.global_stack(self.lay, side, g, self.lay.dtype)
            else:
                z = replicate(self.plan, jax.device_put(L.host_stack(self.lay, side, g)))
            self._cache[key] = (z, replicate(self.plan, np.asarray(g.widths, np.int32)))
        return self._cache[key]


def _positions(m: int, k: int, upper: bool) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(ia, jb)`` of every pair of ``m`` and ``k`` items; ``upper``: only ``ia <= jb``."""
    ia, jb = (g.ravel() for g in np.meshgrid(np.arange(m), np.arange(k), indexing="ij"))
    return (ia[ia <= jb], jb[ia <= jb]) if upper else (ia, jb)


def _pair_index(ga: L.Group, gb: L.Group, plan: Plan, buckets: bool, upper: bool = False
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Positions ``(ia, jb)`` of every real pair of two groups (``upper``: of a group with itself, each
    unordered pair once), padded (repeats) to a bucket of pairs."""
    ia, jb = _positions(len(ga.idx), len(gb.idx), upper)
    count = len(ia)
    size = L.bucket(count) if buckets else count
    size += (-size) % plan.ndev
    pad = size - count
    return np.concatenate([ia, np.repeat(ia[-1:], pad)]), np.concatenate([jb, np.repeat(jb[-1:], pad)]), count


def block_size(core: Core, lay: L.Layers, groups: dict, stats_budget: float) -> int:
    """Layers per block when every layer's statistics together exceed ``stats_budget``: the most such that a
    block of each side fits in it (0: they all fit; 1: not even one layer per side, so per pair)."""
    sides = "a" if lay.same else "ab"  # one grid of a side with itself keeps one copy of each layer's statistics
    per = [_stats_bytes(core, lay.n, g.width, 1, lay.dtype) for s in sides for g in groups[s]]
    counts = [len(g.pidx) for s in sides for g in groups[s]]
    if sum(b * c for b, c in zip(per, counts)) <= stats_budget:
        return 0
    return max(1, int(stats_budget // (2 * max(per))))


class Block(NamedTuple):
    """Up to ``slots`` layers of one side whose statistics have one shape, computed together.

    Attributes:
      leaves: ``((shape, dtype), ...)`` of the block's statistics (leading axis ``slots``); ``treedef`` their
        structure.
      segments: ``((group, positions), ...)``: the block's layers, by the group whose stack holds them.
      layers: ``(real,)`` each real slot's layer (its index into the side), in slot order.
    """

    treedef: Any
    leaves: tuple
    slots: int
    segments: tuple
    layers: np.ndarray


def side_blocks(core: Core, lay: L.Layers, groups, size: int) -> list[Block]:
    """A side's layers in blocks of at most ``size``: consecutive layers of the groups whose statistics have
    one shape. Statistics that do not depend on the width (an RDM: ``n (n - 1) / 2`` numbers) have one
    shape in every group, so their blocks span groups; a basis ``(n, W)`` has one per group."""
    classes: dict = {}
    for g in groups:
        shapes = _stats_shapes(core, lay.n, g.width, lay.dtype)
        leaves, treedef = jax.tree.flatten(shapes)
        key = (treedef, tuple((a.shape, a.dtype) for a in leaves))
        classes.setdefault(key, []).append(g)
    out = []
    for (treedef, leaves), gs in classes.items():
        items = [(g, p) for g in gs for p in range(len(g.idx))]
        slots = min(size, L.bucket(len(items)))  # a small class is one block of its bucketed count
        for start in range(0, len(items), slots):
            chunk = items[start:start + slots]
            segments: list = []
            for g, p in chunk:
                if segments and segments[-1][0] is g:
                    segments[-1][1].append(p)
                else:
                    segments.append((g, [p]))
            out.append(Block(treedef, tuple(((slots, *shape), dtype) for shape, dtype in leaves), slots,
                             tuple((g, np.asarray(ps, np.int32)) for g, ps in segments),
                             np.asarray([g.idx[p] for g, p in chunk], np.int64)))
    return out


def _block_stats(core: Core, opts, block: Block, side: str, *, plan: Plan, stacks: Stacks):
    """A block's statistics, its slots filled a group's segment at a time."""
    buf = _zeros_jit(block.treedef, block.leaves, plan.sharding())()
    offset = 0
    for g, pos in block.segments:
        z, w = stacks(side, g)
        pad = block.slots - len(pos)
        idx = np.concatenate([pos, np.zeros(pad, np.int32)])
        dest = np.concatenate([np.arange(offset, offset + len(pos), dtype=np.int32), np.zeros(pad, np.int32)])
        buf = _fill_jit(core.layer)(buf, z, w, *replicate(plan, (idx, dest, np.int32(len(pos)))), opts)
        offset += len(pos)
    return replicate_computed(plan, buf)


def _blocked_pairs(core: Core, opts, groups_a, groups_b, size: int, *, plan: Plan, stacks: Stacks,
                   directions: tuple[str, ...], same: bool, triangle: bool = False):
    """Every pair of the layers of ``groups_a`` and ``groups_b``, ``size`` layers of each side at a time
    (:func:`side_blocks`): each block of side a computed once, each block of side b once per block of a.
    ``same`` (a side with itself): a block against itself reuses its statistics, and the pairs of two
    different blocks are computed in both orders while both are held, so each pair of blocks is held once;
    with ``triangle`` (a symmetric measure) each unordered pair is computed once (:func:`_mirror`).
    Yields ``(direction, rows, cols, (values, flags))``."""
    blocks_a = side_blocks(core, stacks.lay, groups_a, size)
    blocks_b = blocks_a if same else side_blocks(core, stacks.lay, groups_b, size)
    for i, ba in enumerate(blocks_a):
        sa = _block_stats(core, opts, ba, "a", plan=plan, stacks=stacks)
        for j, bb in enumerate(blocks_b):
            if same and j < i:
                continue  # computed with block j in both orders
            sb = sa if same and j == i else _block_stats(core, opts, bb, "b", plan=plan, stacks=stacks)
            if triangle:
                yield from _block_pair(core, opts, ba, sa, bb, sb, plan=plan, directions=directions,
                                       upper=j == i, mirror=True)
                continue
            orders = [(ba, sa, bb, sb)] + ([(bb, sb, ba, sa)] if same and j > i else [])
            for (b1, s1, b2, s2) in orders:
                yield from _block_pair(core, opts, b1, s1, b2, s2, plan=plan, directions=directions)


def _block_pair(core: Core, opts, b1: Block, s1, b2: Block, s2, *, plan: Plan, directions, upper: bool = False,
                mirror: bool = False):
    """Every pair of a block of side a (``b1``, its statistics ``s1``) and one of side b, by direction
    (``upper``, ``mirror``: a block with itself, each unordered pair once, and the mirrored cells; see
    :func:`_mirror`)."""
    ia, jb = _positions(len(b1.layers), len(b2.layers), upper)
    count = len(ia)
    pad = L.bucket(count) - count
    ia, jb = np.concatenate([ia, np.repeat(ia[-1:], pad)]), np.concatenate([jb, np.repeat(jb[-1:], pad)])
    ia_d, jb_d = put_pairs(plan, ia, jb)  # padded to a multiple of the devices
    rows, cols = b1.layers[ia[:count]], b2.layers[jb[:count]]

    def run(d):
        args = (s1, s2, ia_d, jb_d) if d == "fwd" else (s2, s1, jb_d, ia_d)
        value, flags = tree_to_host(_pairs_jit(core.pair)(*args, opts))
        return value[:count], jax.tree.map(lambda a: a[:count], flags)

    for d in directions:
        res = run(d)
        yield d, rows, cols, res
        if mirror:
            yield d, cols, rows, _mirror(res, run)


def _mirror(res, run):
    """The mirrored cells' ``(values, flags)`` of a symmetric measure on a side with itself: cell ``(j, i)``
    is ``measure(A_j, A_i) = measure(A_i, A_j)``, so its value is cell ``(i, j)``'s, and so are its flags where
    they are not read (every value finite: the flags of a finite cell without a static reason are never read,
    :func:`.undefined.settle`). Where a value is not finite its flags give the reason, which may name the
    arguments in order, so then the mirrored cells are computed (``run("rev")``: ``measure(B_j, A_i)``)."""
    return res if np.isfinite(res[0]).all() else run("rev")


def _layer_key(core: Core) -> tuple:
    """What a layer's statistics depend on besides the layer: the core's layer function and options."""
    return core.layer, tuple(map(float, core.opts))


def by_statistics(measures: list) -> list:
    """``[(name, measure), ...]`` reordered (stably) so that the measures that share per-layer statistics
    (:func:`_layer_key`: the shape metrics' angular and Euclidean forms of one alpha) come one after another,
    in the order of their first appearance: with :func:`evict`, one measure's statistics are held at a time."""
    order: dict = {}
    for name, m in measures:
        order.setdefault(_layer_key(core_of(m)[0]), []).append((name, m))
    return [item for items in order.values() for item in items]


def evict(stats_cache: dict, keep) -> None:
    """Drop the cached per-layer statistics that none of the measures ``keep`` uses (in place)."""
    needed = {_layer_key(core_of(m)[0]) for m in keep}
    for key in [k for k in stats_cache if k[:2] not in needed]:
        del stats_cache[key]


def generic_table(lay: L.Layers, measure, *, directions: tuple[str, ...], plan: Plan, stats_budget: float,
                  stacks: Stacks, stats_cache: dict) -> dict[str, Table]:
    """One measure's tables by direction: ``"fwd"`` (``measure(A_i, B_j)``) and/or ``"rev"``
    (``measure(B_j, A_i)``, indexed ``[i, j]`` too).

    Per-layer statistics are computed once per layer when all of them fit in ``stats_budget``, else once
    per block of the other side's layers (:func:`block_size`, :func:`side_blocks`; a side with itself: a
    block's once for itself and once more for each earlier block), else (not one layer per side fits) per
    pair. A symmetric measure of a side with itself computes each unordered pair once (:func:`_mirror`)."""
    core, padded = core_of(measure)
    groups = {s: lay.groups(s) if padded else L.make_groups(lay.side(s), buckets=False) for s in "ab"}
    # a symmetric measure of a side with itself: each unordered pair once, the other cells mirrored (_mirror)
    triangle = lay.same and measure.symmetric and directions == ("fwd",)
    opts = tuple(np.asarray(o, lay.dtype) for o in core.opts)
    size = block_size(core, lay, groups, stats_budget)
    per_layer = size == 0
    stats = {}
    if per_layer:
        for s in "ab":
            for g in groups[s]:
                key = (*_layer_key(core), "a" if lay.same else s, g.width, g.pidx)
                if key not in stats_cache:
                    z, w = stacks(s, g)
                    stats_cache[key] = replicate_computed(plan, _layers_jit(core.layer)(z, w, opts))
                stats[s, g.width, g.pidx] = stats_cache[key]
    shape = (len(lay.va), len(lay.vb))
    values = {d: np.full(shape, np.nan, lay.dtype) for d in directions}
    parts: dict[str, list] = {d: [] for d in directions}
    if size > 1:
        for d, rows, cols, (value, flags) in _blocked_pairs(core, opts, groups["a"], groups["b"], size, plan=plan,
                                                            stacks=stacks, directions=directions, same=lay.same,
                                                            triangle=triangle):
            values[d][rows, cols] = value
            parts[d].append((rows, cols, flags))
        return {d: Table(values[d], _assemble(parts[d], shape)) for d in directions}
    for k, ga in enumerate(groups["a"]):
        for m, gb in enumerate(groups["b"]):
            if triangle and m < k:
                continue  # the mirror of group pair (m, k)
            ia, jb, count = _pair_index(ga, gb, plan, padded, upper=triangle and m == k)
            ia_d, jb_d = put_pairs(plan, ia, jb)
            rows, cols = np.asarray(ga.idx)[ia[:count]], np.asarray(gb.idx)[jb[:count]]

            def run(d, ga=ga, gb=gb, ia_d=ia_d, jb_d=jb_d, count=count):
                src, tgt, i_src, j_tgt = (("a", ga), ("b", gb), ia_d, jb_d) if d == "fwd" else \
                    (("b", gb), ("a", ga), jb_d, ia_d)
                if per_layer:
                    res = _pairs_jit(core.pair)(stats[src[0], src[1].width, src[1].pidx],
                                                stats[tgt[0], tgt[1].width, tgt[1].pidx], i_src, j_tgt, opts)
                else:
                    (za, wa), (zb, wb) = stacks(*src), stacks(*tgt)
                    res = _raw_pairs_jit(core.layer, core.pair)(za, wa, zb, wb, i_src, j_tgt, opts)
                value, flags = tree_to_host(res)
                return value[:count], jax.tree.map(lambda a: a[:count], flags)

            for d in directions:
                cells = [(rows, cols, run(d))]
                if triangle:
                    cells.append((cols, rows, _mirror(cells[0][2], run)))
                for r, c, (value, flags) in cells:
                    values[d][r, c] = value
                    parts[d].append((r, c, flags))
    return {d: Table(values[d], _assemble(parts[d], shape)) for d in directions}


def _assemble(parts: list, shape) -> Any:
    """Per-group flags ``(rows, cols, pytree of (pairs,))`` into one pytree of ``(La, Lb)`` host arrays."""
    tree = None
    for rows, cols, flags in parts:
        if tree is None:
            tree = jax.tree.map(lambda a: np.zeros(shape, np.asarray(a).dtype), flags)
        jax.tree.map(lambda t, a: t.__setitem__((rows, cols), a), tree, flags)
    return tree
