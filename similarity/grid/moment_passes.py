"""Moment passes: every moment measure of a grid from per-layer and per-pair centred second moments.

A *moment measure* (``measure(name).moments``, a :class:`~similarity.MomentStats`)
is a function of centred second moments, so the grid computes, per layer, its
power-of-two scale, its means and its moments (all rows, and train/test rows for
the held-out scores) once, and per pair only the cross moments, which come out of
one large matrix product for a whole block of source layers, and the measures'
``finish`` steps, nested-``vmap`` ped over the pairs.

Programs: with all samples at once, one program computes every layer's moments
and flags of a side (:func:`layer_program`), and one evaluates a block of source
layers against every target layer (:func:`block_evaluator`); both are compiled
once per padded shape, whatever the real widths. Streaming (``chunk_size``) adds
one program per pass over the row chunks (sums, then centred sums). The layers
are zero-padded to one width (see :mod:`.layers`): zero features leave every
moment measure unchanged (see :class:`similarity.MomentStats`). A group wider than its
rows is, for rotation-invariant measures, evaluated in the rows' span (:func:`row_space`).

Each side's data is divided by its power-of-two scale before any product is
formed (exact), so float32 moments neither overflow nor underflow (data at
1e-20 ... 1e20), like the pairwise functions.

Flags: each layer's ``finite`` and ``varies`` (:func:`similarity._validate.rep_flags`:
column ranges against the largest magnitude, on all rows, and on the train rows
for the ``"split"`` moments), exactly as the pairwise calls compute them; each
pair's finish flags. A cell is NaN wherever they say the measure is undefined.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funsim.similarity import _validate as V
from funsim.similarity._ladder import bucket
from funsim.similarity._linalg import pow2_at
from funsim.similarity._linalg import qr as _qr
from funsim.similarity._precision import sum_of_products
from funsim.similarity._stitch_fit import affine_roots, affine_roots_from_factors
from funsim.similarity.moments import FullMoments, LayerMoments, MomentPair, PairMoments


class Entry(NamedTuple):
    """One requested moment measure: its name, its MomentStats, and whether to compute its reverse."""

    name: str
    spec: Any  # MomentStats
    reverse: bool


def hooks(entries) -> tuple:
    """The distinct per-layer hooks (``MomentStats.layer``) of the entries, with their moment kind."""
    seen = {}
    for e in entries:
        if e.spec.layer is not None and e.spec.layer not in seen:
            seen[e.spec.layer] = e.spec.moments
    return tuple(seen.items())


def _needs_roots(hook_list) -> bool:
    """Whether a hook reads the layers' :class:`~similarity.stitching.AffineRoots` (a QR of the rows: the
    affine stitcher's fit, marked ``needs_roots``), which the split moments then carry."""
    return any(getattr(h, "needs_roots", False) for h, _ in hook_list)


def _masks(widths, size: int, dtype):
    """``(L, size)``: 1 on each layer's real features, 0 on its zero padding."""
    return (jnp.arange(size)[None, :] < widths[:, None]).astype(dtype)


def _safe(norm):
    """``norm`` where positive, else 1: keeps the moments of a constant layer finite (zero). (``lax``, not
    ``jnp.where``: the same operations, with less to trace in the grid's programs.)"""
    return lax.select(lax.gt(norm, lax.full_like(norm, 0)), norm, lax.full_like(norm, 1))


def range_stats(lo, hi) -> tuple[jax.Array, dict]:
    """``(max_abs, {"finite", "varies"})``, each ``(L,)``, from column minima and maxima ``(L, W)``: the
    largest magnitude, and the flags of :func:`similarity._validate.rep_flags` (every bound finite; the
    widest column range above ``CONSTANT_RTOL`` times the largest magnitude; zero columns change neither).

    One reduction over the columns (max, max, and), so that it compiles as one kernel."""
    inf = jnp.array(jnp.inf, lo.dtype)

    def step(a, b):
        return lax.max(a[0], b[0]), lax.max(a[1], b[1]), lax.bitwise_and(a[2], b[2])

    ops = (lax.max(lax.abs(lo), lax.abs(hi)), lax.sub(hi, lo), lax.bitwise_and(lax.is_finite(lo), lax.is_finite(hi)))
    max_abs, spread, finite = lax.reduce(ops, (-inf, -inf, jnp.array(True)), step, (1,))
    return max_abs, {"finite": finite, "varies": spread > V.CONSTANT_RTOL * max_abs}


