"""All-pairs comparisons across layers and models: vmapped, streamed, sharded (docs/design.md §3).

:func:`compare_grid` takes two collections of layer representations of the
same samples and returns one ``(La, Lb)`` table per measure. It reads the
registry, and only the registry: ``tables[name][i, j] == measure(name)(A_i, B_j)``
for every key it returns, and with ``reverse=True``
``reverse[name][i, j] == measure(name)(B_j, A_i)``.

* **Moment measures** (``measure(name).moments``, a
  :class:`~similarity.MomentStats`; the built-in ones are listed in
  :data:`MOMENT_MEASURES`: linear CKA, NBS, Procrustes, the alpha = 1 shape
  metrics and every ``stitch/*`` reconstruction score). Every layer's
  centred, normalised second moments (all rows, or train and test rows) are
  computed once, the cross moments of all pairs of two width groups come out
  of one large matrix product, and each pair only adds its measures' finish
  step: an SVD, a triangular solve, shared by all the measures (and both
  directions) that need it. They stream samples in chunks and shard over devices.
* **Any other measure**: with per-layer statistics (``measure(name).stats``, a
  :class:`~similarity.LayerStats`: the RDM for RSA, the kernel matrix for CKA,
  a basis for the CCA family, an SVD for regression and PWCCA, the whitened
  data for the shape metrics) they are computed once per layer as long as
  they fit in ``stats_budget``; otherwise the measure is mapped over the pairs
  on the raw representations.
* **Batches by width.** Layers are grouped by width; the pairs of each
  ``(d_a, d_b)`` group are evaluated in one jit-compiled call, compiled once
  per shape and set of measures.
* **Size buckets.** So that a grid of another architecture reuses the compiled
  programs, sizes are padded up to the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24,
  32, 48, ... (at most 1.5x per axis): for the moment measures each layer is
  zero-padded to the bucket of its width (zero features leave every moment
  measure unchanged; see :class:`similarity.MomentStats`), and the layer
  count of every width group (so also the pair count) is padded with repeats
  whose results are dropped. The values equal the unpadded ones to rounding.
  The other measures keep their exact sizes: zero features would change an RDM
  or a CCA basis, so their programs depend on the widths anyway.
* **Sharding.** The pair axis is sharded over a 1-D ``jax.sharding.Mesh`` of
  the available devices (layer statistics are replicated), so the same call
  uses every GPU/TPU, or every host after ``jax.distributed.initialize()``;
  the results equal the single-device run.
* **Streaming.** With ``chunk_size``, samples are read in chunks of rows
  (numpy arrays or memmaps are fine; only one chunk per layer is on the device
  at a time), and the moments are accumulated in two passes (means, then
  centred moments); the answer equals the one-shot call up to rounding. Only
  the moment measures stream.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import stitching as S
from funsim.similarity._jit_memory import release_if_near_limit
from funsim.similarity._linalg import pow2_at
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import FullMoments, LayerMoments, MomentPair, PairMoments, split_weights
from funsim.similarity.registry import Measure, list_measures
from funsim.similarity.registry import measure as get_measure

MOMENT_MEASURES = tuple(n for n in list_measures() if get_measure(n).moments is not None)
"""The built-in moment measures (``measure(name).moments is not None``); any such measure streams."""


class GridResult(NamedTuple):
    """Tables of an all-pairs comparison.

    Attributes:
      tables: ``{name: (La, Lb) array}`` with ``tables[name][i, j] ==
        measure(name)(rows[i] layer, cols[j] layer)``.
      rows: names of the ``reps_a`` layers.
      cols: names of the ``reps_b`` layers.
      reverse: with ``reverse=True``, ``{name: (La, Lb) array}`` with
        ``reverse[name][i, j] == measure(name)(cols[j] layer, rows[i] layer)``
        (for a symmetric measure, the same array as ``tables[name]`` unless
        the two directions differ in where they are defined); else ``{}``.
      undefined: ``{name: {(i, j): reason}}`` for every measure: the cells of
        ``tables[name]`` where the pairwise call ``measure(name)(A_i, B_j)``
        raises a ``ValueError`` (they are NaN), with its message.
      reverse_undefined: the same for ``reverse`` (``(i, j)`` indexes
        ``reverse[name]``, i.e. the call ``measure(name)(B_j, A_i)``); ``{}``
        without ``reverse=True``.
    """

    tables: dict[str, jax.Array]
    rows: tuple
    cols: tuple
    reverse: dict[str, jax.Array]
    undefined: dict[str, dict[tuple[int, int], str]] = {}
    reverse_undefined: dict[str, dict[tuple[int, int], str]] = {}


class UndefinedCellWarning(UserWarning):
    """:func:`compare_grid` left cells undefined (NaN); the reasons are in ``GridResult.undefined``."""


# ----------------------------------------------------------------------------- layers


def _bucket(k: int) -> int:
    """The smallest size of the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (``2^m`` and ``3 * 2^m``) >= ``k``.

    Widths and layer counts are padded up to it, so that grids of different
    architectures share compiled programs; the padding costs at most 1.5x per axis.
    """
    if k <= 4:
        return k
    p = 1 << (k - 1).bit_length()
    return p * 3 // 4 if p * 3 // 4 >= k else p


class _Group(NamedTuple):
    """Layers computed together: padded to one ``width`` (zero features) and a bucketed count.

    ``idx`` are the real layers (indices into their side), ``pidx`` repeats the last
    one up to the count bucket (dummy layers, whose results are dropped), and
    ``widths`` are the real widths of ``pidx``.
    """

    width: int
    idx: tuple
    pidx: tuple
    widths: np.ndarray

    def mask(self, dtype) -> np.ndarray:
        """``(len(pidx), width)``: 1 on each layer's real features, 0 on its padding."""
        return (np.arange(self.width)[None, :] < self.widths[:, None]).astype(dtype)


def _groups(vs, *, buckets: bool) -> dict[int, _Group]:
    """Moment-measure groups by (bucketed) width, in order of first appearance."""
    by: dict[int, list[int]] = {}
    for k, z in enumerate(vs):
        d = int(z.shape[1])
        by.setdefault(_bucket(d) if buckets else d, []).append(k)
    out = {}
    for w, idx in by.items():
        pidx = tuple(idx) + (idx[-1],) * ((_bucket(len(idx)) if buckets else len(idx)) - len(idx))
        out[w] = _Group(w, tuple(idx), pidx, np.array([int(vs[k].shape[1]) for k in pidx]))
    return out


class _Layers(NamedTuple):
    """The checked inputs: ``va``/``vb`` lists of ``(n, d)`` arrays, grouped by width.

    ``groups_*``: exact width -> layer indices (the generic measures); ``mgroups_*``:
    (bucketed) width -> :class:`_Group` (the moment measures). ``cache``: padded
    device copies of whole layers, made once per call.
    """

    rows: tuple
    cols: tuple
    va: list
    vb: list
    groups_a: dict  # width -> layer indices
    groups_b: dict
    n: int
    dtype: Any
    mgroups_a: dict
    mgroups_b: dict
    buckets: bool
    cache: dict

    def side(self, side: str):
        return (self.va, self.groups_a) if side == "a" else (self.vb, self.groups_b)

    def mgroups(self, side: str) -> dict[int, _Group]:
        return self.mgroups_a if side == "a" else self.mgroups_b

    def pair_groups(self):
        """The ``(w_a, w_b)`` pairs of moment-measure groups."""
        return [(da, db) for da in self.mgroups_a for db in self.mgroups_b]

    def exact_pair_groups(self):
        """The ``(d_a, d_b)`` pairs of exact-width groups (the generic measures)."""
        return [(da, db) for da in self.groups_a for db in self.groups_b]



_SIDE_NAMES = {"a": "reps_a", "b": "reps_b"}


def _as_layers(reps, name) -> tuple[tuple, list]:
    if isinstance(reps, Mapping):
        keys, vals = tuple(reps.keys()), list(reps.values())
    elif isinstance(reps, Sequence) and not isinstance(reps, (str, bytes)):
        keys, vals = tuple(range(len(reps))), list(reps)
    else:
        raise TypeError(f"{name} must be a dict or a list of (n, d) arrays, got {type(reps).__name__}.")
    if not vals:
        raise ValueError(f"{name} is empty; pass at least one layer.")
    return keys, vals


