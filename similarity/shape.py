"""Shape metrics (Williams et al. 2021, netrep semantics) and the normalised Bures similarity.

:func:`shape_distance` equals netrep's ``LinearMetric(alpha, score_method=...)``
(``fit_score``; ``center_columns=True``, ``zero_pad=True``):

1. zero-pad the narrower side to the common width ``D = max(d1, d2)`` and
   centre the columns;
2. partially whiten each side: ``X~ = Xc Z`` with
   ``Z = c V diag(alpha + (1 - alpha) lam^{-1/2}) V^T`` from the
   eigendecomposition ``Xc^T Xc = V diag(lam) V^T`` of the padded ``D x D``
   matrix, eigenvalues clipped below at ``1e-7`` (netrep's ``eigval_tol``),
   and the scalar ``c`` chosen to preserve the total variance over all ``D``
   eigenvalues: ``c^2 sum_i (alpha + (1 - alpha) lam_i^{-1/2})^2 lam_i = sum_i lam_i``
   (netrep's ``preserve_variance=True``). The padded coordinates have
   ``lam = 1e-7`` and contribute nothing to ``X~`` but do count in that sum,
   so for ``alpha < 1`` the narrower side's scale depends on the other side's
   width. ``alpha = 1`` (netrep: ``alpha > 1 - 1e-7``) is no whitening
   (Procrustes, rotations only); ``alpha = 0`` is full whitening (CCA-like,
   invariant to any invertible linear map);
3. align with the orthogonal ``Q`` from the SVD of the cross-covariance, and
   measure ``arccos(<X~, Y~ Q> / (||X~|| ||Y~||))`` ("angular", a metric in
   [0, pi/2] for centred data) or ``||X~ - Y~ Q||_F`` ("euclidean").

The optimum of step 3 is the nuclear norm: ``max_Q <X~, Y~ Q> = ||X~^T Y~||_*``,
so no ``Q`` is formed, and the whitening is done in each side's own width
(the padded eigen-directions only enter the scale ``c``). The angular distance
does not depend on ``c`` at all.

One documented difference from netrep: for ``alpha < 1`` a side whose centred
covariance is singular (``d >= n``, duplicated features) raises a
``ValueError`` here, where netrep clips its zero eigenvalues and carries on.

Scale: each side is computed at unit scale (divided by the power of two at
its largest magnitude, exactly) and enters the distance through a scalar
factor, so float32 data at 1e-20 or 1e20 neither overflows nor underflows; the
angular distances and NBS do not depend on the scale at all.

Value checks (NaN/Inf, constant sides, a singular covariance for alpha < 1)
run inside the compiled program; under a user's ``jit``/``vmap``/``grad``
such input gives NaN.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats, MomentPair, MomentStats, full_pair
from funsim.similarity._linalg import arccos_unit, pow2_scale, sqrt_floor
from funsim.similarity._linalg import svd as _svd

__all__ = ["SHAPE_DISTANCES", "shape_distance", "nbs", "procrustes_distance", "partial_whiten",
           "shape_layer_stats", "shape_moment_stats", "nbs_moment_stats", "procrustes_moment_stats"]

SHAPE_DISTANCES = ("angular", "euclidean")
EIGVAL_FLOOR = 1e-7  # netrep's eigval_tol: covariance eigenvalues are clipped below at this


def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def _whitens(alpha: float) -> bool:
    """Whether ``alpha`` whitens at all (netrep returns the data unchanged for ``alpha > 1 - 1e-7``)."""
    return alpha <= 1.0 - EIGVAL_FLOOR


class _Whitened(NamedTuple):
    """One side, whitened in its own width, kept at unit scale (nothing overflows or underflows).

    With ``c`` the unit the side is computed in (``x / c`` has its largest magnitude
    near 1) and netrep's variance-preserving scale ``c_var``, the whitened side in
    the data's units is ``c_var * factor * data``, and
    ``c_var = c_over_h * sqrt((total + pad * floor) / (gain + pad * h_floor^2))``
    for a side zero-padded by ``pad`` columns (see :func:`_scale`).
    """

    data: jax.Array  # (n, d) Xc V diag(alpha + (1 - alpha) lam^-1/2) V^T / factor, max |entry| in [1, 2)
    factor: jax.Array  # ()
    total: jax.Array  # () sum of the clipped eigenvalues of (x / c)'s covariance, every direction
    gain: jax.Array  # () sum of h^2 / H^2, h = alpha sqrt(lam) + 1 - alpha (data units), H a power of two
    c_over_h: jax.Array  # () c / H
    floor: jax.Array  # () netrep's eigenvalue floor in the units of x / c
    h_floor: jax.Array  # () h of a floored eigenvalue, / H
    s_ratio: jax.Array  # () smallest / largest singular value of the centred side (1 without whitening)


_MIN_UNIT = 2.0**-12  # below sqrt(1e-7) every eigenvalue is floored anyway: no need to scale tiny data up


def _whiten_layer(x: jax.Array, alpha, whiten: bool | None = None) -> _Whitened:
    """Partial whitening of one side (netrep's, before its variance-preserving scale).

    ``alpha`` may be traced; ``whiten`` (static) says whether ``alpha`` whitens at
    all (default: from a concrete ``alpha``). The eigen-directions come from the SVD
    of the centred data (``Xc^T Xc = V diag(s^2) V^T``), which is more accurate than
    an eigendecomposition of the covariance and gives the rank check its singular values.
    """
    if whiten is None:
        whiten = _whitens(float(alpha))
    one = jnp.ones((), x.dtype)
    if not whiten:
        c = pow2_scale(x)
        return _Whitened(_centre(x / c), c, one, one, one, one, one, one)
    c = jnp.maximum(pow2_scale(x), _MIN_UNIT)
    zc = _centre(x / c)  # exact: a power of two
    d = zc.shape[1]
    u, s, vt = _svd(zc)
    floor = EIGVAL_FLOOR / c / c  # netrep's absolute floor, in the units of x / c
    lam = jnp.maximum(s * s, floor)
    root = jnp.sqrt(jnp.maximum(lam, jnp.finfo(zc.dtype).tiny))
    g = alpha * c + (1.0 - alpha) / root  # c * (alpha + (1 - alpha) lam_x^-1/2), lam_x = c^2 lam
    data = jnp.einsum("nr,r,rd->nd", u, s * g, vt)
    p = pow2_scale(data)
    h = alpha * c * root + (1.0 - alpha)  # sqrt of netrep's gain of each direction, in data units
    big_h = pow2_scale(h)
    h_floor = (alpha * EIGVAL_FLOOR**0.5 + (1.0 - alpha)) / big_h
    null = d - s.shape[0]  # directions beyond the rank (d > n): eigenvalue 0, floored
    ratio = s[-1] / s[0] if null == 0 else jnp.zeros((), zc.dtype)
    return _Whitened(data / p, p, jnp.sum(lam) + null * floor, jnp.sum((h / big_h) ** 2) + null * h_floor**2,
                     c / big_h, floor, h_floor, ratio)


def _scale(w: _Whitened, alpha, width: int, whiten: bool | None = None) -> jax.Array:
    """netrep's variance-preserving scale ``c_var`` of a side zero-padded to ``width`` columns."""
    if not (_whitens(float(alpha)) if whiten is None else whiten):
        return jnp.ones((), w.data.dtype)
    pad = width - w.data.shape[1]
    return w.c_over_h * jnp.sqrt((w.total + pad * w.floor) / (w.gain + pad * w.h_floor**2))


@full_precision
def partial_whiten(x: ArrayLike, /, *, alpha: float = 1.0, width: int | None = None) -> jax.Array:
    """netrep's partial whitening, preserving total variance (pure; no validation).

    Args:
      x: ``(n, d)``; for ``alpha < 1`` its centred covariance should be full rank
        (eigenvalues are clipped below at ``1e-7``, as netrep does).
      alpha: in [0, 1]; 1 = no whitening, 0 = full whitening.
      width: zero-pad ``x`` to this many columns first (default ``d``), as
        netrep does for the narrower side of a pair.

    Returns:
      ``(n, width)``, centred. Without padding ``||out||_F == ||x - mean||_F``.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(10, 3)) * np.array([1.0, 5.0, 20.0])
      >>> w = np.asarray(partial_whiten(x, alpha=0.0))
      >>> c = w.T @ w
      >>> bool(np.allclose(c / c[0, 0], np.eye(3), atol=1e-4))
      True
    """
    x = V.as_float_array(x, "x")
    width = x.shape[1] if width is None else int(width)
    if width < x.shape[1]:
        raise ValueError(f"width={width} is smaller than x's {x.shape[1]} columns; pass width >= d.")
    w = _whiten_layer(x, float(alpha))
    return _pad(_scale(w, float(alpha), width) * w.factor * w.data, width)


def _pad(x: jax.Array, d: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, d - x.shape[1])))


