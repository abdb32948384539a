"""All-pairs comparisons across layers and models: vmapped, streamed, sharded (DESIGN.md §3).

:func:`compare_grid` takes two collections of layer representations of the
same samples and returns one ``(La, Lb)`` table per measure.

* **Statistics once per layer.** For the *moment measures*
  (:data:`MOMENT_MEASURES`: the ``stitch/*`` reconstruction scores, linear
  CKA, NBS and the Procrustes distance) every layer's centred, normalised
  second moments (Gram/covariance, train and test parts, norms, means, the
  Cholesky factor of the normal equations) are computed once, and each pair
  only adds its cross-covariance and an SVD or a triangular solve. These are
  exactly the formulas of the pairwise functions
  (:func:`similarity.reconstruction_score`, :func:`similarity.cka`,
  :func:`similarity.nbs`, :func:`similarity.procrustes_distance`), so the
  grid agrees with calling them pair by pair.
  The cross moments of all pairs of two width groups come out of one large GEMM.
* **Any other registered measure** (``similarity.measure(name)``) that has
  per-layer statistics (``Measure.stats``: the RDM for RSA, the kernel matrix
  for CKA, an orthonormal basis for the CCA family, an SVD for regression)
  computes them once per layer and only the cheap pairwise step per pair, as
  long as they fit in ``stats_budget``; otherwise the measure is mapped over
  the pairs on the raw representations.
* **Batches by width.** Layers are grouped by width; the pairs of each
  ``(d_a, d_b)`` group are evaluated in one jit-compiled call.
* **Sharding.** The pair axis is sharded over a 1-D ``jax.sharding.Mesh`` of
  the available devices (layer statistics are replicated), so the same call
  uses every GPU/TPU, or every host after ``jax.distributed.initialize()``;
  the results equal the single-device run.
* **Streaming.** With ``chunk_size``, samples are read in chunks of rows
  (numpy arrays or memmaps are fine; only one chunk per layer is on the device
  at a time), and the moments are accumulated in two passes (means, then
  centred moments); the answer equals the one-shot call up to rounding. Only
  the moment measures stream.

Stitching measures are directed and come in both directions:
``tables["stitch/affine"][i, j]`` scores ``A_i -> B_j`` (held out) and
``tables["stitch/affine/reverse"][i, j]`` scores ``B_j -> A_i``; the keys
``.../in_sample`` hold the in-sample (leaky) counterparts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from similarity import _validate as V
from similarity._linalg import svd as _svd
from similarity import stitching as S
from similarity.registry import measure as get_measure

STITCH_MEASURES = tuple(f"stitch/{f}" for f in S.FAMILIES)
MOMENT_MEASURES = STITCH_MEASURES + ("cka/linear", "nbs", "procrustes")


class GridResult(NamedTuple):
    """Tables of an all-pairs comparison.

    Attributes:
      tables: ``{name: (La, Lb) array}``; entry ``[i, j]`` compares ``rows[i]``
        with ``cols[j]`` (stitching keys: see the module docstring).
      rows: names of the ``reps_a`` layers.
      cols: names of the ``reps_b`` layers.
    """

    tables: dict[str, jax.Array]
    rows: tuple
    cols: tuple


# ----------------------------------------------------------------------------- moments


# A width group holds L layers of width d, passed to the jitted passes as a
# tuple of ``(c, d)`` row chunks. Per-layer moments stack them as ``(L, c, d)``
# (a batched GEMM); cross moments put them side by side as ``(c, L * d)`` so
# that every pair of two groups comes out of a single large GEMM.


@jax.jit
def _acc_means(zs, w_tr):
    """Pass 1 for a tuple of L ``(c, d)`` chunks.

    Returns ``(sum_train (L*d,), sum_all (L*d,), max_abs (L,), finite (L,))``:
    column sums over the train rows and over all rows, each layer's largest
    ``|z|`` and whether it is all finite (for the input checks).
    """
    z = jnp.concatenate(zs, axis=1)
    return (
        jnp.einsum("n,nd->d", w_tr, z),
        jnp.sum(z, axis=0),
        jnp.stack([jnp.max(jnp.abs(jnp.where(jnp.isfinite(x), x, 0))) for x in zs]),
        jnp.stack([jnp.all(jnp.isfinite(x)) for x in zs]),
    )


@functools.partial(jax.jit, static_argnames=("split", "full"))
def _acc_layer(zs, mean_tr, mean_all, w_tr, w_te, *, split, full):
    """Pass 2 for a tuple of L ``(c, d)`` chunks: each layer's centred second moments ``(L, d, d)``.

    ``split``: train/test moments around the train mean (stitching); ``full``:
    the all-rows moment around the all-rows mean (CKA, NBS, Procrustes).
    """
    z = jnp.stack(zs)  # (L, c, d)
    shape = (z.shape[0], 1, z.shape[2])
    out = {}
    if split:
        zt = z - mean_tr.reshape(shape)
        out["g_tr"] = jnp.einsum("n,lni,lnj->lij", w_tr, zt, zt)
        out["g_te"] = jnp.einsum("n,lni,lnj->lij", w_te, zt, zt)
        out["s_te"] = jnp.einsum("n,lni->li", w_te, zt)
    if full:
        za = z - mean_all.reshape(shape)
        out["g_all"] = jnp.einsum("lni,lnj->lij", za, za)
    return out


def _pair_blocks(u, v, la, lb):
    """``u: (c, la*da)``, ``v: (c, lb*db)`` -> ``(la*lb, da, db)``: ``u_k^T v_l`` for pair ``k*lb + l``."""
    m = jnp.einsum("ni,nj->ij", u, v)  # one GEMM for every pair
    da, db = u.shape[1] // la, v.shape[1] // lb
    return m.reshape(la, da, lb, db).transpose(0, 2, 1, 3).reshape(la * lb, da, db)


@functools.partial(jax.jit, static_argnames=("split", "full", "sharding"))
def _acc_cross(zas, zbs, ma_tr, mb_tr, ma_all, mb_all, w_tr, w_te, *, split, full, sharding):
    """Pass 2 cross moments of every pair of two tuples of chunks, ``(La*Lb, da, db)`` each.

    ``sharding`` (or None) places the source block's columns, whole layers per
    device, so each device computes the pairs of its own source layers.
    """
    la, lb = len(zas), len(zbs)
    za, zb = jnp.concatenate(zas, axis=1), jnp.concatenate(zbs, axis=1)
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


def _layer_finish(sums, mean_tr, n_te, *, split, full):
    """``(LayerMoments or None, norm_all or None, normalised all-rows Gram or None)``."""
    lm = norm_all = g_all = None
    if split:
        norm = jnp.sqrt(jnp.trace(sums["g_tr"], axis1=1, axis2=2))
        lm = S.LayerMoments(
            mean=mean_tr,
            norm=norm,
            gram_train=sums["g_tr"] / norm[:, None, None] ** 2,
            gram_test=sums["g_te"] / norm[:, None, None] ** 2,
            sum_test=sums["s_te"] / norm[:, None],
            n_test=jnp.broadcast_to(n_te, norm.shape),
        )
    if full:
        norm_all = jnp.sqrt(jnp.trace(sums["g_all"], axis1=1, axis2=2))
        g_all = sums["g_all"] / norm_all[:, None, None] ** 2
    return lm, norm_all, g_all


@functools.partial(jax.jit, static_argnames=("names", "ridge"))
def _evaluate(lm_a, lm_b, g_a, g_b, nrm_a, nrm_b, chol_a, chol_b, pm, ia, jb, *, names, ridge):
    """Every moment measure for the pairs ``(ia[p], jb[p])``; returns ``{key: (P,)}``."""

    def one(i, j, c_tr, c_te, c_all):
        ma = jax.tree.map(lambda t: t[i], lm_a)
        mb = jax.tree.map(lambda t: t[j], lm_b)
        if c_tr is not None:  # stitching measures requested
            na, nb = ma.norm, mb.norm
            fwd_pm = S.PairMoments(c_tr / (na * nb), c_te / (na * nb))
            bwd_pm = S.PairMoments(fwd_pm.cross_train.T, fwd_pm.cross_test.T)
        out = {}
        # The SVDs go through similarity._linalg.svd, which on the CPU runs a vmapped
        # batch as unbatched kernels: jaxlib's batched CPU SVD blocks XLA's thread
        # pool and deadlocks when several run at once (see that module).
        for name in names:
            if name.startswith("stitch/"):
                fam = name.split("/")[1]
                f = S.score_from_moments(ma, mb, fwd_pm, family=fam, ridge=ridge,
                                         chol=chol_a[i] if fam == "affine" else None)
                b = S.score_from_moments(mb, ma, bwd_pm, family=fam, ridge=ridge,
                                         chol=chol_b[j] if fam == "affine" else None)
                out[name], out[name + "/in_sample"] = f.held_out, f.in_sample
                out[name + "/reverse"], out[name + "/reverse/in_sample"] = b.held_out, b.in_sample
            else:
                c = c_all / (nrm_a[i] * nrm_b[j])
                if name == "cka/linear":
                    out[name] = jnp.sum(c * c) / jnp.sqrt(jnp.sum(g_a[i] ** 2) * jnp.sum(g_b[j] ** 2))
                else:
                    nuc = jnp.sum(_svd(c, compute_uv=False))
                    out[name] = nuc if name == "nbs" else 2.0 - 2.0 * nuc
        return out

    return jax.vmap(one)(ia, jb, pm.get("c_tr"), pm.get("c_te"), pm.get("c_all"))


@functools.partial(jax.jit, static_argnames=("fn",))
def _generic(xa, xb, ia, jb, *, fn):
    # lax.map, not vmap: a generic measure works on the raw (n, d) representations,
    # and vmapping it over every pair would hold all pairs' (n, d)-sized intermediates.
    return jax.lax.map(lambda ij: fn(xa[ij[0]], xb[ij[1]]), (ia, jb))


@functools.partial(jax.jit, static_argnames=("fn",))
def _layer_stats(x, *, fn):
    """``fn`` (a measure's ``LayerStats.layer``) on each layer of a stack ``(L, n, d)``."""
    return jax.lax.map(fn, x)


@functools.partial(jax.jit, static_argnames=("fn",))
def _pairs_from_stats(sa, sb, ia, jb, *, fn):
    """``fn(sa[ia[p]], sb[jb[p]])`` for every pair ``p`` (``LayerStats.pair``)."""

    def one(ij):
        pick = lambda s, k: jax.tree.map(lambda t: t[k], s)  # noqa: E731
        return fn(pick(sa, ij[0]), pick(sb, ij[1]))

    return jax.lax.map(one, (ia, jb))


def _stats_fit(stats, n, widths, dtype, budget) -> bool:
    """Whether every layer's statistics fit in ``budget`` bytes together (e.g. ``n^2`` RDMs)."""
    if stats is None:
        return False
    total = 0
    for d in widths:
        shapes = jax.eval_shape(stats.layer, jax.ShapeDtypeStruct((n, d), dtype))
        total += sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(shapes))
    return total <= budget


