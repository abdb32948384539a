"""Kernels, HSIC estimators and the per-representation statistics of linear CKA.

The pure pieces behind :mod:`similarity.cka` (whose module docstring gives the estimators'
formulas, the scale and the validation rules): centring, the linear and RBF Gram matrices (with
the median heuristic and its derivative), the biased and unbiased HSIC of Gram matrices, and
linear CKA in feature space from per-representation statistics (:class:`LinearStats`) or from
second moments.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._linalg import pow2_scale
from funsim.similarity._precision import full_precision, sum_of_products

KERNELS = ("linear", "rbf")
METHODS = ("auto", "features", "gram")

CONSTANT_CAUSE = (
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


def rbf_gram_and_median(x: jax.Array, scale, width=None) -> tuple[jax.Array, jax.Array]:
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
    scale = V.check_option_positive(scale, "scale", why=RBF_SCALE_WHY)
    k = rbf_gram_and_median(V.as_float_array(x, "x"), scale)[0]
    if V.is_traced(scale):  # checked in the program: NaN (and NaN derivatives) out of range
        k = V.nan_reaches_inputs(V.nan_unless(rbf_bound("scale").ok(scale), k), scale)
    return k


RBF_SCALE_WHY = "the RBF bandwidth is this factor times the median pairwise distance"


def rbf_bound(name: str = "rbf_scale") -> V.Bound:
    return V.Bound(name, 0.0, float("inf"), lo_open=True, why=RBF_SCALE_WHY)


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


def hsic_gram(k: jax.Array, l: jax.Array, debiased: bool) -> jax.Array:
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
        tr + jnp.sum(k1) * jnp.sum(l1) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * sum_of_products(k1, l1)
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
    return hsic_gram(k.astype(dt), l.astype(dt), debiased)


# ------------------------------------------------------------ linear CKA by statistics


def hsic_from_terms(c_xy, kx, ky, n: int, debiased: bool) -> jax.Array:
    """HSIC from ``c_xy = ||Xc^T Yc||_F^2`` and row squared norms of centred features."""
    if not debiased:
        return c_xy / (n - 1) ** 2
    return (
        c_xy
        - n / (n - 2) * sum_of_products(kx, ky)
        + jnp.sum(kx) * jnp.sum(ky) / ((n - 1) * (n - 2))
    ) / (n * (n - 3))


def cross_sq(xc: jax.Array, yc: jax.Array, method: str) -> jax.Array:
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
    return centred_stats(centre_features(x), V.check_bool(debiased, "debiased"), method)


def centred_stats(xc: jax.Array, debiased: bool, method: str = "auto") -> LinearStats:
    kx = jnp.sum(xc * xc, axis=1)
    n = xc.shape[0]
    return LinearStats(xc, kx, hsic_from_terms(cross_sq(xc, xc, method), kx, kx, n, debiased))


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
    return hsic_from_terms(
        cross_sq(sx.centred, sy.centred, method), sx.row_sq, sy.row_sq, n, debiased
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
