"""Centered kernel alignment (CKA) and the HSIC estimators behind it (docs/design.md §2).

Notation: ``H = I - 11^T/n`` centres; ``K``, ``L`` are ``(n, n)`` Gram matrices.

* Biased HSIC: ``tr(K H L H) / (n-1)^2``.
* Unbiased HSIC (Song et al. 2012), with ``K~``, ``L~`` the Gram matrices with
  zeroed diagonals: ``[tr(K~ L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2))
  - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))``; it needs ``n >= 4``.
* ``CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))``.

Linear CKA has a feature-space form that costs ``O(n d^2)`` instead of
``O(n^2 d)``. With centred features ``Xc`` (row squared norms ``kx``) and
``c_xy = ||Xc^T Yc||_F^2``:

* biased HSIC ``= c_xy / (n-1)^2``;
* unbiased HSIC ``= [c_xy - n/(n-2) kx.ky + |Xc|^2 |Yc|^2 / ((n-1)(n-2))] / (n(n-3))``,
  because ``K~ 1 = -kx`` once the columns are centred (the unbiased estimator
  is unchanged by centring: it is a U-statistic of a translation-invariant
  kernel of the data).

Per-representation statistics (:func:`linear_stats`) are computed once per
layer, so a grid of comparisons only pays for the cross products
(:func:`linear_cka_from_stats`). :func:`cka_accumulate` / :func:`cka_finalize`
stream minibatch CKA (Nguyen et al. 2021) over data that does not fit in
memory; its state is a pytree of sums, so states from several devices add up
with ``jax.lax.psum(state, axis_name)`` or :func:`cka_merge`.

Scale: each side is divided by the power of two at its largest magnitude
before any product is formed (exact, and CKA is scale invariant), so float32
data at 1e-20 or 1e20 gives the same value as at 1.

Validation: shapes are checked on the host; NaN/Inf, constant
representations, a zero RBF bandwidth and a non-positive self-HSIC are
checked inside the compiled program and raised after it returns. Under a
user's ``jit``/``vmap``/``grad`` such input gives NaN (see
:mod:`similarity._validate`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import pow2_at, pow2_scale
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats, MomentPair, MomentStats
from funsim.similarity.protocol import Core

__all__ = [
    "KERNELS",
    "METHODS",
    "centre_features",
    "linear_gram",
    "rbf_gram",
    "centre_gram",
    "hsic",
    "cka",
    "LinearStats",
    "linear_stats",
    "linear_hsic_cross",
    "linear_cka_from_stats",
    "linear_cka_from_moments",
    "cka_layer_stats",
    "cka_core",
    "linear_cka_moment_stats",
    "CKAState",
    "cka_init",
    "cka_accumulate",
    "cka_merge",
    "cka_finalize",
    "minibatch_cka",
]

KERNELS = ("linear", "rbf")
METHODS = ("auto", "features", "gram")

_CONSTANT_CAUSE = (
    "a representation is constant across samples (zero centred variance) or has too few "
    "distinct samples for the estimator; check for dead layers or duplicated inputs."
)


# ----------------------------------------------------------------------------- kernels


@full_precision
def centre_features(x: ArrayLike, /) -> jax.Array:
    """Centre the columns of ``x`` and scale it to unit Frobenius norm.

    CKA is invariant to both operations; doing them first keeps float32 sums
    of products well scaled (the data is first divided by the power of two at
    its largest magnitude, exactly, so that the norm itself cannot overflow).
    Pure and vmap-able; a constant ``x`` gives NaN (validate first).

    Args:
      x: ``(n, d)``.

    Returns:
      ``(n, d)``: ``(x - mean) / ||x - mean||_F``.

    Examples:
      >>> import jax.numpy as jnp
      >>> xc = centre_features(jnp.array([[1.0, 2.0], [3.0, 2.0]]))
      >>> [[round(v, 6) for v in row] for row in xc.tolist()]
      [[-0.707107, 0.0], [0.707107, 0.0]]
    """
    x = V.as_float_array(x, "x")
    x = x / pow2_scale(x)
    xc = x - jnp.mean(x, axis=0, keepdims=True)
    return xc / jnp.sqrt(jnp.sum(xc * xc))


@full_precision
def linear_gram(x: ArrayLike, /) -> jax.Array:
    """Linear kernel ``K = x x^T``.

    Args:
      x: ``(n, d)``.

    Returns:
      ``(n, n)``.

    Examples:
      >>> linear_gram(jnp.array([[1.0, 0.0], [1.0, 1.0]])).tolist()
      [[1.0, 1.0], [1.0, 2.0]]
    """
    x = V.as_float_array(x, "x")
    return jnp.einsum("nd,md->nm", x, x)


def _sq_dists(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Squared Euclidean distances ``(n, n)`` from centred data (diagonal exactly 0), and the centred
    rows' squared norms ``(n,)`` that they were computed from."""
    xc = x - jnp.mean(x, axis=0, keepdims=True)
    sq = jnp.sum(xc * xc, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * jnp.einsum("nd,md->nm", xc, xc)
    n = x.shape[0]
    return jnp.where(jnp.eye(n, dtype=bool), 0.0, jnp.maximum(d2, 0.0)), sq


def _median_is_rounding(d2: jax.Array, sq: jax.Array, width) -> jax.Array:
    """``()`` bool: the median of ``d2`` is zero to within its rounding (at least half the entries are).

    An entry ``sq_i + sq_j - 2 <x_i, x_j>`` of :func:`_sq_dists` is off by at most about
    ``2 (width + 1) eps (sq_i + sq_j)`` in any summation order; coinciding rows give exactly 0 on
    a CPU, but a few ulps of either sign where the Gram matrix is summed in another order than the
    norms (a GPU's GEMM), so the median of a layer with mostly repeated rows can be a tiny positive number.
    """
    tol = 2.0 * (jnp.asarray(width, d2.dtype) + 1.0) * jnp.finfo(d2.dtype).eps * (sq[:, None] + sq[None, :])
    return 2 * jnp.sum(d2 <= tol) > d2.size


def _median_lo_hi(v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two middle order statistics of a non-negative vector, by sorting its bit patterns.

    Non-negative floats order like their bit patterns, and XLA's CPU backend sorts
    integers several times faster than floats (NaN-aware comparisons).
    """
    it = {4: jnp.int32, 8: jnp.int64}[v.dtype.itemsize]
    s = jnp.sort(jax.lax.bitcast_convert_type(jnp.where(v == 0, jnp.zeros((), v.dtype), v), it))
    m = v.shape[0]
    return tuple(jax.lax.bitcast_convert_type(s[i], v.dtype) for i in ((m - 1) // 2, m // 2))


@jax.custom_jvp
def _median_flat(v: jax.Array) -> jax.Array:
    lo, hi = _median_lo_hi(v)
    return lo + (hi - lo) / 2


@_median_flat.defjvp
def _median_flat_jvp(primals, tangents):
    """The median moves with the entries it is made of: the mean tangent of the entries equal to
    each middle value (equal entries are the same distance counted twice, ``d_ij = d_ji``).

    The primal output is ``_median_flat(v)`` itself, not ``lo + (hi - lo) / 2`` rebuilt from the
    bit-pattern sort: the sort carries no derivative, so a rebuilt value would be a constant to an
    outer derivative and every second derivative through the bandwidth would be lost (a Hessian of
    RBF CKA asymmetric and off by tens of percent). Called recursively, an outer ``jvp`` applies
    this rule again. The tangent is linear in ``dv`` with a locally constant mask: the median is
    piecewise linear, so its own second derivative is zero.
    """
    (v,), (dv,) = primals, tangents
    lo, hi = _median_lo_hi(v)

    def at(value):
        hit = v == value
        return jnp.sum(jnp.where(hit, dv, 0.0)) / jnp.maximum(jnp.sum(hit), 1)

    return _median_flat(v), (at(lo) + at(hi)) / 2


def _median_nonneg(a: jax.Array) -> jax.Array:
    """``jnp.median`` of a non-negative array, differentiable (its gradient flows to the middle entries).

    The RBF bandwidth is a median of squared distances; CKA with that bandwidth is
    invariant to scaling the data, and its gradient is only right if the bandwidth's
    own gradient flows (along ``x`` itself the two cancel exactly).
    """
    v = a.reshape(-1)
    if v.dtype.itemsize not in (4, 8):
        return jnp.median(v)
    return _median_flat(v)


def _rbf_gram_and_median(x: jax.Array, scale, width=None) -> tuple[jax.Array, jax.Array]:
    """The RBF kernel and the median squared distance of ``x`` divided by its power-of-two scale
    (the kernel does not depend on that scale; the median is in the scaled units). With ``width`` (the
    real number of features) the median returned is 0 where it is zero to within rounding."""
    d2, sq = _sq_dists(x / pow2_scale(x))
    med = _median_nonneg(d2)
    k = jnp.exp(-d2 / (2.0 * scale**2 * med))
    if width is not None:
        med = jnp.where(_median_is_rounding(d2, sq, width), jnp.zeros((), med.dtype), med)
    return k, med


@full_precision
def rbf_gram(x: ArrayLike, /, *, scale: float = 0.5) -> jax.Array:
    """RBF kernel with the median heuristic of Kornblith et al. (2019).

    ``K_ij = exp(-||x_i - x_j||^2 / (2 sigma^2))`` with
    ``sigma = scale * sqrt(median of the squared pairwise distances)``, the
    median taken over all ``n^2`` entries of the distance matrix (diagonal
    zeros included), as in Kornblith et al.'s reference code.

    Args:
      x: ``(n, d)``.
      scale: the bandwidth relative to the median distance (keyword-only).

    Returns:
      ``(n, n)``.

    Raises:
      ValueError: ``scale`` not a finite number > 0.

    Examples:
      >>> k = rbf_gram(jnp.array([[0.0], [1.0], [3.0]]), scale=1.0)
      >>> k.shape
      (3, 3)
    """
    scale = V.check_option_positive(scale, "scale", why=_RBF_SCALE_WHY)
    k = _rbf_gram_and_median(V.as_float_array(x, "x"), scale)[0]
    if V.is_traced(scale):  # checked in the program: NaN (and NaN derivatives) out of range
        k = V.nan_reaches_inputs(V.nan_unless(_rbf_bound("scale").ok(scale), k), scale)
    return k


_RBF_SCALE_WHY = "the RBF bandwidth is this factor times the median pairwise distance"


def _rbf_bound(name: str = "rbf_scale") -> V.Bound:
    return V.Bound(name, 0.0, float("inf"), lo_open=True, why=_RBF_SCALE_WHY)


@full_precision
def centre_gram(k: ArrayLike, /) -> jax.Array:
    """Double-centre a Gram matrix: ``H K H``.

    Args:
      k: ``(n, n)``.

    Returns:
      ``(n, n)``.

    Examples:
      >>> centre_gram(jnp.ones((3, 3))).tolist()
      [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    k = V.as_float_array(k, "k")
    k = k - jnp.mean(k, axis=0, keepdims=True)
    return k - jnp.mean(k, axis=1, keepdims=True)


def _hsic_gram(k: jax.Array, l: jax.Array, debiased: bool) -> jax.Array:
    n = k.shape[0]
    if not debiased:
        return jnp.sum(centre_gram(k) * centre_gram(l)) / (n - 1) ** 2
    off = ~jnp.eye(n, dtype=bool)
    kt = jnp.where(off, k, 0.0)
    lt = jnp.where(off, l, 0.0)
    tr = jnp.sum(kt * lt)
    k1 = jnp.sum(kt, axis=1)
    l1 = jnp.sum(lt, axis=1)
    return (
        tr + jnp.sum(k1) * jnp.sum(l1) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * jnp.dot(k1, l1)
    ) / (n * (n - 3))


@full_precision
def hsic(k: ArrayLike, l: ArrayLike, /, *, debiased: bool = False) -> jax.Array:
    """Hilbert-Schmidt independence criterion of two Gram matrices.

    Args:
      k: ``(n, n)`` symmetric Gram matrix of the first representation.
      l: ``(n, n)`` symmetric Gram matrix of the second.
      debiased: use the unbiased estimator of Song et al. (2012) (needs n >= 4)
        instead of the biased ``tr(K H L H) / (n-1)^2``.

    Returns:
      ``()``.

    Raises:
      ValueError: non-square or mismatched Gram matrices, or n < 4 when debiased.

    Examples:
      >>> x = jnp.array([[0.0], [1.0], [2.0], [4.0]])
      >>> round(float(hsic(linear_gram(x), linear_gram(x))), 4)  # 8.75**2 / 3**2
      8.5069
    """
    debiased = V.check_bool(debiased, "debiased")
    k = V.as_float_array(k, "k")
    l = V.as_float_array(l, "l")
    for name, a in (("k", k), ("l", l)):
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"{name} must be a square (n, n) Gram matrix, got shape {tuple(a.shape)}.")
    if k.shape != l.shape:
        raise ValueError(
            f"k and l must have the same shape, got k.shape={tuple(k.shape)} and "
            f"l.shape={tuple(l.shape)}; both are Gram matrices over the same n samples."
        )
    n = k.shape[0]
    need = 4 if debiased else 2
    if n < need:
        raise ValueError(
            f"k has shape {tuple(k.shape)}: the {'unbiased' if debiased else 'biased'} HSIC "
            f"needs n >= {need} samples. Pass more samples."
        )
    V.check_finite(k, "k")
    V.check_finite(l, "l")
    dt = jnp.promote_types(k.dtype, l.dtype)
    return _hsic_gram(k.astype(dt), l.astype(dt), debiased)


# ------------------------------------------------------------ linear CKA by statistics


def _hsic_from_terms(c_xy, kx, ky, n: int, debiased: bool) -> jax.Array:
    """HSIC from ``c_xy = ||Xc^T Yc||_F^2`` and row squared norms of centred features."""
    if not debiased:
        return c_xy / (n - 1) ** 2
    return (
        c_xy
        - n / (n - 2) * jnp.dot(kx, ky)
        + jnp.sum(kx) * jnp.sum(ky) / ((n - 1) * (n - 2))
    ) / (n * (n - 3))


def _cross_sq(xc: jax.Array, yc: jax.Array, method: str) -> jax.Array:
    """``||Xc^T Yc||_F^2``, in feature space or through the Gram matrices."""
    if method == "auto":
        method = "features" if max(xc.shape[1], yc.shape[1]) <= xc.shape[0] else "gram"
    if method == "features":
        c = jnp.einsum("nd,ne->de", xc, yc)
        return jnp.sum(c * c)
    return jnp.sum(linear_gram(xc) * linear_gram(yc))


class LinearStats(NamedTuple):
    """Per-representation statistics for linear CKA (a pytree; vmap-able).

    Attributes:
      centred: ``(n, d)`` column-centred features scaled to unit Frobenius norm
        (:func:`centre_features`).
      row_sq: ``(n,)`` squared row norms of ``centred`` (used by the unbiased HSIC).
      self_hsic: ``()`` HSIC of the representation with itself.
    """

    centred: jax.Array
    row_sq: jax.Array
    self_hsic: jax.Array


@full_precision
def linear_stats(x: ArrayLike, /, *, debiased: bool = False, method: str = "auto") -> LinearStats:
    """Statistics of one representation, reusable across every pair it is in.

    Pure (no validation): validate with :func:`cka` semantics first or accept
    NaN for degenerate input.

    Args:
      x: ``(n, d)``.
      debiased: whether ``self_hsic`` is the unbiased estimator.
      method: "auto" | "features" | "gram" (see :func:`cka`).

    Returns:
      :class:`LinearStats`.

    Examples:
      >>> s = linear_stats(jnp.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]]))
      >>> s.centred.shape, s.row_sq.shape, s.self_hsic.shape
      ((3, 2), (3,), ())
    """
    V.check_choice(method, "method", METHODS)
    return _stats(centre_features(x), V.check_bool(debiased, "debiased"), method)


def _stats(xc: jax.Array, debiased: bool, method: str = "auto") -> LinearStats:
    kx = jnp.sum(xc * xc, axis=1)
    n = xc.shape[0]
    return LinearStats(xc, kx, _hsic_from_terms(_cross_sq(xc, xc, method), kx, kx, n, debiased))


@full_precision
def linear_hsic_cross(
    sx: LinearStats, sy: LinearStats, /, *, debiased: bool = False, method: str = "auto"
) -> jax.Array:
    """HSIC between two representations from their :class:`LinearStats`.

    Args:
      sx: statistics of ``x`` (n samples).
      sy: statistics of ``y`` (the same n samples).
      debiased: use the unbiased estimator.
      method: "auto" | "features" | "gram".

    Returns:
      ``()``, the HSIC of the unit-norm centred representations.

    Examples:
      >>> s = linear_stats(jnp.array([[0.0], [1.0], [3.0]]))
      >>> bool(jnp.allclose(linear_hsic_cross(s, s), s.self_hsic))
      True
    """
    debiased = V.check_bool(debiased, "debiased")
    V.check_choice(method, "method", METHODS)
    n = sx.centred.shape[0]
    return _hsic_from_terms(
        _cross_sq(sx.centred, sy.centred, method), sx.row_sq, sy.row_sq, n, debiased
    )


@full_precision
def linear_cka_from_stats(
    sx: LinearStats, sy: LinearStats, /, *, debiased: bool = False, method: str = "auto"
) -> jax.Array:
    """Linear CKA from precomputed :class:`LinearStats` (pure, vmap-able).

    ``linear_cka_from_stats(linear_stats(x), linear_stats(y)) == cka(x, y)``;
    a layer grid computes :func:`linear_stats` once per layer and vmaps this
    over pairs. No validation and no epsilon: a non-positive self-HSIC gives NaN.

    Args:
      sx: statistics of ``x``, computed with the same ``debiased``.
      sy: statistics of ``y``.
      debiased: use the unbiased HSIC.
      method: "auto" | "features" | "gram".

    Returns:
      ``()``.

    Examples:
      >>> x = jnp.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [5.0, 1.0]])
      >>> float(linear_cka_from_stats(linear_stats(x), linear_stats(2 * x + 1)))
      1.0
    """
    xy = linear_hsic_cross(sx, sy, debiased=debiased, method=method)
    return xy / jnp.sqrt(sx.self_hsic * sy.self_hsic)


def linear_cka_from_moments(gram_x: ArrayLike, gram_y: ArrayLike, cross: ArrayLike, /) -> jax.Array:
    """Linear CKA (biased HSIC) from centred second moments (pure, vmap-able).

    ``CKA = ||Xc^T Yc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``; any common
    scaling of the three moments cancels, so normalised moments work too.

    Args:
      gram_x: ``(d1, d1)`` ``Xc^T Xc``.
      gram_y: ``(d2, d2)`` ``Yc^T Yc``.
      cross: ``(d1, d2)`` ``Xc^T Yc``.

    Returns:
      ``()``.

    Examples:
      >>> x = jnp.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [5.0, 1.0]])
      >>> xc = x - x.mean(axis=0, keepdims=True)
      >>> g = xc.T @ xc
      >>> float(linear_cka_from_moments(g, 4.0 * g, 2.0 * g))
      1.0
    """
    gx, gy, c = jnp.asarray(gram_x), jnp.asarray(gram_y), jnp.asarray(cross)
    return jnp.sum(c * c) / jnp.sqrt(jnp.sum(gx * gx) * jnp.sum(gy * gy))


def _linear_cka_finish(ctx: MomentPair) -> jax.Array:
    return linear_cka_from_moments(ctx.x.gram, ctx.y.gram, ctx.cross)


def linear_cka_moment_stats() -> MomentStats:
    """Linear CKA (``"cka/linear"``) as a moment measure on all-rows moments."""
    return MomentStats("full", _linear_cka_finish)


def cka_layer_stats(*, kernel: str, debiased: bool, rbf_scale: float = 0.5) -> LayerStats:
    """Per-layer statistics of :func:`cka`: :class:`LinearStats` (linear) or the kernel matrix (RBF).

    ``pair(layer(x), layer(y)) == cka(x, y, kernel=kernel, debiased=debiased)``.
    Memory per layer: ``n d`` numbers (linear), ``n^2`` (RBF).
    """
    if kernel == "linear":
        return LayerStats(
            functools.partial(linear_stats, debiased=debiased),
            functools.partial(linear_cka_from_stats, debiased=debiased),
        )

    def layer(x):
        k, _ = _rbf_gram_and_median(x, rbf_scale)
        return k, _hsic_gram(k, k, debiased)

    def pair(sx, sy):
        (k, hk), (l, hl) = sx, sy
        return _hsic_gram(k, l, debiased) / jnp.sqrt(hk * hl)

    return LayerStats(layer, pair)


# ------------------------------------------------------------------------------ CKA


class _CKALayer(NamedTuple):
    """Per-layer statistics of the CKA core: linear ``(xc, row_sq, c_self)`` or RBF ``(k, hsic_kk, median)``."""

    data: jax.Array  # linear: (n, W) centred layer divided by its power-of-two scale; rbf: (n, n) kernel
    row_sq: jax.Array  # linear: (n,) squared row norms of data (the unbiased HSIC); rbf: ()
    self_hsic: jax.Array  # () HSIC of the layer with itself (up to a common factor)
    median: jax.Array  # () the RBF median squared distance, 0 if zero to rounding (1 for the linear kernel)
    flags: dict


def _cka_layer(z, width, opts, *, kernel: str, debiased: bool, method: str) -> _CKALayer:
    """One layer ``(n, W)`` (zero padding leaves every statistic unchanged); ``opts = (rbf_scale,)``."""
    # zero features change neither a linear nor an RBF kernel; the width only sizes the RBF median's rounding
    f = V.rep_flags(z)
    n = z.shape[0]
    if kernel == "linear":
        # centred, divided by a power of two (exact); not normalised: every ratio below is scale free
        zc = (z - jnp.mean(z, axis=0, keepdims=True)) / pow2_at(f["max_abs"])
        kz = jnp.sum(zc * zc, axis=1)
        c = _cross_sq(zc, zc, _method(method, z.shape[1], n))
        self_hsic = _hsic_from_terms(c, kz, kz, n, True) if debiased else c  # biased: 1 / (n - 1)^2 cancels
        return _CKALayer(zc, kz, self_hsic, jnp.ones((), z.dtype), f)
    (rbf_scale,) = opts
    k, med = _rbf_gram_and_median(z, rbf_scale, width)
    return _CKALayer(k, jnp.zeros((), z.dtype), _hsic_gram(k, k, debiased), med, f)


def _method(method: str, width: int, n: int) -> str:
    if method == "auto":
        return "features" if width <= n else "gram"
    return method


def _cka_pair(sx: _CKALayer, sy: _CKALayer, opts, *, kernel: str, debiased: bool, method: str):
    """CKA of two layers' statistics and its value checks: ``(value, flags)``."""
    del opts
    n = sx.data.shape[0]
    if kernel == "linear":
        c = _cross_sq(sx.data, sy.data, _method(method, max(sx.data.shape[1], sy.data.shape[1]), n))
        xy = _hsic_from_terms(c, sx.row_sq, sy.row_sq, n, True) if debiased else c
    else:
        xy = _hsic_gram(sx.data, sy.data, debiased)
    xx, yy = sx.self_hsic, sy.self_hsic
    flags = dict(x=sx.flags, y=sy.flags, med_x=sx.median > 0, med_y=sy.median > 0, xx=xx, yy=yy)
    ok = V.flags_ok(sx.flags, sy.flags) & flags["med_x"] & flags["med_y"] & (xx > 0) & (yy > 0)
    return V.nan_unless(ok, xy / (jnp.sqrt(xx) * jnp.sqrt(yy))), flags


def _cka_reason(flags, shape_x, shape_y, opts, *, kernel: str, debiased: bool, method: str) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    del opts
    need, why = (4, "the unbiased (debiased) HSIC") if debiased else (2, "CKA")
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, need, why)
        if msg is not None:
            return msg
    if method == "features" and kernel == "rbf":
        return "method='features' is only available for kernel='linear'; use 'auto'."
    if flags is None:
        return None
    msg = V.pair_constant_reason(flags, shape_x, shape_y, what="CKA")
    if msg is not None:
        return msg
    for name, shape in (("x", shape_x), ("y", shape_y)):
        if not flags[f"med_{name}"]:
            return (f"{name} of shape {tuple(shape)} has a zero median squared pairwise distance "
                    "(at least half of its sample pairs coincide), so the RBF bandwidth is zero. "
                    "Deduplicate the samples or use kernel='linear'.")
    for key, what in (("xx", "HSIC(x, x)"), ("yy", "HSIC(y, y)")):
        if not flags[key] > 0:
            return f"{what} = {flags[key]!r} is not positive: {_CONSTANT_CAUSE}"
    return None


@functools.lru_cache(maxsize=None)
def _cka_parts(kernel: str, debiased: bool, method: str) -> tuple:
    """The core's three functions for one set of static options (one object each: shared programs)."""
    kw = dict(kernel=kernel, debiased=debiased, method=method)
    return (functools.partial(_cka_layer, **kw), functools.partial(_cka_pair, **kw),
            functools.partial(_cka_reason, **kw))


def cka_core(*, kernel: str = "linear", debiased: bool = False, rbf_scale: float = 0.5,
             method: str = "auto") -> Core:
    """The compiled core of :func:`cka` (:class:`similarity.protocol.Core`); ``rbf_scale`` is traced.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> value, flags = protocol.evaluate(cka_core(), x, 2 * x)
      >>> round(float(value), 6), bool(flags["x"]["varies"])
      (1.0, True)
    """
    V.check_choice(kernel, "kernel", KERNELS)
    V.check_choice(method, "method", METHODS)
    rbf_scale = _rbf_bound().check(rbf_scale)
    layer, pair, reason = _cka_parts(kernel, V.check_bool(debiased, "debiased"), method)
    return Core(layer, pair, reason, (rbf_scale,), (_rbf_bound(),))


@full_precision
def cka(
    x: ArrayLike,
    y: ArrayLike,
    /,
    *,
    kernel: str = "linear",
    debiased: bool = False,
    rbf_scale: float = 0.5,
    method: str = "auto",
) -> jax.Array:
    """Centered kernel alignment (Kornblith et al. 2019), a score in [0, 1].

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``, the same n inputs in the same order.
      kernel: "linear" or "rbf" (bandwidth by :func:`rbf_gram`'s median rule).
      debiased: use the unbiased HSIC (Song et al. 2012); needs n >= 4. The
        debiased value can be slightly negative for unrelated representations.
      rbf_scale: RBF bandwidth relative to the median distance, > 0 (traced:
        a new value compiles nothing; ``jit``, ``vmap`` and ``grad`` over it work).
      method: linear kernel only: "features" (``O(n d^2)``), "gram"
        (``O(n^2 d)``) or "auto" (features when ``max(d1, d2) <= n``). Both
        give the same value.

    Returns:
      ``()`` in the dtype of the (promoted) inputs.

    Raises:
      ValueError: rank != 2, different sample counts, too few samples, NaN/Inf,
        a constant representation, ``rbf_scale <= 0``, or an unknown option.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(50, 8))
      >>> round(float(cka(x, x @ np.diag(np.arange(1.0, 9.0)))), 4) < 1.0
      True
      >>> round(float(cka(x, 3 * x + 1)), 6)
      1.0
    """
    V.check_choice(kernel, "kernel", KERNELS)
    V.check_choice(method, "method", METHODS)
    debiased = V.check_bool(debiased, "debiased")
    if kernel == "rbf" and method == "features":
        raise ValueError("method='features' is only available for kernel='linear'; use 'auto'.")
    rbf_scale = V.check_option_positive(rbf_scale, "rbf_scale", why=_RBF_SCALE_WHY)
    need = 4 if debiased else 2
    why = "the unbiased (debiased) HSIC" if debiased else "CKA"
    x, y = V.check_pair(x, y, min_samples=need, why=why, finite=False)
    return protocol.call(cka_core(kernel=kernel, debiased=debiased, rbf_scale=rbf_scale, method=method), x, y)


# ------------------------------------------------------------------- minibatch CKA


class CKAState(NamedTuple):
    """Running sums for minibatch CKA (a pytree: add states, or ``psum`` them).

    Attributes:
      xy: ``()`` sum over batches of HSIC(x_b, y_b).
      xx: ``()`` sum of HSIC(x_b, x_b).
      yy: ``()`` sum of HSIC(y_b, y_b).
      count: ``()`` number of batches.
    """

    xy: jax.Array
    xx: jax.Array
    yy: jax.Array
    count: jax.Array


@full_precision
def cka_init(dtype: DTypeLike | None = None) -> CKAState:
    """An empty :class:`CKAState` (all sums zero).

    Args:
      dtype: float dtype of the sums; default ``jnp.result_type(float)``
        (float64 when x64 is enabled). Half precision is promoted to float32.

    Returns:
      :class:`CKAState`.

    Examples:
      >>> cka_init(jnp.float32).count.tolist()
      0.0
    """
    dt = jnp.result_type(float) if dtype is None else V.compute_dtype(dtype, "dtype")
    z = jnp.zeros((), dt)
    return CKAState(z, z, z, z)


@full_precision
def cka_accumulate(
    state: CKAState, x_batch: ArrayLike, y_batch: ArrayLike, /, *, debiased: bool = True
) -> CKAState:
    """Add one minibatch's HSIC terms (linear kernel) to ``state``. Pure.

    Nguyen et al. (2021) average the per-batch (unbiased) HSIC separately for
    the numerator and each denominator term; :func:`cka_finalize` divides.
    Sums of the raw HSIC values (of the centred, unscaled batch) are kept in
    ``state``'s dtype; float32 sums are fine for activations of ordinary
    magnitude (values near 1e19 would overflow).

    Args:
      state: from :func:`cka_init` or a previous call.
      x_batch: ``(b, d1)``.
      y_batch: ``(b, d2)``, the same b inputs.
      debiased: use the unbiased HSIC (then b >= 4).

    Returns:
      The updated :class:`CKAState`.

    Raises:
      ValueError: bad shapes, b < 4 when debiased, NaN/Inf in a concrete batch.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(8, 3))
      >>> s = cka_accumulate(cka_init(), x[:4], x[:4] + 1)
      >>> s = cka_accumulate(s, x[4:], x[4:] + 1)
      >>> round(float(cka_finalize(s)), 5), float(s.count)
      (1.0, 2.0)
    """
    debiased = V.check_bool(debiased, "debiased")
    need = 4 if debiased else 2
    why = "the unbiased (debiased) HSIC of a minibatch" if debiased else "HSIC"
    xb, yb = V.check_pair(x_batch, y_batch, ("x_batch", "y_batch"), min_samples=need, why=why)
    return _accumulate(state, xb, yb, debiased)


def _accumulate(state: CKAState, xb: jax.Array, yb: jax.Array, debiased: bool) -> CKAState:
    # raw (unnormalised) centred features: batches are averaged on one common scale
    dt = state.xy.dtype
    xb, yb = xb.astype(dt), yb.astype(dt)
    sx = _stats(xb - jnp.mean(xb, axis=0, keepdims=True), debiased)
    sy = _stats(yb - jnp.mean(yb, axis=0, keepdims=True), debiased)
    xy = linear_hsic_cross(sx, sy, debiased=debiased)
    return CKAState(state.xy + xy, state.xx + sx.self_hsic, state.yy + sy.self_hsic, state.count + 1)


@full_precision
def cka_merge(a: CKAState, b: CKAState, /) -> CKAState:
    """Add two states (e.g. from two hosts); inside ``pmap``/``shard_map`` use
    ``jax.lax.psum(state, axis_name)`` instead, which sums every leaf.

    Examples:
      >>> cka_merge(cka_init(), cka_init()).count.tolist()
      0.0
    """
    return jax.tree.map(jnp.add, a, b)


@full_precision
def cka_finalize(state: CKAState, /) -> jax.Array:
    """Minibatch CKA ``mean(HSIC_xy) / sqrt(mean(HSIC_xx) mean(HSIC_yy))``.

    Args:
      state: accumulated :class:`CKAState`.

    Returns:
      ``()``.

    Raises:
      ValueError: (eagerly) when no batch was added or a self-HSIC sum is not positive.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(1).normal(size=(6, 2))
      >>> float(cka_finalize(cka_accumulate(cka_init(), x, -x)))
      1.0
    """
    if V.is_concrete(state.count) and float(state.count) == 0:
        raise ValueError("cka_finalize got an empty state (count=0); call cka_accumulate first.")
    V.check_positive_result(state.xx, "the summed HSIC(x_b, x_b)", _CONSTANT_CAUSE)
    V.check_positive_result(state.yy, "the summed HSIC(y_b, y_b)", _CONSTANT_CAUSE)
    return state.xy / jnp.sqrt(state.xx * state.yy)


@functools.partial(jax.jit, static_argnames=("batch_size", "debiased"))
def _minibatch_state(x, y, batch_size: int, debiased: bool) -> CKAState:
    n = x.shape[0]
    nb = n // batch_size
    state = cka_init(x.dtype)
    xs = x[: nb * batch_size].reshape(nb, batch_size, x.shape[1])
    ys = y[: nb * batch_size].reshape(nb, batch_size, y.shape[1])

    def body(s, b):
        return _accumulate(s, b[0], b[1], debiased), None

    state, _ = jax.lax.scan(body, state, (xs, ys))
    if nb * batch_size < n:
        state = _accumulate(state, x[nb * batch_size :], y[nb * batch_size :], debiased)
    return state


@full_precision
def minibatch_cka(
    x: ArrayLike, y: ArrayLike, /, *, batch_size: int, debiased: bool = True
) -> jax.Array:
    """Minibatch linear CKA (Nguyen et al. 2021) over consecutive batches of rows.

    Rows are split in order into ``n // batch_size`` batches of ``batch_size``,
    plus one shorter final batch holding the remainder (if any); every batch
    counts equally. With one batch covering all rows this equals
    ``cka(x, y, debiased=debiased)``. For data that does not fit in memory use
    :func:`cka_accumulate` / :func:`cka_finalize` directly.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.
      batch_size: rows per batch (static); >= 4 when debiased.
      debiased: use the unbiased HSIC per batch.

    Returns:
      ``()``.

    Raises:
      ValueError: bad shapes, NaN/Inf, a batch (including the remainder batch)
        smaller than the estimator needs, or a constant representation.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(40, 3))
      >>> float(minibatch_cka(x, 2 * x, batch_size=10))
      1.0
    """
    debiased = V.check_bool(debiased, "debiased")
    need = 4 if debiased else 2
    why = "the unbiased (debiased) HSIC" if debiased else "CKA"
    x, y = V.check_pair(x, y, min_samples=need, why=why)
    n = x.shape[0]
    batch_size = int(batch_size)
    if batch_size < need or batch_size > n:
        raise ValueError(
            f"batch_size={batch_size} must be in [{need}, n={n}] for x.shape={tuple(x.shape)}"
            f"{' (the unbiased HSIC needs at least 4 samples per batch)' if debiased else ''}."
        )
    rem = n % batch_size
    if 0 < rem < need:
        raise ValueError(
            f"x has n={n} rows, so batch_size={batch_size} leaves a final batch of {rem} rows, "
            f"fewer than the {need} the estimator needs. Choose a batch_size that divides n "
            f"or leaves at least {need} rows, or drop the last {rem} rows."
        )
    V.check_not_constant(x, "x", what="CKA")
    V.check_not_constant(y, "y", what="CKA")
    return cka_finalize(_minibatch_state(x, y, batch_size, debiased))
