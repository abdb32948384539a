"""Layers and buckets: the grid's checked inputs, padded into one stack per side.

The shape policy: every layer of a side is zero-padded (on the host, so that no
program is compiled per width) to one width, and the number of layers to one
count, both rounded up the ladder :func:`bucket` (1, 2, 3, 4, 6, 8, 12, 16, 24,
32, 48, ...: at most 1.5x per axis). A grid then compiles the same few programs
whatever mix of widths it holds, and another grid whose sizes fall in the same
buckets compiles nothing. Padded layers repeat the last real one; their results
are dropped. Every measure's core is exact under zero padding (its layer sees the
real width as data), so the values are those of the unpadded layers to rounding.

``buckets=False`` groups the layers by their exact widths instead (no padding,
one program per pair of widths): for a user-registered measure that reads its
input's width (its ``moments`` or ``stats`` are not exact under padding).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from funsim.similarity import _validate as V
from funsim.similarity._ladder import bucket

SIDE_NAMES = {"a": "reps_a", "b": "reps_b"}


class Group(NamedTuple):
    """Layers of one side computed together, zero-padded to one ``width``.

    Attributes:
      width: the padded width ``W``.
      idx: the real layers (indices into their side).
      pidx: ``idx`` with the last one repeated up to the padded count (dummy layers, dropped).
      widths: ``(len(pidx),)`` the real width of each layer of ``pidx``.
    """

    width: int
    idx: tuple
    pidx: tuple
    widths: np.ndarray

    def mask(self, dtype) -> np.ndarray:
        """``(len(pidx), width)``: 1 on each layer's real features, 0 on its padding."""
        return (np.arange(self.width)[None, :] < self.widths[:, None]).astype(dtype)


class Layers(NamedTuple):
    """The checked inputs of one grid.

    Attributes:
      rows, cols: the layer names of ``reps_a`` and ``reps_b``.
      va, vb: the layers, ``(n, d_k)`` arrays (NumPy, memmaps or JAX arrays).
      n: the number of samples.
      dtype: the compute dtype of every layer.
      same: ``reps_b`` is ``reps_a`` (one side's work serves both).
      groups_a, groups_b: the side's :class:`Group` s.
    """

    rows: tuple
    cols: tuple
    va: list
    vb: list
    n: int
    dtype: Any
    same: bool
    groups_a: tuple
    groups_b: tuple

    def side(self, side: str) -> list:
        return self.va if side == "a" else self.vb

    def groups(self, side: str) -> tuple:
        return self.groups_a if side == "a" else self.groups_b

    def width(self, side: str, k: int) -> int:
        return int(self.side(side)[k].shape[1])

    def shape(self, side: str, k: int) -> tuple[int, int]:
        return (self.n, self.width(side, k))


def as_layers(reps, name) -> tuple[tuple, list]:
    if isinstance(reps, Mapping):
        keys, vals = tuple(reps.keys()), list(reps.values())
    elif isinstance(reps, Sequence) and not isinstance(reps, (str, bytes)):
        keys, vals = tuple(range(len(reps))), list(reps)
    else:
        raise TypeError(f"{name} must be a dict or a list of (n, d) arrays, got {type(reps).__name__}.")
    if not vals:
        raise ValueError(f"{name} is empty; pass at least one layer.")
    return keys, vals


def global_layers(reps_a, reps_b) -> list[tuple[str, int, Any]]:
    """``(side name, index, layer)`` of every layer spread over several processes (not fully addressable)."""
    out = []
    for name, reps in (("reps_a", reps_a), ("reps_b", reps_b)):
        if reps is None:
            continue
        for k, z in enumerate(as_layers(reps, name)[1]):
            if isinstance(z, jax.Array) and not z.is_fully_addressable:
                out.append((name, k, z))
    return out


def _check_layer(z, name: str):
    """Shape and dtype (values are checked as the stacks are built, or inside the passes when streaming)."""
    if isinstance(z, (list, tuple)):
        z = np.asarray(z)
    if not hasattr(z, "shape") or not hasattr(z, "dtype"):
        raise TypeError(f"{name} must be an array (numpy or jax), got {type(z).__name__}.")
    if len(z.shape) != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got {tuple(z.shape)}.")
    V.compute_dtype(z.dtype, name)  # complex or non-numeric: TypeError
    if z.shape[0] < 2 or z.shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(z.shape)}; it needs at least 2 samples and 1 feature.")
    return z


