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

Compiled cores (:mod:`similarity.protocol`): :func:`shape_core`, :func:`nbs_core` and
:func:`procrustes_core` take zero-padded layers with their real width traced. A padded
layer is whitened in its real directions only (the padding's singular values are the
smallest: zero), its variance-preserving sums count its real width, and the pair pads
to the common *real* width ``max(d1, d2)``, so the values are those of the unpadded layers.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import arccos_unit, pow2_at, pow2_scale, sqrt_floor
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats, MomentPair, MomentStats
from funsim.similarity.protocol import Core

__all__ = ["SHAPE_DISTANCES", "shape_distance", "nbs", "procrustes_distance", "partial_whiten",
           "shape_layer_stats", "shape_moment_stats", "nbs_moment_stats", "procrustes_moment_stats",
           "shape_core", "nbs_core", "procrustes_core"]

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
    for a side zero-padded by ``pad`` columns (see :func:`_scale`). Sums run over the
    side's ``width`` real features only: a side that is itself zero-padded (a layer of a
    padded stack) gives the statistics of the unpadded one.
    """

    data: jax.Array  # (n, W) Xc V diag(alpha + (1 - alpha) lam^-1/2) V^T / factor, max |entry| in [1, 2)
    factor: jax.Array  # ()
    total: jax.Array  # () sum of the clipped eigenvalues of (x / c)'s covariance, every real direction
    gain: jax.Array  # () sum of h^2 / H^2, h = alpha sqrt(lam) + 1 - alpha (data units), H a power of two
    c_over_h: jax.Array  # () c / H
    floor: jax.Array  # () netrep's eigenvalue floor in the units of x / c
    h_floor: jax.Array  # () h of a floored eigenvalue, / H
    s_ratio: jax.Array  # () smallest / largest singular value of the centred side (1 without whitening)
    width: jax.Array  # () the number of real features d (the rest of the W columns are zero padding)


_MIN_UNIT = 2.0**-12  # below sqrt(1e-7) every eigenvalue is floored anyway: no need to scale tiny data up


def _whiten_layer(x: jax.Array, alpha, whiten: bool | None = None, width=None, max_abs=None) -> _Whitened:
    """Partial whitening of one side (netrep's, before its variance-preserving scale).

    ``alpha`` may be traced; ``whiten`` (static) says whether ``alpha`` whitens at
    all (default: from a concrete ``alpha``). The eigen-directions come from the SVD
    of the centred data (``Xc^T Xc = V diag(s^2) V^T``), which is more accurate than
    an eigendecomposition of the covariance and gives the rank check its singular values.

    ``width`` (may be traced; default all ``W`` columns): only the first ``width``
    columns of ``x`` are real, the others zero. Their singular values are the smallest
    (zero), so the real directions are the first ``width``: only those are whitened and
    counted, and the rank check reads the ``width``-th singular value.
    ``max_abs``: ``max |x|`` if already known (the value checks' pass).
    """
    if whiten is None:
        whiten = _whitens(float(alpha))
    n, big_w = x.shape
    dt = x.dtype
    one = jnp.ones((), dt)
    wd = jnp.asarray(big_w if width is None else width)
    c = pow2_scale(x) if max_abs is None else pow2_at(max_abs)
    if not whiten:
        return _Whitened(_centre(x / c), c, one, one, one, one, one, one, wd.astype(dt))
    c = jnp.maximum(c, _MIN_UNIT)
    zc = _centre(x / c)  # exact: a power of two
    u, s, vt = _svd(zc)
    r = s.shape[0]
    real = jnp.arange(r) < wd  # the real directions (all of them when unpadded)
    floor = EIGVAL_FLOOR / c / c  # netrep's absolute floor, in the units of x / c
    lam = jnp.maximum(s * s, floor)
    root = jnp.sqrt(jnp.maximum(lam, jnp.finfo(dt).tiny))
    g = alpha * c + (1.0 - alpha) / root  # c * (alpha + (1 - alpha) lam_x^-1/2), lam_x = c^2 lam
    data = jnp.einsum("nr,r,rd->nd", u, jnp.where(real, s * g, 0.0), vt)
    if width is not None:  # rounding in the padded columns of vt: exactly zero there
        data = jnp.where(protocol.feature_mask(wd, big_w, dt)[None, :] > 0, data, 0.0)
    p = pow2_scale(data)
    h = jnp.where(real, alpha * c * root + (1.0 - alpha), 0.0)  # sqrt of netrep's gain of each direction
    big_h = pow2_scale(h)
    h_floor = (alpha * EIGVAL_FLOOR**0.5 + (1.0 - alpha)) / big_h
    null = jnp.maximum(wd - r, 0).astype(dt)  # real directions beyond the rank (d > n): eigenvalue 0, floored
    ratio = jnp.where(wd <= r, s[jnp.clip(wd - 1, 0, r - 1)] / s[0], jnp.zeros((), dt))
    total = jnp.sum(jnp.where(real, lam, 0.0)) + null * floor
    gain = jnp.sum((h / big_h) ** 2) + null * h_floor**2
    return _Whitened(data / p, p, total, gain, c / big_h, floor, h_floor, ratio, wd.astype(dt))


def _scale(w: _Whitened, alpha, width, whiten: bool | None = None) -> jax.Array:
    """netrep's variance-preserving scale ``c_var`` of a side zero-padded to ``width`` columns
    (``width`` >= the side's real width; may be traced)."""
    if not (_whitens(float(alpha)) if whiten is None else whiten):
        return jnp.ones((), w.data.dtype)
    pad = width - w.width
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


def _nuclear(a: jax.Array, b: jax.Array, rank=None) -> jax.Array:
    """``||a^T b||_*`` for ``a``: (n, d1), ``b``: (n, d2); with ``rank`` (may be traced), the sum of
    the ``rank`` largest singular values only (the others are those of zero padding: 0 up to rounding)."""
    s = _svd(jnp.einsum("ni,nj->ij", a, b), compute_uv=False)
    if rank is not None:
        s = jnp.where(jnp.arange(s.shape[0]) < rank, s, 0.0)
    return jnp.sum(s)


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
    width = jnp.maximum(wx.width, wy.width)  # netrep pads the narrower side to the common real width
    nx2, ny2 = jnp.sum(wx.data**2), jnp.sum(wy.data**2)
    cos = _nuclear(wx.data, wy.data, jnp.minimum(wx.width, wy.width)) / jnp.sqrt(nx2 * ny2)
    if distance == "angular":
        return arccos_unit(cos)
    a = _scale(wx, alpha, width, whiten) * wx.factor * jnp.sqrt(nx2)  # ||X~||
    b = _scale(wy, alpha, width, whiten) * wy.factor * jnp.sqrt(ny2)
    m = jax.lax.stop_gradient(jnp.maximum(a, b))
    return m * _distance((a / m) ** 2, (b / m) ** 2, (a / m) * (b / m) * cos, distance)


_SHAPE_WHAT = "the shape distance"


class _ShapeLayer(NamedTuple):
    """Per-layer statistics of the shape, NBS and Procrustes cores."""

    w: _Whitened
    rank: jax.Array  # () bool: the centred layer has full column rank (always True without whitening)
    flags: dict  # V.rep_flags of the layer


def _shape_layer(z, width, opts, *, whiten: bool) -> _ShapeLayer:
    """One layer ``(n, W)`` with ``width`` real features (zero padding beyond); ``opts = (alpha,)``
    when whitening (unread otherwise: NBS and Procrustes share this layer with ``opts = ()``)."""
    f = V.rep_flags(z)
    w = _whiten_layer(z, opts[0] if whiten else 1.0, whiten, width, f["max_abs"])
    n = z.shape[0]
    tol = jnp.maximum(n, width).astype(z.dtype) * 10.0 * jnp.finfo(z.dtype).eps
    return _ShapeLayer(w, w.s_ratio > tol if whiten else jnp.ones((), bool), f)


def _shape_core_pair(sx: _ShapeLayer, sy: _ShapeLayer, opts, *, whiten: bool, distance: str):
    """The shape distance of two layers' statistics and its value checks: ``(value, flags)``."""
    alpha = opts[0] if whiten else 1.0
    flags = dict(x=sx.flags, y=sy.flags, rank_x=sx.rank, rank_y=sy.rank)
    ok = V.flags_ok(sx.flags, sy.flags) & sx.rank & sy.rank
    return V.nan_unless(ok, _shape_pair(sx.w, sy.w, alpha, distance, whiten)), flags


def _shape_reason(flags, shape_x, shape_y, opts, *, whiten: bool, distance: str) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    del opts, distance
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, 2, "a shape metric")
        if msg is not None:
            return msg
    if whiten:
        for name, shape in (("x", shape_x), ("y", shape_y)):
            if shape[1] >= shape[0]:
                return (f"{name} has shape {tuple(shape)}: partial whitening (alpha < 1) needs a full-rank "
                        "covariance, so d < n. Use alpha=1, reduce the features (e.g. PCA), or add samples.")
    if flags is None:
        return None
    msg = V.pair_constant_reason(flags, shape_x, shape_y, what=_SHAPE_WHAT)
    if msg is not None or not whiten:  # without whitening only "x" and "y" are read (the grid's moment flags)
        return msg
    for name, shape in (("x", shape_x), ("y", shape_y)):
        if not flags[f"rank_{name}"]:
            return (f"{name} of shape {tuple(shape)} has a singular covariance (duplicated or "
                    "collinear features), so partial whitening with alpha < 1 divides by zero. "
                    "Remove redundant features or use alpha=1.")
    return None


@functools.lru_cache(maxsize=None)
def _shape_layer_fn(whiten: bool):
    """The layer function (one object per ``whiten``; NBS and Procrustes share the unwhitened one)."""
    return functools.partial(_shape_layer, whiten=whiten)


@functools.lru_cache(maxsize=None)
def _shape_parts(whiten: bool, distance: str) -> tuple:
    """The core's three functions for one set of static options (one object each: shared programs)."""
    kw = dict(whiten=whiten, distance=distance)
    return (_shape_layer_fn(whiten), functools.partial(_shape_core_pair, **kw), functools.partial(_shape_reason, **kw))


_ALPHA = V.Bound("alpha", 0.0, 1.0, message="alpha must be in [0, 1] (1 = Procrustes, 0 = CCA-like), got {value!r}.")


def _check_alpha(alpha):
    """A concrete ``alpha`` as a float (``ValueError`` outside [0, 1]), a traced one as it is."""
    return _ALPHA.check(alpha)


def shape_core(*, alpha: float = 1.0, distance: str = "angular") -> Core:
    """The compiled core of :func:`shape_distance` (:class:`similarity.protocol.Core`).

    ``alpha`` is traced (``opts``): every ``alpha`` that whitens (netrep: ``alpha <= 1 - 1e-7``)
    shares the compiled programs of one ``distance``. A layer's statistics are its whitened
    data ``(n, W)`` and the sums behind netrep's variance-preserving scale, counted over its
    real width; the pair applies the scale for the pair's common real width ``max(d1, d2)``.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> value, flags = protocol.evaluate(shape_core(alpha=0.5), x, -x)
      >>> abs(float(value)) < 1e-6, bool(flags["rank_x"])
      (True, True)
    """
    V.check_choice(distance, "distance", SHAPE_DISTANCES)
    alpha = _check_alpha(alpha)
    # a traced alpha gets the whitening program for every value (it cannot pick a program)
    whiten = True if V.is_traced(alpha) else _whitens(alpha)
    return Core(*_shape_parts(whiten, distance), (alpha,), (_ALPHA,))


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
        compiles nothing): 1 = Procrustes, 0 = CCA-like. ``jit``, ``vmap`` and
        ``grad`` over ``alpha`` work; a traced ``alpha`` always takes the whitening
        program, so it needs ``d < n`` and full-rank sides even where its value is 1.
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
    core = shape_core(alpha=alpha, distance=distance)
    x, y = V.check_pair(x, y, min_samples=2, why="a shape metric", finite=False)
    return protocol.call(core, x, y)


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


def _nbs_pair(sx: _ShapeLayer, sy: _ShapeLayer, opts, *, procrustes: bool):
    """NBS (or Ding et al.'s ``2 - 2 NBS``) of two unwhitened layers: ``(value, flags)``."""
    del opts
    w, v = sx.w, sy.w
    cos = _nuclear(w.data, v.data, jnp.minimum(w.width, v.width)) / jnp.sqrt(jnp.sum(w.data**2) * jnp.sum(v.data**2))
    ok = V.flags_ok(sx.flags, sy.flags)
    return V.nan_unless(ok, 2.0 - 2.0 * cos if procrustes else cos), dict(x=sx.flags, y=sy.flags)


def _nbs_reason(flags, shape_x, shape_y, opts) -> str | None:
    """The pairwise call's message (NBS and Procrustes raise the same ones)."""
    del opts
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, 2, "NBS")
        if msg is not None:
            return msg
    if flags is None:
        return None
    return V.pair_constant_reason(flags, shape_x, shape_y, what="NBS")


_NBS_PARTS = (_shape_layer_fn(False), functools.partial(_nbs_pair, procrustes=False), _nbs_reason)
_PROCRUSTES_PARTS = (_shape_layer_fn(False), functools.partial(_nbs_pair, procrustes=True), _nbs_reason)


def nbs_core() -> Core:
    """The compiled core of :func:`nbs` (its layer is the unwhitened shape metrics' layer).

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> value, flags = protocol.evaluate(nbs_core(), x, -2 * x)
      >>> round(float(value), 6), bool(flags["y"]["varies"])
      (1.0, True)
    """
    return Core(*_NBS_PARTS)


def procrustes_core() -> Core:
    """The compiled core of :func:`procrustes_distance` (``2 - 2 NBS``; NBS's messages)."""
    return Core(*_PROCRUSTES_PARTS)


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
    x, y = V.check_pair(x, y, min_samples=2, why="NBS", finite=False)
    return protocol.call(nbs_core(), x, y)


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
    x, y = V.check_pair(x, y, min_samples=2, why="NBS", finite=False)
    return protocol.call(procrustes_core(), x, y)


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
