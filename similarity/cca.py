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
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats
from funsim.similarity._linalg import pow2_scale
from funsim.similarity._linalg import svd as _svd

__all__ = ["cca", "cca_r2", "cca_mean", "svcca", "pwcca", "cca_layer_stats", "svcca_layer_stats",
           "pwcca_layer_stats"]


def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def _rank_tol(dtype, n: int, d) -> float:
    return max(n, d) * float(jnp.finfo(dtype).eps) * 10.0


def _unit(x: jax.Array) -> jax.Array:
    """``x`` divided by the power of two at its largest magnitude (exact)."""
    return x / pow2_scale(x)


_WIDE = (
    "{name} has shape {shape}: CCA needs more samples than features (d < n; centring uses one "
    "degree of freedom), otherwise every canonical correlation is 1. Reduce {name} first "
    "({hint}), or pass more samples."
)


def _check_shape(x: jax.Array, name: str, hint: str = "svcca does this after keeping d < n directions") -> None:
    n, d = x.shape
    if d >= n:
        raise ValueError(_WIDE.format(name=name, shape=tuple(x.shape), hint=hint))


def _rank_flag(sv: jax.Array, n: int, d, dtype) -> dict[str, jax.Array]:
    """Whether singular values ``sv`` (descending) of a centred ``(n, d)`` side are full rank, and the rank."""
    tol = _rank_tol(dtype, n, d) * sv[0]
    return {"full": sv[-1] > tol, "rank": jnp.sum(sv > tol)}


def _raise_rank(flag, name: str, shape) -> None:
    if not flag["full"]:
        raise ValueError(
            f"{name} of shape {tuple(shape)} has centred rank {int(flag['rank'])} < {shape[1]} features "
            "(duplicated, collinear or constant features), so CCA is not defined. Remove "
            "the redundant features, or use svcca, which keeps only directions with variance."
        )


def _qr_basis(x: jax.Array) -> jax.Array:
    q, _ = jnp.linalg.qr(_centre(_unit(x)), mode="reduced")
    return q


def _rho_from_bases(qx: jax.Array, qy: jax.Array) -> jax.Array:
    """Canonical correlations from orthonormal bases ``(n, d1)``, ``(n, d2)`` of the centred sides."""
    return jnp.clip(_svd(jnp.einsum("ni,nj->ij", qx, qy), compute_uv=False), 0.0, 1.0)


# the summaries of the canonical correlations, by registry name
_REDUCE = {"r2": lambda rho: jnp.mean(rho**2), "mean": jnp.mean, "all": lambda rho: rho}


@functools.partial(jax.jit, static_argnames=("reduce",))
def _cca_program(x, y, *, reduce: str):
    """Canonical correlations (summarised by ``reduce``) and the value checks: ``(value, flags)``.

    The rank of each side comes from the singular values of its QR factor ``R``
    (those of the centred data), a ``d x d`` SVD beside the ``n x d`` QR.
    """
    flags, bases = {}, []
    for name, z in (("x", x), ("y", y)):
        q, r = jnp.linalg.qr(_centre(_unit(z)), mode="reduced")
        bases.append(q)
        flags[name] = V.rep_flags(z)
        flags[f"rank_{name}"] = _rank_flag(_svd(r, compute_uv=False), *z.shape, z.dtype)
    ok = V.flags_ok(flags["x"], flags["y"]) & flags["rank_x"]["full"] & flags["rank_y"]["full"]
    return V.nan_unless(ok, _REDUCE[reduce](_rho_from_bases(*bases))), flags


def _cca_checked(x, y, reduce: str) -> jax.Array:
    x, y = V.check_pair(x, y, min_samples=3, why="CCA", finite=False)
    _check_shape(x, "x")
    _check_shape(y, "y")
    out, flags = _cca_program(x, y, reduce=reduce)
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what="CCA", constant=False)
        _raise_rank(flags["rank_x"], "x", x.shape)
        _raise_rank(flags["rank_y"], "y", y.shape)
    return out


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