def _nuclear(a: jax.Array, b: jax.Array) -> jax.Array:
    """``||a^T b||_*`` for ``a``: (n, d1), ``b``: (n, d2)."""
    return jnp.sum(_svd(jnp.einsum("ni,nj->ij", a, b), compute_uv=False))


def _distance(sxx: jax.Array, syy: jax.Array, nuc: jax.Array, distance: str) -> jax.Array:
    """The shape distance from ``||X~||^2``, ``||Y~||^2`` and ``max_Q <X~, Y~ Q> = ||X~^T Y~||_*``.

    At a distance of zero (``y = x Q``) the gradient is the subgradient 0
    (:func:`similarity._linalg.arccos_unit`, :func:`similarity._linalg.sqrt_floor`).
    """
    if distance == "angular":
        return arccos_unit(nuc / jnp.sqrt(sxx * syy))
    total = sxx + syy
    return sqrt_floor(total - 2.0 * nuc, 64.0 * jnp.finfo(total.dtype).eps * total)


def _shape_pair(wx: _Whitened, wy: _Whitened, alpha, distance: str, whiten: bool | None = None) -> jax.Array:
    """The distance of two whitened sides; each enters as ``factor * scale * data`` with ``data`` at
    unit scale, and the euclidean distance is formed relative to the larger side (no overflow)."""
    width = max(wx.data.shape[1], wy.data.shape[1])
    nx2, ny2 = jnp.sum(wx.data**2), jnp.sum(wy.data**2)
    cos = _nuclear(wx.data, wy.data) / jnp.sqrt(nx2 * ny2)
    if distance == "angular":
        return arccos_unit(cos)
    a = _scale(wx, alpha, width, whiten) * wx.factor * jnp.sqrt(nx2)  # ||X~||
    b = _scale(wy, alpha, width, whiten) * wy.factor * jnp.sqrt(ny2)
    m = jax.lax.stop_gradient(jnp.maximum(a, b))
    return m * _distance((a / m) ** 2, (b / m) ** 2, (a / m) * (b / m) * cos, distance)