def _check_layer_lazily(z, name, streaming):
    """Shape and dtype only; the moment passes check the values (host arrays stay where they are)."""
    if not streaming:  # to a float device array (ints and bools are cast), once
        z = V.as_float_array(z, name)
    if not hasattr(z, "shape") or len(z.shape) != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got {getattr(z, 'shape', type(z))}.")
    V.compute_dtype(z.dtype, name)  # complex or non-numeric: TypeError
    if z.shape[0] < 2 or z.shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(z.shape)}; it needs at least 2 samples and 1 feature.")
    return z


def _check_layers(vals, name, *, eager_values, streaming, strict):
    """Shape and dtype checks; with ``eager_values`` also NaN/Inf (and with ``strict`` constant layers)."""
    out = []
    for k, z in enumerate(vals):
        nm = f"{name}[{k}]"
        if eager_values:
            z = V.check_rep(z, nm)
            if strict:
                V.check_not_constant(z, nm, what="the comparison grid")
        else:
            z = _check_layer_lazily(z, nm, streaming)
        out.append(z)
    return out


def _width_groups(vs) -> dict[int, list[int]]:
    g: dict[int, list[int]] = {}
    for k, z in enumerate(vs):
        g.setdefault(int(z.shape[1]), []).append(k)
    return g


def _prepare(reps_a, reps_b, *, eager_values, streaming, strict, buckets) -> _Layers:
    rows, va = _as_layers(reps_a, "reps_a")
    cols, vb = _as_layers(reps_a if reps_b is None else reps_b, "reps_b")
    va = _check_layers(va, "reps_a", eager_values=eager_values, streaming=streaming, strict=strict)
    vb = _check_layers(vb, "reps_b", eager_values=eager_values, streaming=streaming, strict=strict)
    n = va[0].shape[0]
    for nm, vs in (("reps_a", va), ("reps_b", vb)):
        for k, z in enumerate(vs):
            if z.shape[0] != n:
                raise ValueError(
                    f"every layer must hold the same samples: reps_a[0] has n={n} but "
                    f"{nm}[{k}] has shape {tuple(z.shape)}."
                )
    dt = functools.reduce(jnp.promote_types, [V.compute_dtype(z.dtype, "reps") for z in va + vb])
    return _Layers(rows, cols, va, vb, _width_groups(va), _width_groups(vb), n, dt,
                   _groups(va, buckets=buckets), _groups(vb, buckets=buckets), buckets, {})


def _resolve(measures, *, streaming) -> tuple[list[tuple[str, Measure]], list[tuple[str, Measure]]]:
    """``(moment measures, other measures)`` as ``(name, Measure)``, in request order."""
    names = list(dict.fromkeys(measures))
    if not names:
        raise ValueError("measures is empty; e.g. measures=['cka/linear', 'stitch/affine'].")
    moment, generic = [], []
    for name in names:
        m = get_measure(name)
        (moment if m.moments is not None else generic).append((name, m))
    if streaming and generic:
        raise ValueError(
            f"measure {generic[0][0]!r} cannot stream samples in chunks; with chunk_size only moment "
            f"measures (measure(name).moments, e.g. {', '.join(MOMENT_MEASURES[:4])}, ...) are "
            "available. Drop chunk_size or the measure."
        )
    return moment, generic


# ----------------------------------------------------------------------------- devices


class _Plan(NamedTuple):
    mesh: Mesh | None
    ndev: int


def _make_plan(devices) -> _Plan:
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) <= 1:
        return _Plan(None, 1)
    return _Plan(Mesh(np.array(devices), ("pairs",)), len(devices))


def _put_pairs(plan: _Plan, *arrs):
    """Shard pair-axis arrays over the mesh (first axis), padding to a device multiple."""
    out = []
    for a in arrs:
        a = np.asarray(a)
        if plan.mesh is not None:
            pad = (-a.shape[0]) % plan.ndev
            if pad:
                a = np.concatenate([a, np.repeat(a[-1:], pad, axis=0)])
            a = jax.device_put(a, NamedSharding(plan.mesh, P("pairs")))
        out.append(a)
    return out


def _replicate(plan: _Plan, tree):
    if plan.mesh is None:
        return tree
    return jax.device_put(tree, NamedSharding(plan.mesh, P()))


def _replicate_computed(plan: _Plan, tree):
    """Replicate statistics that every process computed from the same checked inputs.

    Across processes, ``jax.device_put`` onto a global mesh first checks that
    every process passes equal values; NaN (the statistic of an undefined cell,
    e.g. a rank-deficient layer) never equals itself and fails that check, and
    so would last-bit differences between hosts. The inputs themselves still go
    through :func:`_replicate` and its check; each process places its own copy
    of what it derived from them.
    """
    if plan.mesh is None or jax.process_count() == 1:
        return _replicate(plan, tree)
    sharding = NamedSharding(plan.mesh, P())

    def place(t):
        if isinstance(t, jax.Array) and not t.is_fully_addressable:  # already global: reshard, no value check
            return jax.device_put(t, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(t), np.shape(t))

    return jax.tree.map(place, tree)


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def _pick(tree, k):
    return jax.tree.map(lambda t: t[k], tree)


# ----------------------------------------------------------------------------- undefined cells
#
# A cell is undefined where the pairwise call ``measure(name)(A_i, B_j)`` raises a
# ValueError. The grid does not run that call on every pair (it would be the pair
# loop again). It flags the layers where a measure can be undefined, cheaply and
# generously, from statistics it has anyway: near-constant layers, numerically
# rank-deficient ones (by NumPy's matrix_rank tolerance with a wide margin, on the
# train rows for the reconstruction scores) and layers with a sample constant across
# features, both only for the measures not declared robust to them
# (``Measure.robust_to``: defined there with one value), and sources a moment
# measure's own width check refuses. Every cell of a flagged layer, and every cell that comes out
# non-finite, is then computed by the pairwise call itself: its value, or NaN and
# its message. Flagging too much costs only pairwise calls; every other cell is
# the grid's own value.


class _Suspects:
    """Layers whose cells the pairwise call decides: ``layer[side]`` (near-constant layers) for every
    measure, ``kind[degeneracy][side]`` (:data:`similarity.DEGENERACIES`) for the measures not robust
    to it, ``source[name][side]`` for one measure with that side as the source."""

    def __init__(self, la: int, lb: int):
        self.layer = {"a": np.zeros(la, bool), "b": np.zeros(lb, bool)}
        self.kind: dict[str, dict[str, np.ndarray]] = {}
        self.source: dict[str, dict[str, np.ndarray]] = {}

    def flag(self, side: str, idx, bad, kind: str | None = None) -> None:
        flags = self.layer if kind is None else self.kind.setdefault(
            kind, {s: np.zeros_like(v) for s, v in self.layer.items()})
        flags[side][np.asarray(idx)[np.asarray(bad, bool)]] = True

    def flag_source(self, name: str, side: str, k: int) -> None:
        src = self.source.setdefault(name, {s: np.zeros_like(v) for s, v in self.layer.items()})
        src[side][k] = True

    def cells(self, name: str, src_side: str, robust_to=frozenset()) -> np.ndarray:
        """``(La, Lb)`` mask of the suspect cells of ``name`` whose source is ``src_side``."""
        bad_a, bad_b = self.layer["a"].copy(), self.layer["b"].copy()
        for kind, flags in self.kind.items():
            if kind not in robust_to:
                bad_a |= flags["a"]
                bad_b |= flags["b"]
        if name in self.source:
            (bad_a if src_side == "a" else bad_b)[:] |= self.source[name][src_side]
        return bad_a[:, None] | bad_b[None, :]


_CONST_TOL = 1e-6  # flag layers whose centred RMS is below this fraction of max(RMS of the values, 1)


def _near_constant(rms, scale, dtype) -> np.ndarray:
    """Generous constant-layer flags: a superset of the measures' own constant checks, which compare
    the largest centred value with ``1e-12 max(max|z|, 1)``; ``max|z| <= sqrt(d) scale`` for a constant
    layer, far inside the margin."""
    tol = max(_CONST_TOL, 1e4 * float(jnp.finfo(dtype).eps))
    return ~(np.asarray(rms, np.float64) > tol * np.maximum(np.asarray(scale, np.float64), 1.0))