#: At most this many width groups per side (each pair of groups is one compiled program per measure kind).
MAX_GROUPS = 3
#: A second or third group is used only where padding everything to the widest costs more than this multiple
#: of the least padded arithmetic ...
PAD_COST = 2.0
#: ... and more than this much in absolute terms (the sum of the cubes of the padded widths, about the flops
#: of one SVD per layer: 1e9 is a fraction of a second of arithmetic on a CPU, less than one compile).
PAD_FLOOR = 1e9


def _cost(widths: list[int]) -> float:
    """The arithmetic of a group padded to the bucket of its widest layer, relative units: per-pair work
    (an SVD, a solve) grows as the cube of the width."""
    return len(widths) * float(bucket(max(widths))) ** 3


def partition(widths: list[int], *, max_groups: int | None = None, pad_cost: float | None = None,
              pad_floor: float | None = None) -> list[list[int]]:
    """Split layers (their indices) into the fewest groups of contiguous widths whose padded arithmetic is
    within ``pad_cost`` of every layer padded only to its own bucket, or below ``pad_floor``; at most
    ``max_groups`` (then the cheapest split).

    One group is the rule (one program for every width): compiling a program costs more than the padded
    arithmetic of moderate widths on any device. More groups only separate layers whose widths are far
    apart and large (e.g. 10 and 2,048 features), where padding the narrow ones costs more than a compile.

    Examples:
      >>> partition([64, 96, 128, 200, 64, 96, 128, 200])  # all padded to 256: cheap enough for one program
      [[0, 4, 1, 5, 2, 6, 3, 7]]
      >>> partition([10, 10, 10, 10, 2048, 2048])
      [[0, 1, 2, 3], [4, 5]]
    """
    max_groups = MAX_GROUPS if max_groups is None else max_groups  # the module's settings, read per call
    pad_cost = PAD_COST if pad_cost is None else pad_cost
    pad_floor = PAD_FLOOR if pad_floor is None else pad_floor
    order = sorted(range(len(widths)), key=lambda k: widths[k])
    ws = [widths[k] for k in order]
    m = len(ws)
    bound = max(pad_cost * sum(float(bucket(w)) ** 3 for w in ws), pad_floor)
    ends = [i for i in range(1, m) if ws[i] != ws[i - 1]] + [m]  # groups end between distinct widths
    inf = float("inf")
    best: list[dict] = [{0: (0.0, [])}]  # best[g][i]: the cheapest split of ws[:i] into g groups
    for g in range(1, max_groups + 1):
        layer = {}
        for e in ends:
            for s0, (c0, path) in best[g - 1].items():
                if s0 < e:
                    c = c0 + _cost(ws[s0:e])
                    if c < layer.get(e, (inf,))[0]:
                        layer[e] = (c, path + [e])
        best.append(layer)
        if m in layer and layer[m][0] <= bound:
            break
    found = [g for g in range(1, len(best)) if m in best[g]]
    within = [g for g in found if best[g][m][0] <= bound]
    g = within[0] if within else min(found, key=lambda k: best[k][m][0])
    bounds = [0] + best[g][m][1]
    return [[order[i] for i in range(lo, hi)] for lo, hi in zip(bounds[:-1], bounds[1:])]


def make_groups(vs, *, buckets: bool) -> tuple[Group, ...]:
    """The layers padded into a few groups (:func:`partition`, ``buckets``), or one group per exact width."""
    widths = [int(z.shape[1]) for z in vs]
    if buckets:
        parts = [(bucket(max(widths[k] for k in p)), p) for p in partition(widths)]
    else:
        by: dict[int, list[int]] = {}
        for k, d in enumerate(widths):
            by.setdefault(d, []).append(k)
        parts = list(by.items())
    out = []
    for w, idx in parts:
        count = bucket(len(idx)) if buckets else len(idx)
        pidx = tuple(idx) + (idx[-1],) * (count - len(idx))
        out.append(Group(w, tuple(idx), pidx, np.array([widths[k] for k in pidx], np.int32)))
    return tuple(out)


