"""The compiled core of the ``stitch/*`` measures and their moment statistics.

:func:`stitch_core` (:mod:`similarity.protocol`): per-layer moments on zero-padded layers (the
default split drawn inside the program from the row count), a per-pair fit and score with
flags, and a host-side ``reason`` that gives :func:`similarity.stitching.reconstruction_score`'s
messages; :func:`score_program` is the same pair for any split. :func:`stitch_moment_stats` is a
reconstruction score as a moment measure of the comparison grid (:mod:`similarity.grid`).
The conventions are those of :mod:`similarity.stitching`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import fmix32, row_hash, shared_hashes
from funsim.similarity._stitch_fit import (
    FAMILIES,
    RIDGE,
    HeldOutOverlapWarning,
    ReconstructionScore,
    affine_roots,
    affine_system,
    ambiguity_message,
    check_fit_rows,
    check_options,
    check_ridge,
    fit_rows_reason,
    layer_moments,
    not_finite_message,
    roots_system,
    score_flags,
    scores_with_ambiguity,
)
from funsim.similarity.moments import LayerMoments, MomentPair, MomentStats, PairMoments, split_weights


def _train_varies(z: jax.Array, w_tr: jax.Array) -> jax.Array:
    """Whether the train rows of ``z`` are not all equal: the rule of :func:`similarity._validate.rep_flags`
    (some column's range above ``CONSTANT_RTOL`` times the largest magnitude) on the train rows, as the
    grid computes it from column ranges (exact, also when streamed)."""
    train = (w_tr > 0)[:, None]
    lo = jnp.min(jnp.where(train, z, jnp.inf), axis=0)
    hi = jnp.max(jnp.where(train, z, -jnp.inf), axis=0)
    top = jnp.maximum(jnp.max(jnp.abs(lo)), jnp.max(jnp.abs(hi)))
    return jnp.max(hi - lo) > V.CONSTANT_RTOL * top


# ----------------------------------------------------------------------------- the compiled core

#: The train fraction of the registered held-out measures (``reconstruction_score``'s default split).
DEFAULT_SPLIT = 0.5

_HASH_SEEDS = (0x3C6EF372, 0xA54FF53A)  # two independent row hashes (see _linalg.shared_rows)


class _StitchLayer(NamedTuple):
    """One layer's statistics for the reconstruction scores (zero padding leaves each unchanged).

    Attributes:
      moments: :class:`LayerMoments` on the train/test rows.
      u: ``(n, W)`` the rows centred on the train mean and divided by the train norm.
      w_train, w_test: ``(n,)`` the 0/1 row weights.
      chol: the affine fit's :class:`RootsSolver` from the layer's QR roots (``moments.roots``; ``affine`` only, else ``()``).
      hashes: ``(2, n)`` uint32 hashes of the rows' real features (to count held-out rows repeating a train row).
      flags: ``finite`` (all rows) and ``varies`` (the train rows).
      width: ``()`` the real width (the first ``width`` of the ``W`` features).
    """

    moments: LayerMoments
    u: jax.Array
    w_train: jax.Array
    w_test: jax.Array
    chol: jax.Array
    hashes: jax.Array
    flags: dict
    width: jax.Array


def default_weights(n: int, dtype) -> tuple[jax.Array, jax.Array]:
    """``split_weights(n, DEFAULT_SPLIT, jax.random.key(0), dtype)`` inside a program (pure).

    Row ``i`` is a train row iff its position in ``jax.random.permutation(key, n)``
    is below ``round(DEFAULT_SPLIT * n)``: the rows ``split_weights`` draws.
    """
    n_tr = int(round(DEFAULT_SPLIT * n))
    perm = jax.random.permutation(jax.random.key(0), n)
    w_tr = jnp.zeros((n,), dtype).at[perm].set((jnp.arange(n) < n_tr).astype(dtype))
    return w_tr, 1.0 - w_tr


def _layer_from_weights(z, width, w_tr, w_te, ridge, *, family: str, factor: bool = True) -> _StitchLayer:
    """:class:`_StitchLayer` of ``z: (n, W)`` whose first ``width`` features are real (pure)."""
    m = layer_moments(z, w_tr, w_te)
    u = (z - m.mean[None, :]) / m.norm
    f = V.rep_flags(z)
    flags = {"finite": f["finite"], "varies": _train_varies(z, w_tr)}
    if family == "affine" and factor:
        m = m._replace(roots=affine_roots(u, w_tr, w_te, protocol.feature_mask(width, z.shape[1], z.dtype)))
        chol = roots_system(m.roots, ridge=ridge)
    else:
        chol = jnp.zeros((), z.dtype)
    hashes = jnp.stack([row_hash(z, seed, width) for seed in _HASH_SEEDS])
    return _StitchLayer(m, u, w_tr, w_te, chol, hashes, flags, jnp.asarray(width, jnp.int32))


def _stitch_layer(z, width, opts, *, family: str, which: str) -> _StitchLayer:
    """The core's ``layer``: the default split's weights, drawn inside the program from the row count."""
    del which
    (ridge,) = opts
    w_tr, w_te = default_weights(z.shape[0], z.dtype)
    return _layer_from_weights(z, width, w_tr, w_te, ridge, family=family)


def _pair_hash(hx: jax.Array, hy: jax.Array) -> jax.Array:
    """One uint32 hash per row of the pair ``(z_src, z_tgt)`` from each side's row hashes."""
    return fmix32(hx ^ fmix32(hy + jnp.uint32(0x9E3779B9)))


def _pair_parts(sx: _StitchLayer, sy: _StitchLayer, ridge, *, family: str):
    """``(ReconstructionScore, ambiguity, flags)`` of a pair: the scores before any NaN, and the
    flags every score shares (``x``, ``y``, ``n_rows``, ``n_test``, ``shared``)."""
    w_tr, w_te = sx.w_train, sx.w_test
    pm = PairMoments(
        cross_train=jnp.einsum("n,ni,nj->ij", w_tr, sx.u, sy.u),
        cross_test=jnp.einsum("n,ni,nj->ij", w_te, sx.u, sy.u),
    )
    score, amb = scores_with_ambiguity(sx.moments, sy.moments, pm, family=family, ridge=ridge,
                         chol=sx.chol if family == "affine" else None)
    h1, h2 = (_pair_hash(sx.hashes[k], sy.hashes[k]) for k in range(2))
    train, test = w_tr > 0, w_te > 0
    n_train = jnp.sum(train).astype(jnp.int32)
    # the minimum-rows rule (fit_rows_reason) in the program, where a traced ridge leaves it open
    rows = (n_train - 1 >= sx.width) | ((ridge > 0) if family == "affine" else False)
    flags = dict(x=sx.flags, y=sy.flags, n_rows=jnp.sum(train | test).astype(jnp.int32),
                 n_test=jnp.sum(test).astype(jnp.int32),
                 shared=shared_hashes(h1, h2, train, test).astype(jnp.int32), rows=rows)
    return score, amb, flags


def _stitch_pair(sx: _StitchLayer, sy: _StitchLayer, opts, *, family: str, which: str):
    """The core's ``pair``: ``(score (), flags)``, NaN wherever :func:`_stitch_reason` names a reason."""
    (ridge,) = opts
    score, amb, flags = _pair_parts(sx, sy, ridge, family=family)
    checks = score_flags(score, amb, family=family, which=which)
    ok = V.flags_ok(sx.flags, sy.flags) & checks["determined"] & flags["rows"]
    return V.nan_unless(ok, getattr(score, which)), {**flags, **checks}


def _default_split_reason(n: int) -> str | None:
    """The message of ``split_weights(n, DEFAULT_SPLIT, ...)`` for too few rows, or None (host, no program)."""
    n_tr = int(round(DEFAULT_SPLIT * n))
    if n_tr >= 2 and n - n_tr >= 2:
        return None
    try:  # it raises before it computes anything
        split_weights(n, DEFAULT_SPLIT, None, np.float32)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"split_weights accepted {n} rows")  # pragma: no cover