def _masked_range(z, rows):
    """Column minima and maxima ``(W,)`` over the rows where ``rows > 0`` and their largest magnitude."""
    keep = lax.broadcast_in_dim(lax.gt(rows, lax.full_like(rows, 0)), z.shape, (0,))
    lo = lax.reduce_min(lax.select(keep, z, lax.full_like(z, float("inf"))), (0,))
    hi = lax.reduce_max(lax.select(keep, z, lax.full_like(z, -float("inf"))), (0,))
    return lo, hi, jnp.maximum(jnp.max(jnp.abs(lo)), jnp.max(jnp.abs(hi)))


# ----------------------------------------------------------------------------- per layer


class Sums(NamedTuple):
    """Pass 1 of one side, accumulated over row chunks: column sums and ranges ``(L, W)``."""

    s_all: jax.Array
    s_tr: jax.Array | None
    lo: jax.Array
    hi: jax.Array
    lo_tr: jax.Array | None
    hi_tr: jax.Array | None


def _pass1(z, w_all, w_tr) -> Sums:
    """Column sums (all rows and train rows) and ranges of a chunk ``(L, c, W)``."""
    lo, hi, _ = jax.vmap(lambda zl: _masked_range(zl, w_all))(z)
    s_all = jnp.einsum("n,lni->li", w_all, z)
    if w_tr is None:
        return Sums(s_all, None, lo, hi, None, None)
    lo_t, hi_t, _ = jax.vmap(lambda zl: _masked_range(zl, w_tr))(z)
    return Sums(s_all, jnp.einsum("n,lni->li", w_tr, z), lo, hi, lo_t, hi_t)


def _merge1(a: Sums | None, b: Sums) -> Sums:
    if a is None:
        return b
    pick = lambda f, x, y: None if x is None else f(x, y)  # noqa: E731
    return Sums(a.s_all + b.s_all, pick(jnp.add, a.s_tr, b.s_tr), jnp.minimum(a.lo, b.lo),
                jnp.maximum(a.hi, b.hi), pick(jnp.minimum, a.lo_tr, b.lo_tr), pick(jnp.maximum, a.hi_tr, b.hi_tr))


class Centres(NamedTuple):
    """Each layer's power-of-two scale ``(L,)``, the means of the scaled layer ``(L, W)`` and its flags."""

    scale: jax.Array
    mean_all: jax.Array
    mean_tr: jax.Array | None
    flags: dict  # kind -> {"finite": (L,), "varies": (L,)}


def _centres(s: Sums, n, n_tr, kinds) -> Centres:
    max_abs, full = range_stats(s.lo, s.hi)
    c = pow2_at(max_abs)
    flags = {"full": full}
    mean_tr = None
    if "split" in kinds:
        f_tr = range_stats(s.lo_tr, s.hi_tr)[1]
        flags["split"] = {"finite": flags["full"]["finite"], "varies": f_tr["varies"]}
        mean_tr = s.s_tr / n_tr / c[:, None]
    return Centres(c, s.s_all / n / c[:, None], mean_tr, flags)


def _pass2(z, ce: Centres, w_all, w_tr, w_te, kinds) -> dict:
    """Centred sums of a chunk ``(L, c, W)``: ``g_all`` (all rows, about the all-rows mean) and
    ``g_tr``, ``g_te``, ``s_te`` (train and test rows about the train mean)."""
    u = z / ce.scale[:, None, None]
    out = {}
    if "full" in kinds:
        ua = u - ce.mean_all[:, None, :]
        out["g_all"] = jnp.einsum("n,lni,lnj->lij", w_all, ua, ua)
    if "split" in kinds:
        ut = u - ce.mean_tr[:, None, :]
        out["g_tr"] = jnp.einsum("n,lni,lnj->lij", w_tr, ut, ut)
        out["g_te"] = jnp.einsum("n,lni,lnj->lij", w_te, ut, ut)
        out["s_te"] = jnp.einsum("n,lni->li", w_te, ut)
    return out