class _PwccaLayer(NamedTuple):
    """Per-layer statistics of PWCCA: ``Xc = u diag(s) vt`` (dropped neurons zeroed)."""

    u: jax.Array  # (n, d)
    s: jax.Array  # (d,)
    vt: jax.Array  # (d, d)
    damp: jax.Array  # (d,) s / sqrt(s^2 + epsilon * max_var): the regularised whitening
    kept: jax.Array  # () number of neurons kept


def _pwcca_keep(var, epsilon):
    """The reference's rule: keep neuron j iff ``var_j >= epsilon * max(var)``."""
    return var >= epsilon * jnp.max(var)


def _pwcca_layer(x: jax.Array, epsilon) -> _PwccaLayer:
    """``epsilon`` may be traced; ``epsilon = 0`` keeps every neuron and does not regularise."""
    xc = _centre(_unit(x))
    var = jnp.sum(xc * xc, axis=0)
    keep = _pwcca_keep(var, epsilon)
    u, s, vt = _svd(jnp.where(keep[None, :], xc, 0.0))
    denom = jnp.sqrt(s * s + epsilon * jnp.max(var))
    damp = jnp.where(epsilon > 0, s / jnp.where(denom > 0, denom, 1.0), 1.0)
    return _PwccaLayer(u, s, vt, damp, jnp.sum(keep))


def _pwcca_weights(s: jax.Array, vt: jax.Array, c: jax.Array) -> jax.Array:
    """Weights of the directions ``Xc (V c)`` (``c: (d, k)``, one canonical direction per column).

    The directions are orthonormalised in order (QR) and each weight is the L1
    norm of the projections of the centred neurons on it. With ``Xc = U S V^T``
    the directions are ``U (S c)``, so the QR of the small ``S c`` suffices.
    """
    q, _ = jnp.linalg.qr(s[:, None] * c)
    return jnp.sum(jnp.abs(jnp.einsum("dk,d,de->ke", q, s, vt)), axis=1)


def _pwcca_pair(lx: _PwccaLayer, ly: _PwccaLayer) -> jax.Array:
    m = jnp.einsum("i,ni,nj,j->ij", lx.damp, lx.u, ly.u, ly.damp)
    a, rho, bt = _svd(m)  # rho: the (regularised) canonical correlations, decreasing
    use_x = lx.kept <= ly.kept  # the side with fewer neurons; ties go to x
    w = jnp.where(use_x, _pwcca_weights(lx.s, lx.vt, a), _pwcca_weights(ly.s, ly.vt, bt.T))
    w = w * (jnp.arange(rho.shape[0]) < jnp.where(use_x, lx.kept, ly.kept))
    return jnp.sum(w * jnp.clip(rho, 0.0, 1.0)) / jnp.sum(w)


@jax.jit
def _pwcca_program(x: jax.Array, y: jax.Array, epsilon: jax.Array):
    """PWCCA and its value checks, ``epsilon`` traced: ``(value, flags)``.

    The rank of each side's kept neurons comes from the singular values the
    computation needs anyway (those of the centred side with dropped neurons zeroed).
    """
    lx, ly = _pwcca_layer(x, epsilon), _pwcca_layer(y, epsilon)
    flags = {}
    for name, z, lay in (("x", x, lx), ("y", y, ly)):
        n = z.shape[0]
        smallest = jnp.take(lay.s, jnp.clip(lay.kept - 1, 0, lay.s.shape[0] - 1))
        tol = jnp.maximum(n, lay.kept) * (10.0 * jnp.finfo(z.dtype).eps) * lay.s[0]
        flags[name] = V.rep_flags(z)
        flags[f"rank_{name}"] = {"full": (smallest > tol) & (lay.kept < n), "rank": jnp.sum(lay.s > tol),
                                 "kept": lay.kept}
    ok = V.flags_ok(flags["x"], flags["y"]) & flags["rank_x"]["full"] & flags["rank_y"]["full"]
    return V.nan_unless(ok, _pwcca_pair(lx, ly)), flags


