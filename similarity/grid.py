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
* **Any other registered measure** (``similarity.measure(name)``) is vmapped
  over the pairs of each width group, on the raw representations.
* **Batches by width.** Layers are stacked by width; the pairs of each
  ``(d_a, d_b)`` group are evaluated in one vmapped, jit-compiled call.
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


def _acc_means(z, w_tr):
    """Pass 1 for a stack ``(L, c, d)``: sums over train rows and over all rows."""
    return jnp.einsum("n,lnd->ld", w_tr, z), jnp.sum(z, axis=1)


def _acc_layer(z, mean_tr, mean_all, w_tr, w_te):
    """Pass 2 for a stack ``(L, c, d)``: centred second moments."""
    zt = z - mean_tr[:, None, :]
    za = z - mean_all[:, None, :]
    return dict(
        g_tr=jnp.einsum("n,lni,lnj->lij", w_tr, zt, zt),
        g_te=jnp.einsum("n,lni,lnj->lij", w_te, zt, zt),
        s_te=jnp.einsum("n,lni->li", w_te, zt),
        g_all=jnp.einsum("lni,lnj->lij", za, za),
    )


def _acc_pairs(za, zb, ia, jb, ma_tr, mb_tr, ma_all, mb_all, w_tr, w_te):
    """Pass 2 cross moments for the pairs ``(ia[p], jb[p])`` of two stacks."""

    def one(i, j):
        a, b = za[i], zb[j]
        at, bt = a - ma_tr[i][None, :], b - mb_tr[j][None, :]
        aa, ba = a - ma_all[i][None, :], b - mb_all[j][None, :]
        return dict(
            c_tr=jnp.einsum("n,ni,nj->ij", w_tr, at, bt),
            c_te=jnp.einsum("n,ni,nj->ij", w_te, at, bt),
            c_all=jnp.einsum("ni,nj->ij", aa, ba),
        )

    return jax.vmap(one)(ia, jb)


_acc_means_j = jax.jit(_acc_means)
_acc_layer_j = jax.jit(_acc_layer)
_acc_pairs_j = jax.jit(_acc_pairs)


def _add(acc, new):
    return new if acc is None else jax.tree.map(jnp.add, acc, new)


def _layer_finish(sums, mean_tr, n_te):
    norm = jnp.sqrt(jnp.trace(sums["g_tr"], axis1=1, axis2=2))
    norm_all = jnp.sqrt(jnp.trace(sums["g_all"], axis1=1, axis2=2))
    lm = S.LayerMoments(
        mean=mean_tr,
        norm=norm,
        gram_train=sums["g_tr"] / norm[:, None, None] ** 2,
        gram_test=sums["g_te"] / norm[:, None, None] ** 2,
        sum_test=sums["s_te"] / norm[:, None],
        n_test=jnp.broadcast_to(n_te, norm.shape),
    )
    return lm, norm_all, sums["g_all"] / norm_all[:, None, None] ** 2


@functools.partial(jax.jit, static_argnames=("names", "ridge"))
def _evaluate(lm_a, lm_b, g_a, g_b, nrm_a, nrm_b, chol_a, chol_b, pm, ia, jb, *, names, ridge):
    """Every moment measure for the pairs ``(ia[p], jb[p])``; returns ``{key: (P,)}``."""

    def one(i, j, c_tr, c_te, c_all):
        ma = jax.tree.map(lambda t: t[i], lm_a)
        mb = jax.tree.map(lambda t: t[j], lm_b)
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

    return jax.vmap(one)(ia, jb, pm["c_tr"], pm["c_te"], pm["c_all"])


@functools.partial(jax.jit, static_argnames=("fn",))
def _generic(xa, xb, ia, jb, *, fn):
    # lax.map, not vmap: a generic measure works on the raw (n, d) representations,
    # and vmapping it over every pair would hold all pairs' (n, d)-sized intermediates.
    return jax.lax.map(lambda ij: fn(xa[ij[0]], xb[ij[1]]), (ia, jb))


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