def _moments(sums: dict, ce: Centres, n_te, kinds) -> dict:
    """Stacked per-layer moments ``{kind: FullMoments | LayerMoments}`` from the centred sums; ``norm``
    and ``mean`` in the layers' own units (the sums are of the scaled layers)."""
    c = ce.scale
    out = {}
    if "full" in kinds:
        tr = jnp.trace(sums["g_all"], axis1=1, axis2=2)
        g, den = sums["g_all"], _safe(tr)
        # the gram's norm from the unnormalised gram (a reduction: a dot over both axes loses digits)
        out["full"] = FullMoments(jnp.sqrt(tr) * c, g / den[:, None, None],
                                  jnp.sqrt(sum_of_products(g, g, axis=(1, 2))) / den)
    if "split" in kinds:
        norm = jnp.sqrt(jnp.trace(sums["g_tr"], axis1=1, axis2=2))
        den = _safe(norm)
        out["split"] = LayerMoments(
            mean=ce.mean_tr * c[:, None],
            norm=norm * c,
            gram_train=sums["g_tr"] / den[:, None, None] ** 2,
            gram_test=sums["g_te"] / den[:, None, None] ** 2,
            sum_test=sums["s_te"] / den[:, None],
            n_test=jnp.broadcast_to(n_te, norm.shape),
        )
    return out


def _extras(moments: dict, widths, hook_list) -> tuple:
    """Each hook on every layer's moments, with a unit diagonal on the zero-padded coordinates (so that a
    factorisation stays definite and they decouple; see :class:`similarity.MomentStats`)."""
    if not hook_list:
        return ()
    some = next(iter(moments.values()))
    size = (some.gram if isinstance(some, FullMoments) else some.gram_train).shape[-1]
    unit = jax.vmap(jnp.diag)((jnp.arange(size)[None, :] >= widths[:, None]).astype(some.norm.dtype))
    out = []
    for hook, kind in hook_list:
        m = moments[kind]
        m = m._replace(gram=m.gram + unit) if kind == "full" else m._replace(
            gram_train=m.gram_train + unit, gram_test=m.gram_test + unit)
        out.append(jax.vmap(hook)(m))
    return tuple(out)


class Side(NamedTuple):
    """Everything the pair evaluator needs of one side's layers (stacked, padded count first)."""

    moments: dict
    extras: tuple
    centres: Centres


def row_space(z, scale):
    """``(L, n, n)``: each layer's rows in an orthonormal basis of their span, for layers wider than
    their rows (``W >= n``). ``z = R^T Q^T`` by a QR of the layer's transpose, so ``z Q = R^T``: the
    rows rotated into ``Q``'s coordinates, with every distance and inner product kept. Zero-padded
    features stay zero columns (the QR leaves ``R``'s rows beyond the layer's rank at exactly 0).
    Computed on the layer divided by its power-of-two ``scale`` ``(L,)`` and scaled back (exact), so
    float32 neither overflows nor underflows."""
    r = _qr(jnp.swapaxes(z / scale[:, None, None], 1, 2))[1]
    return jnp.swapaxes(r, 1, 2) * scale[:, None, None]


