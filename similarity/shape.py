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

Under a user's ``jit``/``vmap`` the value checks are skipped and degenerate
input gives NaN or Inf.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity.moments import LayerStats, MomentPair, MomentStats, full_pair
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


def _gain_sq(lam: jax.Array, alpha: float) -> jax.Array:
    """``(alpha + (1 - alpha) lam^{-1/2})^2 lam``: the variance of a direction after whitening."""
    return (alpha * jnp.sqrt(lam) + (1.0 - alpha)) ** 2


class _Whitened(NamedTuple):
    """One side, whitened in its own width before the variance-preserving scale."""

    data: jax.Array  # (n, d) Xc V diag(alpha + (1 - alpha) lam^-1/2) V^T
    total: jax.Array  # () sum of the clipped eigenvalues
    new_total: jax.Array  # () sum of their _gain_sq


def _whiten_layer(x: jax.Array, alpha: float) -> _Whitened:
    xc = _centre(x)
    one = jnp.ones((), xc.dtype)
    if not _whitens(alpha):
        return _Whitened(xc, one, one)
    lam, v = jnp.linalg.eigh(jnp.einsum("nd,ne->de", xc, xc))
    lam = jnp.maximum(lam, EIGVAL_FLOOR)
    dg = alpha + (1.0 - alpha) / jnp.sqrt(lam)
    return _Whitened(jnp.einsum("nd,de,fe->nf", xc, v, v * dg[None, :]), jnp.sum(lam),
                     jnp.sum(_gain_sq(lam, alpha)))


def _scale(w: _Whitened, alpha: float, width: int) -> jax.Array:
    """netrep's variance-preserving scale ``c`` of a side zero-padded to ``width`` columns."""
    if not _whitens(alpha):
        return jnp.ones((), w.data.dtype)
    pad = width - w.data.shape[1]
    floor = jnp.asarray(EIGVAL_FLOOR, w.data.dtype)
    return jnp.sqrt((w.total + pad * floor) / (w.new_total + pad * _gain_sq(floor, alpha)))


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
    return _pad(_scale(w, float(alpha), width) * w.data, width)


def _pad(x: jax.Array, d: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, d - x.shape[1])))


def _nuclear(a: jax.Array, b: jax.Array) -> jax.Array:
    """``||a^T b||_*`` for ``a``: (n, d1), ``b``: (n, d2)."""
    return jnp.sum(_svd(jnp.einsum("ni,nj->ij", a, b), compute_uv=False))


def _distance(sxx: jax.Array, syy: jax.Array, nuc: jax.Array, distance: str) -> jax.Array:
    """The shape distance from ``||X~||^2``, ``||Y~||^2`` and ``max_Q <X~, Y~ Q> = ||X~^T Y~||_*``."""
    if distance == "angular":
        return jnp.arccos(jnp.clip(nuc / jnp.sqrt(sxx * syy), -1.0, 1.0))
    return jnp.sqrt(jnp.maximum(sxx + syy - 2.0 * nuc, 0.0))


def _shape_pair(wx: _Whitened, wy: _Whitened, alpha: float, distance: str) -> jax.Array:
    width = max(wx.data.shape[1], wy.data.shape[1])
    cx, cy = _scale(wx, alpha, width), _scale(wy, alpha, width)
    return _distance(cx**2 * jnp.sum(wx.data**2), cy**2 * jnp.sum(wy.data**2),
                     cx * cy * _nuclear(wx.data, wy.data), distance)


@functools.partial(jax.jit, static_argnames=("alpha", "distance"))
def _shape(x, y, alpha: float, distance: str):
    return _shape_pair(_whiten_layer(x, alpha), _whiten_layer(y, alpha), alpha, distance)


def _check_whitenable(x: jax.Array, name: str) -> None:
    n, d = x.shape
    if d >= n:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}: partial whitening (alpha < 1) needs a full-rank "
            "covariance, so d < n. Use alpha=1, reduce the features (e.g. PCA), or add samples."
        )
    if V.is_concrete(x):
        a = np.asarray(x, dtype=np.float64)
        s = np.linalg.svd(a - a.mean(axis=0), compute_uv=False)
        if s[-1] <= max(n, d) * 10 * float(jnp.finfo(x.dtype).eps) * s[0]:
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} has a singular covariance (duplicated or "
                "collinear features), so partial whitening with alpha < 1 divides by zero. "
                "Remove redundant features or use alpha=1."
            )


def shape_distance(
    x: ArrayLike, y: ArrayLike, /, *, alpha: float = 1.0, distance: str = "angular"
) -> jax.Array:
    """Generalised shape metric of Williams et al. (2021), a symmetric distance; equals netrep's.

    ``shape_distance(x, y, alpha=a, distance=m)`` equals netrep's
    ``LinearMetric(alpha=a, score_method=m).fit_score(x, y)`` for any widths.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``; the narrower side is zero-padded.
      alpha: partial-whitening strength in [0, 1] (static): 1 = Procrustes, 0 = CCA-like.
      distance: "angular" (radians, in [0, pi/2]) or "euclidean" (Frobenius norm
        of the aligned difference; each whitened side keeps its total variance,
        counted over the padded width as netrep does, see the module docstring).

    Returns:
      ``()``.

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
    x, y = V.check_pair(x, y, min_samples=2, why="a shape metric")
    V.check_not_constant(x, "x", what="the shape distance")
    V.check_not_constant(y, "y", what="the shape distance")
    if _whitens(alpha):
        _check_whitenable(x, "x")
        _check_whitenable(y, "y")
    return _shape(x, y, alpha, distance)


def _nbs_finish(ctx: MomentPair) -> jax.Array:
    """NBS from all-rows moments: the nuclear norm of the normalised cross moment."""
    return jnp.sum(ctx.svd()[1])


def _procrustes_finish(ctx: MomentPair) -> jax.Array:
    return 2.0 - 2.0 * _nbs_finish(ctx)


def _procrustes_shape_finish(ctx: MomentPair, *, distance: str) -> jax.Array:
    """The alpha = 1 shape distance from all-rows moments (no whitening, so no scale)."""
    nx, ny = ctx.x.norm, ctx.y.norm
    return _distance(nx**2, ny**2, nx * ny * _nbs_finish(ctx), distance)


_nbs = jax.jit(lambda x, y: _nbs_finish(full_pair(x, y)))


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
    x, y = V.check_pair(x, y, min_samples=2, why="NBS")
    V.check_not_constant(x, "x", what="NBS")
    V.check_not_constant(y, "y", what="NBS")
    return _nbs(x, y)


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
    return 2.0 - 2.0 * nbs(x, y)


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
    return LayerStats(functools.partial(_whiten_layer, alpha=alpha),
                      functools.partial(_shape_pair, alpha=alpha, distance=distance))