def _rank_tol(dtype, n: int, d: int) -> float:
    return max(n, d) * 10.0 * float(jnp.finfo(dtype).eps)


@functools.partial(jax.jit, static_argnames=("whiten", "distance"))
def _shape_program(x, y, alpha, *, whiten: bool, distance: str):
    """The shape distance and its value checks: ``(value, flags)`` (``alpha`` traced)."""
    wx, wy = _whiten_layer(x, alpha, whiten), _whiten_layer(y, alpha, whiten)
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    flags = dict(x=fx, y=fy,
                 rank_x=wx.s_ratio > _rank_tol(x.dtype, *x.shape),
                 rank_y=wy.s_ratio > _rank_tol(y.dtype, *y.shape))
    ok = V.flags_ok(fx, fy) & flags["rank_x"] & flags["rank_y"]
    return V.nan_unless(ok, _shape_pair(wx, wy, alpha, distance, whiten)), flags


def _check_whitenable_shape(x: jax.Array, name: str) -> None:
    n, d = x.shape
    if d >= n:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}: partial whitening (alpha < 1) needs a full-rank "
            "covariance, so d < n. Use alpha=1, reduce the features (e.g. PCA), or add samples."
        )


def _raise_singular(flags, name: str, shape) -> None:
    if not flags[f"rank_{name}"]:
        raise ValueError(
            f"{name} of shape {tuple(shape)} has a singular covariance (duplicated or "
            "collinear features), so partial whitening with alpha < 1 divides by zero. "
            "Remove redundant features or use alpha=1."
        )


@full_precision
def shape_distance(
    x: ArrayLike, y: ArrayLike, /, *, alpha: float = 1.0, distance: str = "angular"
) -> jax.Array:
    """Generalised shape metric of Williams et al. (2021), a symmetric distance; equals netrep's.

    ``shape_distance(x, y, alpha=a, distance=m)`` equals netrep's
    ``LinearMetric(alpha=a, score_method=m).fit_score(x, y)`` for any widths.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``; the narrower side is zero-padded.
      alpha: partial-whitening strength in [0, 1] (traced: a new value in [0, 1)
        compiles nothing): 1 = Procrustes, 0 = CCA-like.
      distance: "angular" (radians, in [0, pi/2]) or "euclidean" (Frobenius norm
        of the aligned difference; each whitened side keeps its total variance,
        counted over the padded width as netrep does, see the module docstring).

    Returns:
      ``()``. At a distance of zero its gradient is the subgradient 0.

    Raises:
      ValueError: bad shapes, NaN/Inf, a constant side, alpha outside [0, 1],
        a rank-deficient side when alpha < 1.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))
      >>> round(float(shape_distance(x, x @ q + 5.0)), 2)  # float32: arccos near 1
      0.0
    """
    V.check_choice(distance, "distance", SHAPE_DISTANCES)
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (1 = Procrustes, 0 = CCA-like), got {alpha!r}.")
    x, y = V.check_pair(x, y, min_samples=2, why="a shape metric", finite=False)
    whiten = _whitens(alpha)
    if whiten:
        _check_whitenable_shape(x, "x")
        _check_whitenable_shape(y, "y")
    out, flags = _shape_program(x, y, jnp.asarray(alpha, x.dtype), whiten=whiten, distance=distance)
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what="the shape distance")
        _raise_singular(flags, "x", x.shape)
        _raise_singular(flags, "y", y.shape)
    return out


