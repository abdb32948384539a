"""Stitchers: maps from a source representation to a target one (docs/design.md §3).

Families, nested: ``orthogonal`` ⊂ ``scaled_orthogonal`` ⊂ ``affine``.

Conventions used throughout this module:

* **Scale-free fits.** Every closed-form fit first centres each side and divides
  it by its Frobenius norm (train rows only), fits the family on these
  normalised matrices ``U = (Z1 - mu1)/||Z1c||`` and ``V = (Z2 - mu2)/||Z2c||``,
  then folds the centring and the two norms back into the returned
  :class:`Stitcher`, so that ``apply_stitcher(fit_stitcher(z1, z2), z1)``
  predicts the *raw* ``z2``. For ``affine`` and ``scaled_orthogonal`` this
  equals the least-squares fit on the raw (centred) data. For ``orthogonal`` it
  means the fitted stitcher is ``Q`` times the fixed ratio ``||Z2c||/||Z1c||``
  (a ratio of the data's norms, not a fitted parameter), stored in ``scale``;
  pass ``normalise=False`` for the raw-space orthogonal fit with ``scale == 1``.
* **Widths.** The orthogonal families zero-pad the narrower side to the common
  width ``D = max(d1, d2)`` and fit a square orthogonal ``Q`` (``D x D``) from
  the SVD of the padded cross-covariance (the netrep convention), so the
  closed form is exact for any widths. ``Stitcher.weight`` is the
  ``(d1, d2)`` block ``Q[:d1, :d2]``, which is semi-orthogonal. We never use
  ``U V^T`` of the rectangular cross-covariance as the solution of the
  *unbalanced* Procrustes problem (semi-orthogonal ``Q`` with ``d1 > d2``):
  it is not its solution.
* **Scores in the padded space.** The reconstruction score of an orthogonal
  family counts the error on the padded coordinates when ``d1 > d2``; this is
  what makes the in-sample identities exact: ``scaled_orthogonal`` scores
  ``NBS^2`` and ``orthogonal`` scores ``2 NBS - 1`` with
  ``NBS = ||Z1c^T Z2c||_* / (||Z1c|| ||Z2c||)``; ``affine`` scores the
  regression ``R^2``.
* **Held-out scores.** ``reconstruction_score`` fits on a train split and
  scores ``1 - SSE / SST`` on the held-out split, where the prediction uses only
  train statistics (means, norms, the fitted map) and ``SST`` is the held-out
  target's variance around its own mean (the usual out-of-sample ``R^2``).

* **Scale.** Each side is divided by the power of two at its largest magnitude
  before any product is formed (exact), and its norm is carried separately, so
  float32 data at 1e-20 or 1e20 neither overflows nor underflows.
* **Traced options.** ``ridge`` is data in every compiled program: a new value
  compiles nothing.
* **Value checks** (NaN/Inf, constant sides, a non-finite result) run inside
  the compiled program and raise after it returns; under a user's
  ``jit``/``vmap``/``grad`` such input gives NaN. A held-out score also counts
  the held-out rows that repeat a train row exactly (duplicated inputs) and
  warns (:class:`HeldOutOverlapWarning`): such rows make the held-out score
  partly in-sample.

Everything is written in terms of per-layer and per-pair second moments
(:func:`layer_moments`, :func:`pair_moments`) so that the comparison grid
(:mod:`similarity.grid`) can compute each layer's statistics once, stream
samples in chunks, and still agree with the pairwise functions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._linalg import pow2_scale, shared_rows
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerMoments, MomentPair, MomentStats, PairMoments, split_weights

FAMILIES = ("orthogonal", "scaled_orthogonal", "affine")


class HeldOutOverlapWarning(UserWarning):
    """Held-out rows that repeat a train row exactly: the held-out score is partly in-sample."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stitcher:
    """A fitted stitcher ``g(z) = scale * (z @ weight) + bias``, acting on raw activations.

    Attributes:
      weight: ``(d_src, d_tgt)``. For the orthogonal families this is the
        ``(d_src, d_tgt)`` block of a square orthogonal matrix on the
        zero-padded space (the netrep convention), or a semi-orthogonal matrix
        when trained with the task loss.
      bias: ``(d_tgt,)``.
      scale: ``()``. For ``scaled_orthogonal`` the fitted isotropic scale (in
        raw units). For ``orthogonal`` fitted by :func:`fit_stitcher` it is the
        fixed norm ratio ``||Z_tgt,c|| / ||Z_src,c||`` (exactly 1 with
        ``normalise=False``). For ``affine`` it is 1 and the scale lives in
        ``weight``.
      family: static; one of ``FAMILIES``.
    """

    weight: jax.Array
    bias: jax.Array
    scale: jax.Array
    family: str = dataclasses.field(default="affine", metadata=dict(static=True))


@full_precision
def apply_stitcher(stitcher: Stitcher, z: ArrayLike, /) -> jax.Array:
    """Apply a stitcher to a batch.

    Args:
      stitcher: a :class:`Stitcher`.
      z: ``(n, d_src)``.

    Returns:
      ``(n, d_tgt)``.
    """
    z = V.as_float_array(z, "z")
    return stitcher.scale * jnp.einsum("ns,st->nt", z, stitcher.weight) + stitcher.bias[None, :]