def _check_layers(vals, name, streaming):
    out = []
    for k, z in enumerate(vals):
        nm = f"{name}[{k}]"
        if streaming:  # keep host arrays on the host; check shape and dtype only
            if not hasattr(z, "shape") or len(z.shape) != 2:
                raise ValueError(f"{nm} must be a 2-D (n, d) array, got {getattr(z, 'shape', type(z))}.")
            if not np.issubdtype(np.dtype(z.dtype), np.floating):
                raise TypeError(f"{nm} has dtype {z.dtype}; pass float arrays.")
            out.append(z)
        else:
            z = V.check_rep(z, nm)
            V.check_not_constant(z, nm, what="the comparison grid")
            out.append(z)
    return out


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
) -> GridResult:
    """Compare every layer of ``reps_a`` with every layer of ``reps_b``.

    Args:
      reps_a: dict ``{name: (n, d_i)}`` or list of ``(n, d_i)`` arrays.
      reps_b: the same for the other model (default: ``reps_a``). Same ``n``
        samples, in the same order, as ``reps_a``.
      measures: registry names (``similarity.list_measures()``), including
        ``"stitch/affine"``, ``"stitch/scaled_orthogonal"``, ``"stitch/orthogonal"``.
      split: train fraction or ``(train_idx, test_idx)`` for the stitching
        measures (the same split for every pair, as in
        :func:`similarity.reconstruction_score`).
      key: PRNG key for a fractional split (default ``jax.random.key(0)``).
      ridge: ridge of the affine stitcher.
      chunk_size: stream samples in chunks of this many rows (moment measures only).
      devices: devices to shard the pair axis over (default: all of ``jax.devices()``).

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
    measures = list(dict.fromkeys(measures))
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
    va = _check_layers(va, "reps_a", streaming)
    vb = _check_layers(vb, "reps_b", streaming)
    n = va[0].shape[0]
    for nm, vs in (("reps_a", va), ("reps_b", vb)):
        for k, z in enumerate(vs):
            if z.shape[0] != n:
                raise ValueError(
                    f"every layer must hold the same samples: reps_a[0] has n={n} but "
                    f"{nm}[{k}] has shape {tuple(z.shape)}."
                )
    dt = functools.reduce(jnp.promote_types, [jnp.dtype(z.dtype) for z in va + vb])
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

    def stack(vs, idx, lo=0, hi=None):
        hi = n if hi is None else hi
        return jnp.stack([jnp.asarray(vs[k][lo:hi], dtype=dt) for k in idx])

    if moment:
        w_tr, w_te = S.split_weights(n, split, key, dt)
        any_stitch = any(m.startswith("stitch/") for m in moment)
        if any_stitch:
            n_tr = int(round(float(jnp.sum(w_tr))))
            dmax = max(z.shape[1] for z in va + vb)
            if "stitch/affine" in moment:
                S._check_affine_rank(n_tr, dmax, "affine", ridge, "the train split")
        chunks = [(lo, min(lo + chunk_size, n)) for lo in range(0, n, chunk_size)] if streaming else [(0, n)]
        n_tr_f, n_all = jnp.sum(w_tr), jnp.asarray(n, dt)

        # pass 1: means
        means = {}
        for side, vs, g in (("a", va, ga), ("b", vb, gb)):
            for d, idx in g.items():
                acc = None
                for lo, hi in chunks:
                    acc = _add(acc, _acc_means_j(stack(vs, idx, lo, hi), w_tr[lo:hi]))
                means[side, d] = (acc[0] / n_tr_f, acc[1] / n_all)
        # pass 2: centred moments, per layer and per pair
        lsums, psums, pidx = {}, {}, {}
        for side, vs, g in (("a", va, ga), ("b", vb, gb)):
            for d, idx in g.items():
                acc = None
                for lo, hi in chunks:
                    acc = _add(acc, _acc_layer_j(stack(vs, idx, lo, hi), *means[side, d],
                                                 w_tr[lo:hi], w_te[lo:hi]))
                lsums[side, d] = acc
        for da, db in pair_groups:
            ia, jb = np.meshgrid(np.arange(len(ga[da])), np.arange(len(gb[db])), indexing="ij")
            ia, jb = ia.ravel(), jb.ravel()
            pidx[da, db] = (ia, jb)
            ia_s, jb_s = _put_pairs(plan, ia, jb)
            acc = None
            for lo, hi in chunks:
                xa = _replicate(plan, stack(va, ga[da], lo, hi))
                xb = _replicate(plan, stack(vb, gb[db], lo, hi))
                rest = _replicate(plan, (*means["a", da], *means["b", db], w_tr[lo:hi], w_te[lo:hi]))
                ma_tr, ma_all, mb_tr, mb_all, wt, we = rest
                acc = _add(acc, _acc_pairs_j(xa, xb, ia_s, jb_s, ma_tr, mb_tr, ma_all, mb_all, wt, we))
            psums[da, db] = acc
        n_te = jnp.sum(w_te)
        fin = {k: _layer_finish(v, means[k][0], n_te) for k, v in lsums.items()}
        for k, (lm, _, _) in fin.items():
            if V.is_concrete(lm.norm) and not np.all(np.asarray(lm.norm) > 0):
                side = {"a": "reps_a", "b": "reps_b"}[k[0]]
                raise ValueError(
                    f"a layer of {side} with width {k[1]} is constant on the train rows (zero "
                    "variance), so its scores are undefined. Check for dead layers."
                )
        chol = {}
        if "stitch/affine" in moment:
            for k, (lm, _, _) in fin.items():
                mask = jnp.ones((lm.gram_train.shape[1],), dt)
                chol[k] = jax.vmap(lambda g: S.affine_system(g, ridge=float(ridge), mask=mask))(lm.gram_train)
        names = tuple(moment)
        for da, db in pair_groups:
            lma, nra, gra = fin["a", da]
            lmb, nrb, grb = fin["b", db]
            ia, jb = pidx[da, db]
            ia_s, jb_s = _put_pairs(plan, ia, jb)
            ca = chol.get(("a", da), jnp.zeros((len(ga[da]), 0, 0), dt))
            cb = chol.get(("b", db), jnp.zeros((len(gb[db]), 0, 0), dt))
            res = _evaluate(*_replicate(plan, (lma, lmb, gra, grb, nra, nrb, ca, cb)),
                            psums[da, db], ia_s, jb_s, names=names, ridge=float(ridge))
            for key_, vals in res.items():
                t = tables.setdefault(key_, np.full((La, Lb), np.nan, dtype=dt))
                vals = _to_host(vals)[: len(ia)]
                t[np.asarray(ga[da])[ia], np.asarray(gb[db])[jb]] = vals
        for key_, t in tables.items():
            if not np.all(np.isfinite(t)):
                raise ValueError(
                    f"{key_}: some entries are not finite (singular normal equations for an "
                    "affine stitcher, or degenerate layers). Pass ridge > 0."
                )
    for m, meas in generic.items():
        t = np.full((La, Lb), np.nan, dtype=dt)
        for da, db in pair_groups:
            ia, jb = np.meshgrid(np.arange(len(ga[da])), np.arange(len(gb[db])), indexing="ij")
            ia, jb = ia.ravel(), jb.ravel()
            ia_s, jb_s = _put_pairs(plan, ia, jb)
            xa = _replicate(plan, stack(va, ga[da]))
            xb = _replicate(plan, stack(vb, gb[db]))
            vals = _to_host(_generic(xa, xb, ia_s, jb_s, fn=meas.fn))[: len(ia)]
            t[np.asarray(ga[da])[ia], np.asarray(gb[db])[jb]] = vals
        tables[m] = t
    return GridResult({k: jnp.asarray(v) for k, v in tables.items()}, rows, cols)