def _stitch_reason(flags, shape_x, shape_y, opts, *, family: str, which: str) -> str | None:
    """The pairwise call's message for fetched flags, in the order of the eager checks.

    Too few train rows for the source's width (with ``flags=None``: the default
    split of ``shape_x[0]`` rows, which must also leave 2 rows on each side; with
    flags: their row counts), a constant ``z_src`` then ``z_tgt`` on the train
    rows, a held-out orthogonal score left to an arbitrary rotation
    (:func:`held_out_ambiguity`), a non-finite score. NaN/Inf in the inputs are
    the caller's (:func:`similarity.protocol.raise_from_flags`).
    """
    (ridge,) = opts
    if flags is None:
        msg = _default_split_reason(shape_x[0])
        if msg is not None:
            return msg
        n_tr = int(round(DEFAULT_SPLIT * shape_x[0]))
    else:
        n_tr = int(flags["n_rows"]) - int(flags["n_test"])
    msg = fit_rows_reason(n_tr, shape_x[1], family, ridge, "the train split")
    if msg is not None or flags is None:
        return msg
    for key, name, shape in (("x", "z_src", shape_x), ("y", "z_tgt", shape_y)):
        msg = V.constant_reason(flags[key], f"{name} (train rows)", (n_tr, *shape[1:]), "the reconstruction score")
        if msg is not None:
            return msg
    if not flags["determined"]:
        return ambiguity_message(family, float(flags["ambiguity"]))
    if not flags["result"]:
        return not_finite_message("The reconstruction score")
    return None