class ReconstructionScore(NamedTuple):
    """A directed reconstruction score and its in-sample (leaky) counterpart.

    Attributes:
      held_out: ``()`` score on the held-out split (the estimate to report).
      in_sample: ``()`` score on the train split the map was fitted on.
    """

    held_out: jax.Array
    in_sample: jax.Array


class StitchingAsymmetry(NamedTuple):
    """Both directions of a reconstruction score and their difference.

    Attributes:
      forward: score of ``z_a -> z_b``.
      backward: score of ``z_b -> z_a``.
      difference: ``forward - backward`` (field by field).
    """

    forward: ReconstructionScore
    backward: ReconstructionScore
    difference: ReconstructionScore


# ----------------------------------------------------------------------------- moments


def _weighted_mean(z: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("n,nd->d", w, z) / jnp.sum(w)


def layer_moments(
    z: jax.Array, w_train: jax.Array, w_test: jax.Array, /, *, normalise: bool = True, **old_spelling
) -> LayerMoments:
    """Moments of one layer given 0/1 row weights for the train and test rows.

    Args:
      z: ``(n, d)``.
      w_train: ``(n,)`` 1.0 for train rows, else 0.0.
      w_test: ``(n,)`` 1.0 for test rows, else 0.0.
      normalise: divide by the train Frobenius norm (``normalize=``, the old spelling, is
        accepted with a ``DeprecationWarning``).

    Returns:
      A :class:`LayerMoments`.
    """
    normalise = _normalise_option(normalise, old_spelling, "layer_moments")
    c = pow2_scale(z)  # exact; the moments of z / c cannot overflow
    mean = _weighted_mean(z / c, w_train)
    zc = z / c - mean[None, :]
    g_tr = jnp.einsum("n,ni,nj->ij", w_train, zc, zc)
    norm = jnp.sqrt(jnp.trace(g_tr)) if normalise else 1.0 / c
    u = zc / norm
    return LayerMoments(
        mean=mean * c,
        norm=norm * c,
        gram_train=g_tr / norm**2,
        gram_test=jnp.einsum("n,ni,nj->ij", w_test, u, u),
        sum_test=jnp.einsum("n,ni->i", w_test, u),
        n_test=jnp.sum(w_test),
    )


def pair_moments(
    z_src: jax.Array,
    z_tgt: jax.Array,
    m_src: LayerMoments,
    m_tgt: LayerMoments,
    w_train: jax.Array,
    w_test: jax.Array,
    /,
) -> PairMoments:
    """Cross moments ``sum u v^T`` of a pair, over train and test rows.

    Args:
      z_src: ``(n, d1)``; z_tgt: ``(n, d2)``; m_src, m_tgt: their moments.
      w_train, w_test: ``(n,)`` row weights.

    Returns:
      :class:`PairMoments` with ``(d1, d2)`` arrays.
    """
    u = (z_src - m_src.mean[None, :]) / m_src.norm
    v = (z_tgt - m_tgt.mean[None, :]) / m_tgt.norm
    return PairMoments(
        cross_train=jnp.einsum("n,ni,nj->ij", w_train, u, v),
        cross_test=jnp.einsum("n,ni,nj->ij", w_test, u, v),
    )


# ----------------------------------------------------------------------------- fits


def affine_system(gram: jax.Array, *, ridge: float, mask: jax.Array | None = None) -> jax.Array:
    """Cholesky factor of the (ridge-regularised) normal equations ``G + ridge I``.

    Args:
      gram: ``(d, d)`` ``U^T U`` of the normalised source.
      ridge: non-negative ridge, in units of the normalised problem.
      mask: ``(d,)`` 1 for real features, 0 for zero-padded ones (padded
        coordinates get a unit diagonal so the system stays definite; their
        weights come out exactly 0).

    Returns:
      ``(d, d)`` lower Cholesky factor.
    """
    d = gram.shape[0]
    mask = jnp.ones((d,), gram.dtype) if mask is None else mask.astype(gram.dtype)
    a = gram + jnp.diag(ridge * mask + (1.0 - mask))
    return jnp.linalg.cholesky(a)


def fit_from_moments(
    gram_train: jax.Array,
    cross_train: jax.Array,
    /,
    *,
    family: str,
    chol: jax.Array | None = None,
    ridge: float = 0.0,
    mask_src: jax.Array | None = None,
    svd: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Closed-form fit of ``V ≈ s * pad(U) Q`` (or ``U W``) from moments.

    Args:
      gram_train: ``(d1, d1)`` ``U^T U`` (the orthogonal families accept its
        trace ``()`` instead).
      cross_train: ``(d1, d2)`` ``U^T V``.
      family: one of ``FAMILIES``.
      chol: optional precomputed :func:`affine_system` factor (reused by the grid).
      ridge: ridge for ``affine``.
      mask_src: ``(d1,)`` real-feature mask for zero-padded sources.
      svd: optional precomputed thin SVD ``(u, s, vt)`` of ``cross_train``
        (the orthogonal families; the grid shares it between measures).

    Returns:
      ``(W, s)``: ``W`` is ``(d1, d2)`` (the block ``Q[:d1, :d2]`` for the
      orthogonal families), ``s`` the isotropic scale (1 for ``affine`` and
      ``orthogonal``).
    """
    dt = cross_train.dtype
    if family == "affine":
        if chol is None:
            chol = affine_system(gram_train, ridge=ridge, mask=mask_src)
        w = jax.scipy.linalg.cho_solve((chol, True), cross_train)
        return w, jnp.ones((), dt)
    # The (d1, d2) block of the square Procrustes solution on the zero-padded
    # space is U V^T from the *thin* SVD U S V^T of the (d1, d2) cross-covariance
    # (the padded rows/columns only add null directions that the block never
    # sees), so no D x D SVD is needed. It is exact for the padded problem; it
    # is not the solution of the unbalanced problem with a semi-orthogonal map.
    u, sv, vt = _svd(cross_train) if svd is None else svd
    w = jnp.einsum("ik,kj->ij", u, vt)
    if family == "scaled_orthogonal":
        # s = <V, U Q> / ||pad(U) Q||^2 and ||pad(U) Q|| = ||U||.
        sq = jnp.trace(gram_train) if gram_train.ndim == 2 else gram_train
        return w, jnp.sum(sv) / sq
    return w, jnp.ones((), dt)


def _sse(
    w: jax.Array, s: jax.Array, gram: jax.Array, cross: jax.Array, vv: jax.Array, family: str
) -> jax.Array:
    """``||V_p - s pad(U) Q||^2`` (orthogonal, padded) or ``||V - U W||^2`` from moments."""
    lin = jnp.einsum("ij,ij->", w, cross)
    if family == "affine":
        quad = jnp.einsum("ij,ik,kj->", w, gram, w)
    else:  # padded space: ||pad(U) Q||^2 = ||U||^2
        quad = jnp.trace(gram)
    return vv - 2.0 * s * lin + s**2 * quad


def score_from_moments(
    m_src: LayerMoments,
    m_tgt: LayerMoments,
    pm: PairMoments,
    /,
    *,
    family: str,
    ridge: float = 0.0,
    chol: jax.Array | None = None,
    mask_src: jax.Array | None = None,
    svd: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> ReconstructionScore:
    """Held-out and in-sample reconstruction scores from precomputed moments.

    ``chol`` (affine) and ``svd`` (orthogonal families) are optional
    precomputed factors, see :func:`fit_from_moments`.
    """
    w, s = fit_from_moments(
        m_src.gram_train, pm.cross_train, family=family, chol=chol, ridge=ridge, mask_src=mask_src,
        svd=svd,
    )
    vv_tr = jnp.trace(m_tgt.gram_train)  # the target is exactly centred on train rows
    in_sample = 1.0 - _sse(w, s, m_src.gram_train, pm.cross_train, vv_tr, family) / vv_tr
    vv_te = jnp.trace(m_tgt.gram_test)
    sst_te = vv_te - jnp.sum(m_tgt.sum_test**2) / m_tgt.n_test
    held_out = 1.0 - _sse(w, s, m_src.gram_test, pm.cross_test, vv_te, family) / sst_te
    return ReconstructionScore(held_out=held_out, in_sample=in_sample)


# ----------------------------------------------------------------------------- validation


def check_ridge(ridge: float, /, *, name: str = "ridge") -> float:
    """Validate a ridge (a non-negative, finite Python or NumPy number) and return it as a float.

    Examples:
      >>> check_ridge(1e-3)
      0.001
      >>> check_ridge(-1.0)
      Traceback (most recent call last):
      ...
      ValueError: ridge must be a non-negative finite float, got -1.0.
    """
    if isinstance(ridge, (bool, np.bool_)) or not isinstance(ridge, (int, float, np.integer, np.floating)) \
            or not 0 <= ridge < math.inf:
        raise ValueError(f"{name} must be a non-negative finite float, got {ridge!r}.")
    return float(ridge)


def _check_options(family: str, ridge: float) -> None:
    V.check_choice(family, "family", FAMILIES)
    check_ridge(ridge)


def _check_fit_rows(n_fit: int, d_src: int, family: str, ridge: float, where: str) -> None:
    """One minimum-rows rule for every family: more fitting rows than source features.

    With ``n_fit - 1 < d_src`` the centred fitting rows span fewer than ``d_src``
    source directions, so no family's fit is determined on the rest: the affine
    normal equations are singular, and an orthogonal ``Q`` is arbitrary there (any
    completion of the SVD is optimal), so held-out predictions, which do have
    components in those directions, would depend on that arbitrary choice. Only
    the affine family has a regulariser that removes the ambiguity (``ridge > 0``).
    """
    if n_fit - 1 < d_src and not (family == "affine" and ridge > 0):
        fix = "pass ridge > 0 (affine only, e.g. ridge=1e-3), " if family == "affine" else ""
        raise ValueError(
            f"A stitcher fit needs more fitting rows than source features: {where} has {n_fit} "
            f"rows (n - 1 = {n_fit - 1} after centring) but z_src has {d_src} features, so the "
            f"{family} fit is not determined on the source directions those rows do not span "
            "(singular normal equations; an arbitrary rotation there). Use more samples, "
            f"{fix}or reduce the width."
        )


def _raise_not_finite(what: str) -> None:
    raise ValueError(
        f"{what} is not finite: the normal equations are numerically singular "
        "(collinear features, or float32 with an ill-conditioned source). Pass ridge > 0 "
        "or use float64."
    )


def _check_finite_result(x: jax.Array, what: str) -> None:
    if V.is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        _raise_not_finite(what)


# ----------------------------------------------------------------------------- public API


def _normalise_option(normalise, old_spelling: dict, fn: str) -> bool:
    """The ``normalise`` option, also accepted under its old spelling ``normalize=`` (deprecated)."""
    unknown = set(old_spelling) - {"normalize"}
    if unknown:
        raise TypeError(f"{fn}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if "normalize" not in old_spelling:
        return V.check_bool(normalise, "normalise")
    V.warn_at_caller("normalize= is deprecated: use normalise= (the same option).", DeprecationWarning)
    return V.check_bool(old_spelling["normalize"], "normalize")


def _fit_impl(x, y, mask_src, *, family, ridge, normalize):
    cx, cy = pow2_scale(x), pow2_scale(y)  # exact; the sums of squares of x / c cannot overflow
    mx, my = jnp.mean(x / cx, axis=0), jnp.mean(y / cy, axis=0)
    xc, yc = x / cx - mx[None, :], y / cy - my[None, :]
    one = jnp.ones((), x.dtype)
    nx = jnp.sqrt(jnp.sum(xc * xc)) if normalize else 1.0 / cx
    ny = jnp.sqrt(jnp.sum(yc * yc)) if normalize else 1.0 / cy
    u, v = xc / nx, yc / ny
    mx, my, nx, ny = mx * cx, my * cy, nx * cx, ny * cy
    # the orthogonal families only need tr(U^T U), not the Gram matrix
    gram = jnp.einsum("ni,nj->ij", u, u) if family == "affine" else jnp.sum(u * u)
    cross = jnp.einsum("ni,nj->ij", u, v)
    w, s = fit_from_moments(gram, cross, family=family, ridge=ridge, mask_src=mask_src)
    ratio = ny / nx
    if family == "affine":
        weight, scale = w * ratio, one
    else:
        weight, scale = w, s * ratio
    bias = my - scale * jnp.einsum("s,st->t", mx, weight)
    return weight, bias, scale


@functools.partial(jax.jit, static_argnames=("family", "normalize"))
def _fit_program(x, y, ridge, *, family, normalize):
    """One closed-form fit and its value checks: ``((weight, bias, scale), flags)``; ``ridge`` traced."""
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    out = _fit_impl(x, y, None, family=family, ridge=ridge, normalize=normalize)
    flags = dict(x=fx, y=fy, result=jnp.all(jnp.isfinite(out[0])))
    return V.nan_unless(V.flags_ok(fx, fy), out), flags


@full_precision
def fit_stitcher(
    z_src: ArrayLike,
    z_tgt: ArrayLike,
    /,
    *,
    family: str = "affine",
    ridge: float = 0.0,
    normalise: bool = True,
    **old_spelling,
) -> Stitcher:
    """Fit a stitcher ``z_src -> z_tgt`` in closed form (least squares within the family).

    The fit is scale-free: each side is centred and divided by its Frobenius
    norm, the family is fitted on those, and the centring and norms are folded
    back, so the returned stitcher acts on **raw** activations:
    ``apply_stitcher(s, z_src) ≈ z_tgt``.

    * ``affine``: ``W`` from the Cholesky factor of the normal equations
      ``(U^T U + ridge I) W = U^T V`` (ridge in units of the normalised problem,
      where ``tr(U^T U) = 1``).
    * ``orthogonal``: Procrustes; ``Q = A B^T`` from the SVD ``A S B^T`` of the
      cross-covariance zero-padded to the square width ``max(d_src, d_tgt)``;
      ``weight = Q[:d_src, :d_tgt]``; ``scale`` is the fixed norm ratio
      ``||Z_tgt,c||/||Z_src,c||`` (1 with ``normalise=False``).
    * ``scaled_orthogonal``: the same ``Q`` and the optimal isotropic scale.

    When ``d_src > d_tgt`` the orthogonal stitcher outputs the first ``d_tgt``
    coordinates of ``pad(z) Q``; it is the optimum in the padded space, not
    the solution of the unbalanced Procrustes problem.

    Args:
      z_src: ``(n, d_src)`` source activations.
      z_tgt: ``(n, d_tgt)`` target activations (same samples, same order).
      family: ``"affine"``, ``"scaled_orthogonal"`` or ``"orthogonal"``.
      ridge: ridge for ``affine`` (ignored by the orthogonal families).
      normalise: fit on Frobenius-normalised data (default). Only changes the
        ``orthogonal`` family (its scale) and the units of ``ridge``.

    Returns:
      A :class:`Stitcher` with ``weight (d_src, d_tgt)``, ``bias (d_tgt,)``, ``scale ()``.

    Raises:
      ValueError: unknown family, mismatched sample counts, NaN/Inf, a constant
        side, or no more samples than source features (any family, except an
        affine fit with ``ridge > 0``).
      TypeError: complex input, or a non-bool ``normalise``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (50, 3))
      >>> q, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(1), (3, 3)))
      >>> s = fit_stitcher(x, 2.0 * x @ q + 1.0, family="scaled_orthogonal")
      >>> print(round(float(s.scale), 4), bool(jnp.allclose(s.weight, q, atol=1e-5)))
      2.0 True
    """
    _check_options(family, ridge)
    normalize = _normalise_option(normalise, old_spelling, "fit_stitcher")
    x, y = V.check_pair(z_src, z_tgt, ("z_src", "z_tgt"), finite=False)
    _check_fit_rows(x.shape[0], x.shape[1], family, ridge, "z_src")
    (weight, bias, scale), flags = _fit_program(
        x, y, jnp.asarray(float(ridge), x.dtype), family=family, normalize=bool(normalize)
    )
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, ("z_src", "z_tgt"), what="the stitcher fit")
        if not flags["result"]:
            _raise_not_finite("The fitted stitcher weight")
    return Stitcher(weight=weight, bias=bias, scale=scale, family=family)


def _train_varies(z: jax.Array, w_tr: jax.Array) -> jax.Array:
    """Whether the train rows of ``z`` are not all equal (to ``CONSTANT_RTOL`` of their largest magnitude)."""
    train = w_tr > 0
    first = z[jnp.argmax(train)]
    spread = jnp.max(jnp.where(train[:, None], jnp.abs(z - first[None, :]), 0.0))
    return spread > V.CONSTANT_RTOL * jnp.max(jnp.where(train[:, None], jnp.abs(z), 0.0))


@functools.partial(jax.jit, static_argnames=("family",))
def _score_program(x, y, w_tr, w_te, ridge, *, family):
    """The reconstruction scores and their value checks: ``(scores, flags)``; ``ridge`` traced.

    ``flags["shared"]`` counts held-out rows whose ``(z_src, z_tgt)`` repeats a train row.
    """
    mx = layer_moments(x, w_tr, w_te)
    my = layer_moments(y, w_tr, w_te)
    pm = pair_moments(x, y, mx, my, w_tr, w_te)
    out = score_from_moments(mx, my, pm, family=family, ridge=ridge)
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    fx["varies"], fy["varies"] = _train_varies(x, w_tr), _train_varies(y, w_tr)
    rows = jnp.concatenate([x / pow2_scale(x), y / pow2_scale(y)], axis=1)
    shared = shared_rows(rows, w_tr > 0, w_te > 0)
    flags = dict(x=fx, y=fy, result=jnp.isfinite(out.held_out), shared=shared, n_test=jnp.sum(w_te > 0),
                 n_rows=jnp.sum((w_tr > 0) | (w_te > 0)))
    return V.nan_unless(V.flags_ok(fx, fy), out), flags


@full_precision
def reconstruction_score(
    z_src: ArrayLike,
    z_tgt: ArrayLike,
    /,
    *,
    family: str = "affine",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    ridge: float = 0.0,
) -> ReconstructionScore:
    """Directed reconstruction score ``1 - ||Z2c - g(Z1c)||^2 / ||Z2c||^2`` (a score).

    The stitcher ``g`` (scale-free, see :func:`fit_stitcher`) is fitted on the
    train rows and scored on the held-out rows, with train means and norms.
    The denominator is the held-out target's variance around its own mean.
    For the orthogonal families the error is measured in the zero-padded space
    (it counts the padded coordinates when ``d_src > d_tgt``), which makes the
    in-sample identities exact for any widths: ``scaled_orthogonal`` gives
    ``NBS^2``, ``orthogonal`` gives ``2 NBS - 1``, ``affine`` the regression ``R^2``.

    Args:
      z_src: ``(n, d_src)``.
      z_tgt: ``(n, d_tgt)``.
      family: one of ``FAMILIES``.
      split: train fraction in (0, 1), drawn at random with ``key``, or a pair
        ``(train_idx, test_idx)`` of disjoint integer index arrays.
      key: PRNG key for a fractional split (default ``jax.random.key(0)``).
      ridge: ridge for ``affine``.

    Returns:
      :class:`ReconstructionScore` ``(held_out, in_sample)``, each ``()``.

    Raises:
      ValueError: unknown family, bad split, no more train rows than source
        features (any family, except an affine fit with ``ridge > 0``),
        mismatched samples, NaN/Inf, constant input.

    Examples:
      >>> import jax
      >>> x = jax.random.normal(jax.random.key(0), (40, 3))
      >>> r = reconstruction_score(x, x @ jax.random.normal(jax.random.key(1), (3, 2)))
      >>> print(round(float(r.held_out), 6), round(float(r.in_sample), 6))
      1.0 1.0
    """
    _check_options(family, ridge)
    x, y = V.check_pair(z_src, z_tgt, ("z_src", "z_tgt"), finite=False)
    w_tr, w_te = split_weights(x.shape[0], split, key, x.dtype)
    _check_fit_rows(int(round(float(jnp.sum(w_tr)))) if V.is_concrete(w_tr) else x.shape[0],
                    x.shape[1], family, ridge, "the train split")
    out, flags = _score_program(x, y, w_tr, w_te, jnp.asarray(float(ridge), x.dtype), family=family)
    flags = V.fetch_flags(flags)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, ("z_src", "z_tgt"), constant=False)
        n_tr = (int(flags["n_rows"]) - int(flags["n_test"]),)
        for nm, f, z in (("z_src", flags["x"], x), ("z_tgt", flags["y"], y)):
            V.raise_rep_flags(f, z, f"{nm} (train rows)", what="the reconstruction score", shape=n_tr + z.shape[1:])
        if not flags["result"]:
            _raise_not_finite("The reconstruction score")
        if flags["shared"]:
            V.warn_at_caller(
                f"{int(flags['shared'])} of the {int(flags['n_test'])} held-out rows repeat a train row "
                "exactly (the same z_src and z_tgt: duplicated inputs), so the held-out score is partly "
                "in-sample and inflated. Deduplicate the inputs before splitting, or pass "
                "split=(train_idx, test_idx) with each distinct input on one side only.",
                HeldOutOverlapWarning,
            )
    return out


@full_precision
def stitching_asymmetry(
    z_a: ArrayLike,
    z_b: ArrayLike,
    /,
    *,
    family: str = "affine",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    ridge: float = 0.0,
) -> StitchingAsymmetry:
    """Reconstruction scores in both directions, on the same split, and their difference.

    Args:
      z_a: ``(n, d_a)``.
      z_b: ``(n, d_b)``.
      family, split, key, ridge: as in :func:`reconstruction_score`.

    Returns:
      :class:`StitchingAsymmetry` with ``forward`` (a -> b), ``backward``
      (b -> a) and ``difference = forward - backward``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> a = jax.random.normal(jax.random.key(0), (60, 4))
      >>> r = stitching_asymmetry(a, a[:, :2])  # b is a projection of a
      >>> print(round(float(r.forward.held_out), 4), bool(r.difference.held_out > 0))
      1.0 True
    """
    fwd = reconstruction_score(z_a, z_b, family=family, split=split, key=key, ridge=ridge)
    bwd = reconstruction_score(z_b, z_a, family=family, split=split, key=key, ridge=ridge)
    diff = ReconstructionScore(*(f - b for f, b in zip(fwd, bwd)))
    return StitchingAsymmetry(forward=fwd, backward=bwd, difference=diff)


# ----------------------------------------------------------------------------- batched


def _bucket(d: int) -> int:
    return 1 << (d - 1).bit_length()


def _pad_cols(z: jax.Array, d: int) -> jax.Array:
    return jnp.pad(z, ((0, 0), (0, d - z.shape[1])))


@full_precision
def fit_stitchers(
    zs_src: Sequence[ArrayLike] | ArrayLike,
    zs_tgt: Sequence[ArrayLike] | ArrayLike,
    /,
    *,
    family: str | Sequence[str] = "affine",
    ridge: float = 0.0,
    normalise: bool = True,
    bucket: bool = True,
    **old_spelling,
) -> list[Stitcher]:
    """Fit many stitchers in one vmapped, jit-compiled call per family and width bucket.

    Problems of different widths are zero-padded to a common width, with
    feature masks (padded source features get a unit diagonal in the normal
    equations and weight 0; the orthogonal families are exact under zero
    padding), so each result equals the individual unpadded
    :func:`fit_stitcher`. With ``bucket=True`` (default) each width is padded
    only up to the next power of two and each ``(source, target)`` bucket is
    one vmapped call, which bounds the padding waste by 2x per side; with
    ``bucket=False`` every problem of a family is padded to the largest width
    and they are a single call (one compilation).

    Args:
      zs_src: a sequence of b ``(n, d_src_i)`` arrays (same ``n``), or one stacked
        ``(b, n, d_src)`` array.
      zs_tgt: the matching ``(n, d_tgt_i)`` arrays, or ``(b, n, d_tgt)``.
      family: one family for all, or b families (see ``FAMILIES``).
      ridge, normalise: as in :func:`fit_stitcher`.
      bucket: group problems into power-of-two width buckets (see above).

    Returns:
      b :class:`Stitcher` (unpadded), in order, whatever the input form; stack
      them with ``jax.tree.map(lambda *a: jnp.stack(a), *stitchers)`` when
      they share a shape and family.

    Examples:
      >>> import jax
      >>> k = jax.random.split(jax.random.key(0), 3)
      >>> xs = [jax.random.normal(k[0], (30, 3)), jax.random.normal(k[1], (30, 5))]
      >>> ys = [x[:, :2] for x in xs]
      >>> [tuple(s.weight.shape) for s in fit_stitchers(xs, ys)]
      [(3, 2), (5, 2)]
    """
    bucket = V.check_bool(bucket, "bucket")
    stacked = hasattr(zs_src, "ndim") and hasattr(zs_tgt, "ndim")
    b = zs_src.shape[0] if stacked else len(zs_src)
    fams = (family,) * b if isinstance(family, str) else tuple(family)
    if len(fams) != b:
        raise ValueError(f"family has {len(fams)} entries but there are {b} problems.")
    for fam in fams:
        _check_options(fam, ridge)
    normalize = _normalise_option(normalise, old_spelling, "fit_stitchers")
    out: list[Stitcher | None] = [None] * b
    if stacked:
        xs, ys = V.as_float_array(zs_src, "zs_src"), V.as_float_array(zs_tgt, "zs_tgt")
        if xs.ndim != 3 or ys.ndim != 3 or xs.shape[:2] != ys.shape[:2]:
            raise ValueError(
                "Stacked zs_src and zs_tgt must be (b, n, d) arrays with the same b and n, got "
                f"{tuple(xs.shape)} and {tuple(ys.shape)}."
            )
        dt = jnp.promote_types(xs.dtype, ys.dtype)
        for fam in dict.fromkeys(fams):
            idx = [i for i, f in enumerate(fams) if f == fam]
            _check_fit_rows(xs.shape[1], xs.shape[2], fam, ridge, "zs_src")
            sel = jnp.asarray(idx)
            weight, bias, scale, flags = _fit_stacked(
                xs[sel].astype(dt), ys[sel].astype(dt), jnp.asarray(float(ridge), dt), family=fam,
                normalize=normalize,
            )
            _raise_flags(flags, idx)
            _check_finite_result(weight, "A fitted stitcher weight")
            for k, i in enumerate(idx):
                out[i] = Stitcher(weight[k], bias[k], scale[k], family=fam)
        return out
    zs_src, zs_tgt = list(zs_src), list(zs_tgt)
    if len(zs_src) != len(zs_tgt) or not zs_src:
        raise ValueError(
            f"zs_src and zs_tgt must be non-empty and of equal length, got {len(zs_src)} and "
            f"{len(zs_tgt)}."
        )
    pairs = []
    for i, (a, b_) in enumerate(zip(zs_src, zs_tgt)):
        # shapes and dtypes here; values (NaN/Inf, constant sides) are checked
        # inside the batched call, in one pass, and raised below
        x, y = V.check_pair(a, b_, (f"zs_src[{i}]", f"zs_tgt[{i}]"), finite=False)
        _check_fit_rows(x.shape[0], x.shape[1], fams[i], ridge, f"zs_src[{i}]")
        pairs.append((x, y))
    ns = {x.shape[0] for x, _ in pairs}
    if len(ns) != 1:
        raise ValueError(f"All problems must share the sample count n; got n in {sorted(ns)}.")
    dt = functools.reduce(jnp.promote_types, [x.dtype for x, _ in pairs])
    groups: dict[tuple, list[int]] = {}
    for i, (x, y) in enumerate(pairs):
        k = (_bucket(x.shape[1]), _bucket(y.shape[1])) if bucket else (0, 0)
        groups.setdefault((fams[i], *k), []).append(i)
    for (fam, *_), idx in groups.items():
        xs = tuple(pairs[i][0].astype(dt) for i in idx)
        ys = tuple(pairs[i][1].astype(dt) for i in idx)
        weights, biases, scale, flags = _fit_group(xs, ys, jnp.asarray(float(ridge), dt), family=fam,
                                                   normalize=normalize)
        _raise_flags(flags, idx)
        for w in weights:
            _check_finite_result(w, "A fitted stitcher weight")
        for k, i in enumerate(idx):
            out[i] = Stitcher(weights[k], biases[k], scale[k], family=fam)
    return out


def _flags(x, y):
    """Per-problem value checks: all finite, source not constant, target not constant."""
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    finite = fx["finite"] & fy["finite"]
    return jnp.stack([finite, fx["varies"], fy["varies"]])


def _raise_flags(flags, idx) -> None:
    if not V.is_concrete(flags):
        return
    flags = np.asarray(flags)
    for k, i in enumerate(idx):
        if not flags[k, 0]:
            raise ValueError(
                f"zs_src[{i}] or zs_tgt[{i}] contains NaN or Inf values; remove or impute them."
            )
        for col, nm in ((1, "zs_src"), (2, "zs_tgt")):
            if not flags[k, col]:
                raise ValueError(
                    f"{nm}[{i}] is constant across samples (zero variance after centring), so "
                    "the stitcher fit is undefined (0/0). Check that the layer is not dead."
                )


@functools.partial(jax.jit, static_argnames=("family", "normalize"))
def _fit_group(xs, ys, ridge, *, family, normalize):
    """Pad a tuple of problems to the group's widths, fit them vmapped, slice back."""
    d1 = max(x.shape[1] for x in xs)
    d2 = max(y.shape[1] for y in ys)
    xp = jnp.stack([_pad_cols(x, d1) for x in xs])
    yp = jnp.stack([_pad_cols(y, d2) for y in ys])
    masks = jnp.asarray(np.stack([np.arange(d1) < x.shape[1] for x in xs]), xp.dtype)
    fit = functools.partial(_fit_impl, family=family, ridge=ridge, normalize=normalize)
    w, b, s = jax.vmap(fit)(xp, yp, masks)
    flags = jnp.stack([_flags(x, y) for x, y in zip(xs, ys)])
    weights = tuple(w[k, : x.shape[1], : y.shape[1]] for k, (x, y) in enumerate(zip(xs, ys)))
    biases = tuple(b[k, : y.shape[1]] for k, y in enumerate(ys))
    return weights, biases, s, flags