# ----------------------------------------------------------------------------- helpers


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


def _check_layers(vals, name, *, eager_values, streaming):
    """Shape and dtype checks; with ``eager_values`` also NaN/Inf and constant layers.

    Without ``eager_values`` (moment measures only) the arrays stay where they
    are (host arrays are read chunk by chunk) and the value checks run inside
    the first pass (see :func:`_raise_non_finite`, :func:`_raise_constant`).
    """
    out = []
    for k, z in enumerate(vals):
        nm = f"{name}[{k}]"
        if not eager_values:
            if not streaming:  # to a float device array (ints and bools are cast), once
                z = V.as_float_array(z, nm)
            if not hasattr(z, "shape") or len(z.shape) != 2:
                raise ValueError(f"{nm} must be a 2-D (n, d) array, got {getattr(z, 'shape', type(z))}.")
            V.compute_dtype(z.dtype, nm)  # complex or non-numeric: TypeError
            if z.shape[0] < 2 or z.shape[1] < 1:
                raise ValueError(f"{nm} has shape {tuple(z.shape)}; it needs at least 2 samples and 1 feature.")
            out.append(z)
        else:
            z = V.check_rep(z, nm)
            V.check_not_constant(z, nm, what="the comparison grid")
            out.append(z)
    return out


def _raise_non_finite(side_name, idx, finite) -> None:
    """Raise for the first layer whose pass-1 flag says it holds NaN or Inf."""
    if not V.is_concrete(finite):
        return
    bad = np.flatnonzero(~np.asarray(finite))
    if bad.size:
        raise ValueError(f"{side_name}[{idx[bad[0]]}] contains NaN or Inf values; remove or impute them.")