@functools.lru_cache(maxsize=None)
def _stitch_parts(family: str, which: str) -> tuple:
    """The core's three functions for one family and score (one object each: shared programs)."""
    kw = dict(family=family, which=which)
    return (functools.partial(_stitch_layer, **kw), functools.partial(_stitch_pair, **kw),
            functools.partial(_stitch_reason, **kw))


def stitch_core(family: str = "affine", *, ridge: float = 0.0, which: str = "held_out") -> protocol.Core:
    """The compiled core of the ``stitch/*`` measures (:class:`similarity.protocol.Core`); ``ridge`` is traced.

    ``which="held_out"`` is ``reconstruction_score(x, y, family=family, ridge=ridge).held_out``
    (the default split: ``DEFAULT_SPLIT`` of the rows with ``jax.random.key(0)``, drawn inside
    the program from the row count), ``"in_sample"`` its in-sample figure. The pair's flags:
    ``x``, ``y`` (``finite`` on all rows, ``varies`` on the train rows), ``n_rows`` (train +
    test), ``n_test``, ``shared`` (held-out rows repeating a train row, for
    :class:`HeldOutOverlapWarning`), ``result`` (the score is finite), ``determined`` and
    ``ambiguity`` (see :func:`held_out_ambiguity`; always determined for ``affine`` and
    in-sample scores).

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(40, 3))
      >>> value, flags = protocol.evaluate(stitch_core("orthogonal"), x, 2 * x + 1)
      >>> round(float(value), 4), bool(flags["determined"]), int(flags["n_test"])
      (1.0, True, 20)
    """
    check_options(family, ridge)
    V.check_choice(which, "which", ReconstructionScore._fields)
    layer, pair, reason = _stitch_parts(family, which)
    return protocol.Core(layer, pair, reason, (check_ridge(ridge),), (RIDGE,))


def warn_shared(flags: dict) -> None:
    if flags["shared"]:
        V.warn_at_caller(
            f"{int(flags['shared'])} of the {int(flags['n_test'])} held-out rows repeat a train row "
            "exactly (the same z_src and z_tgt: duplicated inputs), so the held-out score is partly "
            "in-sample and inflated. Deduplicate the inputs before splitting, or pass "
            "split=(train_idx, test_idx) with each distinct input on one side only.",
            HeldOutOverlapWarning,
        )


