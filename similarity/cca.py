"""Canonical correlation analysis and its descendants (docs/design.md §2).

* :func:`cca`: canonical correlations ``rho_1 >= ... >= rho_k``,
  ``k = min(d1, d2)``: the singular values of ``Qx^T Qy`` with ``Qx``, ``Qy``
  from thin QR decompositions of the column-centred ``X``, ``Y``.
* :func:`cca_r2`: ``R^2_CCA = mean(rho^2)``; :func:`cca_mean`: ``mean(rho)``.
* :func:`svcca` (Raghu et al. 2017): keep each side's top singular directions
  explaining ``keep_variance`` of its variance, then the mean canonical
  correlation of the kept subspaces.
* :func:`pwcca` (Morcos et al. 2018): ``sum_i alpha_i rho_i`` with
  projection weights ``alpha_i``, exactly as the authors' reference code
  (google/svcca ``compute_pwcca``) computes them: from the side with fewer
  neurons, with its rule for near-zero-variance neurons (see :func:`pwcca`).

Rank: CCA needs each centred representation to have full column rank, so
``d < n`` (centring removes one dimension); with ``d >= n`` every canonical
correlation is 1 whatever the data. :func:`cca`, :func:`cca_r2`, :func:`cca_mean`,
:func:`svcca` and :func:`pwcca` raise a ``ValueError`` for ``d >= n``;
all but :func:`svcca` (which keeps only directions with variance, so it handles
duplicated or collinear features) also refuse a rank-deficient side. The rank
is checked inside the compiled program (from the singular values of the QR
factor ``R``, or of the data for PWCCA) and raised after it returns; under a
user's ``jit``/``vmap``/``grad`` a rank-deficient, non-finite or constant side
gives NaN, never the meaningless correlations near 1 it would otherwise give.

Scale: each side is divided by the power of two at its largest magnitude
before anything is computed (exact; every measure here is scale invariant), so
float32 data at 1e-20 or 1e20 gives the value it gives at 1.

Compiled cores (:mod:`similarity.protocol`): :func:`cca_core`,
:func:`svcca_core` and :func:`pwcca_core`; each public function is its input
checks plus ``protocol.call`` of its core. A core's ``layer`` takes a layer
zero-padded to any width ``W`` with its real width ``d`` traced, and gives the
statistics of the unpadded layer (to rounding): a Householder QR's first ``d``
columns of ``Q`` depend only on the first ``d`` columns of the input, so the
padding's columns of ``Q`` are masked to zero; zero features add zero singular
values, which SVCCA's and PWCCA's rules never keep; ranks and tolerances use
the real width.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import pow2_at
from funsim.similarity._linalg import qr as _qr
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats
from funsim.similarity.protocol import Core

__all__ = ["cca", "cca_r2", "cca_mean", "svcca", "pwcca", "cca_core", "svcca_core", "pwcca_core",
           "cca_layer_stats", "svcca_layer_stats", "pwcca_layer_stats"]



def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def _rank_tol(dtype, n: int, d) -> jax.Array:
    """``max(n, d) * 10 eps``: singular values below this times the largest count as zero (``d`` may be traced)."""
    return jnp.maximum(n, d).astype(dtype) * (10.0 * float(jnp.finfo(dtype).eps))


def _unit_centred(z: jax.Array, max_abs: jax.Array) -> jax.Array:
    """``z`` divided by the power of two at its largest magnitude (exact), then column-centred."""
    return _centre(z / pow2_at(max_abs))


_WIDE = (
    "{name} has shape {shape}: CCA needs more samples than features (d < n; centring uses one "
    "degree of freedom), otherwise every canonical correlation is 1. Reduce {name} first "
    "({hint}), or pass more samples."
)
_HINT_CCA = "svcca does this after keeping d < n directions"
_HINT_SVCCA = "e.g. PCA to fewer than n components"


def _wide_reason(shape: tuple, name: str, hint: str) -> str | None:
    n, d = shape
    return _WIDE.format(name=name, shape=tuple(shape), hint=hint) if d >= n else None


def _shape_reason(shape_x: tuple, shape_y: tuple, why: str, hint: str | None) -> str | None:
    """What the shapes alone decide, in the order of the eager checks: too few samples in ``x``, in
    ``y`` (``n >= 3``), then ``d >= n`` in ``x``, in ``y`` (skipped for ``hint=None``)."""
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, 3, why)
        if msg is not None:
            return msg
    if hint is not None:
        for name, shape in (("x", shape_x), ("y", shape_y)):
            msg = _wide_reason(shape, name, hint)
            if msg is not None:
                return msg
    return None


def _rank_flag(sv: jax.Array, n: int, d, dtype) -> dict[str, jax.Array]:
    """Whether a centred ``(n, d)`` side is full rank, from its singular values ``sv`` (descending; any
    zeros of zero padding after the ``d`` real ones), and its rank. ``d`` may be traced."""
    tol = _rank_tol(dtype, n, d) * sv[0]
    smallest = jnp.take(sv, jnp.clip(d - 1, 0, sv.shape[0] - 1))
    return {"full": smallest > tol, "rank": jnp.sum(sv > tol)}


def _rank_reason(flag, name: str, shape: tuple) -> str | None:
    if flag["full"]:
        return None
    return (f"{name} of shape {tuple(shape)} has centred rank {int(flag['rank'])} < {shape[1]} features "
            "(duplicated, collinear or constant features), so CCA is not defined. Remove "
            "the redundant features, or use svcca, which keeps only directions with variance.")


# ------------------------------------------------------------------------------ CCA


# the summaries of the canonical correlations, by registry name ("all": every correlation)
REDUCTIONS = ("r2", "mean", "all")


class _CCALayer(NamedTuple):
    """Per-layer statistics of the CCA core."""

    q: jax.Array  # (n, min(n, W)) orthonormal basis of the centred real columns; zero columns for the padding
    width: jax.Array  # () int32: the real width d
    rank: dict  # {"full", "rank"} of the centred real columns
    flags: dict  # rep_flags


def _cca_layer(z: jax.Array, width, opts) -> _CCALayer:
    """A thin QR of the centred layer ``(n, W)``; ``Q``'s columns past ``width`` are zeroed.

    The rank comes from the singular values of the QR factor ``R`` (those of the
    centred data): a ``W x W`` SVD beside the ``n x W`` QR.
    """
    del opts
    f = V.rep_flags(z)
    q, r = _qr(_unit_centred(z, f["max_abs"]))
    q = q * protocol.feature_mask(width, q.shape[1], q.dtype)[None, :]
    rank = _rank_flag(_svd(r, compute_uv=False), z.shape[0], width, z.dtype)
    return _CCALayer(q, jnp.asarray(width, jnp.int32), rank, f)


def _cca_pair(sx: _CCALayer, sy: _CCALayer, opts, *, reduce: str):
    """The canonical correlations, summarised by ``reduce``, and the value checks: ``(value, flags)``.

    The singular values of ``Qx^T Qy`` are the ``min(dx, dy)`` canonical correlations,
    then zeros (the padding's columns of ``Q`` are zero).
    """
    del opts
    rho = jnp.clip(_svd(jnp.einsum("ni,nj->ij", sx.q, sy.q), compute_uv=False), 0.0, 1.0)
    k = jnp.minimum(sx.width, sy.width)
    rho = jnp.where(jnp.arange(rho.shape[0]) < k, rho, 0.0)
    if reduce == "all":
        value = rho
    else:
        value = jnp.sum(rho * rho if reduce == "r2" else rho) / k.astype(rho.dtype)
    flags = dict(x=sx.flags, y=sy.flags, rank_x=sx.rank, rank_y=sy.rank)
    ok = V.flags_ok(sx.flags, sy.flags) & sx.rank["full"] & sy.rank["full"]
    return V.nan_unless(ok, value), flags


def _cca_reason(flags, shape_x, shape_y, opts) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    del opts
    msg = _shape_reason(shape_x, shape_y, "CCA", _HINT_CCA)
    if msg is not None or flags is None:
        return msg
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = _rank_reason(flags[f"rank_{name}"], name, shape)
        if msg is not None:
            return msg
    # a side constant to CONSTANT_RTOL whose tiny variations are still of full rank
    return V.pair_constant_reason(flags, shape_x, shape_y, what="CCA")


@functools.lru_cache(maxsize=None)
def _cca_pair_fn(reduce: str):
    """The CCA core's pair for one summary (one object per summary: shared programs)."""
    return functools.partial(_cca_pair, reduce=reduce)


def cca_core(*, reduce: str) -> Core:
    """The compiled core of :func:`cca_r2` (``reduce="r2"``), :func:`cca_mean` (``"mean"``) or :func:`cca` (``"all"``).

    See :class:`similarity.protocol.Core`. The per-layer statistics (a basis of
    the centred columns, ``n min(n, W)`` numbers) are the same for every
    ``reduce``: its ``layer`` is one function. With ``reduce="all"`` the value is
    not ``()`` but ``(min(Wx, Wy),)``: the ``min(dx, dy)`` canonical correlations
    in decreasing order, then zeros for the padding.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> value, flags = protocol.evaluate(cca_core(reduce="r2"), x, 2 * x + 1)
      >>> round(float(value), 6), bool(flags["rank_x"]["full"])
      (1.0, True)
    """
    V.check_choice(reduce, "reduce", REDUCTIONS)
    return Core(_cca_layer, _cca_pair_fn(reduce), _cca_reason, ())


def _cca_checked(x, y, reduce: str) -> jax.Array:
    x, y = V.check_pair(x, y, min_samples=3, why="CCA", finite=False)
    return protocol.call(cca_core(reduce=reduce), x, y)


@full_precision
def cca(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Canonical correlations of two representations, in decreasing order.

    Args:
      x: ``(n, d1)`` with ``d1 < n`` and full column rank after centring.
      y: ``(n, d2)`` likewise.

    Returns:
      ``(min(d1, d2),)`` in [0, 1], decreasing.

    Raises:
      ValueError: bad shapes, NaN/Inf, or a rank-deficient side (see module docstring).

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> np.round(np.asarray(cca(x, x @ np.array([[1.0, 2, 0], [0, 1, 0], [3, 0, 1]]))), 6).tolist()
      [1.0, 1.0, 1.0]
    """
    return _cca_checked(x, y, "all")


@full_precision
def cca_r2(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """``R^2_CCA``: the mean squared canonical correlation, a symmetric score in [0, 1].

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.

    Returns:
      ``()``.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(cca_r2(x, 2 * x + 1)), 6)
      1.0
    """
    return _cca_checked(x, y, "r2")


@full_precision
def cca_mean(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Mean canonical correlation ``mean(rho)``, a symmetric score in [0, 1].

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(cca_mean(x, -x)), 6)
      1.0
    """
    return _cca_checked(x, y, "mean")


# ---------------------------------------------------------------------------- PWCCA


class _PwccaLayer(NamedTuple):
    """Per-layer statistics of PWCCA: ``Xc = u diag(s) vt`` (dropped neurons and padding zeroed)."""

    u: jax.Array  # (n, r), r = min(n, W)
    s: jax.Array  # (r,)
    vt: jax.Array  # (r, W)
    damp: jax.Array  # (r,) s / sqrt(s^2 + epsilon * max_var): the regularised whitening; 0 past `kept`
    kept: jax.Array  # () number of (real) neurons kept
    rank: dict  # {"full", "rank", "kept"}
    flags: dict  # rep_flags


def _pwcca_keep(var, epsilon):
    """The reference's rule: keep neuron j iff ``var_j >= epsilon * max(var)``."""
    return var >= epsilon * jnp.max(var)


def _pwcca_layer(z: jax.Array, width, opts) -> _PwccaLayer:
    """``opts = (epsilon,)``, possibly traced; ``epsilon = 0`` keeps every real neuron and does not regularise.

    The rank of the kept neurons comes from the singular values the computation
    needs anyway (those of the centred side with dropped neurons zeroed).
    """
    (epsilon,) = opts
    f = V.rep_flags(z)
    n = z.shape[0]
    zc = _unit_centred(z, f["max_abs"])
    var = jnp.sum(zc * zc, axis=0)
    # the padding has zero variance, which epsilon = 0 would keep: only real neurons count
    keep = _pwcca_keep(var, epsilon) & (jnp.arange(z.shape[1]) < width)
    kept = jnp.sum(keep)
    u, s, vt = _svd(jnp.where(keep[None, :], zc, 0.0))
    denom = jnp.sqrt(s * s + epsilon * jnp.max(var))
    damp = jnp.where(epsilon > 0, s / jnp.where(denom > 0, denom, 1.0), 1.0)
    damp = jnp.where(jnp.arange(s.shape[0]) < kept, damp, 0.0)  # no direction past the kept neurons
    smallest = jnp.take(s, jnp.clip(kept - 1, 0, s.shape[0] - 1))
    tol = _rank_tol(z.dtype, n, kept) * s[0]
    rank = {"full": (smallest > tol) & (kept < n), "rank": jnp.sum(s > tol), "kept": kept}
    return _PwccaLayer(u, s, vt, damp, kept, rank, f)


def _pwcca_weights(s: jax.Array, vt: jax.Array, c: jax.Array, kept: jax.Array) -> jax.Array:
    """Weights of the directions ``Xc (V c)`` (``c: (r, k)``, one canonical direction per column).

    The directions are orthonormalised in order (QR) and each weight is the L1
    norm of the projections of the centred neurons on it. With ``Xc = U S V^T``
    the directions are ``U (S c)``, so the QR of the small ``S c`` suffices (its
    first ``j`` columns depend only on the first ``j`` directions). Only the first
    ``kept`` weights are used: the columns from ``kept`` on are replaced by unit
    vectors, which leaves those weights unchanged and keeps the QR (and its
    derivative) away from the rank deficiency of the dropped directions.
    """
    sc = s[:, None] * c
    past = jnp.arange(sc.shape[1]) >= kept
    q, _ = _qr(jnp.where(past[None, :], jnp.eye(*sc.shape, dtype=sc.dtype), sc))
    return jnp.sum(jnp.abs(jnp.einsum("dk,d,de->ke", q, s, vt)), axis=1)


def _pwcca_pair(lx: _PwccaLayer, ly: _PwccaLayer, opts):
    """PWCCA and its value checks: ``(value, flags)``."""
    del opts
    m = jnp.einsum("i,ni,nj,j->ij", lx.damp, lx.u, ly.u, ly.damp)
    a, rho, bt = _svd(m)  # rho: the (regularised) canonical correlations, decreasing, then zeros
    use_x = lx.kept <= ly.kept  # the side with fewer (real, kept) neurons; ties go to x
    w = jnp.where(use_x, _pwcca_weights(lx.s, lx.vt, a, lx.kept), _pwcca_weights(ly.s, ly.vt, bt.T, ly.kept))
    w = w * (jnp.arange(rho.shape[0]) < jnp.where(use_x, lx.kept, ly.kept))
    value = jnp.sum(w * jnp.clip(rho, 0.0, 1.0)) / jnp.sum(w)
    flags = dict(x=lx.flags, y=ly.flags, rank_x=lx.rank, rank_y=ly.rank)
    ok = V.flags_ok(lx.flags, ly.flags) & lx.rank["full"] & ly.rank["full"]
    return V.nan_unless(ok, value), flags


def _pwcca_rank_reason(flag, name: str, n: int, epsilon: float) -> str | None:
    if flag["full"]:
        return None
    k = int(flag["kept"])
    what = name if epsilon == 0 else f"{name} (its {k} kept neurons)"
    if k >= n:
        return _WIDE.format(name=what, shape=(n, k), hint=_HINT_CCA)
    return _rank_reason(flag, what, (n, k))


def _pwcca_reason(flags, shape_x, shape_y, opts) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    epsilon = opts[0]
    # with epsilon > 0 the kept neurons decide (d >= n is fine when enough are dropped); a traced
    # epsilon leaves that to the program's rank flags
    msg = _shape_reason(shape_x, shape_y, "CCA", _HINT_CCA if not V.is_traced(epsilon) and epsilon == 0 else None)
    if msg is not None or flags is None:
        return msg
    msg = V.pair_constant_reason(flags, shape_x, shape_y, what="PWCCA")
    if msg is not None:
        return msg
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = _pwcca_rank_reason(flags[f"rank_{name}"], name, shape[0], epsilon)
        if msg is not None:
            return msg
    return None


_EPSILON = V.Bound("epsilon", 0.0, 1.0, hi_open=True,
                   message="epsilon must be in [0, 1) (a variance relative to the largest), got {value!r}.")


def _check_epsilon(epsilon):
    return _EPSILON.check(epsilon)


def pwcca_core(*, epsilon: float = 0.0) -> Core:
    """The compiled core of :func:`pwcca` (:class:`similarity.protocol.Core`); ``epsilon`` is traced.

    Per layer: the SVD of the centred, kept neurons (``n r + r + r W`` numbers,
    ``r = min(n, W)``). Padded neurons are never kept, and neither counted for
    the choice of the side with fewer neurons.

    Raises:
      ValueError: ``epsilon`` outside [0, 1).

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(30, 4))
      >>> value, flags = protocol.evaluate(pwcca_core(epsilon=1e-10), x, x[:, :2])
      >>> round(float(value), 6), int(flags["rank_x"]["kept"])
      (1.0, 4)
    """
    return Core(_pwcca_layer, _pwcca_pair, _pwcca_reason, (_check_epsilon(epsilon),), (_EPSILON,))


@full_precision
def pwcca(x: ArrayLike, y: ArrayLike, /, *, epsilon: float = 0.0) -> jax.Array:
    """Projection-weighted CCA (Morcos et al. 2018) as the authors' code computes it; a score in [0, 1].

    This is ``compute_pwcca`` of google/svcca (``pwcca.py`` with ``cca_core.py``):

    1. neurons whose variance is below ``epsilon`` times the largest variance
       of their side are dropped, and ``epsilon`` (relative to that largest
       variance) is added to the diagonal of each covariance;
    2. ``rho``, ``u``, ``v`` from the SVD of ``Sxx^-1/2 Sxy Syy^-1/2``: the
       ``min(kx, ky)`` canonical correlations ``rho_i`` and the canonical
       directions ``u`` (of x) and ``v`` (of y), orthonormal in the whitened spaces;
    3. the weights come from the side with **fewer kept neurons** (x on a tie):
       its centred activations rotated by its directions, ``Xc u``, are
       orthonormalised in order (QR) into ``p_i``, and
       ``alpha_i ∝ sum_j |<p_i, x_j>|`` over that side's centred neurons ``x_j``;
    4. the score is ``sum_i alpha_i rho_i``.

    So ``pwcca(x, y) == pwcca(y, x)`` when the kept widths differ; with equal
    widths the first argument's weights are used and the order matters. It is
    invariant to translation, isotropic scale and permutations of neurons, not
    to rotations (the L1 norm over neurons is not rotation invariant).

    Two documented departures from the reference, where the reference is not
    well defined: (a) the reference adds neuron ``i``'s mean back to canonical
    direction ``i`` before the QR. On uncentred data that term puts extra
    weight on the leading directions in proportion to the neurons' means, and
    makes the value depend on the arbitrary signs LAPACK gives the singular
    vectors (on uniform data in [0, 1), 80 x 8 per side, it moves by 0.02 to
    0.04 with the signs), so no independent implementation can reproduce it.
    Here the data is centred, which makes PWCCA translation invariant and
    equals the reference on centred input to rounding (tested at 1e-9). (b)
    The reference crashes when the second argument has fewer neurons (it
    indexes the first argument's activations with the second's mask); here
    that case uses the second argument's activations, as intended. PWCCA is
    only well defined when the chosen side's canonical correlations are
    distinct: with ``d1 + d2 >= n - 1`` some of them are exactly 1 and the
    weights within that block depend on rounding, in the reference as in any
    implementation.

    Args:
      x: ``(n, d1)`` with ``d1 < n`` and full column rank after centring (its kept neurons).
      y: ``(n, d2)`` likewise.
      epsilon: relative variance below which a neuron is dropped, in [0, 1) (traced);
        also the ridge added to the normalised covariances. ``epsilon > 0``
        (e.g. 1e-10) handles dead (constant) units.

    Returns:
      ``()``.

    Raises:
      ValueError: as :func:`cca` (rank-deficient kept neurons: pass ``epsilon > 0``
        for constant ones), or epsilon outside [0, 1).

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(30, 4))
      >>> y = x[:, :2] + np.random.default_rng(1).normal(size=(30, 2))
      >>> 0.0 < float(pwcca(x, y)) < 1.0
      True
    """
    core = pwcca_core(epsilon=epsilon)
    x, y = V.check_pair(x, y, min_samples=3, why="CCA", finite=False)
    return protocol.call(core, x, y)


# ---------------------------------------------------------------------------- SVCCA


class _SVCCALayer(NamedTuple):
    """Per-layer statistics of SVCCA: the kept top-SVD directions."""

    u: jax.Array  # (n, min(n, W)) the kept directions; zero columns for the others
    kept: jax.Array  # () how many are kept
    flags: dict  # rep_flags


def _svcca_layer(z: jax.Array, width, opts) -> _SVCCALayer:
    """The top-SVD directions of the centred ``z: (n, W)`` that SVCCA keeps; ``opts = (keep_variance,)``."""
    (keep_variance,) = opts
    f = V.rep_flags(z)
    u, s, _ = _svd(_unit_centred(z, f["max_abs"]))
    var = s * s
    frac = jnp.cumsum(var) / jnp.sum(var)
    # keep direction i iff the directions before it explain < keep_variance; never one without
    # variance (a collinear feature, or the zero padding's)
    before = jnp.concatenate([jnp.zeros((1,), frac.dtype), frac[:-1]])
    tol = _rank_tol(z.dtype, z.shape[0], width) * s[0]
    keep = (before < keep_variance) & (s > tol) & (jnp.arange(s.shape[0]) < width)
    return _SVCCALayer(u * keep[None, :].astype(u.dtype), jnp.sum(keep), f)


def _svcca_pair(sx: _SVCCALayer, sy: _SVCCALayer, opts):
    """SVCCA and its value checks: ``(value, flags)``."""
    del opts
    rho = _svd(jnp.einsum("ni,nj->ij", sx.u, sy.u), compute_uv=False)
    # the masked matrix has the kept block's min(kx, ky) correlations, then zeros
    k = jnp.minimum(sx.kept, sy.kept)
    rho = jnp.where(jnp.arange(rho.shape[0]) < k, jnp.clip(rho, 0.0, 1.0), 0.0)
    flags = dict(x=sx.flags, y=sy.flags)
    return V.nan_unless(V.flags_ok(sx.flags, sy.flags), jnp.sum(rho) / k), flags


def _svcca_reason(flags, shape_x, shape_y, opts) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    del opts
    msg = _shape_reason(shape_x, shape_y, "SVCCA", _HINT_SVCCA)
    if msg is not None or flags is None:
        return msg
    return V.pair_constant_reason(flags, shape_x, shape_y, what="SVCCA")


_KEEP_VARIANCE = V.Bound("keep_variance", 0.0, 1.0, lo_open=True,
                         message="keep_variance must be in (0, 1], got {value!r}.")


def _check_keep_variance(keep_variance):
    return _KEEP_VARIANCE.check(keep_variance)


def svcca_core(*, keep_variance: float = 0.99) -> Core:
    """The compiled core of :func:`svcca` (:class:`similarity.protocol.Core`); ``keep_variance`` is traced.

    Per layer: the kept top-SVD directions (``n min(n, W)`` numbers).

    Raises:
      ValueError: ``keep_variance`` outside (0, 1].

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(30, 4))
      >>> value, flags = protocol.evaluate(svcca_core(keep_variance=0.5), x, -x)
      >>> round(float(value), 6), bool(flags["y"]["varies"])
      (1.0, True)
    """
    return Core(_svcca_layer, _svcca_pair, _svcca_reason, (_check_keep_variance(keep_variance),),
                (_KEEP_VARIANCE,))


@full_precision
def svcca(x: ArrayLike, y: ArrayLike, /, *, keep_variance: float = 0.99) -> jax.Array:
    """SVCCA (Raghu et al. 2017): mean canonical correlation of the top SVD subspaces.

    Each side keeps its fewest top singular directions (of the centred data)
    that explain at least ``keep_variance`` of its variance; directions with
    zero variance are never kept, so duplicated or collinear features are fine.
    Each side needs ``d < n``, as for :func:`cca`: with ``d >= n`` the kept
    directions span nearly all of the ``n - 1`` centred dimensions and the
    canonical correlations are near 1 even for pure noise. The score is the
    mean of the ``min(k1, k2)`` canonical correlations. Shapes are static under
    ``jit``: kept directions are selected by a mask.

    Args:
      x: ``(n, d1)`` with ``d1 < n``.
      y: ``(n, d2)`` with ``d2 < n``.
      keep_variance: fraction in (0, 1] (traced: a new value compiles nothing).

    Returns:
      ``()`` in [0, 1]; symmetric.

    Raises:
      ValueError: bad shapes, ``d >= n``, NaN/Inf, a constant side,
        keep_variance outside (0, 1].

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(30, 12))
      >>> round(float(svcca(x, 2 * x + 1)), 4)
      1.0
      >>> svcca(x[:10], x[:10])  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: x has shape (10, 12): CCA needs more samples than features ...
    """
    core = svcca_core(keep_variance=keep_variance)
    x, y = V.check_pair(x, y, min_samples=3, why="SVCCA", finite=False)
    return protocol.call(core, x, y)


# ----------------------------------------------------------------- per-layer statistics


def _stats_layer(layer, opts: tuple, x: jax.Array):
    return layer(x, x.shape[1], opts)


def _stats_pair(pair, opts: tuple, sx, sy) -> jax.Array:
    return pair(sx, sy, opts)[0]


@functools.lru_cache(maxsize=None)
def _stats_fn(fn, *args):
    """One ``functools.partial`` object per function and arguments (the same programs for the same options)."""
    return functools.partial(fn, *args)


def _layer_stats(core: Core) -> LayerStats:
    """A core as :class:`LayerStats` on unpadded layers (the value NaN where the core's flags say undefined)."""
    return LayerStats(_stats_fn(_stats_layer, core.layer, core.opts), _stats_fn(_stats_pair, core.pair, core.opts))


def cca_layer_stats(*, reduce: str) -> LayerStats:
    """Per-layer statistics of :func:`cca_r2` (``reduce="r2"``) or :func:`cca_mean` (``"mean"``).

    An orthonormal basis of the centred columns per layer (``n d`` numbers);
    the canonical correlations per pair (:func:`cca_core` on unpadded layers).
    """
    return _layer_stats(cca_core(reduce=reduce))


def svcca_layer_stats(*, keep_variance: float = 0.99) -> LayerStats:
    """Per-layer statistics of :func:`svcca`: the kept top-SVD directions (``n d`` numbers; :func:`svcca_core`)."""
    return _layer_stats(svcca_core(keep_variance=keep_variance))


def pwcca_layer_stats(*, epsilon: float = 0.0) -> LayerStats:
    """Per-layer statistics of :func:`pwcca`: the SVD of the centred, kept neurons (:func:`pwcca_core`).

    ``pair(layer(x), layer(y)) == pwcca(x, y, epsilon=epsilon)``; ``n d + d^2`` numbers per layer.
    """
    return _layer_stats(pwcca_core(epsilon=epsilon))
