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

``ridge`` is traced (a new value compiles nothing). Scale: each side is
computed divided by the power of two at its largest magnitude; the predictor's
singular values are scaled back for the ridge (in the data's units) and the
shrinkage is formed as ``1 / (1 + ridge / s^2)``, so float32 data at 1e-20 or
1e20 neither overflows nor underflows. Value checks (NaN/Inf, a constant side)
run inside the compiled program; under a user's ``jit``/``vmap``/``grad`` such
input gives NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats
from funsim.similarity._linalg import pow2_scale
from funsim.similarity._linalg import svd as _svd

__all__ = ["linear_regression_r2", "regression_layer_stats"]


def _centred_unit(z):
    c = pow2_scale(z)
    return z / c - jnp.mean(z / c, axis=0, keepdims=True), c


def _layer(z):
    """``(u (n, r), s (r,), centred z / c (n, d))``: what a layer contributes as predictor or target.

    ``s`` are the singular values of the centred ``z`` in its own units; the centred
    data is returned divided by ``c`` (the power of two at ``max |z|``), which the
    R^2 of a target does not depend on.
    """
    zc, c = _centred_unit(z)
    u, s, _ = _svd(zc)
    return u, s * c, zc


@jax.jit
def _r2_program(x, y, ridge):
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    yc, _ = _centred_unit(y)
    out = _r2_from_layers(_layer(x), (None, None, yc), ridge)
    return V.nan_unless(V.flags_ok(fx, fy), out), dict(x=fx, y=fy)


def _r2_from_layers(lx, ly, ridge):
    """``ridge`` may be traced: 0 is least squares (a pseudo-inverse), > 0 shrinks by ``1 / (1 + ridge / s^2)``."""
    (u, s, xc), (_, _, yc) = lx, ly
    tol = max(xc.shape) * jnp.finfo(xc.dtype).eps * s[0]
    t2 = (jnp.sqrt(ridge) / jnp.where(s > 0, s, 1.0)) ** 2
    shrink = jnp.where(s > 0, 1.0 / (1.0 + t2), 0.0)
    f = jnp.where(ridge == 0, (s > tol).astype(xc.dtype), shrink)
    coef = jnp.einsum("nk,ne->ke", u, yc)
    resid = yc - jnp.einsum("nk,k,ke->ne", u, f, coef)
    return 1.0 - jnp.sum(resid * resid) / jnp.sum(yc * yc)


@full_precision
def linear_regression_r2(x: ArrayLike, y: ArrayLike, /, *, ridge: float = 0.0) -> jax.Array:
    """Fraction of ``y``'s variance explained by a linear map from ``x`` (directed).

    Args:
      x: ``(n, d1)``, the predictor.
      y: ``(n, d2)``, the target.
      ridge: ``>= 0``; penalty ``ridge * ||W||_F^2`` added to the squared error
        on centred data (traced: a new value compiles nothing).

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
    x, y = V.check_pair(x, y, min_samples=2, why="regression", finite=False)
    out, flags = _r2_program(x, y, jnp.asarray(ridge, x.dtype))
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, what="the regression R^2")
    return out


def regression_layer_stats(*, ridge: float = 0.0) -> LayerStats:
    """Per-layer statistics of :func:`linear_regression_r2`: the SVD of the centred layer.

    A layer contributes the same statistics as predictor and as target, so
    ``pair(layer(x), layer(y)) == linear_regression_r2(x, y, ridge=ridge)``
    and the reverse direction costs nothing extra (``n d + d`` numbers per layer).
    """
    return LayerStats(_layer, functools.partial(_r2_from_layers, ridge=float(ridge)))