def _raise_constant(side_name, idx, max_abs, norm, n, d, dtype, where) -> None:
    """Raise for the first constant layer of a width group.

    A layer counts as constant when the root-mean-square of its centred values
    is at most ``tol * max|z|``, with ``tol = max(1e-12, 16 * eps(dtype))``: below
    that the centred data is rounding noise and every score would be 0/0.
    """
    if not V.is_concrete(norm, max_abs):
        return
    tol = max(1e-12, 16 * float(jnp.finfo(dtype).eps))
    rms = np.asarray(norm, np.float64) / np.sqrt(n * d)
    bad = np.flatnonzero(~(rms > tol * np.asarray(max_abs, np.float64)))
    if bad.size:
        raise ValueError(
            f"{side_name}[{idx[bad[0]]}] (width {d}) is constant across {where} (zero variance "
            "after centring), so its scores are undefined (0/0). Check that the layer is not "
            "dead and that the samples differ."
        )


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


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


# ----------------------------------------------------------------------------- public


def compare_grid(
    reps_a: Mapping[Any, ArrayLike] | Sequence[ArrayLike],
    reps_b: Mapping[Any, ArrayLike] | Sequence[ArrayLike] | None = None,
    /,
    *,
    measures: Sequence[str] = ("cka/linear", "stitch/affine"),
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    ridge: float = 0.0,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    stats_budget: float = 2.0 * 2**30,
) -> GridResult:
    """Compare every layer of ``reps_a`` with every layer of ``reps_b``.

    Args:
      reps_a: dict ``{name: (n, d_i)}`` or list of ``(n, d_i)`` arrays.
      reps_b: the same for the other model (default: ``reps_a``). Same ``n``
        samples, in the same order, as ``reps_a``.
      measures: registry names (``similarity.list_measures()``; one name may be
        passed as a plain string), including
        ``"stitch/affine"``, ``"stitch/scaled_orthogonal"``, ``"stitch/orthogonal"``.
      split: train fraction or ``(train_idx, test_idx)`` for the stitching
        measures (the same split for every pair, as in
        :func:`similarity.reconstruction_score`).
      key: PRNG key for a fractional split (default ``jax.random.key(0)``).
      ridge: ridge of the affine stitcher.
      chunk_size: stream samples in chunks of this many rows (moment measures only).
      devices: devices to shard the pair axis over (default: all of ``jax.devices()``).
      stats_budget: bytes allowed for the per-layer statistics of a measure that
        has them (``Measure.stats``: RDMs, kernel matrices, bases), all layers
        together. Within it, such a measure does its per-layer work once per
        layer; above it (e.g. ``n^2`` RDMs for large ``n``), once per pair.

    Returns:
      :class:`GridResult` ``(tables, rows, cols)``; each table is ``(La, Lb)``.

    Raises:
      ValueError: unknown measure, a non-streamable measure with ``chunk_size``,
        mismatched sample counts, NaN/Inf, constant layers, bad split.

    Examples:
      >>> import jax
      >>> x = jax.random.normal(jax.random.key(0), (40, 3))
      >>> g = compare_grid({"a": x, "b": 2 * x}, [x, x[:, :2]], measures=["cka/linear"])
      >>> g.tables["cka/linear"].shape, g.rows
      ((2, 2), ('a', 'b'))
    """
    streaming = chunk_size is not None
    rows, va = _as_layers(reps_a, "reps_a")
    cols, vb = _as_layers(reps_a if reps_b is None else reps_b, "reps_b")
    measures = list(dict.fromkeys([measures] if isinstance(measures, str) else measures))
    if not measures:
        raise ValueError("measures is empty; e.g. measures=['cka/linear', 'stitch/affine'].")
    generic = {}
    for m in measures:
        if m in MOMENT_MEASURES:
            continue
        if m.startswith("stitch/"):
            V.check_choice(m, "measure name", STITCH_MEASURES)
        generic[m] = get_measure(m)
        if streaming:
            raise ValueError(
                f"measure {m!r} cannot stream samples in chunks; with chunk_size only "
                f"{', '.join(MOMENT_MEASURES)} are available. Drop chunk_size or the measure."
            )
    if streaming and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    S._check_options("affine", ridge)
    # Generic measures need the eager value checks; the moment measures check
    # values inside their first pass (cheaper, and possible while streaming).
    eager = bool(generic)
    va = _check_layers(va, "reps_a", eager_values=eager, streaming=streaming)
    vb = _check_layers(vb, "reps_b", eager_values=eager, streaming=streaming)
    n = va[0].shape[0]
    for nm, vs in (("reps_a", va), ("reps_b", vb)):
        for k, z in enumerate(vs):
            if z.shape[0] != n:
                raise ValueError(
                    f"every layer must hold the same samples: reps_a[0] has n={n} but "
                    f"{nm}[{k}] has shape {tuple(z.shape)}."
                )
    dt = functools.reduce(jnp.promote_types, [V.compute_dtype(z.dtype, "reps") for z in va + vb])
    plan = _make_plan(devices)
    moment = [m for m in measures if m in MOMENT_MEASURES]
    tables: dict[str, np.ndarray] = {}
    La, Lb = len(va), len(vb)

    # Width groups of layers, and pair groups by (d_a, d_b).
    def groups(vs):
        g: dict[int, list[int]] = {}
        for k, z in enumerate(vs):
            g.setdefault(int(z.shape[1]), []).append(k)
        return g

    ga, gb = groups(va), groups(vb)
    pair_groups = [(da, db) for da in ga for db in gb]

    def chunk(vs, idx, lo=0, hi=None):
        """Rows ``lo:hi`` of layers ``idx`` of ``vs``, as a tuple of ``(c, d)`` device arrays."""
        hi = n if hi is None else hi
        return tuple(jnp.asarray(vs[k][lo:hi] if (lo, hi) != (0, n) else vs[k], dtype=dt) for k in idx)

    stacks: dict = {}

    def stack(side, d):
        """Layers of width ``d`` of one side as ``(L, n, d)``, built once for all generic measures."""
        if (side, d) not in stacks:
            vs, g = (va, ga) if side == "a" else (vb, gb)
            stacks[side, d] = _replicate(plan, jnp.stack([jnp.asarray(vs[k], dtype=dt) for k in g[d]]))
        return stacks[side, d]

    if moment:
        w_tr, w_te = S.split_weights(n, split, key, dt)
        need_split = any(m.startswith("stitch/") for m in moment)
        need_full = any(not m.startswith("stitch/") for m in moment)
        if need_split:
            n_tr = int(round(float(jnp.sum(w_tr))))
            dmax = max(z.shape[1] for z in va + vb)
            for m in moment:
                if m.startswith("stitch/"):
                    S._check_fit_rows(n_tr, dmax, m.split("/")[1], ridge, "the train split")
        # When the split covers every row once, the all-rows moments follow from the
        # train/test ones (see _shift_full) and need no GEMMs of their own.
        derive_full = need_split and need_full and bool(np.all(np.asarray(w_tr + w_te) == 1))
        flags = dict(split=need_split, full=need_full and not derive_full)
        chunks = [(lo, min(lo + chunk_size, n)) for lo in range(0, n, chunk_size)] if streaming else [(0, n)]
        n_tr_f, n_all = jnp.sum(w_tr), jnp.asarray(n, dt)
        side_names = {"a": "reps_a", "b": "reps_b"}

        # pass 1: means (L * d,), and the value checks
        means = {}
        for side, vs, g in (("a", va, ga), ("b", vb, gb)):
            for d, idx in g.items():
                acc, mx, fin_ok = None, None, None
                for lo, hi in chunks:
                    s_tr, s_all, m_abs, ok = _acc_means(chunk(vs, idx, lo, hi), w_tr[lo:hi])
                    acc = _add(acc, (s_tr, s_all))
                    mx = m_abs if mx is None else jnp.maximum(mx, m_abs)
                    fin_ok = ok if fin_ok is None else fin_ok & ok
                _raise_non_finite(side_names[side], idx, fin_ok)
                means[side, d] = (acc[0] / n_tr_f, acc[1] / n_all, mx)
        # pass 2: centred moments, per layer and per pair
        lsums, psums, pidx = {}, {}, {}
        for side, vs, g in (("a", va, ga), ("b", vb, gb)):
            for d, idx in g.items():
                acc = None
                for lo, hi in chunks:
                    acc = _add(acc, _acc_layer(chunk(vs, idx, lo, hi), *means[side, d][:2], w_tr[lo:hi],
                                               w_te[lo:hi], **flags))
                if derive_full:
                    delta = (means[side, d][1] - means[side, d][0]).reshape(len(idx), d)
                    acc["g_all"] = _shift_full(acc["g_tr"] + acc["g_te"], delta, delta, n_all)
                lsums[side, d] = acc
        n_te = jnp.sum(w_te)
        fin = {k: _layer_finish(v, means[k][0], n_te, split=need_split, full=need_full)
               for k, v in lsums.items()}
        for (side, d), (lm, norm_all, _) in fin.items():
            idx = (ga if side == "a" else gb)[d]
            if lm is not None:
                _raise_constant(side_names[side], idx, means[side, d][2], lm.norm, float(n_tr_f), d, dt,
                                "the train rows")
            if norm_all is not None:
                _raise_constant(side_names[side], idx, means[side, d][2], norm_all, n, d, dt, "samples")
        for da, db in pair_groups:
            # Pad the source layers to a multiple of the device count (repeating the
            # last one), so the pair axis (source-major) splits evenly over the mesh;
            # padded pairs come last and are dropped.
            la, lb = len(ga[da]), len(gb[db])
            la_pad = la + (-la) % plan.ndev
            pad_a = np.minimum(np.arange(la_pad), la - 1)
            idx_a = [ga[da][k] for k in pad_a]
            ia, jb = np.repeat(pad_a, lb), np.tile(np.arange(lb), la_pad)
            pidx[da, db] = (ia, jb, la * lb)
            shard = None if plan.mesh is None else NamedSharding(plan.mesh, P(None, "pairs"))
            ma_tr, ma_all = (m.reshape(la, da)[pad_a].reshape(-1) for m in means["a", da][:2])
            acc = None
            for lo, hi in chunks:
                rest = _replicate(plan, (ma_tr, ma_all, *means["b", db][:2], w_tr[lo:hi], w_te[lo:hi]))
                m_tr, m_all, mb_tr, mb_all, wt, we = rest
                acc = _add(acc, _acc_cross(_replicate(plan, chunk(va, idx_a, lo, hi)),
                                           _replicate(plan, chunk(vb, gb[db], lo, hi)),
                                           m_tr, mb_tr, m_all, mb_all, wt, we, sharding=shard, **flags))
            if derive_full:
                d_a = (means["a", da][1] - means["a", da][0]).reshape(la, da)[ia]
                d_b = (means["b", db][1] - means["b", db][0]).reshape(lb, db)[jb]
                acc["c_all"] = _shift_full(acc["c_tr"] + acc["c_te"], d_a, d_b, n_all)
            psums[da, db] = acc
        chol = {}
        if "stitch/affine" in moment:
            for k, (lm, _, _) in fin.items():
                mask = jnp.ones((lm.gram_train.shape[1],), dt)
                chol[k] = jax.vmap(lambda g: S.affine_system(g, ridge=float(ridge), mask=mask))(lm.gram_train)
        names = tuple(moment)
        for da, db in pair_groups:
            lma, nra, gra = fin["a", da]
            lmb, nrb, grb = fin["b", db]
            ia, jb, n_real = pidx[da, db]
            ia_s, jb_s = _put_pairs(plan, ia, jb)
            ca = chol.get(("a", da), jnp.zeros((len(ga[da]), 0, 0), dt))
            cb = chol.get(("b", db), jnp.zeros((len(gb[db]), 0, 0), dt))
            res = _evaluate(*_replicate(plan, (lma, lmb, gra, grb, nra, nrb, ca, cb)),
                            psums[da, db], ia_s, jb_s, names=names, ridge=float(ridge))
            ia, jb = ia[:n_real], jb[:n_real]
            for key_, vals in res.items():
                t = tables.setdefault(key_, np.full((La, Lb), np.nan, dtype=dt))
                vals = _to_host(vals)[:n_real]
                t[np.asarray(ga[da])[ia], np.asarray(gb[db])[jb]] = vals
        for key_, t in tables.items():
            if not np.all(np.isfinite(t)):
                raise ValueError(
                    f"{key_}: some entries are not finite (singular normal equations for an "
                    "affine stitcher, or degenerate layers). Pass ridge > 0."
                )
    for m, meas in generic.items():
        t = np.full((La, Lb), np.nan, dtype=dt)
        st = meas.stats if _stats_fit(meas.stats, n, [z.shape[1] for z in va + vb], dt, stats_budget) else None
        if st is not None:  # per-layer work once per layer
            sa = {d: _replicate(plan, _layer_stats(stack("a", d), fn=st.layer)) for d in ga}
            sb = {d: _replicate(plan, _layer_stats(stack("b", d), fn=st.layer)) for d in gb}
        for da, db in pair_groups:
            ia, jb = np.meshgrid(np.arange(len(ga[da])), np.arange(len(gb[db])), indexing="ij")
            ia, jb = ia.ravel(), jb.ravel()
            ia_s, jb_s = _put_pairs(plan, ia, jb)
            if st is not None:
                out = _pairs_from_stats(sa[da], sb[db], ia_s, jb_s, fn=st.pair)
            else:
                out = _generic(stack("a", da), stack("b", db), ia_s, jb_s, fn=meas.fn)
            t[np.asarray(ga[da])[ia], np.asarray(gb[db])[jb]] = _to_host(out)[: len(ia)]
        if not np.all(np.isfinite(t)):
            i, j = np.argwhere(~np.isfinite(t))[0]
            raise ValueError(
                f"{m}: the entry for rows[{i}] = {rows[i]!r} and cols[{j}] = {cols[j]!r} is not finite "
                f"(undefined for those layers). Call similarity.measure({m!r})(a, b) on that pair "
                "to see which input check fails."
            )
        tables[m] = t
    return GridResult({k: jnp.asarray(v) for k, v in tables.items()}, rows, cols)