@functools.partial(jax.jit, static_argnames=("family", "normalize"))
def _fit_stacked(xs, ys, ridge, *, family, normalize):
    fit = functools.partial(_fit_impl, mask_src=None, family=family, ridge=ridge, normalize=normalize)
    w, b, s = jax.vmap(lambda x, y: fit(x, y))(xs, ys)
    return w, b, s, jax.vmap(_flags)(xs, ys)


# ----------------------------------------------------------------------------- registry


def _fit_rows_check(n_fit: int, d_src: int, where: str, *, family: str, ridge: float) -> None:
    """:func:`_check_fit_rows` for the grid (``MomentStats.check``), with the pair named by ``where``."""
    try:
        _check_fit_rows(n_fit, d_src, family, ridge, "the train split")
    except ValueError as e:
        hint = " In compare_grid the ridge is part of the name: 'stitch/affine/ridge=0.001'." if family == "affine" else ""
        raise ValueError(f"{where}: {e}{hint}") from None


def _affine_factor(m: LayerMoments, *, ridge: float) -> jax.Array:
    return affine_system(m.gram_train, ridge=ridge)


@functools.lru_cache(maxsize=None)
def _affine_hook(ridge: float):
    """The per-layer Cholesky factor for one ridge: one function object per ridge, so that
    measures with the same ridge share it in the grid."""
    return functools.partial(_affine_factor, ridge=ridge)