@functools.partial(jax.jit, static_argnames=("family",))
def score_program(x, y, w_tr, w_te, ridge, *, family):
    """Both reconstruction scores for any split and their flags (those of :func:`stitch_core`'s
    held-out pair): ``(ReconstructionScore, flags)``; ``ridge`` traced."""
    sx = _layer_from_weights(x, x.shape[1], w_tr, w_te, ridge, family=family)
    sy = _layer_from_weights(y, y.shape[1], w_tr, w_te, ridge, family=family, factor=False)
    score, amb, flags = _pair_parts(sx, sy, ridge, family=family)
    checks = score_flags(score, amb, family=family, which="held_out")
    score = V.nan_unless(V.flags_ok(sx.flags, sy.flags) & flags["rows"], score)
    score = score._replace(held_out=V.nan_unless(checks["determined"], score.held_out))
    return score, {**flags, **checks}

# ----------------------------------------------------------------------------- moment statistics (the grid)


def _fit_rows_check(n_fit: int, d_src: int, where: str, *, family: str, ridge: float) -> None:
    """:func:`check_fit_rows` for the grid (``MomentStats.check``), with the pair named by ``where``."""
    try:
        check_fit_rows(n_fit, d_src, family, ridge, "the train split")
    except ValueError as e:
        hint = " In compare_grid the ridge is part of the name: 'stitch/affine/ridge=0.001'." if family == "affine" else ""
        raise ValueError(f"{where}: {e}{hint}") from None


def _affine_factor(m: LayerMoments, *, ridge: float):
    """The layer's affine solver: a :class:`RootsSolver` from its QR roots (the grid gives them), else
    the Cholesky factor of its moments."""
    if m.roots is not None:
        return roots_system(m.roots, ridge=ridge)
    return affine_system(m.gram_train, ridge=ridge)


@functools.lru_cache(maxsize=None)
def _affine_hook(ridge: float):
    """The per-layer affine solver for one ridge (:func:`_affine_factor`): one function object per ridge,
    so that measures with the same ridge share it in the grid."""
    hook = functools.partial(_affine_factor, ridge=ridge)
    hook.needs_roots = True  # the grid gives the layers' moments their AffineRoots
    return hook


def _stitch_finish(ctx: MomentPair, *, family: str, ridge: float, which: str) -> tuple[jax.Array, dict]:
    def parts():
        chol = ctx.extra(_affine_hook(ridge))[0] if family == "affine" else None
        svd = None if family == "affine" else ctx.svd()
        return scores_with_ambiguity(ctx.x, ctx.y, ctx.cross, family=family, ridge=ridge, chol=chol, svd=svd)

    score, amb = ctx.memo(("stitch", family, ridge), parts)
    checks = score_flags(score, amb, family=family, which=which)
    # the moments hold no rows, so held-out rows that repeat a train row cannot be counted here
    # the minimum-rows rule is checked before the grid's programs run (``check``): rows always hold here
    flags = dict(shared=jnp.zeros((), jnp.int32), rows=jnp.ones((), bool), **checks)
    return V.nan_unless(checks["determined"], getattr(score, which)), flags


def stitch_moment_stats(family: str, *, ridge: float = 0.0, which: str = "held_out") -> MomentStats:
    """A reconstruction score as a moment measure on train/test ("split") moments.

    ``which="held_out"`` is ``reconstruction_score(x, y, family=family, ridge=ridge).held_out``,
    ``"in_sample"`` its in-sample figure. Measures with the same family and ridge
    share one fit per pair (and the orthogonal families share one SVD).

    ``finish`` returns ``(value, flags)`` with the keys of :func:`stitch_core`'s pair
    flags but ``x``, ``y``, ``n_rows`` and ``n_test`` (the grid's): ``result``,
    ``determined``, ``ambiguity`` and ``shared`` (always 0: moments hold no rows).
    The ambiguity (:func:`held_out_ambiguity`) is unchanged by the grid's zero
    padding, so a grid cell and the pairwise call agree on it.
    """
    V.check_choice(family, "family", FAMILIES)
    V.check_choice(which, "which", ReconstructionScore._fields)
    ridge = check_ridge(ridge)
    affine = family == "affine"
    return MomentStats(
        "split",
        functools.partial(_stitch_finish, family=family, ridge=ridge, which=which),
        layer=_affine_hook(ridge) if affine else None,
        check=None if affine and ridge > 0 else functools.partial(_fit_rows_check, family=family, ridge=ridge),
    )