def _rank_suspect(ratio, n: int, d: int, dtype) -> np.ndarray:
    """Flags from ``lambda_min / lambda_max`` of each layer's centred Gram matrix.

    NumPy's ``matrix_rank`` calls singular values below ``max(n, d) * eps * s_max``
    zero; flag ten times that (squared, for eigenvalues), or rounding noise of the
    Gram matrix itself (``100 d eps``), whichever is larger, and any ``d >= n``.
    """
    eps = float(jnp.finfo(dtype).eps)
    tol = max((10.0 * max(n, d) * eps) ** 2, 100.0 * d * eps)
    r = np.asarray(ratio, np.float64)
    return ~(r > tol) | (d >= n)


@jax.jit
def _gram_ratio(gram, mask=None):
    """``lambda_min / lambda_max`` of each ``(L, d, d)`` symmetric matrix (unbatched LAPACK calls).

    ``mask`` ``(L, d)``: the real features of zero-padded layers; the padded
    coordinates get the mean real eigenvalue on the diagonal, which leaves the ratio as it is.
    """
    if mask is not None:
        fill = jnp.trace(gram, axis1=1, axis2=2) / jnp.sum(mask, axis=1)
        gram = gram + jax.vmap(jnp.diag)((1.0 - mask) * fill[:, None])
    ev = jax.lax.map(jnp.linalg.eigvalsh, gram)
    return ev[:, 0] / jnp.maximum(ev[:, -1], jnp.finfo(gram.dtype).tiny)


_RELEASE_EVERY = 32  # pairwise calls between two counts of the process's memory mappings
_ROW_TOL = 1e-6  # flag layers with a row whose spread across features is below this fraction of max |z|


@jax.jit
def _layer_health(z):
    """``(centred rms, rms, lambda_min / lambda_max, smallest row spread)`` of each layer of a stack
    ``(L, n, d)``, each layer first divided by its power-of-two scale (exact; the squares cannot
    overflow or underflow). The row spread (``max_i |z_ri - z_r0|`` over ``max |z|``) is zero for a
    sample constant across features (all zero too), where correlation and cosine distances are undefined."""
    z = z / pow2_at(jnp.max(jnp.abs(z), axis=(1, 2)))[:, None, None]
    top = jnp.max(jnp.abs(z), axis=(1, 2))
    row_dev = jnp.min(jnp.max(jnp.abs(z - z[:, :, :1]), axis=2), axis=1) / jnp.where(top > 0, top, 1.0)
    zc = z - jnp.mean(z, axis=1, keepdims=True)
    g = jnp.einsum("lni,lnj->lij", zc, zc)
    ss = jnp.trace(g, axis1=1, axis2=2)
    size = z.shape[1] * z.shape[2]
    rms_all = jnp.sqrt(jnp.einsum("lni,lni->l", z, z) / size)
    return jnp.sqrt(ss / size), rms_all, _gram_ratio(g / jnp.where(ss > 0, ss, 1.0)[:, None, None]), row_dev


# ----------------------------------------------------------------------------- moment passes

# A width group holds L layers of width d, passed to the jitted passes as a
# tuple of ``(c, d)`` row chunks. Per-layer moments stack them as ``(L, c, d)``
# (a batched GEMM); cross moments put them side by side as ``(c, L * d)`` so
# that every pair of two groups comes out of a single large GEMM.


@jax.jit
def _acc_means(zs, w_tr):
    """Pass 1 for a tuple of L ``(c, d)`` chunks.

    Returns ``(sum_train (L*d,) or None, sum_all (L*d,), max_abs (L,))``: column sums over the
    train rows and over all rows, as matrix-vector products (XLA's CPU reductions
    are several times slower), and each layer's largest magnitude (for its power-of-two
    scale, :func:`similarity._linalg.pow2_at`). A NaN or Inf anywhere in a layer makes its sums
    non-finite, which is the input check (:func:`_raise_non_finite`).
    """
    ones = jnp.ones((zs[0].shape[0],), zs[0].dtype)
    return (
        None if w_tr is None else jnp.concatenate([w_tr @ z for z in zs]),
        jnp.concatenate([ones @ z for z in zs]),
        jnp.stack([jnp.max(jnp.abs(z)) for z in zs]),
    )


@functools.partial(jax.jit, static_argnames=("split", "full", "raw"))
def _acc_layer(zs, scale, mean_tr, mean_all, w_tr, w_te, *, split, full, raw=False):
    """Pass 2 for a tuple of L ``(c, d)`` chunks: each layer's centred second moments ``(L, d, d)``.

    Of the data divided by each layer's power-of-two ``scale`` ``(L,)`` (exact, so the
    products can neither overflow nor underflow); the means are those of the scaled data.

    ``split``: train/test moments around the train mean; ``full``: the all-rows
    moment around the all-rows mean, or with ``raw`` the uncentred ``Z^T Z`` (one
    matrix product per layer on the layer as it is, no centred copy; see
    :func:`_centre_raw`).
    """
    zs = tuple(z / scale[k] for k, z in enumerate(zs))
    out = {}
    if split:
        z = jnp.stack(zs)  # (L, c, d)
        zt = z - mean_tr.reshape(z.shape[0], 1, z.shape[2])
        out["g_tr"] = jnp.einsum("n,lni,lnj->lij", w_tr, zt, zt)
        out["g_te"] = jnp.einsum("n,lni,lnj->lij", w_te, zt, zt)
        out["s_te"] = jnp.einsum("n,lni->li", w_te, zt)
    if full and raw:
        out["g_raw"] = jnp.stack([jnp.einsum("ni,nj->ij", z, z) for z in zs])
    elif full:
        m = mean_all.reshape(len(zs), -1)
        out["g_all"] = jnp.stack([jnp.einsum("ni,nj->ij", z - m[k][None, :], z - m[k][None, :])
                                  for k, z in enumerate(zs)])
    return out


# The all-rows Gram matrix from the uncentred one, Xc^T Xc = X^T X - n m m^T, loses about
# log2(amplification) bits to cancellation, amplification = tr(X^T X) / tr(Xc^T Xc) = 1 + n |m|^2 / ||Xc||^2
# (about 2 for ReLU activations). Above this, the group is computed again from centred data.
_RAW_GRAM_MAX_AMPLIFICATION = 16.0


@jax.jit
def _centre_raw(g_raw, mean_all, n):
    """``(Xc^T Xc (L, d, d), amplification (L,))`` from ``X^T X`` and the all-rows means ``(L*d,)``."""
    m = mean_all.reshape(g_raw.shape[0], -1)
    g = g_raw - n * jnp.einsum("li,lj->lij", m, m)
    tr = jnp.trace(g, axis1=1, axis2=2)
    amp = jnp.trace(g_raw, axis1=1, axis2=2) / jnp.where(tr > 0, tr, jnp.zeros_like(tr))
    return g, amp


