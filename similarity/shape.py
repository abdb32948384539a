"""Shape metrics (Williams et al. 2021, netrep semantics) and the normalised Bures similarity.

:func:`shape_distance` follows netrep's ``LinearMetric``:

1. centre the columns of each side;
2. partially whiten: ``X~ = Xc Z`` with ``Z = V diag(alpha + (1 - alpha) lam^{-1/2}) V^T``
   from the eigendecomposition ``Xc^T Xc = V diag(lam) V^T``, rescaled so that
   the total variance ``||X~||_F^2`` equals ``||Xc||_F^2`` (netrep's
   ``preserve_variance=True``). ``alpha = 1`` is no whitening (Procrustes,
   rotations only); ``alpha = 0`` is full whitening (CCA-like, invariant to any
   invertible linear map);
3. zero-pad the narrower side to the common width;
4. align with the orthogonal ``Q`` from the SVD of the cross-covariance, and
   measure ``arccos(<X~, Y~ Q> / (||X~|| ||Y~||))`` ("angular", a metric in
   [0, pi/2] for centred data) or ``||X~ - Y~ Q||_F`` ("euclidean").

The optimum of step 4 is the nuclear norm: ``max_Q <X~, Y~ Q> = ||X~^T Y~||_*``,
so no ``Q`` is formed.

Two documented differences from netrep: netrep zero-pads *before* whitening
and clips covariance eigenvalues at ``1e-7``; we whiten each side in its own
width and then pad, and never clip: for ``alpha < 1`` a rank-deficient side
(``d >= n``, duplicated features) raises a ``ValueError``. The angular distance
is the same either way; the euclidean distance matches netrep when the widths
are equal.

Under a user's ``jit``/``vmap`` the value checks are skipped and degenerate
input gives NaN or Inf.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from similarity import _validate as V
from similarity._linalg import svd as _svd

__all__ = ["SHAPE_DISTANCES", "shape_distance", "nbs", "procrustes_distance", "partial_whiten"]

SHAPE_DISTANCES = ("angular", "euclidean")


def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def partial_whiten(x: ArrayLike, /, *, alpha: float = 1.0) -> jax.Array:
    """Centre and partially whiten, preserving total variance (pure; no validation).

    Args:
      x: ``(n, d)``; for ``alpha < 1`` its centred covariance must be full rank.
      alpha: in [0, 1]; 1 = no whitening, 0 = full whitening.

    Returns:
      ``(n, d)`` with ``||out||_F == ||x - mean||_F``.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(10, 3)) * np.array([1.0, 5.0, 20.0])
      >>> w = np.asarray(partial_whiten(x, alpha=0.0))
      >>> c = w.T @ w
      >>> bool(np.allclose(c / c[0, 0], np.eye(3), atol=1e-4))
      True
    """
    xc = _centre(V.as_float_array(x, "x"))
    if alpha == 1.0:
        return xc
    lam, v = jnp.linalg.eigh(jnp.einsum("nd,ne->de", xc, xc))
    dg = alpha + (1.0 - alpha) / jnp.sqrt(lam)
    new_var = jnp.sum(dg * dg * lam)
    dg = dg * jnp.sqrt(jnp.sum(lam) / new_var)
    return jnp.einsum("nd,de,fe->nf", xc, v, v * dg[None, :])


def _pad(x: jax.Array, d: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, d - x.shape[1])))


def _nuclear(a: jax.Array, b: jax.Array) -> jax.Array:
    """``||a^T b||_*`` for ``a``: (n, d1), ``b``: (n, d2)."""
    return jnp.sum(_svd(jnp.einsum("ni,nj->ij", a, b), compute_uv=False))


@functools.partial(jax.jit, static_argnames=("alpha", "distance"))
def _shape(x, y, alpha: float, distance: str):
    xw = partial_whiten(x, alpha=alpha)
    yw = partial_whiten(y, alpha=alpha)
    d = max(x.shape[1], y.shape[1])
    xw, yw = _pad(xw, d), _pad(yw, d)
    nuc = _nuclear(xw, yw)
    sxx = jnp.sum(xw * xw)
    syy = jnp.sum(yw * yw)
    if distance == "angular":
        return jnp.arccos(jnp.clip(nuc / jnp.sqrt(sxx * syy), -1.0, 1.0))
    return jnp.sqrt(jnp.maximum(sxx + syy - 2.0 * nuc, 0.0))


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
    """Generalised shape metric of Williams et al. (2021), a symmetric distance.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``; the narrower side is zero-padded.
      alpha: partial-whitening strength in [0, 1] (static): 1 = Procrustes, 0 = CCA-like.
      distance: "angular" (radians, in [0, pi/2]) or "euclidean" (Frobenius norm,
        in the units of the data).

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
    if alpha < 1.0:
        _check_whitenable(x, "x")
        _check_whitenable(y, "y")
    return _shape(x, y, alpha, distance)


@jax.jit
def _nbs(x, y):
    xc, yc = _centre(x), _centre(y)
    return _nuclear(xc, yc) / jnp.sqrt(jnp.sum(xc * xc) * jnp.sum(yc * yc))


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
