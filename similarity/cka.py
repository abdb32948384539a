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

The kernels, the HSIC estimators and the linear statistics live in
:mod:`similarity._hsic` and are re-exported here; this module holds CKA itself
(its compiled core, per-layer and moment statistics) and minibatch CKA.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._hsic import (
    CONSTANT_CAUSE,
    KERNELS,
    METHODS,
    RBF_SCALE_WHY,
    LinearStats,
    centre_features,
    centre_gram,
    centred_stats,
    cross_sq,
    hsic,
    hsic_from_terms,
    hsic_gram,
    linear_cka_from_moments,
    linear_cka_from_stats,
    linear_gram,
    linear_hsic_cross,
    linear_stats,
    rbf_bound,
    rbf_gram,
    rbf_gram_and_median,
)
from funsim.similarity._linalg import pow2_at
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


# ------------------------------------------------------------------ CKA's per-layer statistics


def _linear_cka_finish(ctx: MomentPair) -> jax.Array:
    """:func:`linear_cka_from_moments` with the grams' norms read from the moments (formed once per layer)."""
    c = ctx.cross
    return jnp.sum(c * c) / (ctx.x.gram_norm * ctx.y.gram_norm)


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
        k, _ = rbf_gram_and_median(x, rbf_scale)
        return k, hsic_gram(k, k, debiased)

    def pair(sx, sy):
        (k, hk), (l, hl) = sx, sy
        return hsic_gram(k, l, debiased) / jnp.sqrt(hk * hl)

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
        c = cross_sq(zc, zc, _method(method, z.shape[1], n))
        self_hsic = hsic_from_terms(c, kz, kz, n, True) if debiased else c  # biased: 1 / (n - 1)^2 cancels
        return _CKALayer(zc, kz, self_hsic, jnp.ones((), z.dtype), f)
    (rbf_scale,) = opts
    k, med = rbf_gram_and_median(z, rbf_scale, width)
    return _CKALayer(k, jnp.zeros((), z.dtype), hsic_gram(k, k, debiased), med, f)


def _method(method: str, width: int, n: int) -> str:
    if method == "auto":
        return "features" if width <= n else "gram"
    return method


def _cka_pair(sx: _CKALayer, sy: _CKALayer, opts, *, kernel: str, debiased: bool, method: str):
    """CKA of two layers' statistics and its value checks: ``(value, flags)``."""
    del opts
    n = sx.data.shape[0]
    if kernel == "linear":
        c = cross_sq(sx.data, sy.data, _method(method, max(sx.data.shape[1], sy.data.shape[1]), n))
        xy = hsic_from_terms(c, sx.row_sq, sy.row_sq, n, True) if debiased else c
    else:
        xy = hsic_gram(sx.data, sy.data, debiased)
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
            return f"{what} = {flags[key]!r} is not positive: {CONSTANT_CAUSE}"
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
    rbf_scale = rbf_bound().check(rbf_scale)
    layer, pair, reason = _cka_parts(kernel, V.check_bool(debiased, "debiased"), method)
    return Core(layer, pair, reason, (rbf_scale,), (rbf_bound(),))


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
    rbf_scale = V.check_option_positive(rbf_scale, "rbf_scale", why=RBF_SCALE_WHY)
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
    sx = centred_stats(xb - jnp.mean(xb, axis=0, keepdims=True), debiased)
    sy = centred_stats(yb - jnp.mean(yb, axis=0, keepdims=True), debiased)
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
    V.check_positive_result(state.xx, "the summed HSIC(x_b, x_b)", CONSTANT_CAUSE)
    V.check_positive_result(state.yy, "the summed HSIC(y_b, y_b)", CONSTANT_CAUSE)
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