@functools.lru_cache(maxsize=None)
def layer_program(kinds: tuple, hook_list: tuple, reduce: bool = False):
    """One side's per-layer moments, hooks and flags from all its rows, as one compiled program:
    ``run(z (L, n, W), widths (L,), w_tr, w_te) -> (z or None, Side)``.

    ``reduce`` (for measures invariant to rotations, on layers wider than their rows, ``W > n``):
    the moments are those of :func:`row_space` ``(L, n, n)``, which is returned as the layers' data
    for the cross moments (else None: the data is ``z``); the flags are the layers' own (column
    ranges are not rotation invariant). Every moment measure is invariant to zero padding, so a
    rotation-invariant one has the same value on the ``n`` rotated columns as on the ``W`` features,
    and each pair's products, SVDs and solves are ``n x n`` instead of ``W x W``."""
    roots = _needs_roots(hook_list)

    def run(z, widths, w_tr, w_te):
        n = z.shape[1]
        w_all = jnp.ones((n,), z.dtype)
        n_tr = None if w_tr is None else jnp.sum(w_tr)
        ce = _centres(_pass1(z, w_all, w_tr), n, n_tr, kinds)
        if reduce:
            z, widths = row_space(z, ce.scale), jnp.minimum(widths, n)
            ce = _centres(_pass1(z, w_all, w_tr), n, n_tr, kinds)._replace(flags=ce.flags)
        n_te = None if w_te is None else jnp.sum(w_te)
        moments = _moments(_pass2(z, ce, w_all, w_tr, w_te, kinds), ce, n_te, kinds)
        if roots:  # the rows the pairwise fit factors: scaled, train-centred, over the train norm
            m = moments["split"]
            den = _safe(m.norm / ce.scale)
            u = (z / ce.scale[:, None, None] - ce.mean_tr[:, None, :]) / den[:, None, None]
            r = jax.vmap(affine_roots, in_axes=(0, None, None, 0))(u, w_tr, w_te, _masks(widths, z.shape[2], z.dtype))
            moments["split"] = m._replace(roots=r)
        return (z if reduce else None), Side(moments, _extras(moments, widths, hook_list), ce)

    return jax.jit(run)


@jax.jit
def _pass1_step(acc, z, w_all, w_tr):
    return _merge1(acc, _pass1(z, w_all, w_tr))


@functools.partial(jax.jit, static_argnames="kinds")
def _centres_step(s, n, n_tr, *, kinds):
    return _centres(s, n, n_tr, kinds)


def _root_update(r, rows):
    """``(W, W)`` upper ``R'`` with ``R'^T R' = R^T R + rows^T rows``: one step of a QR over row chunks."""
    return _qr(jnp.concatenate([r, rows], axis=0))[1]


@functools.partial(jax.jit, static_argnames=("kinds", "roots"))
def _pass2_step(acc, z, ce, w_all, w_tr, w_te, *, kinds, roots=False):
    """Add a chunk's centred sums; with ``roots``, also fold its train and test rows into the running R
    factors ``r_tr``, ``r_te`` ``(L, W, W)`` of the scaled, train-centred rows (a QR over the chunks)."""
    new = _pass2(z, ce, w_all, w_tr, w_te, kinds)
    out = new if acc is None else jax.tree.map(jnp.add, {k: acc[k] for k in new}, new)
    if roots:
        ut = z / ce.scale[:, None, None] - ce.mean_tr[:, None, :]
        size = z.shape[2]
        zero = jnp.zeros((z.shape[0], size, size), z.dtype)
        for key, w in (("r_tr", w_tr), ("r_te", w_te)):
            prev = zero if acc is None else acc[key]
            out[key] = jax.vmap(_root_update)(prev, ut * w[None, :, None])
    return out


@functools.lru_cache(maxsize=None)
def finish_layers_program(kinds: tuple, hook_list: tuple):
    """Streaming's last per-layer step: moments and hooks from the accumulated centred sums."""
    roots = _needs_roots(hook_list)

    def run(sums, ce, widths, n_te):
        moments = _moments(sums, ce, n_te, kinds)
        if roots:
            m = moments["split"]
            den = _safe(m.norm / ce.scale)
            mask = _masks(widths, m.gram_train.shape[-1], m.norm.dtype)
            r_tr, r_te = sums["r_tr"] / den[:, None, None], sums["r_te"] / den[:, None, None]
            moments["split"] = m._replace(roots=jax.vmap(affine_roots_from_factors)(r_tr, r_te, mask))
        return Side(moments, _extras(moments, widths, hook_list), ce)

    return jax.jit(run)