def _nbs_finish(ctx: MomentPair) -> jax.Array:
    """NBS from all-rows moments: the nuclear norm of the normalised cross moment."""
    return jnp.sum(ctx.svd()[1])


def _procrustes_finish(ctx: MomentPair) -> jax.Array:
    return 2.0 - 2.0 * _nbs_finish(ctx)


def _procrustes_shape_finish(ctx: MomentPair, *, distance: str) -> jax.Array:
    """The alpha = 1 shape distance from all-rows moments (no whitening, so no scale).

    The euclidean one is formed relative to the larger norm, as :func:`_shape_pair` does, so that
    the squares cannot overflow or underflow (float32 data at 1e-20 ... 1e20)."""
    nbs = _nbs_finish(ctx)
    if distance == "angular":  # arccos of the normalised nuclear norm: the norms cancel
        one = jnp.ones_like(nbs)
        return _distance(one, one, nbs, distance)
    nx, ny = ctx.x.norm, ctx.y.norm
    m = jax.lax.stop_gradient(jnp.maximum(nx, ny))
    m = jnp.where(m > 0, m, jnp.ones_like(m))
    a, b = nx / m, ny / m
    return m * _distance(a**2, b**2, a * b * nbs, distance)


@jax.jit
def _nbs_program(x, y):
    """NBS and its value checks; each side is first divided by its power-of-two scale (exact;
    NBS is scale invariant), so the moments cannot overflow."""
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    out = _nbs_finish(full_pair(x / pow2_scale(x), y / pow2_scale(y)))
    return V.nan_unless(V.flags_ok(fx, fy), out), dict(x=fx, y=fy)


def _nbs_checked(x, y, what: str) -> jax.Array:
    x, y = V.check_pair(x, y, min_samples=2, why=what, finite=False)
    out, flags = _nbs_program(x, y)
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what=what)
    return out


@full_precision
def nbs(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Normalised Bures similarity ``||Xc^T Yc||_* / (||Xc||_F ||Yc||_F)``, a score in [0, 1].

    Equals ``cos`` of the angular Procrustes shape distance (alpha = 1).
    Costs an SVD of the ``(d1, d2)`` cross-covariance.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.

    Returns:
      ``()``.

    Raises:
      ValueError: bad shapes, NaN/Inf, a constant side.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(nbs(x, -2 * x)), 6)
      1.0
    """
    return _nbs_checked(x, y, "NBS")


@full_precision
def procrustes_distance(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Ding et al.'s (2021) squared Procrustes distance ``2 - 2 NBS``, in [0, 2].

    It is ``min_Q ||X~ - Y~ Q||_F^2`` with each centred side scaled to unit
    Frobenius norm and ``Q`` orthogonal (after zero-padding).

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.

    Returns:
      ``()``.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> abs(float(procrustes_distance(x, 3 * x))) < 1e-5
      True
    """
    return 2.0 - 2.0 * _nbs_checked(x, y, "NBS")


def nbs_moment_stats() -> MomentStats:
    """:func:`nbs` (``"nbs"``) as a moment measure on all-rows moments."""
    return MomentStats("full", _nbs_finish)


def procrustes_moment_stats() -> MomentStats:
    """:func:`procrustes_distance` (``"procrustes"``) as a moment measure on all-rows moments."""
    return MomentStats("full", _procrustes_finish)


def shape_moment_stats(*, alpha: float, distance: str) -> MomentStats | None:
    """``shape_distance(x, y, alpha=alpha, distance=distance)`` as a moment measure on all-rows moments.

    Only without whitening (``alpha = 1``, netrep: ``alpha > 1 - 1e-7``); ``None`` otherwise,
    since whitening needs each side's own eigendecomposition (see :func:`shape_layer_stats`).
    """
    if _whitens(float(alpha)):
        return None
    return MomentStats("full", functools.partial(_procrustes_shape_finish, distance=distance))


def shape_layer_stats(*, alpha: float, distance: str) -> LayerStats:
    """Per-layer statistics of :func:`shape_distance`: each side whitened once (``n d`` numbers).

    ``pair(layer(x), layer(y)) == shape_distance(x, y, alpha=alpha, distance=distance)``;
    the variance-preserving scale, which depends on the pair's common width,
    is applied per pair.
    """
    alpha = float(alpha)
    return LayerStats(functools.partial(_whiten_layer, alpha=alpha, whiten=_whitens(alpha)),
                      functools.partial(_shape_pair, alpha=alpha, distance=distance))