def prepare(reps_a, reps_b, *, buckets: bool) -> Layers:
    """Check the layers' shapes, dtypes and sample counts, and group them (no values are read)."""
    rows, va = as_layers(reps_a, "reps_a")
    same = reps_b is None or reps_b is reps_a
    cols, vb = (rows, va) if same else as_layers(reps_b, "reps_b")
    va = [_check_layer(z, f"reps_a[{k}]") for k, z in enumerate(va)]
    vb = va if same else [_check_layer(z, f"reps_b[{k}]") for k, z in enumerate(vb)]
    n = va[0].shape[0]
    for nm, vs in (("reps_a", va), ("reps_b", vb)):
        for k, z in enumerate(vs):
            if z.shape[0] != n:
                raise ValueError(
                    f"every layer must hold the same samples: reps_a[0] has n={n} but "
                    f"{nm}[{k}] has shape {tuple(z.shape)}."
                )
    dt = functools.reduce(jnp.promote_types, [V.compute_dtype(z.dtype, "reps") for z in va + vb])
    if dt == jnp.dtype(jnp.float64) and not jax.config.jax_enable_x64:
        V.warn_float64_without_x64("reps")
        dt = jnp.dtype(jnp.float32)
    ga = make_groups(va, buckets=buckets)
    gb = ga if same else make_groups(vb, buckets=buckets)
    return Layers(rows, cols, va, vb, n, dt, same, ga, gb)


def _host_rows(z, lo: int, hi: int, dtype) -> np.ndarray:
    """Rows ``lo:hi`` of a layer as a host array of ``dtype`` (a slice of a memmap reads only those rows)."""
    part = z if (lo, hi) == (0, z.shape[0]) else z[lo:hi]
    return np.asarray(part, dtype=dtype)


def host_stack(lay: Layers, side: str, g: Group, lo: int = 0, hi: int | None = None, rows: int | None = None
               ) -> np.ndarray:
    """``(len(g.pidx), rows, g.width)``: rows ``lo:hi`` of the group's layers, zero-padded, on the host.

    Each layer is read once (a padded repeat copies the real one); NaN/Inf raise, naming the layer.
    ``rows`` pads the row axis with zero rows (a short last chunk).
    """
    hi = lay.n if hi is None else hi
    rows = hi - lo if rows is None else rows
    out = np.zeros((len(g.pidx), rows, g.width), dtype=lay.dtype)
    vs = lay.side(side)
    first = {}
    for slot, k in enumerate(g.pidx):
        if k in first:
            out[slot] = out[first[k]]
            continue
        first[k] = slot
        block = _host_rows(vs[k], lo, hi, lay.dtype)
        if not np.all(np.isfinite(block)):  # counted in the whole layer, and named
            V.check_finite(np.asarray(vs[k]), f"{SIDE_NAMES[side]}[{k}]")
        out[slot, : hi - lo, : block.shape[1]] = block
    return out


@functools.partial(jax.jit, static_argnums=1)
def _pad_columns(z, width: int):
    return jnp.pad(z, ((0, 0), (0, width - z.shape[1])))


@jax.jit
def _stack(zs):
    return jnp.stack(zs)


def global_stack(lay: Layers, side: str, g: Group, dtype) -> jax.Array:
    """The group's layers stacked ``(L, n, W)`` where they are spread over processes (rows sharded):
    padded in place (one small program per width) and stacked in one program."""
    vs = lay.side(side)
    zs = []
    for k in g.pidx:
        z = _rows_sharded(vs[k])
        z = z.astype(dtype) if z.dtype != dtype else z
        zs.append(_pad_columns(z, g.width) if z.shape[1] < g.width else z)
    return _stack(tuple(zs))


def _rows_sharded(z: jax.Array) -> jax.Array:
    """``z`` with its feature axis whole on every device (its row sharding kept): a layer sharded over
    its features (a tensor-parallel layer's ``PartitionSpec(None, "d")``) is resharded first, since
    the padded width need not divide over the devices that held its features."""
    sharding = getattr(z, "sharding", None)
    if isinstance(sharding, NamedSharding) and len(sharding.spec) > 1 and sharding.spec[1] is not None:
        z = jax.device_put(z, NamedSharding(sharding.mesh, PartitionSpec(sharding.spec[0])))
    return z