def stream_side(chunks, widths, weights, n, n_tr, n_te, kinds, hook_list) -> Side:
    """One side's :class:`Side` from row chunks: ``chunks()`` yields ``(z (L, c, W), lo, hi)`` twice over
    (two passes: means and ranges, then centred sums); ``weights(lo, hi, c)`` gives
    ``(w_all, w_tr, w_te)`` for a chunk (zero on padded rows)."""
    acc = None
    for z, lo, hi in chunks():
        w_all, w_tr, _ = weights(lo, hi, z.shape[1])
        acc = _pass1_step(acc, z, w_all, w_tr)
    ce = _centres_step(acc, np.asarray(n, z.dtype), None if n_tr is None else np.asarray(n_tr, z.dtype),
                       kinds=kinds)
    sums = None
    for z, lo, hi in chunks():
        sums = _pass2_step(sums, z, ce, *weights(lo, hi, z.shape[1]), kinds=kinds, roots=_needs_roots(hook_list))
    return finish_layers_program(kinds, hook_list)(sums, ce, widths,
                                                   None if n_te is None else np.asarray(n_te, z.dtype))


# ----------------------------------------------------------------------------- per pair


def _pair_blocks(u, v, la, lb):
    """``u: (c, la*da)``, ``v: (c, lb*db)`` -> ``(la, da, lb, db)``: ``[k, :, l, :] = u_k^T v_l`` in one GEMM."""
    m = jnp.einsum("ni,nj->ij", u, v)
    return m.reshape(la, u.shape[1] // la, lb, v.shape[1] // lb)


def _flat(z, ce: Centres, mean):
    """``(L, c, W)`` scaled and centred, side by side as ``(c, L W)``."""
    u = z / ce.scale[:, None, None] - mean[:, None, :]
    return jnp.transpose(u, (1, 0, 2)).reshape(z.shape[1], -1)


def cross_sums(za, ca: Centres, zb, cb: Centres, w_all, w_tr, w_te, kinds, sharding=None) -> dict:
    """The centred cross sums of every (source, target) pair of two stacks, ``(La, Wa, Lb, Wb)`` each.

    ``w_all``: 1 on the real rows of a chunk, 0 on its zero-padded rows (or None: every row is real)."""
    la, lb = za.shape[0], zb.shape[0]
    out = {}
    if "full" in kinds:
        u = _flat(za, ca, ca.mean_all)
        if w_all is not None:
            u = u * w_all[:, None]
        if sharding is not None:
            u = jax.lax.with_sharding_constraint(u, sharding)
        out["c_all"] = _pair_blocks(u, _flat(zb, cb, cb.mean_all), la, lb)
    if "split" in kinds:
        u, v = _flat(za, ca, ca.mean_tr), _flat(zb, cb, cb.mean_tr)
        if sharding is not None:
            u = jax.lax.with_sharding_constraint(u, sharding)
        out["c_tr"] = _pair_blocks(u * w_tr[:, None], v, la, lb)
        out["c_te"] = _pair_blocks(u * w_te[:, None], v, la, lb)
    return out


def _pick(tree, k):
    return jax.tree.map(lambda t: t[k], tree)


def _split_finish(out):
    """A finish's result as ``(value, flags)`` (a finish may return a bare value)."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out
    return out, {}


@functools.lru_cache(maxsize=64)
def block_evaluator(entries: tuple, kinds: tuple, hook_list: tuple, streamed: bool, sharding, whole: bool = False):
    """A compiled function evaluating every entry (and its reverse) on every pair of a block of source
    layers ``idx`` (positions in side a's padded stack) and every target layer.

    ``run(za, sa, zb, sb, idx, w_tr, w_te, sums)``: the cross sums are formed from the data
    (``za``, ``zb``, all rows) unless ``streamed``, where ``sums`` holds them (accumulated over
    chunks) and the data is not passed. ``whole``: the block is side a's whole stack in order
    (``idx == arange(La)``, not read), so nothing is gathered. Returns ``(fwd, rev)``,
    ``{name: (value (B, Lb), flags)}`` with the finish's own flags; the layers' flags (``"x"``
    and ``"y"`` of each cell: the source's and target's ``finite`` and ``varies``) are not
    repeated per cell here, the caller adds them from the sides (:func:`cell_flags`).

    The pairs are a nested ``vmap``, over source layers and then target layers, so whatever a
    measure computes from one side alone is computed once per layer; each pair's cross sums are
    normalised where they are read.
    """
    hook_names = tuple(h for h, _ in hook_list)

    def cell(xa, exa, fa, ca, yb, exb, fb, cb, sums):
        ex = {h: (exa[k], exb[k]) for k, h in enumerate(hook_names)}
        ctx = {}
        for kind in kinds:
            den = (_safe(xa[kind].norm) / ca) * (_safe(yb[kind].norm) / cb)
            if kind == "split":
                cross = PairMoments(sums["c_tr"] / den, sums["c_te"] / den)
                ctx[kind] = MomentPair(xa[kind], yb[kind], cross, cross.cross_train, extras=ex)
            else:
                ctx[kind] = MomentPair(xa[kind], yb[kind], sums["c_all"] / den, extras=ex)
        fwd, rev = {}, {}
        for e in entries:
            kind = e.spec.moments
            for out, c, f_src, f_tgt in ((fwd, ctx[kind], fa[kind], fb[kind]),
                                         (rev, ctx[kind].transposed(), fb[kind], fa[kind])):
                if out is rev and not e.reverse:
                    continue
                value, flags = _split_finish(e.spec.finish(c))
                ok = f_src["finite"] & f_src["varies"] & f_tgt["finite"] & f_tgt["varies"]
                out[e.name] = (V.nan_unless(ok, value), flags)
        return fwd, rev

    def run(za, sa: Side, zb, sb: Side, idx, w_tr, w_te, sums):
        if whole:
            xa, exa, ce_a = sa.moments, sa.extras, sa.centres
        else:
            xa, exa, ce_a = _pick((sa.moments, sa.extras, sa.centres), idx)
        fa = ce_a.flags
        if not streamed:
            sums = cross_sums(za if whole else za[idx], ce_a, zb, sb.centres, None, w_tr, w_te, kinds, sharding)
        fb = sb.centres.flags

        def row(x, ex, f, c, s):  # s: (Wa, Lb, Wb), the pairs of one source layer
            return jax.vmap(lambda y, ey, fy, cy, sy: cell(x, ex, f, c, y, ey, fy, cy, sy),
                            in_axes=(0, 0, 0, 0, 1))(sb.moments, sb.extras, fb, sb.centres.scale, s)

        return jax.vmap(row)(xa, exa, fa, ce_a.scale, sums)

    return jax.jit(run)


def cell_flags(fa: dict, fb: dict, flags: dict, *, reverse: bool) -> dict:
    """A block's per-cell flags ``(B, Lb)``: the finish's ``flags`` and each cell's ``"x"`` and ``"y"``, the
    flags of its source and target layers, from the layers' ``fa: {"finite": (B,), "varies": (B,)}`` (side
    a's layers of the block) and ``fb`` (``(Lb,)``, side b's); the reverse's source is side b's layer."""
    shape = (len(fa["finite"]), len(fb["finite"]))
    rows = {k: np.broadcast_to(np.asarray(v)[:, None], shape) for k, v in fa.items()}
    cols = {k: np.broadcast_to(np.asarray(v)[None, :], shape) for k, v in fb.items()}
    x, y = (cols, rows) if reverse else (rows, cols)
    return {"x": x, "y": y, **flags}


@functools.partial(jax.jit, static_argnames=("kinds",))
def cross_step(acc, za, ce_a, idx, zb, ce_b, w_all, w_tr, w_te, *, kinds):
    """Streaming: add one chunk's cross sums of a block of source layers ``za`` (the layers ``idx`` of
    side a, whose centres ``ce_a`` are the whole side's) and every target layer ``zb``."""
    new = cross_sums(za, _pick(ce_a, idx), zb, ce_b, w_all, w_tr, w_te, kinds)
    return new if acc is None else jax.tree.map(jnp.add, acc, new)


# ----------------------------------------------------------------------------- driver

_CROSS_BUDGET = 512 * 2**20  # bytes of cross moments (and their pair intermediates) per block of source layers


def _block_size(la: int, wa: int, lb: int, wb: int, nmat: int, itemsize: int, ndev: int) -> int:
    """Source layers per block: the most whose cross moments fit the budget (a ladder size, a multiple of
    the device count), at least one per device."""
    per_layer = wa * lb * wb * nmat * itemsize
    fit = max(1, _CROSS_BUDGET // max(per_layer, 1))
    size = 1
    for k in range(1, la + 1):
        if bucket(k) <= fit:
            size = bucket(k)
    size = min(size, bucket(la))
    return size + (-size) % ndev


def _blocks(la: int, size: int) -> list[np.ndarray]:
    """Positions ``0 .. la-1`` in blocks of ``size`` (the last one padded by repeating its last position)."""
    out = []
    for lo in range(0, la, size):
        idx = np.arange(lo, min(lo + size, la))
        out.append(np.concatenate([idx, np.repeat(idx[-1:], size - len(idx))]).astype(np.int32))
    return out


def moment_tables(lay, entries: tuple, *, weights, chunk_size, plan, stacks,
                  rotation_invariant: bool = False, steps=None) -> dict:
    """``{name: {"fwd": Table, "rev": Table}}`` of the moment measures (``rev`` for the entries with
    ``reverse``). ``weights``: the split's ``(w_tr, w_te)`` host arrays ``(n,)`` or ``None``.
    ``rotation_invariant``: every entry is invariant to rotations of either layer, so a group of
    layers wider than the rows is evaluated in its :func:`row_space` (without ``chunk_size``).
    ``steps``: counts the blocks (``steps.add`` before the first runs, ``steps.advance`` after each)."""
    from funsim.similarity.grid import layers as L
    from funsim.similarity.grid.devices import replicate_computed, tree_to_host
    from funsim.similarity.grid.undefined import Table

    kinds = tuple(sorted({e.spec.moments for e in entries}))
    hook_list = hooks(entries)
    split = "split" in kinds
    w_tr, w_te = (None, None) if not split else (np.asarray(weights[0], lay.dtype), np.asarray(weights[1], lay.dtype))
    n_tr = None if not split else float(w_tr.sum())
    n_te = None if not split else float(w_te.sum())
    ga, gb = lay.groups_a, lay.groups_b
    itemsize = np.dtype(lay.dtype).itemsize
    nmat = ("full" in kinds) + 2 * split
    shape = (len(lay.va), len(lay.vb))
    values = {(e.name, d): np.full(shape, np.nan, lay.dtype) for e in entries for d in ("fwd", "rev")
              if d == "fwd" or e.reverse}
    parts: dict = {k: [] for k in values}

    def chunk_weights(lo, hi, c):
        pad = c - (hi - lo)
        w_all = np.concatenate([np.ones(hi - lo, lay.dtype), np.zeros(pad, lay.dtype)])
        if not split:
            return w_all, None, None
        return (w_all, np.concatenate([w_tr[lo:hi], np.zeros(pad, lay.dtype)]),
                np.concatenate([w_te[lo:hi], np.zeros(pad, lay.dtype)]))

    chunks = None if chunk_size is None else [(lo, min(lo + chunk_size, lay.n)) for lo in range(0, lay.n, chunk_size)]
    c_rows = None if chunk_size is None else min(chunk_size, lay.n)

    def side_of(side, g) -> tuple:
        """``(data or None, Side, width)`` of one group: one program with all rows (in the rows' span for
        layers wider than the rows, where the measures allow), or the streaming passes."""
        if chunks is None:
            z, widths = stacks(side, g)
            w = replicate_computed(plan, (w_tr, w_te))
            reduce = rotation_invariant and g.width > lay.n
            zr, s = layer_program(kinds, hook_list, reduce)(z, widths, *w)
            if reduce:
                return replicate_computed(plan, zr), replicate_computed(plan, s), lay.n
            return z, replicate_computed(plan, s), g.width

        def gen():
            for lo, hi in chunks:
                yield jax.device_put(L.host_stack(lay, side, g, lo, hi, rows=c_rows)), lo, hi

        widths = np.asarray(g.widths, np.int32)
        return None, replicate_computed(plan, stream_side(gen, widths, chunk_weights, lay.n, n_tr, n_te, kinds,
                                                          hook_list)), g.width

    sides = {}
    for side, groups in (("a", ga), ("b", gb)):
        for g in groups:
            key = ("a" if lay.same else side, g.width, g.pidx)
            if key not in sides:
                sides[key] = side_of(side, g)
    layer_flags: dict = {}  # {side key: {kind: {flag: (L,)}}}, read once the first block is running

    def flags_of(key):
        if key not in layer_flags:
            layer_flags[key] = tree_to_host(sides[key][1].centres.flags)
        return layer_flags[key]

    kind_of = {e.name: e.spec.moments for e in entries}
    work = []  # (group a, group b, block size): every block is known before the first runs
    for g_a in ga:
        for g_b in gb:
            wa, wb = sides["a", g_a.width, g_a.pidx][2], sides["a" if lay.same else "b", g_b.width, g_b.pidx][2]
            work.append((g_a, g_b, _block_size(len(g_a.pidx), wa, len(g_b.pidx), wb, nmat, itemsize, plan.ndev)))
    if steps is not None:
        steps.add(sum(len(_blocks(len(g_a.pidx), size)) for g_a, _, size in work))
    for g_a, g_b, size in work:
        za, sa, _ = sides["a", g_a.width, g_a.pidx]
        key_b = ("a" if lay.same else "b", g_b.width, g_b.pidx)
        zb, sb, _ = sides[key_b]
        sharding = plan.sharding(None, "pairs")
        evaluate = block_evaluator(entries, kinds, hook_list, chunks is not None, sharding,
                                   size == len(g_a.pidx))
        for idx in _blocks(len(g_a.pidx), size):
            real = np.asarray(idx) < len(g_a.idx)
            first = {}
            for p, pos in enumerate(idx):  # repeated positions (padding) are dropped
                first.setdefault(int(pos), p)
            keep = np.array([first[int(pos)] == p and real[p] for p, pos in enumerate(idx)])
            sums = None
            if chunks is not None:
                for lo, hi in chunks:
                    blk = L.host_stack(lay, "a", L.Group(g_a.width, g_a.idx, tuple(g_a.pidx[int(k)] for k in idx),
                                                         g_a.widths[idx]), lo, hi, rows=c_rows)
                    zbc = L.host_stack(lay, "b", g_b, lo, hi, rows=c_rows)
                    sums = cross_step(sums, blk, sa.centres, idx, zbc, sb.centres, *chunk_weights(lo, hi, c_rows),
                                      kinds=kinds)
            w = replicate_computed(plan, (w_tr, w_te))
            fwd, rev = evaluate(za, sa, zb, sb, replicate_computed(plan, idx), *w, sums)
            fwd, rev = tree_to_host(fwd), tree_to_host(rev)
            fa = jax.tree.map(lambda t: t[idx], flags_of(("a", g_a.width, g_a.pidx)))
            rows = np.asarray(g_a.pidx)[idx][keep]
            cols = np.asarray(g_b.idx)
            for d, res in (("fwd", fwd), ("rev", rev)):
                for name, (value, flags) in res.items():
                    kind = kind_of[name]
                    flags = cell_flags(fa[kind], flags_of(key_b)[kind], flags, reverse=d == "rev")
                    v = np.asarray(value)[keep][:, : len(g_b.idx)]
                    f = jax.tree.map(lambda a: np.asarray(a)[keep][:, : len(g_b.idx)], flags)
                    values[name, d][np.ix_(rows, cols)] = v
                    parts[name, d].append((rows, cols, f))
            if steps is not None:
                steps.advance()
    out: dict = {}
    for (name, d), v in values.items():
        out.setdefault(name, {})[d] = Table(v, _assemble(parts[name, d], shape))
    return out


def _assemble(parts: list, shape):
    """Per-block flags ``(rows, cols, pytree of (r, c))`` into one pytree of ``(La, Lb)`` host arrays."""
    tree = None
    for rows, cols, flags in parts:
        if tree is None:
            tree = jax.tree.map(lambda a: np.zeros(shape, np.asarray(a).dtype), flags)
        jax.tree.map(lambda t, a: t.__setitem__(np.ix_(rows, cols), a), tree, flags)
    return tree