def _pair_blocks(u, v, la, lb):
    """``u: (c, la*da)``, ``v: (c, lb*db)`` -> ``(la, da, lb, db)``: ``[k, :, l, :] = u_k^T v_l``.

    One GEMM for every pair; its output is read in place (no transposed copy),
    the evaluator maps over axes 0 and 2.
    """
    m = jnp.einsum("ni,nj->ij", u, v)
    return m.reshape(la, u.shape[1] // la, lb, v.shape[1] // lb)


@functools.partial(jax.jit, static_argnames=("split", "full", "sharding"))
def _acc_cross(zas, zbs, ca, cb, ma_tr, mb_tr, ma_all, mb_all, w_tr, w_te, pad_a, *, split, full, sharding):
    """Pass 2 cross moments of every pair of two tuples of chunks, ``(La, da, Lb, db)`` each.

    ``ca``, ``cb``: each group's power-of-two scales ``(L,)``; the data is divided by them (exact)
    and ``ma_*``, ``mb_*`` are the means of the scaled data. ``ma_*``: the source group's means
    ``(L*da,)``, of which ``pad_a`` (also for ``ca``) picks the layers in ``zas`` (padded source
    layers repeat). ``sharding`` (or None) places
    the source block's columns, whole layers per device, so each device computes
    the pairs of its own source layers.
    """
    la, lb = len(zas), len(zbs)
    da = zas[0].shape[1]
    ma_tr = None if ma_tr is None else ma_tr.reshape(-1, da)[pad_a].reshape(-1)
    ma_all = ma_all.reshape(-1, da)[pad_a].reshape(-1)
    ca = ca[pad_a]
    za = jnp.concatenate([z / ca[k] for k, z in enumerate(zas)], axis=1)
    zb = jnp.concatenate([z / cb[k] for k, z in enumerate(zbs)], axis=1)
    if sharding is not None:
        za = jax.lax.with_sharding_constraint(za, sharding)
    out = {}
    if split:
        at, bt = za - ma_tr[None, :], zb - mb_tr[None, :]
        out["c_tr"] = _pair_blocks(at * w_tr[:, None], bt, la, lb)
        out["c_te"] = _pair_blocks(at * w_te[:, None], bt, la, lb)
    if full:
        out["c_all"] = _pair_blocks(za - ma_all[None, :], zb - mb_all[None, :], la, lb)
    return out


def _add(acc, new):
    return new if acc is None else jax.tree.map(jnp.add, acc, new)


def _shift_full(split_sum, delta_a, delta_b, n):
    """All-rows centred moment from the train-centred one when train + test = all rows.

    ``sum (a - m_all)(b - m_all)^T = sum (a - m_tr)(b - m_tr)^T - n (m_all - m_tr)(m_all - m_tr)^T``.
    """
    return split_sum - n * jnp.einsum("...i,...j->...ij", delta_a, delta_b)


class _Moments(NamedTuple):
    """What the moment passes need: row weights, row chunks, which moments."""

    w_tr: jax.Array | None
    w_te: jax.Array | None
    n_train: float | None  # the number of train rows (host), with a split
    chunks: list  # [(lo, hi)]
    split: bool
    full: bool
    derive_full: bool  # all-rows moments from the train/test ones (the split covers each row once)

    @property
    def acc_flags(self):
        return dict(split=self.split, full=self.full and not self.derive_full)

    def weights(self, lo, hi):
        if not self.split:
            return None, None
        return self.w_tr[lo:hi], self.w_te[lo:hi]


@functools.partial(jax.jit, static_argnums=1)
def _pad_columns(z, width: int):
    return jnp.pad(z, ((0, 0), (0, width - z.shape[1])))


def _chunk(lay: _Layers, side: str, idx, width: int, lo, hi):
    """Rows ``lo:hi`` of layers ``idx`` of one side, zero-padded to ``width``: a tuple of ``(c, width)``
    device arrays. The padding is done on the host, so no program is compiled per real width."""
    vs = lay.side(side)[0]
    whole = (lo, hi) == (0, lay.n)
    out = []
    for k in idx:
        if whole and (side, k) in lay.cache:
            out.append(lay.cache[side, k])
            continue
        z = vs[k] if whole else vs[k][lo:hi]
        if z.shape[1] < width and isinstance(z, jax.Array) and not z.is_fully_addressable:
            z = _pad_columns(z.astype(lay.dtype), width)  # rows spread over processes: pad where they are
        elif z.shape[1] < width:
            zp = np.zeros((z.shape[0], width), dtype=lay.dtype)
            zp[:, : z.shape[1]] = np.asarray(z)
            z = jax.device_put(zp)
        elif isinstance(z, jax.Array):
            z = z if z.dtype == lay.dtype else z.astype(lay.dtype)
        else:
            z = jax.device_put(np.asarray(z, dtype=lay.dtype))
        if whole:
            lay.cache[side, k] = z
        out.append(z)
    return tuple(out)


def _raise_non_finite(side_name, lay: _Layers, side: str, idx, sums) -> None:
    """Raise for the first layer of ``idx`` that holds NaN or Inf.

    ``sums`` ``(L, w)``: its column sums, non-finite for such a layer; a layer of
    huge finite values can overflow them too, so a flagged layer is checked itself.
    """
    if not V.is_concrete(sums):
        return
    for k in np.flatnonzero(~np.all(np.isfinite(np.asarray(sums)), axis=1)):
        if not np.all(np.isfinite(np.asarray(lay.side(side)[0][idx[k]]))):
            raise ValueError(f"{side_name}[{idx[k]}] contains NaN or Inf values; remove or impute them.")


def _scale(mean, norm, rows, d) -> np.ndarray:
    """Each layer's root-mean-square value ``sqrt(sum z^2 / (rows d))``, from its centred norm and its mean.

    ``mean`` ``(L, w)`` (zero-padded), ``norm`` ``(L,)``: ``sum z^2 = norm^2 + rows |mean|^2``.
    """
    mean, norm = np.asarray(mean, np.float64), np.asarray(norm, np.float64)
    return np.sqrt((norm**2 + rows * np.sum(mean**2, axis=1)) / (rows * d))


def _raise_constant(side_name, idx, scale, norm, n, d, dtype, where) -> None:
    """Raise for the first constant layer of a width group.

    A layer counts as constant when the root-mean-square of its centred values
    is at most ``tol`` times that of its values (:func:`_scale`), with
    ``tol = max(1e-12, 16 * eps(dtype))``: below that the centred data is rounding
    noise and every score would be 0/0.
    """
    if not V.is_concrete(norm, scale):
        return
    tol = max(1e-12, 16 * float(jnp.finfo(dtype).eps))
    rms = np.asarray(norm, np.float64) / np.sqrt(n * d)
    bad = np.flatnonzero(~(rms > tol * np.asarray(scale, np.float64)))
    if bad.size:
        raise ValueError(
            f"{side_name}[{idx[bad[0]]}] (width {np.broadcast_to(d, rms.shape)[bad[0]]}) is constant across "
            f"{where} (zero variance "
            "after centring), so its scores are undefined (0/0). Check that the layer is not "
            "dead and that the samples differ."
        )


def _means(lay: _Layers, mo: _Moments) -> dict:
    """Pass 1: ``{(side, w): (train mean or None, all-rows mean, scale)}``; NaN/Inf checks.

    ``scale`` ``(L,)``: each layer's power-of-two scale (:func:`similarity._linalg.pow2_at` of its
    largest magnitude); the means ``(L*w,)`` are those of the layer divided by it. Every later
    pass divides the data by the same scale before forming products (exact), so the grid's
    moments neither overflow nor underflow in float32 (1e-20 ... 1e20), like the pairwise functions.
    """
    means = {}
    for side in "ab":
        for w, g in lay.mgroups(side).items():
            acc, amax = None, None
            for lo, hi in mo.chunks:
                s_tr, s_all, m = _acc_means(_chunk(lay, side, g.pidx, w, lo, hi), mo.weights(lo, hi)[0])
                acc = _add(acc, (s_tr, s_all))
                amax = m if amax is None else jnp.maximum(amax, m)
            _raise_non_finite(_SIDE_NAMES[side], lay, side, g.pidx, np.asarray(acc[1]).reshape(len(g.pidx), w))
            means[side, w] = _divide_means(acc[0], acc[1], amax, mo.w_tr, lay.n)
    return means


@jax.jit
def _divide_means(s_tr, s_all, amax, w_tr, n):
    """Column sums to the means of the scaled layers: ``(train mean or None, all-rows mean, scale (L,))``."""
    c = pow2_at(amax)
    cols = jnp.repeat(c, s_all.shape[0] // c.shape[0])
    return (None if s_tr is None else s_tr / jnp.sum(w_tr) / cols), s_all / n / cols, c


def _layer_moments(lay: _Layers, mo: _Moments, means: dict, sus: _Suspects, *, strict: bool) -> dict:
    """Pass 2, per layer: ``{(side, d): {"split": LayerMoments, "full": FullMoments}}`` (stacked).

    Near-constant layers (and, with a split, layers rank-deficient on the train rows)
    are flagged in ``sus``; with ``strict`` a constant layer raises.
    """
    out = {}
    for side in "ab":
        for w, g in lay.mgroups(side).items():
            mean_tr, mean_all, scale_w = means[side, w]
            raw = mo.acc_flags["full"]  # the all-rows Gram matrix from the uncentred one, where that is exact enough
            acc = None
            for lo, hi in mo.chunks:
                acc = _add(acc, _acc_layer(_chunk(lay, side, g.pidx, w, lo, hi), scale_w, mean_tr, mean_all,
                                           *mo.weights(lo, hi), **mo.acc_flags, raw=raw))
            if raw:
                g_all, amp = _centre_raw(acc.pop("g_raw"), mean_all, lay.n)
                if not np.all(np.asarray(amp) <= _RAW_GRAM_MAX_AMPLIFICATION):  # an offset layer, or a constant one
                    g_all = None
                    for lo, hi in mo.chunks:
                        g_all = _add(g_all, _acc_layer(_chunk(lay, side, g.pidx, w, lo, hi), scale_w, mean_tr,
                                                       mean_all, None, None, split=False, full=True)["g_all"])
                acc["g_all"] = g_all
            out[side, w] = _finish_layers(acc, mean_tr, mean_all, scale_w, mo.w_te, lay.n, split=mo.split,
                                          full=mo.full, derive=mo.derive_full)
            where, real, d = _SIDE_NAMES[side], len(g.idx), g.widths[: len(g.idx)]
            for kind, rows, what, mean in (("split", mo.n_train, "the train rows", mean_tr),
                                           ("full", lay.n, "samples", mean_all)):
                if kind in out[side, w]:  # relative to the scaled layer (the mean is the scaled one's)
                    norm = (np.asarray(out[side, w][kind].norm) / np.asarray(scale_w))[:real]
                    scale = _scale(np.asarray(mean).reshape(-1, w)[:real], norm, rows, d)
                    if strict:
                        _raise_constant(where, g.idx, scale, norm, rows, d, lay.dtype, what)
                    sus.flag(side, g.idx, _near_constant(norm / np.sqrt(rows * d), scale, lay.dtype))
            if mo.split:
                # with buckets always masked (also when nothing is padded), so that the program is the same
                mask = jnp.asarray(g.mask(lay.dtype)) if lay.buckets else None
                ratio = _gram_ratio(out[side, w]["split"].gram_train, mask)
                ratio = np.asarray(ratio)[:real]
                for k, dk in enumerate(d[:real]):
                    sus.flag(side, [g.idx[k]], _rank_suspect(ratio[k:k + 1], int(round(mo.n_train)), int(dk),
                                                             lay.dtype), "rank_deficient")
    return out


@functools.partial(jax.jit, static_argnames=("split", "full", "derive"))
def _finish_layers(sums, mean_tr, mean_all, scale, w_te, n, *, split, full, derive) -> dict:
    """Normalise one width group's sums into stacked per-layer moments (one program).

    The sums and means are those of the layers divided by their power-of-two ``scale`` ``(L,)``;
    the moments' ``norm`` and ``mean`` are given back in the layers' own units (exact).
    ``derive``: the all-rows moment from the train and test ones (:func:`_shift_full`).
    """
    if derive:
        delta = (mean_all - mean_tr).reshape(sums["g_tr"].shape[:2])
        sums = {**sums, "g_all": _shift_full(sums["g_tr"] + sums["g_te"], delta, delta, n)}
    out = {}
    if split:
        n_te = jnp.sum(w_te)
        norm = jnp.sqrt(jnp.trace(sums["g_tr"], axis1=1, axis2=2))
        den = _safe(norm)  # a constant layer: zero moments, not 0/0 (its cells are decided pairwise)
        out["split"] = LayerMoments(
            mean=mean_tr.reshape(norm.shape[0], -1) * scale[:, None],
            norm=norm * scale,
            gram_train=sums["g_tr"] / den[:, None, None] ** 2,
            gram_test=sums["g_te"] / den[:, None, None] ** 2,
            sum_test=sums["s_te"] / den[:, None],
            n_test=jnp.broadcast_to(n_te, norm.shape),
        )
    if full:
        norm = jnp.sqrt(jnp.trace(sums["g_all"], axis1=1, axis2=2))
        out["full"] = FullMoments(norm * scale, sums["g_all"] / _safe(norm)[:, None, None] ** 2)
    return out


def _safe(norm):
    """``norm`` where positive, else 1: keeps the moments of a constant layer finite (zero)."""
    return jnp.where(norm > 0, norm, jnp.ones_like(norm))


def _source_rows(ga: _Group, ndev: int) -> np.ndarray:
    """Positions in ``ga.pidx`` of the source layers of a pair group: the padded layers, the last one
    repeated further up to a multiple of the device count (whole layers per device)."""
    la = len(ga.pidx)
    return np.minimum(np.arange(la + (-la) % ndev), la - 1)


def _cross_sums(lay: _Layers, mo: _Moments, means: dict, ga: _Group, gb: _Group, pad_a: np.ndarray, plan) -> dict:
    """Pass 2, per pair: the centred cross sums ``{"c_tr", "c_te", "c_all"}``, each ``(La, wa, Lb, wb)``
    for the source layers ``pad_a`` and every target layer (one large GEMM per chunk)."""
    da, db = ga.width, gb.width
    idx_a = [ga.pidx[k] for k in pad_a]
    ma_tr, ma_all, ca = means["a", da]
    mb_tr, mb_all, cb = means["b", db]
    shard = None if plan.mesh is None else NamedSharding(plan.mesh, P(None, "pairs"))
    acc = None
    for lo, hi in mo.chunks:
        rest = _replicate_computed(plan, (ca, cb, ma_tr, mb_tr, ma_all, mb_all, *mo.weights(lo, hi), pad_a))
        acc = _add(acc, _acc_cross(_replicate(plan, _chunk(lay, "a", idx_a, da, lo, hi)),
                                   _replicate(plan, _chunk(lay, "b", gb.pidx, db, lo, hi)),
                                   *rest, sharding=shard, **mo.acc_flags))
    return acc


def _pair_moments(kinds, xa, yb, sums, delta_a, delta_b, ca, cb, n, derive):
    """One pair's normalised cross moments ``{kind: PairMoments or (wa, wb)}`` from its centred sums.

    The sums are those of the layers divided by their power-of-two scales ``ca``, ``cb``, so they
    are normalised by the norms in the same units (``norm / c``, exact).
    ``delta_*``: all-rows minus train mean of each (scaled) side (``derive``: the all-rows sums
    from the train and test ones, :func:`_shift_full`).
    """
    out = {}
    if "split" in kinds:
        den = (_safe(xa["split"].norm) / ca) * (_safe(yb["split"].norm) / cb)
        out["split"] = PairMoments(sums["c_tr"] / den, sums["c_te"] / den)
    if "full" in kinds:
        c_all = _shift_full(sums["c_tr"] + sums["c_te"], delta_a, delta_b, n) if derive else sums["c_all"]
        out["full"] = c_all / ((_safe(xa["full"].norm) / ca) * (_safe(yb["full"].norm) / cb))
    return out


# ----------------------------------------------------------------------------- moment measures


class _Entry(NamedTuple):
    """One requested moment measure: its name, its MomentStats, and whether to compute its reverse."""

    name: str
    spec: Any  # MomentStats
    reverse: bool


def _hooks(entries) -> tuple:
    """The distinct per-layer hooks (``MomentStats.layer``) of the entries, with their moment kind."""
    seen = {}
    for e in entries:
        if e.spec.layer is not None and e.spec.layer not in seen:
            seen[e.spec.layer] = e.spec.moments
    return tuple(seen.items())


@functools.lru_cache(maxsize=None)
def _map_layers_jit(fn):
    """``fn`` over the leading (layer) axis of a stacked pytree, jit-compiled once per function and shape.

    With a ``mask`` ``(L, d)`` of real features, ``fn`` sees each Gram matrix with a
    unit diagonal on the zero-padded coordinates (see :class:`similarity.MomentStats`).
    """

    def run(moments, mask):
        if mask is not None:
            unit = jax.vmap(jnp.diag)(1.0 - mask)
            if isinstance(moments, LayerMoments):
                moments = moments._replace(gram_train=moments.gram_train + unit, gram_test=moments.gram_test + unit)
            else:
                moments = moments._replace(gram=moments.gram + unit)
        return jax.vmap(fn)(moments)

    return jax.jit(run)


@functools.lru_cache(maxsize=64)
def _moment_evaluator(entries: tuple[_Entry, ...], derive: bool):
    """A jit-compiled function evaluating every entry (and its reverse) on every pair of two groups.

    Built once per set of measures (their registry functions have stable
    identities), so a grid compiles once per set of measures and shapes. The
    pairs are a nested ``vmap``, over source layers and then target layers, so
    whatever a measure computes from one side alone (a norm, a trace) is computed
    once per layer, not once per pair; each pair's cross sums are normalised
    where they are read, without a normalised copy of them all.
    """
    kinds = sorted({e.spec.moments for e in entries})
    hooks = tuple(h for h, _ in _hooks(entries))

    def cell(xa, exa, dla, ca, yb, exb, dlb, cb, sums, n):
        ex = {h: (exa[k], exb[k]) for k, h in enumerate(hooks)}
        pair = _pair_moments(kinds, xa, yb, sums, dla, dlb, ca, cb, n, derive)
        ctx = {}
        for kind in kinds:
            cross = pair[kind]
            fit = cross.cross_train if kind == "split" else cross
            ctx[kind] = MomentPair(xa[kind], yb[kind], cross, fit, extras=ex)
        fwd = {e.name: e.spec.finish(ctx[e.spec.moments]) for e in entries}
        rev = {e.name: e.spec.finish(ctx[e.spec.moments].transposed()) for e in entries if e.reverse}
        return fwd, rev

    def run(layers_a, layers_b, extras_a, extras_b, deltas, scales, pad_a, sums, n):
        # The SVDs go through similarity._linalg.svd (in MomentPair.svd and the
        # stitching fits), which on the CPU runs a vmapped batch as unbatched kernels:
        # jaxlib's batched CPU SVD blocks XLA's thread pool and deadlocks when several
        # run at once (see that module).
        xa, exa, dla, ca = _pick((layers_a, extras_a, deltas[0], scales[0]), pad_a)

        def row(x, ex, dl, c, s):  # s: (da, Lb, db), the pairs of one source layer
            return jax.vmap(lambda y, ey, dy, cy, sy: cell(x, ex, dl, c, y, ey, dy, cy, sy, n),
                            in_axes=(0, 0, 0, 0, 1))(layers_b, extras_b, deltas[1], scales[1], s)

        return jax.vmap(row)(xa, exa, dla, ca, sums)

    return jax.jit(run)


def _moment_plan(lay: _Layers, entries, *, weights, chunk_size) -> _Moments:
    kinds = {e.spec.moments for e in entries}
    need_split, need_full = "split" in kinds, "full" in kinds
    w_tr, w_te = weights if need_split else (None, None)
    n_train = float(np.asarray(w_tr).sum()) if need_split else None
    derive = need_split and need_full and bool(np.all(np.asarray(w_tr) + np.asarray(w_te) == 1))
    chunks = [(lo, min(lo + chunk_size, lay.n)) for lo in range(0, lay.n, chunk_size)] if chunk_size else [(0, lay.n)]
    return _Moments(w_tr, w_te, n_train, chunks, need_split, need_full, derive)


def _run_checks(lay: _Layers, entries, mo: _Moments, sus: _Suspects, *, reverse: bool, strict: bool) -> None:
    """Each measure's ``MomentStats.check`` on every source it will see.

    With ``reverse`` the ``reps_b`` layers are sources too, also for a symmetric
    measure (its reverse table is its own, but ``measure(name)(B_j, A_i)`` must be defined).
    A refused source is flagged in ``sus`` (with ``strict``, the widest one raises).
    """
    n_tr = int(round(mo.n_train)) if mo.split else lay.n
    for e in entries:
        if e.spec.check is None:
            continue
        n_fit = n_tr if e.spec.moments == "split" else lay.n
        sides = ("a", "b") if reverse else ("a",)
        for side in sides:
            vs, _ = lay.side(side)
            if strict:
                k = int(np.argmax([z.shape[1] for z in vs]))
                e.spec.check(n_fit, int(vs[k].shape[1]), f"{e.name} with source {_SIDE_NAMES[side]}[{k}]")
            for k, z in enumerate(vs):
                try:
                    e.spec.check(n_fit, int(z.shape[1]), f"{e.name} with source {_SIDE_NAMES[side]}[{k}]")
                except ValueError:
                    sus.flag_source(e.name, side, k)


def _moment_tables(lay: _Layers, moment, sus: _Suspects, *, reverse, weights, chunk_size, plan, strict):
    """``(tables, reverse tables)`` of the moment measures, as float numpy arrays.

    ``weights``: the ``(n,)`` 0/1 train and test row weights of the split. Layers
    where a measure may be undefined are flagged in ``sus``.
    """
    entries = tuple(_Entry(name, m.moments, reverse and not m.symmetric) for name, m in moment)
    mo = _moment_plan(lay, entries, weights=weights, chunk_size=chunk_size)
    _run_checks(lay, entries, mo, sus, reverse=reverse, strict=strict)
    means = _means(lay, mo)
    lms = _layer_moments(lay, mo, means, sus, strict=strict)
    hooks = _hooks(entries)
    extras = {}
    for (side, w), v in lms.items():
        g = lay.mgroups(side)[w]
        mask = jnp.asarray(g.mask(lay.dtype)) if lay.buckets else None
        extras[side, w] = tuple(_map_layers_jit(h)(v[kind], mask) for h, kind in hooks)
    evaluate = _moment_evaluator(entries, mo.derive_full)
    deltas = {k: (None if not mo.derive_full else (mean_all - mean_tr).reshape(-1, k[1]))
              for k, (mean_tr, mean_all, _) in means.items()}
    fwd = {e.name: np.full((len(lay.va), len(lay.vb)), np.nan, dtype=lay.dtype) for e in entries}
    rev = {e.name: np.full_like(fwd[e.name], np.nan) for e in entries if e.reverse}
    for da, db in lay.pair_groups():
        release_if_near_limit()  # one program per pair of width buckets
        ga, gb = lay.mgroups_a[da], lay.mgroups_b[db]
        pad_a = _source_rows(ga, plan.ndev)
        sums = _cross_sums(lay, mo, means, ga, gb, pad_a, plan)
        res_f, res_r = evaluate(*_replicate_computed(plan, (lms["a", da], lms["b", db], extras["a", da], extras["b", db],
                                                   (deltas["a", da], deltas["b", db]),
                                                   (means["a", da][2], means["b", db][2]), pad_a)), sums, lay.n)
        ra, rb = len(ga.idx), len(gb.idx)  # the real layers come first; the repeats are dropped
        rows, cols = np.asarray(ga.idx)[:, None], np.asarray(gb.idx)[None, :]
        for out, res in ((fwd, res_f), (rev, res_r)):
            for name, vals in res.items():
                out[name][rows, cols] = _to_host(vals)[:ra, :rb]
    return fwd, rev


# ----------------------------------------------------------------------------- other measures


@functools.lru_cache(maxsize=None)
def _map_pairs_jit(fn):
    """``fn(xa[ia[p]], xb[jb[p]])`` for every pair ``p``, jit-compiled once per function and shape.

    ``lax.map``, not ``vmap``: a generic measure works on ``(n, d)``-sized
    inputs, and vmapping it over every pair would hold all pairs' intermediates.
    """

    def run(xa, xb, ia, jb):
        return jax.lax.map(lambda ij: fn(_pick(xa, ij[0]), _pick(xb, ij[1])), (ia, jb))

    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _map_layers_seq_jit(fn):
    """``fn`` on each layer of a stack ``(L, n, d)`` (``lax.map``), jit-compiled once per function and shape."""
    return jax.jit(lambda x: jax.lax.map(fn, x))


def _stats_fit(stats, n, widths, dtype, budget) -> bool:
    """Whether every layer's statistics fit in ``budget`` bytes together (e.g. ``n^2`` RDMs)."""
    if stats is None:
        return False
    total = 0
    for d in widths:
        shapes = jax.eval_shape(stats.layer, jax.ShapeDtypeStruct((n, d), dtype))
        total += sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(shapes))
    return total <= budget


class _Stacks:
    """Each width group's layers stacked as ``(L, n, d)``, built once for all generic measures.

    Exact sizes: these measures' programs depend on the widths anyway (zero features would
    change an RDM or a CCA basis), and padded layer or pair counts would add up to half
    again as much work.
    """

    def __init__(self, lay: _Layers, plan: _Plan):
        self.lay, self.plan, self._cache = lay, plan, {}

    def __call__(self, side: str, d: int):
        if (side, d) not in self._cache:
            vs, groups = self.lay.side(side)
            stack = jnp.stack([jnp.asarray(vs[k], dtype=self.lay.dtype) for k in groups[d]])
            self._cache[side, d] = _replicate(self.plan, stack)
        return self._cache[side, d]


def _generic_table(lay: _Layers, m: Measure, *, reverse, plan, stats_budget, stacks: _Stacks):
    """``(table, reverse table or None)`` of one measure without moments."""
    widths = [z.shape[1] for z in lay.va + lay.vb]
    st = m.stats if _stats_fit(m.stats, lay.n, widths, lay.dtype, stats_budget) else None
    if st is not None:  # per-layer work once per layer
        layer = _map_layers_seq_jit(st.layer)
        src = {(side, d): _replicate_computed(plan, layer(stacks(side, d)))
               for side in "ab" for d in lay.side(side)[1]}
        pair = _map_pairs_jit(st.pair)
    else:
        src = {(side, d): stacks(side, d) for side in "ab" for d in lay.side(side)[1]}
        pair = _map_pairs_jit(m.fn)
    fwd = np.full((len(lay.va), len(lay.vb)), np.nan, dtype=lay.dtype)
    rev = np.full_like(fwd, np.nan) if reverse else None
    for da, db in lay.exact_pair_groups():
        release_if_near_limit()  # one program per pair of widths
        ia, jb = (g.ravel() for g in np.meshgrid(np.arange(len(lay.groups_a[da])), np.arange(len(lay.groups_b[db])),
                                                 indexing="ij"))
        ia_s, jb_s = _put_pairs(plan, ia, jb)
        rows, cols = np.asarray(lay.groups_a[da])[ia], np.asarray(lay.groups_b[db])[jb]
        fwd[rows, cols] = _to_host(pair(src["a", da], src["b", db], ia_s, jb_s))[: len(ia)]
        if rev is not None:
            rev[rows, cols] = _to_host(pair(src["b", db], src["a", da], jb_s, ia_s))[: len(ia)]
    return fwd, rev


# ----------------------------------------------------------------------------- undefined cells: settling


def _flag_generic_layers(lay: _Layers, stacks: _Stacks, sus: _Suspects) -> None:
    """Near-constant and rank-suspect layers (all rows), for the measures without moments."""
    for side in "ab":
        for d, idx in lay.side(side)[1].items():
            rms, scale, ratio, row_dev = (np.asarray(v) for v in _layer_health(stacks(side, d)))
            sus.flag(side, idx, _near_constant(rms, scale, lay.dtype))
            sus.flag(side, idx, _rank_suspect(ratio, lay.n, d, lay.dtype), "rank_deficient")
            sus.flag(side, idx, ~(row_dev > _ROW_TOL), "constant_rows")


def _pairwise_cell(m: Measure, x, y, dtype) -> tuple[float | None, str | None]:
    """``(value, None)`` of the pairwise call ``m(x, y)``, or ``(None, message)`` where it raises."""
    try:
        return float(m(jnp.asarray(x, dtype), jnp.asarray(y, dtype))), None
    except ValueError as e:
        return None, str(e)


def _where(lay: _Layers, i: int, j: int, reverse: bool) -> str:
    if reverse:
        return f"(cols[{j}] = {lay.cols[j]!r}, rows[{i}] = {lay.rows[i]!r})"
    return f"(rows[{i}] = {lay.rows[i]!r}, cols[{j}] = {lay.cols[j]!r})"


def _undefined_error(name: str, lay: _Layers, i: int, j: int, reverse: bool, reason: str) -> ValueError:
    hint = (" In compare_grid the ridge is part of the name: 'stitch/affine/ridge=0.001'."
            if "normal equations" in reason and name.startswith("stitch/affine") else "")
    return ValueError(f"{name}{' (reverse)' if reverse else ''}: the entry for {_where(lay, i, j, reverse)} is "
                      f"not finite (undefined; on_undefined='raise'): {reason}{hint}")


def _silent_non_finite(name: str, lay: _Layers, i: int, j: int, reverse: bool, value: float) -> ValueError:
    return ValueError(
        f"{name}{' (reverse)' if reverse else ''}: the entry for {_where(lay, i, j, reverse)} is not finite: "
        f"similarity.measure({name!r}) returns {value} for that pair without raising. A measure must raise a "
        "ValueError where it is undefined; fix the measure, or drop it or the layer."
    )


def _by_shape_pair(cells: np.ndarray, lay: _Layers) -> np.ndarray:
    """The ``(i, j)`` of the true cells of ``cells``, those of one pair of widths together: each pairwise
    program is compiled once and finished with before the next (a release of the compiled programs,
    :func:`release_if_near_limit`, then drops only finished ones)."""
    ij = np.argwhere(cells)
    wa = np.array([z.shape[1] for z in lay.va])[ij[:, 0]]
    wb = np.array([z.shape[1] for z in lay.vb])[ij[:, 1]]
    return ij[np.lexsort((ij[:, 1], ij[:, 0], wb, wa))]


def _settle(name: str, m: Measure, table: np.ndarray, suspect: np.ndarray, lay: _Layers, *, reverse: bool,
            strict: bool) -> dict:
    """Decide the suspect (and non-finite) cells of ``table`` by the pairwise call, in place.

    Returns ``{(i, j): reason}`` of the undefined cells (set to NaN). ``reverse``:
    ``table[i, j]`` is ``m(B_j, A_i)``.
    """
    undefined = {}
    for k, (i, j) in enumerate(_by_shape_pair(suspect | ~np.isfinite(table), lay)):
        i, j = int(i), int(j)
        if k % _RELEASE_EVERY == _RELEASE_EVERY - 1:
            release_if_near_limit()  # each new shape pair compiles the pairwise call again
        x, y = (lay.vb[j], lay.va[i]) if reverse else (lay.va[i], lay.vb[j])
        value, reason = _pairwise_cell(m, x, y, lay.dtype)
        if reason is not None:
            if strict:
                raise _undefined_error(name, lay, i, j, reverse, reason)
            table[i, j] = np.nan
            undefined[i, j] = reason
        elif not np.isfinite(value):
            raise _silent_non_finite(name, lay, i, j, reverse, value)
        else:
            table[i, j] = value
    return undefined


def _settle_symmetric_reverse(name: str, m: Measure, table: np.ndarray, undefined: dict, suspect: np.ndarray,
                              lay: _Layers, *, strict: bool) -> tuple[np.ndarray, dict]:
    """The reverse table of a symmetric measure: ``table`` itself unless some ``m(B_j, A_i)``
    is defined where ``m(A_i, B_j)`` is not, or the other way round (a directional input check)."""
    rev, rev_undef = table, dict(undefined)
    for k, (i, j) in enumerate(_by_shape_pair(suspect | ~np.isfinite(table), lay)):
        i, j = int(i), int(j)
        if k % _RELEASE_EVERY == _RELEASE_EVERY - 1:
            release_if_near_limit()
        value, reason = _pairwise_cell(m, lay.vb[j], lay.va[i], lay.dtype)
        if reason is not None and (i, j) in undefined:
            rev_undef[i, j] = reason  # the reverse call's own message (it names its own arguments)
        if (reason is None) == ((i, j) not in undefined):
            continue
        if rev is table:
            rev = table.copy()
        if reason is not None:
            if strict:
                raise _undefined_error(name, lay, i, j, True, reason)
            rev[i, j] = np.nan
            rev_undef[i, j] = reason
        elif not np.isfinite(value):
            raise _silent_non_finite(name, lay, i, j, True, value)
        else:
            rev[i, j] = value
            del rev_undef[i, j]
    return rev, rev_undef


def _warn_undefined(undefined: dict, rev_undefined: dict, lay: _Layers) -> None:
    counts = {k: len(v) + len(rev_undefined.get(k, {})) for k, v in undefined.items()}
    counts = {k: c for k, c in counts.items() if c}
    if not counts:
        return
    name = next(iter(counts))
    first = undefined[name] or rev_undefined[name]
    (i, j), reason = next(iter(first.items()))
    direction = "" if undefined[name] else " (reverse)"
    per = ", ".join(f"{k}: {c}" for k, c in counts.items())
    V.warn_at_caller(
        f"compare_grid: {sum(counts.values())} cell(s) are undefined and set to NaN ({per}), e.g. "
        f"{name}{direction} {_where(lay, i, j, bool(direction))}: {reason.split('. ')[0]}. Each reason is in "
        "GridResult.undefined (and reverse_undefined); on_undefined='raise' stops at the first instead.",
        UndefinedCellWarning,
    )


def _refuse_process_sharded(reps_a, reps_b, measure_name: str) -> None:
    """Raise for a layer spread over several processes when a measure needs all of its rows in one place.

    Moment measures sum over rows, so a layer whose rows are sharded across
    processes (a ``jax.Array`` that is not fully addressable) works for them;
    the others build per-layer statistics over all samples (RDMs, kernels, bases).
    """
    for name, reps in (("reps_a", reps_a), ("reps_b", reps_b)):
        if reps is None:
            continue
        keys, vals = _as_layers(reps, name)
        for k, z in enumerate(vals):
            if isinstance(z, jax.Array) and not z.is_fully_addressable:
                raise ValueError(
                    f"{name}[{k}] ({keys[k]!r}, shape {tuple(z.shape)}) is spread over several processes, and "
                    f"measure {measure_name!r} needs every row of a layer in each process. With rows sharded "
                    f"across processes use the moment measures only (similarity.MOMENT_MEASURES, e.g. "
                    f"{', '.join(MOMENT_MEASURES[:3])}), or gather the rows first: "
                    "jax.experimental.multihost_utils.process_allgather(x, tiled=True)."
                )


# ----------------------------------------------------------------------------- public


@full_precision
def compare_grid(
    reps_a: Mapping[Any, ArrayLike] | Sequence[ArrayLike],
    reps_b: Mapping[Any, ArrayLike] | Sequence[ArrayLike] | None = None,
    /,
    *,
    measures: str | Sequence[str] = ("cka/linear", "stitch/affine"),
    reverse: bool = False,
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    stats_budget: float = 2.0 * 2**30,
    on_undefined: str = "nan",
    buckets: bool = True,
) -> GridResult:
    """Compare every layer of ``reps_a`` with every layer of ``reps_b``, for every measure by name.

    ``tables[name][i, j] == similarity.measure(name)(A_i, B_j)`` for every
    returned name (to rounding; the tests check 1e-10 in float64), where
    ``A_i``, ``B_j`` are the i-th layer of ``reps_a`` and the j-th of ``reps_b``.
    With ``reverse=True`` the same call also returns
    ``reverse[name][i, j] == measure(name)(B_j, A_i)``, reusing the same
    per-layer (and, for moment measures, per-pair) work.

    **Undefined cells.** Where the pairwise call raises a ``ValueError`` for a
    pair of valid layers (a constant layer, a rank-deficient one for CCA, PWCCA
    or the whitened shape metrics, singular normal equations, a source wider
    than the fitting rows), the cell is NaN and ``GridResult.undefined[name][(i, j)]``
    holds the pairwise call's message (``reverse_undefined`` for the reverse
    table); one :class:`UndefinedCellWarning` summarises them. The grid flags
    the layers where that can happen from statistics it has anyway
    (near-constant and numerically rank-deficient layers, widths a measure
    refuses) and computes their cells, and any cell that comes out non-finite,
    by the pairwise call itself, so the defined/undefined pattern and the
    values are the pairwise ones. ``on_undefined="raise"`` raises instead, at
    the first such layer or cell, naming it. Invalid input is an error either
    way: NaN/Inf, mismatched sample counts, a bad split, unknown measures.

    The reconstruction scores are named by family, figure and ridge:
    ``"stitch/<family>"`` (held out), ``"stitch/<family>/in_sample"`` (the
    leaky in-sample figure on the train rows), and for the affine family
    ``"stitch/affine/ridge=<r>"`` and ``"stitch/affine/in_sample/ridge=<r>"``.

    Args:
      reps_a: dict ``{name: (n, d_i)}`` or list of ``(n, d_i)`` arrays.
      reps_b: the same for the other model (default: ``reps_a``). Same ``n``
        samples, in the same order, as ``reps_a``.
      measures: registry names (``similarity.list_measures()``; parametrised
        names like ``"shape/angular/alpha=0.5"`` too); one name may be passed
        as a plain string.
      reverse: also return ``GridResult.reverse`` (see above).
      split: the train/test split of the held-out reconstruction scores, shared
        by every pair: a train fraction or ``(train_idx, test_idx)``. The
        registered measures use the default (0.5 with ``key=jax.random.key(0)``);
        with another split the tables equal
        :func:`similarity.reconstruction_score` with that split.
      key: PRNG key for a fractional split (default ``jax.random.key(0)``).
      chunk_size: stream samples in chunks of this many rows (moment measures only).
      devices: devices to shard the pair axis over (default: all of ``jax.devices()``).
      stats_budget: bytes allowed for the per-layer statistics of a measure that
        has them (``Measure.stats``: RDMs, kernel matrices, bases), all layers
        together. Within it, such a measure does its per-layer work once per
        layer; above it (e.g. ``n^2`` RDMs for large ``n``), once per pair.
      on_undefined: ``"nan"`` (default): undefined cells are NaN, with their
        reasons in the result and one warning; ``"raise"``: a ``ValueError`` at
        the first constant layer, refused width or undefined cell (cells are
        decided one pair of layer widths at a time, narrowest first).
      buckets: pad sizes into buckets so that grids of other architectures
        reuse the compiled programs (see above); ``False`` compiles for the
        exact sizes (less arithmetic when a width is just above a bucket).

    Returns:
      :class:`GridResult` ``(tables, rows, cols, reverse, undefined,
      reverse_undefined)``; each table is ``(La, Lb)``.

    Raises:
      ValueError: unknown measure, a measure without moments with ``chunk_size``,
        mismatched sample counts, NaN/Inf, a bad split, a measure that returns a
        non-finite value without raising (named by its pair), or with
        ``on_undefined="raise"`` an undefined cell.

    Examples:
      >>> import jax
      >>> x = jax.random.normal(jax.random.key(0), (40, 3))
      >>> g = compare_grid({"a": x, "b": 2 * x}, [x, x[:, :2]], measures=["cka/linear", "stitch/affine"],
      ...                  reverse=True)
      >>> g.tables["cka/linear"].shape, g.rows, sorted(g.reverse)
      ((2, 2), ('a', 'b'), ['cka/linear', 'stitch/affine'])

      A dead layer (constant) leaves its cells undefined, not the grid:

      >>> import warnings
      >>> with warnings.catch_warnings(record=True) as w:
      ...     warnings.simplefilter("always")
      ...     g = compare_grid({"x": x, "dead": 0 * x}, [x], measures="cka/linear")
      >>> g.tables["cka/linear"][:, 0].tolist()[1], list(g.undefined["cka/linear"]), w[0].category.__name__
      (nan, [(1, 0)], 'UndefinedCellWarning')
    """
    streaming = chunk_size is not None
    if streaming and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    reverse = V.check_bool(reverse, "reverse")
    strict = V.check_choice(on_undefined, "on_undefined", ("nan", "raise")) == "raise"
    measures = [measures] if isinstance(measures, str) else list(measures)
    moment, generic = _resolve(measures, streaming=streaming)
    if generic:
        _refuse_process_sharded(reps_a, reps_b, generic[0][0])
    # Generic measures need the eager value checks; the moment measures check
    # values inside their first pass (cheaper, and possible while streaming).
    buckets = V.check_bool(buckets, "buckets")
    lay = _prepare(reps_a, reps_b, eager_values=bool(generic), streaming=streaming, strict=strict, buckets=buckets)
    weights = split_weights(lay.n, split, key, lay.dtype)  # validates split even when no measure uses it
    plan = _make_plan(devices)
    sus = _Suspects(len(lay.va), len(lay.vb))
    fwd, rev = {}, {}
    if moment:
        fwd, rev = _moment_tables(lay, moment, sus, reverse=reverse, weights=weights, chunk_size=chunk_size,
                                  plan=plan, strict=strict)
    stacks = _Stacks(lay, plan)
    # the moment passes flag near-constant layers (and rank-deficient ones on the train rows); samples
    # constant across features need the layers themselves (no built-in moment measure minds them)
    if generic or (not streaming and any("constant_rows" not in m.robust_to for _, m in moment)):
        _flag_generic_layers(lay, stacks, sus)
    for name, m in generic:
        fwd[name], r = _generic_table(lay, m, reverse=reverse and not m.symmetric, plan=plan,
                                      stats_budget=stats_budget, stacks=stacks)
        if r is not None:
            rev[name] = r
    measures = list(dict.fromkeys(measures))
    undefined, rev_undefined = {}, {}
    for name in measures:
        m = get_measure(name)
        undefined[name] = _settle(name, m, fwd[name], sus.cells(name, "a", m.robust_to), lay,
                                  reverse=False, strict=strict)
        if name in rev:
            rev_undefined[name] = _settle(name, m, rev[name], sus.cells(name, "b", m.robust_to), lay,
                                          reverse=True, strict=strict)
        elif reverse:  # a symmetric measure is its own reverse, where both directions are defined
            rev[name], rev_undefined[name] = _settle_symmetric_reverse(
                name, m, fwd[name], undefined[name], sus.cells(name, "b", m.robust_to), lay,
                strict=strict)
    _warn_undefined(undefined, rev_undefined, lay)
    tables = {name: jnp.asarray(fwd[name]) for name in measures}
    rev_tables = {}
    if reverse:
        rev_tables = {name: tables[name] if rev[name] is fwd[name] else jnp.asarray(rev[name]) for name in measures}
    return GridResult(tables, lay.rows, lay.cols, rev_tables, undefined, rev_undefined)
