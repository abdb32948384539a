"""Directed linear-regression R^2 between representations (docs/design.md §2).

``R^2(X -> Y) = 1 - ||Yc - Xc W||_F^2 / ||Yc||_F^2`` with ``W`` the
least-squares (or ridge) fit on column-centred data (the intercept is not
penalised). It pools all output columns, so wide-variance columns of ``Y``
weigh more. This is an in-sample score: with ``ridge = 0`` and ``d_x >= n - 1``
it is 1 for any ``Y``; use a held-out split (the stitching module does) when
that matters.

With ``Xc = U S V^T`` the fitted values are ``U diag(f) U^T Yc`` with
``f = s^2 / (s^2 + ridge)``. For ``ridge = 0`` this is the least-squares
projection (``numpy.linalg.lstsq`` semantics): directions with
``s <= max(n, d) * eps * s_max`` are treated as the null space of ``X``,
exactly as a pseudo-inverse does, so duplicated or collinear features are fine.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity.moments import LayerStats
from funsim.similarity._linalg import svd as _svd

__all__ = ["linear_regression_r2", "regression_layer_stats"]


def _layer(z):
    """``(u (n, r), s (r,), centred z (n, d))``: what a layer contributes as predictor or target."""
    zc = z - jnp.mean(z, axis=0, keepdims=True)
    u, s, _ = _svd(zc)
    return u, s, zc


@functools.partial(jax.jit, static_argnames=("ridge",))
def _r2(x, y, ridge: float):
    yc = y - jnp.mean(y, axis=0, keepdims=True)
    return _r2_from_layers(_layer(x), (None, None, yc), ridge)


def _r2_from_layers(lx, ly, ridge: float):
    (u, s, xc), (_, _, yc) = lx, ly
    if ridge == 0.0:
        tol = max(xc.shape) * jnp.finfo(xc.dtype).eps * s[0]
        f = (s > tol).astype(xc.dtype)
    else:
        f = s * s / (s * s + ridge)
    coef = jnp.einsum("nk,ne->ke", u, yc)
    resid = yc - jnp.einsum("nk,k,ke->ne", u, f, coef)
    return 1.0 - jnp.sum(resid * resid) / jnp.sum(yc * yc)


def linear_regression_r2(x: ArrayLike, y: ArrayLike, /, *, ridge: float = 0.0) -> jax.Array:
    """Fraction of ``y``'s variance explained by a linear map from ``x`` (directed).

    Args:
      x: ``(n, d1)``, the predictor.
      y: ``(n, d2)``, the target.
      ridge: ``>= 0``; penalty ``ridge * ||W||_F^2`` added to the squared error
        on centred data (static).

    Returns:
      ``()`` in [0, 1] (in-sample).

    Raises:
      ValueError: bad shapes, NaN/Inf, a constant ``y`` (0/0) or a constant
        ``x`` (nothing to regress on), or a negative ridge.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(linear_regression_r2(x, x @ np.ones((3, 2)) + 1.0)), 6)
      1.0
    """
    ridge = float(ridge)
    if not ridge >= 0.0:
        raise ValueError(f"ridge must be >= 0, got {ridge!r}.")
    x, y = V.check_pair(x, y, min_samples=2, why="regression")
    V.check_not_constant(x, "x", what="the regression R^2")
    V.check_not_constant(y, "y", what="the regression R^2")
    return _r2(x, y, ridge)


def regression_layer_stats(*, ridge: float = 0.0) -> LayerStats:
    """Per-layer statistics of :func:`linear_regression_r2`: the SVD of the centred layer.

    A layer contributes the same statistics as predictor and as target, so
    ``pair(layer(x), layer(y)) == linear_regression_r2(x, y, ridge=ridge)``
    and the reverse direction costs nothing extra (``n d + d`` numbers per layer).
    """
    return LayerStats(_layer, functools.partial(_r2_from_layers, ridge=float(ridge)))