def _stitch_finish(ctx: MomentPair, *, family: str, ridge: float, which: str) -> jax.Array:
    def score():
        chol = ctx.extra(_affine_hook(ridge))[0] if family == "affine" else None
        svd = None if family == "affine" else ctx.svd()
        return score_from_moments(ctx.x, ctx.y, ctx.cross, family=family, ridge=ridge, chol=chol, svd=svd)

    return getattr(ctx.memo(("stitch", family, ridge), score), which)


def stitch_moment_stats(family: str, *, ridge: float = 0.0, which: str = "held_out") -> MomentStats:
    """A reconstruction score as a moment measure on train/test ("split") moments.

    ``which="held_out"`` is ``reconstruction_score(x, y, family=family, ridge=ridge).held_out``,
    ``"in_sample"`` its in-sample figure. Measures with the same family and ridge
    share one fit per pair (and the orthogonal families share one SVD).
    """
    V.check_choice(family, "family", FAMILIES)
    V.check_choice(which, "which", ReconstructionScore._fields)
    ridge = check_ridge(ridge)
    affine = family == "affine"
    return MomentStats(
        "split",
        functools.partial(_stitch_finish, family=family, ridge=ridge, which=which),
        layer=_affine_hook(ridge) if affine else None,
        check=None if affine and ridge > 0 else functools.partial(_fit_rows_check, family=family, ridge=ridge),
    )


