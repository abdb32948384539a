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
input gives NaN. The compiled core (:func:`regression_core`, :mod:`similarity.protocol`)
takes zero-padded layers: the padding's singular values are set to exactly 0 and the
rank tolerance counts the real width.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import pow2_at, pow2_scale
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats
from funsim.similarity.protocol import Core

__all__ = ["linear_regression_r2", "regression_layer_stats", "regression_core"]


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


def _r2_from_layers(lx, ly, ridge):
    """``ridge`` may be traced: 0 is least squares (a pseudo-inverse), > 0 shrinks by ``1 / (1 + ridge / s^2)``."""
    (u, s, xc), (_, _, yc) = lx, ly
    return _r2(u, s, xc.shape[1], yc, ridge)


def _r2(u, s, d, yc, ridge):
    """R^2 of ``yc`` (n, e) from the predictor's ``u`` (n, r) and singular values ``s`` (r,), ``d``
    its real width (the rank tolerance is numpy's ``max(n, d) eps s_max``); ``s = 0`` marks a
    direction that is not the predictor's (zero padding)."""
    tol = jnp.maximum(u.shape[0], d).astype(yc.dtype) * jnp.finfo(yc.dtype).eps * s[0]
    safe = jnp.where(s > 0, s, 1.0)
    t2 = ridge / safe / safe  # ridge / s^2 without forming s^2 (no overflow); smooth in ridge at 0
    shrink = jnp.where(s > 0, 1.0 / (1.0 + t2), 0.0)
    f = jnp.where(ridge == 0, (s > tol).astype(yc.dtype), shrink)
    coef = jnp.einsum("nk,ne->ke", u, yc)
    resid = yc - jnp.einsum("nk,k,ke->ne", u, f, coef)
    return 1.0 - jnp.sum(resid * resid) / jnp.sum(yc * yc)


class _RegressionLayer(NamedTuple):
    """Per-layer statistics of the regression core (the same as predictor and as target)."""

    u: jax.Array  # (n, r) left singular vectors of the centred layer, r = min(n, W)
    s: jax.Array  # (r,) its singular values in the data's units, 0 beyond the real width
    data: jax.Array  # (n, W) the centred layer divided by its power-of-two scale (the target's part)
    width: jax.Array  # () the real width d
    flags: dict  # V.rep_flags of the layer


def _regression_layer(z, width, opts) -> _RegressionLayer:
    """One layer ``(n, W)`` with ``width`` real features (zero padding beyond; its singular
    values, zero, are the smallest and are set to exactly 0)."""
    del opts
    f = V.rep_flags(z)
    c = pow2_at(f["max_abs"])
    zc = z / c - jnp.mean(z / c, axis=0, keepdims=True)
    u, s, _ = _svd(zc)
    s = jnp.where(jnp.arange(s.shape[0]) < width, s * c, 0.0)
    return _RegressionLayer(u, s, zc, jnp.asarray(width), f)


def _regression_pair(sx: _RegressionLayer, sy: _RegressionLayer, opts):
    """R^2 of ``y`` (target) from ``x`` (predictor): ``(value, flags)``; ``opts = (ridge,)``."""
    (ridge,) = opts
    out = _r2(sx.u, sx.s, sx.width, sy.data, ridge)
    return V.nan_unless(V.flags_ok(sx.flags, sy.flags), out), dict(x=sx.flags, y=sy.flags)


def _regression_reason(flags, shape_x, shape_y, opts) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    del opts
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, 2, "regression")
        if msg is not None:
            return msg
    if flags is None:
        return None
    return V.pair_constant_reason(flags, shape_x, shape_y, what="the regression R^2")


_RIDGE = V.Bound("ridge", 0.0, float("inf"), message="ridge must be >= 0 (and finite), got {value!r}.")


def _check_ridge(ridge):
    return _RIDGE.check(ridge)


def regression_core(*, ridge: float = 0.0) -> Core:
    """The compiled core of :func:`linear_regression_r2` (``ridge`` traced: every ridge shares
    the programs). Directed: ``pair(layer(x), layer(y))`` is the R^2 of ``y`` from ``x``; a
    layer's statistics serve as predictor and as target.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> value, flags = protocol.evaluate(regression_core(), x, x @ np.ones((3, 2)))
      >>> round(float(value), 6), bool(flags["x"]["varies"])
      (1.0, True)
    """
    return Core(_regression_layer, _regression_pair, _regression_reason, (_check_ridge(ridge),), (_RIDGE,))


@full_precision
def linear_regression_r2(x: ArrayLike, y: ArrayLike, /, *, ridge: float = 0.0) -> jax.Array:
    """Fraction of ``y``'s variance explained by a linear map from ``x`` (directed).

    Args:
      x: ``(n, d1)``, the predictor.
      y: ``(n, d2)``, the target.
      ridge: ``>= 0``; penalty ``ridge * ||W||_F^2`` added to the squared error
        on centred data (traced: a new value compiles nothing; ``jit``, ``vmap``
        and ``grad`` over it work).

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
    core = regression_core(ridge=ridge)
    x, y = V.check_pair(x, y, min_samples=2, why="regression", finite=False)
    return protocol.call(core, x, y)


def regression_layer_stats(*, ridge: float = 0.0) -> LayerStats:
    """Per-layer statistics of :func:`linear_regression_r2`: the SVD of the centred layer.

    A layer contributes the same statistics as predictor and as target, so
    ``pair(layer(x), layer(y)) == linear_regression_r2(x, y, ridge=ridge)``
    and the reverse direction costs nothing extra (``n d + d`` numbers per layer).
    """
    return LayerStats(_layer, functools.partial(_r2_from_layers, ridge=float(ridge)))