def _raise_pwcca_rank(flag, name: str, n: int, d: int, epsilon: float) -> None:
    if flag["full"]:
        return
    k = int(flag["kept"])
    what = name if epsilon == 0 else f"{name} (its {k} kept neurons)"
    if k >= n:
        raise ValueError(_WIDE.format(name=what, shape=(n, k), hint="svcca does this after keeping d < n directions"))
    _raise_rank(flag, what, (n, k))


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
    epsilon = float(epsilon)
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1) (a variance relative to the largest), got {epsilon!r}.")
    x, y = V.check_pair(x, y, min_samples=3, why="CCA", finite=False)
    if epsilon == 0:
        _check_shape(x, "x")
        _check_shape(y, "y")
    out, flags = _pwcca_program(x, y, jnp.asarray(epsilon, x.dtype))
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what="PWCCA")
        _raise_pwcca_rank(flags["rank_x"], "x", *x.shape, epsilon)
        _raise_pwcca_rank(flags["rank_y"], "y", *y.shape, epsilon)
    return out


def pwcca_layer_stats(*, epsilon: float = 0.0) -> LayerStats:
    """Per-layer statistics of :func:`pwcca`: the SVD of the centred, kept neurons.

    ``pair(layer(x), layer(y)) == pwcca(x, y, epsilon=epsilon)``; ``n d + d^2`` numbers per layer.
    """
    return LayerStats(functools.partial(_pwcca_layer, epsilon=float(epsilon)), _pwcca_pair)


def _svcca_basis(a: jax.Array, keep_variance) -> tuple[jax.Array, jax.Array]:
    """The top-SVD directions of ``a: (n, d)`` that SVCCA keeps: ``(u masked (n, r), count)``."""
    u, s, _ = _svd(_centre(_unit(a)))
    var = s * s
    frac = jnp.cumsum(var) / jnp.sum(var)
    # keep direction i iff the directions before it explain < keep_variance
    before = jnp.concatenate([jnp.zeros((1,), frac.dtype), frac[:-1]])
    tol = _rank_tol(a.dtype, *a.shape) * s[0]
    keep = (before < keep_variance) & (s > tol)
    return u * keep[None, :].astype(u.dtype), jnp.sum(keep)


@jax.jit
def _svcca_program(x: jax.Array, y: jax.Array, keep_variance: jax.Array):
    """SVCCA and its value checks, ``keep_variance`` traced: ``(value, flags)``."""
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    out = _svcca_pair(_svcca_basis(x, keep_variance), _svcca_basis(y, keep_variance))
    return V.nan_unless(V.flags_ok(fx, fy), out), dict(x=fx, y=fy)


def _svcca_pair(bx, by) -> jax.Array:
    (ux, kx), (uy, ky) = bx, by
    rho = _svd(jnp.einsum("ni,nj->ij", ux, uy), compute_uv=False)
    # the masked matrix has the kept block's min(kx, ky) correlations, then zeros
    return jnp.sum(jnp.clip(rho, 0.0, 1.0)) / jnp.minimum(kx, ky)


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
    if not 0.0 < float(keep_variance) <= 1.0:
        raise ValueError(f"keep_variance must be in (0, 1], got {keep_variance!r}.")
    x, y = V.check_pair(x, y, min_samples=3, why="SVCCA", finite=False)
    hint = "e.g. PCA to fewer than n components"
    _check_shape(x, "x", hint)
    _check_shape(y, "y", hint)
    out, flags = _svcca_program(x, y, jnp.asarray(float(keep_variance), x.dtype))
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what="SVCCA")
    return out


def cca_layer_stats(*, reduce: str) -> LayerStats:
    """Per-layer statistics of :func:`cca_r2` (``reduce="r2"``) or :func:`cca_mean` (``"mean"``).

    An orthonormal basis of the centred columns per layer (``n d`` numbers);
    the canonical correlations per pair.
    """
    summary = _REDUCE[reduce]
    return LayerStats(_qr_basis, lambda qx, qy: summary(_rho_from_bases(qx, qy)))


def svcca_layer_stats(*, keep_variance: float = 0.99) -> LayerStats:
    """Per-layer statistics of :func:`svcca`: the kept top-SVD directions (``n d`` numbers)."""
    return LayerStats(functools.partial(_svcca_basis, keep_variance=float(keep_variance)), _svcca_pair)