_IN_SAMPLE_BOUNDS = {"orthogonal": (-1.0, 1.0), "scaled_orthogonal": (0.0, 1.0), "affine": (0.0, 1.0)}
_IN_SAMPLE_IDENTITY = {"orthogonal": "2 NBS - 1 on the train rows", "scaled_orthogonal": "NBS^2 on the train rows",
                       "affine": "the regression R^2 on the train rows"}


def _score_of(x: ArrayLike, y: ArrayLike, /, *, family: str, ridge: float, which: str) -> jax.Array:
    return getattr(reconstruction_score(x, y, family=family, ridge=ridge), which)


def _stitch_measure(family: str, ridge: float, which: str, name: str, register_it: bool = False):
    from funsim.similarity.registry import make_measure, register

    in_sample = which == "in_sample"
    what = "ridge={:g}, ".format(ridge) if ridge else ""
    if in_sample:
        desc = (f"in-sample (leaky) reconstruction score of y from x, {family} stitcher ({what}fitted and "
                f"scored on the train split of reconstruction_score: {_IN_SAMPLE_IDENTITY[family]})")
    else:
        desc = (f"directed held-out reconstruction score of y from x, {family} stitcher ({what}split=0.5 "
                "with jax.random.key(0); see reconstruction_score)")
    return (register if register_it else make_measure)(
        name,
        functools.partial(_score_of, family=family, ridge=ridge, which=which),
        kind="score",
        # the in-sample orthogonal scores are functions of NBS, which is symmetric
        symmetric=in_sample and family != "affine",
        invariances=("translation", "rotation", "isotropic_scale", "permutation"),
        description=desc,
        bounds=_IN_SAMPLE_BOUNDS[family] if in_sample else (-math.inf, 1.0),
        moments=stitch_moment_stats(family, ridge=ridge, which=which),
        # one value on rank-deficient layers: the in-sample orthogonal scores (functions of NBS) and the
        # ridge-regularised affine fits (a unique solution); a held-out orthogonal map is not unique there
        # (any rotation of the null space) and the plain affine fit's normal equations are singular
        robust_to=(("rank_deficient", "constant_rows") if (in_sample and family != "affine") or ridge > 0
                   else ("constant_rows",)),
        **({"overwrite": True} if register_it else {}),
    )


def _ridge_family(which: str):
    suffix = "/in_sample" if which == "in_sample" else ""

    def build(ridge: float):
        ridge = check_ridge(ridge)
        return _stitch_measure("affine", ridge, which, f"stitch/affine{suffix}/ridge={ridge:g}")

    return build


def _register_measures() -> None:
    from funsim.similarity.registry import register_family

    for fam in FAMILIES:
        for which, suffix in (("held_out", ""), ("in_sample", "/in_sample")):
            _stitch_measure(fam, 0.0, which, f"stitch/{fam}{suffix}", register_it=True)
    for which, suffix in (("held_out", ""), ("in_sample", "/in_sample")):
        register_family(f"stitch/affine{suffix}", "ridge", _ridge_family(which), examples=(1e-3,))


_register_measures()
