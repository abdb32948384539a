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
* **Undetermined held-out scores.** Where the train cross-covariance is
  rank-deficient, the orthogonal fit is not unique (any rotation between its
  null spaces is optimal), and a held-out score whose rows have components
  there would depend on that arbitrary choice: such a score is undefined (a
  ``ValueError`` naming the cause; NaN under tracing), and one whose held-out
  rows stay in the spans the train rows determine is computed, with a value
  that does not depend on the choice (:func:`held_out_ambiguity`).
* **One compiled core.** The registered ``stitch/*`` measures are
  :func:`stitch_core` (:mod:`similarity.protocol`): per-layer moments on
  zero-padded layers (the default split drawn inside the program from the row
  count), a per-pair fit and score with flags, and a host-side ``reason`` that
  gives :func:`reconstruction_score`'s messages; the comparison grid reads its
  cells' reasons from the same function.

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
from funsim.similarity import protocol
from funsim.similarity._linalg import cho_solve as _cho_solve
from funsim.similarity._linalg import cholesky as _cholesky
from funsim.similarity._linalg import eigh as _eigh
from funsim.similarity._linalg import fmix32, pow2_scale, row_hash, shared_hashes
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


# Refinement steps of the affine solve: each multiplies the error along an eigenvalue lambda of
# G by shift / (lambda + shift). One step left float32 held-out scores 0.1 off the float64 ones
# on a moment of condition 1e5 (shift / lambda = 0.23); three reach float32's own floor there.
_REFINE_STEPS = 3


def _affine_shift(gram: jax.Array) -> jax.Array:
    """``()``: the smallest diagonal shift of the affine normal equations, ``10 eps tr(G)``.

    Eigenvalues of ``G`` below it are rounding (a dead unit, a duplicated column: exactly 0 in
    exact arithmetic), and the rank rule of :func:`affine_ambiguity` counts them as null.
    """
    tr = jnp.trace(gram)
    return (_RANK_RTOL * jnp.finfo(gram.dtype).eps) * jnp.where(tr > 0, tr, 1.0)


def affine_system(gram: jax.Array, *, ridge: float, mask: jax.Array | None = None) -> jax.Array:
    """Cholesky factor of the normal equations ``G + max(ridge, shift) I`` (``shift`` = 10 eps tr G).

    :func:`fit_from_moments` solves with it and refines three times against ``G + ridge I``: for
    a ridge above the shift that is ordinary iterative refinement, and at ridge 0 it gives the
    least-squares fit to a relative ``(shift / (lambda + shift))^4`` on every direction of
    eigenvalue ``lambda``. Along directions of ``G`` with eigenvalue 0 (a dead unit, a duplicated
    column) the least-squares weights are not unique: there the weights are set by rounding (zero
    for an exactly dead unit, a few percent of the weights' size for a duplicated column), and the
    predictions on rows in the span of the train rows, hence every defined score, do not depend on
    them (:func:`affine_ambiguity` says when a held-out score would). The factor exists for every
    ``G``, so derivatives are finite too.

    Args:
      gram: ``(d, d)`` ``U^T U`` of the normalised source.
      ridge: non-negative ridge, in units of the normalised problem (may be traced).
      mask: ``(d,)`` 1 for real features, 0 for zero-padded ones (padded
        coordinates get a unit diagonal so the system stays definite; their
        weights come out exactly 0).

    Returns:
      ``(d, d)`` lower Cholesky factor.
    """
    d = gram.shape[0]
    mask = jnp.ones((d,), gram.dtype) if mask is None else mask.astype(gram.dtype)
    a = gram + jnp.diag(jnp.maximum(ridge, _affine_shift(gram)) * mask + (1.0 - mask))
    return _cholesky(a)


def affine_ambiguity(gram_train: jax.Array, gram_test: jax.Array, ridge, /) -> jax.Array:
    """How much of a held-out affine score at ridge 0 the train rows leave to an arbitrary choice (pure).

    At ridge 0 the least-squares weights are not unique along the null directions ``N`` of the
    train source moment ``G`` (eigenvalues at most :func:`_affine_shift`: a dead unit, a
    duplicated column, fewer train rows than features). The held-out predictions ``U_te W`` do
    not depend on that choice exactly when ``U_te N = 0``: the held-out rows have no component
    there. This returns ``sqrt(tr(N^T G_te N) / tr(G_te))``, the share of the held-out source's
    norm in those directions (0 for a unit dead on every row or a column duplicated on every
    row; of order 1 for a unit constant on the train rows that varies on the held-out rows), and
    0 for ``ridge > 0`` (the fit is unique). Compare it with :func:`ambiguity_threshold`, as for
    the orthogonal families (:func:`held_out_ambiguity`). No derivative flows through it: it only
    decides whether the score is defined.

    Args:
      gram_train: ``(d, d)`` the train source moment ``U_tr^T U_tr`` (zero padding allowed).
      gram_test: ``(d, d)`` the held-out source moment ``U_te^T U_te``.
      ridge: ``()`` the ridge (may be traced).

    Returns:
      ``()`` in ``[0, 1]``.
    """
    g, g_te = jax.lax.stop_gradient(gram_train), jax.lax.stop_gradient(gram_test)
    lam, vec = _eigh(g)
    null = (lam <= _affine_shift(g)).astype(g.dtype)
    part = jnp.einsum("ik,ij,jk,k->", vec, g_te, vec, null)
    total = jnp.trace(g_te)
    amb = jnp.sqrt(jnp.clip(part / jnp.where(total > 0, total, 1.0), 0.0, 1.0))
    return jnp.where(jax.lax.stop_gradient(ridge) > 0, jnp.zeros((), g.dtype), amb)


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
        w = _cho_solve(chol, cross_train)
        # refinement against G + ridge I (the factor may carry a larger shift: affine_system)
        d = gram_train.shape[0]
        mask = jnp.ones((d,), dt) if mask_src is None else mask_src.astype(dt)
        for _ in range(_REFINE_STEPS):
            resid = cross_train - jnp.einsum("ij,jk->ik", gram_train, w) - (ridge * mask)[:, None] * w
            w = w + _cho_solve(chol, resid)
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


_RANK_RTOL = 10.0  # the rank tolerance of held_out_ambiguity, in units of eps * ||C||_F


def ambiguity_threshold(dtype) -> float:
    """The largest :func:`held_out_ambiguity` at which a held-out orthogonal score counts as determined.

    ``sqrt(eps)`` of the dtype (1.5e-8 in float64, 3.5e-4 in float32), halfway on a
    log scale between rounding (``eps``) and a genuine ambiguity (order 1). The
    ambiguity of a score that the data determine is rounding: at most ``1.3e-16``
    (float64) and ``4.3e-8`` (float32) on layers with a dead unit, duplicated
    columns or rank-deficient pre-activations (``n`` from 60 to 4,000, widths
    5 to 256), and at most ``1.2e-5`` in float32 on full-rank layers whose
    singular values decay over 3 to 7 decades. A genuine ambiguity is the
    held-out rows' variance in directions the train rows leave free: a unit that
    is constant on the train rows and varies on the held-out rows gave ``8e-2``
    to ``3e-1`` (widths 5 to 16) and ``9e-4`` to ``2e-3`` as one unit among 256
    (float32); its effect on the score is at most about twice the ambiguity, so
    below the threshold a score is arbitrary by less than about ``1e-3`` in float32.
    """
    return float(np.sqrt(np.finfo(np.dtype(dtype)).eps))


def held_out_ambiguity(
    svd: tuple[jax.Array, jax.Array, jax.Array],
    cross_test: jax.Array,
    gram_test_src: jax.Array,
    gram_test_tgt: jax.Array,
    /,
) -> jax.Array:
    """How much of a held-out orthogonal score the train rows leave to an arbitrary choice (pure).

    **Where the fit is not unique.** The orthogonal families fit the square
    ``Q`` (``D x D``, ``D = max(d1, d2)``) that maximises ``<Q, C_p>``, ``C_p``
    the train cross moment ``C = U_tr^T V_tr`` (``d1 x d2``) zero-padded to
    ``D x D``. With the full SVD ``C_p = A S B^T`` and ``r`` the number of
    non-zero singular values, every maximiser is
    ``Q = A_+ B_+^T + A_0 R B_0^T`` for an arbitrary orthogonal ``R``
    (``(D - r) x (D - r)``), where ``A_+, B_+`` (``D x r``) are the singular
    vectors of the non-zero singular values and ``A_0, B_0`` span the left and
    right null spaces of ``C_p``. The held-out error
    ``||V_p,te - s U_p,te Q||^2 = ||V_te||^2 - 2 s <Q, C_p,te> + s^2 ||U_te||^2``
    (``||U_p Q|| = ||U||`` for orthogonal ``Q``; ``C_p,te`` the padded held-out
    cross moment) depends on ``Q`` only through ``<Q, C_p,te>``, whose arbitrary
    part is ``tr(R^T A_0^T C_p,te B_0)``: it ranges over
    ``+-||A_0^T C_p,te B_0||_*`` as ``R`` varies, so the held-out score is
    determined by the data exactly when ``A_0^T C_p,te B_0 = 0``, i.e. when
    ``(I - A_+ A_+^T) C_p,te (I - B_+ B_+^T) = 0``. (The in-sample term
    ``<Q, C_p> = sum(s)`` never sees ``R``: the in-sample scores are always
    determined, and the affine family has no such freedom.)

    **The same on the unpadded blocks, for any widths.** Zero padding adds zero
    rows (``d1 < D``) or columns (``d2 < D``) to ``C``, so the non-zero singular
    vectors are those of ``C`` padded with zeros, ``A_+ = [a_+; 0]`` and
    ``B_+ = [b_+; 0]``, and ``I - A_+ A_+^T = diag(I - a_+ a_+^T, I)``. With
    ``C_p,te = [[C_te, 0], [0, 0]]`` the product is
    ``[[(I - a_+ a_+^T) C_te (I - b_+ b_+^T), 0], [0, 0]]``, so only the
    ``(d1, d2)`` block ``M = (I - a_+ a_+^T) C_te (I - b_+ b_+^T)`` matters, in
    all three cases:

    * ``d1 < d2``: with ``rank C = d1`` (the generic case), ``a_+`` is a square
      orthogonal ``d1 x d1`` matrix, ``I - a_+ a_+^T = 0`` and ``M = 0``: the
      freedom of ``R`` only mixes the padded source coordinates with target
      directions, which the ``(d1, d2)`` block of ``Q`` never sees.
    * ``d1 > d2``: symmetrically, ``rank C = d2`` gives ``I - b_+ b_+^T = 0``.
    * ``d1 = d2``: ``M = 0`` whenever ``C`` is invertible.

    When ``rank C < min(d1, d2)``, ``M`` is zero exactly when the held-out cross
    moment has no part that lies in the left null space of ``C`` on the source
    side and in its right null space on the target side. It is zero in exact
    arithmetic when the held-out rows lie in the spans the train rows determine:
    a unit dead on every row or a duplicated column (the null direction, ``e_j``
    or ``e_j - e_k``, is orthogonal to every held-out row too), rank-deficient
    pre-activations (every row in one subspace; generically ``C`` has the rank of
    the narrower subspace, which then holds all the held-out cross moment). It is
    not for a unit that is constant on the train rows but varies on the held-out
    rows (``e_j`` is then in the left null space, and the held-out rows have a
    component there). Only the singular vectors ``a_+, b_+`` of the thin SVD are
    needed.

    **Rank tolerance.** A singular value counts as non-zero above
    ``10 * eps * ||C||_F``: the rounding of the SVD (backward stable: the
    computed singular values are exact for ``C + E``, ``||E|| ~ eps ||C||_F``)
    puts the computed singular values of exactly null directions below it, and
    the rows of ``C`` that are exactly null (a unit constant on the train rows)
    stay far below it whatever ``n``. It is tighter than the codebase's rank rule
    for ``(n, d)`` data matrices (``max(n, d) * 10 * eps * s_max``) on purpose: a
    null direction whose rounding happens to exceed it is kept as fitted, and
    then the held-out rows' component in it is rounding too (harmless), while a
    looser tolerance drops genuine weak directions, whose held-out components
    are then taken for an ambiguity: on float32 layers with singular values
    decaying over 3 to 7 decades, ``max(n, d) * 10 * eps * s_max`` gave
    ambiguities up to ``2e-3`` (above :func:`ambiguity_threshold`),
    ``max(d1, d2) * 10 * eps * s_max`` up to ``3e-4``, and this rule at most
    ``1.2e-5``. ``||C||_F`` and the singular values do not change under zero
    padding, so neither does the tolerance (no widths needed: the grid's padded
    moments give the pairwise value).

    Args:
      svd: the thin SVD ``(u (d1, k), s (k,), vt (k, d2))`` of the train cross
        moment, ``k = min(d1, d2)`` (zero padding allowed on either side).
      cross_test: ``(d1, d2)`` the held-out cross moment ``C_te``.
      gram_test_src: ``(d1, d1)`` the held-out source moment (its trace is ``||U_te||^2``).
      gram_test_tgt: ``(d2, d2)`` the held-out target moment.

    Returns:
      ``()``: ``||M||_F / (||U_te||_F ||V_te||_F)``, in ``[0, 1]`` (0 where the
      held-out norms are 0). Compare it with :func:`ambiguity_threshold`.
    """
    u, s, vt = svd
    dt = s.dtype
    tol = (_RANK_RTOL * jnp.finfo(dt).eps) * jnp.sqrt(jnp.sum(s * s))
    keep = (s > tol).astype(dt)
    a, b = u * keep[None, :], jnp.swapaxes(vt, -1, -2) * keep[None, :]
    m = cross_test - jnp.einsum("ik,jk,jl->il", a, a, cross_test)
    m = m - jnp.einsum("ij,jk,lk->il", m, b, b)
    size = jnp.sqrt(jnp.sum(m * m))
    den = jnp.sqrt(jnp.trace(gram_test_src)) * jnp.sqrt(jnp.trace(gram_test_tgt))
    return jnp.where(size > 0, size / jnp.where(den > 0, den, 1.0), jnp.zeros((), dt))


def _scores(m_src, m_tgt, pm, *, family, ridge, chol=None, svd=None):
    """``(ReconstructionScore, ambiguity ())``: :func:`score_from_moments` and the held-out score's
    ambiguity: :func:`held_out_ambiguity` from the same SVD (orthogonal families) or
    :func:`affine_ambiguity` (``affine``, 0 for ``ridge > 0``)."""
    if family != "affine" and svd is None:
        svd = _svd(pm.cross_train)
    score = score_from_moments(m_src, m_tgt, pm, family=family, ridge=ridge, chol=chol, svd=svd)
    if family == "affine":
        return score, affine_ambiguity(m_src.gram_train, m_src.gram_test, ridge)
    return score, held_out_ambiguity(svd, pm.cross_test, m_src.gram_test, m_tgt.gram_test)


def _score_flags(score: ReconstructionScore, ambiguity: jax.Array, *, family: str, which: str) -> dict:
    """The checks of one score (``which``): ``result`` (finite), ``determined`` (not left to an
    arbitrary choice of the fit: only a held-out score can fail it) and ``ambiguity`` itself."""
    del family
    value = getattr(score, which)
    if which == "held_out":  # NaN (a failed SVD) is left to ``result``
        determined = ~(ambiguity > ambiguity_threshold(value.dtype))
    else:
        determined = jnp.ones((), bool)
    return dict(result=jnp.isfinite(value), determined=determined, ambiguity=ambiguity)


def _ambiguity_message(family: str, ambiguity: float) -> str:
    if family == "affine":
        return (
            "The held-out affine reconstruction score at ridge 0 is not determined by the train rows: "
            "the train rows of z_src are rank-deficient, and the held-out rows have components in "
            f"directions the train rows leave free ({ambiguity:.2g} of the held-out norm), e.g. a unit "
            "that is constant on the train rows but varies on the held-out rows. Any least-squares "
            "weights there fit the train rows equally well, so the score would be arbitrary. Use more "
            "train rows (or another split), drop that unit, or pass ridge > 0 (e.g. ridge=1e-3; "
            "'stitch/affine/ridge=0.001' in the registry)."
        )
    return (
        f"The held-out {family} reconstruction score is not determined by the train rows: the train "
        "cross-covariance of z_src and z_tgt is rank-deficient, and the held-out rows have components "
        "in directions the train rows leave free (their held-out cross-covariance there is "
        f"{ambiguity:.2g} of the held-out norms), e.g. a unit that is constant on the train rows but "
        "varies on the held-out rows. Any rotation of those directions fits the train rows equally well, "
        "so the score would be arbitrary. Use more train rows (or another split), drop that unit, or use "
        "family='affine' with a ridge (e.g. ridge=1e-3; 'stitch/affine/ridge=0.001' in the registry)."
    )


# ----------------------------------------------------------------------------- validation


_RIDGE = V.Bound("ridge", 0.0, math.inf, message="{name} must be a non-negative finite float, got {value!r}.")


def check_ridge(ridge: float, /, *, name: str = "ridge") -> float:
    """Validate a ridge (a non-negative, finite Python or NumPy number) and return it as a float;
    a caller's traced ``()`` ridge is returned as it is (checked in the program: NaN out of range).

    Examples:
      >>> check_ridge(1e-3)
      0.001
      >>> check_ridge(-1.0)
      Traceback (most recent call last):
      ...
      ValueError: ridge must be a non-negative finite float, got -1.0.
    """
    bound = _RIDGE._replace(name=name, message=_RIDGE.message.replace("{name}", name))
    return bound.check(ridge)


def _ridge_array(ridge, dtype):
    """A checked ridge as a ``()`` array of ``dtype`` (NumPy for a Python float: placing it compiles nothing)."""
    return jnp.asarray(ridge, dtype) if V.is_traced(ridge) else np.asarray(ridge, dtype)


def _ridge_in_range(ridge, out):
    """``out`` as it is for a concrete ridge (checked eagerly); for a traced one, NaN (NaN derivatives
    too) where the ridge is out of range."""
    if not V.is_traced(ridge):
        return out
    return V.nan_reaches_inputs(V.nan_unless(_RIDGE.ok(ridge), out), ridge)


def _check_options(family: str, ridge: float) -> None:
    V.check_choice(family, "family", FAMILIES)
    check_ridge(ridge)


def _fit_rows_reason(n_fit: int, d_src: int, family: str, ridge: float, where: str) -> str | None:
    """One minimum-rows rule for every family: more fitting rows than source features (the message, or None).

    With ``n_fit - 1 < d_src`` the centred fitting rows span fewer than ``d_src``
    source directions, so no family's fit is determined on the rest: the affine
    normal equations are singular, and an orthogonal ``Q`` is arbitrary there (any
    completion of the SVD is optimal), so held-out predictions, which do have
    components in those directions, would depend on that arbitrary choice. Only
    the affine family has a regulariser that removes the ambiguity (``ridge > 0``).
    """
    if V.is_traced(ridge) and family == "affine":
        return None  # a traced ridge: the program checks ridge > 0 where the rows are too few
    if n_fit - 1 < d_src and not (family == "affine" and ridge > 0):
        fix = "pass ridge > 0 (affine only, e.g. ridge=1e-3), " if family == "affine" else ""
        return (
            f"A stitcher fit needs more fitting rows than source features: {where} has {n_fit} "
            f"rows (n - 1 = {n_fit - 1} after centring) but z_src has {d_src} features, so the "
            f"{family} fit is not determined on the source directions those rows do not span "
            "(singular normal equations; an arbitrary rotation there). Use more samples, "
            f"{fix}or reduce the width."
        )
    return None


def _check_fit_rows(n_fit: int, d_src: int, family: str, ridge: float, where: str) -> None:
    """:func:`_fit_rows_reason` as a ``ValueError``."""
    msg = _fit_rows_reason(n_fit, d_src, family, ridge, where)
    if msg is not None:
        raise ValueError(msg)


def _not_finite_message(what: str) -> str:
    return (
        f"{what} is not finite: the normal equations are numerically singular "
        "(collinear features, or float32 with an ill-conditioned source). Pass ridge > 0 "
        "or use float64."
    )


def _raise_not_finite(what: str) -> None:
    raise ValueError(_not_finite_message(what))


def _check_finite_result(x: jax.Array, what: str) -> None:
    if V.is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        _raise_not_finite(what)


# ----------------------------------------------------------------------------- public API


def _normalise_option(normalise, old_spelling: dict, fn: str, check=V.check_bool):
    """The ``normalise`` option, also accepted under its old spelling ``normalize=`` (deprecated);
    ``check(value, name)`` validates it."""
    unknown = set(old_spelling) - {"normalize"}
    if unknown:
        raise TypeError(f"{fn}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if "normalize" not in old_spelling:
        return check(normalise, "normalise")
    V.warn_at_caller("normalize= is deprecated: use normalise= (the same option).", DeprecationWarning)
    return check(old_spelling["normalize"], "normalize")


def _norm(zc, c, normalize):
    """The scale a centred side is divided by: its Frobenius norm (``normalize``) or ``1 / c``;
    ``normalize`` a Python bool or a traced one (one per problem in a batch of mixed options)."""
    if isinstance(normalize, bool):
        return jnp.sqrt(jnp.sum(zc * zc)) if normalize else 1.0 / c
    return jnp.where(normalize, jnp.sqrt(jnp.sum(zc * zc)), 1.0 / c)


def _fit_impl(x, y, mask_src, *, family, ridge, normalize):
    cx, cy = pow2_scale(x), pow2_scale(y)  # exact; the sums of squares of x / c cannot overflow
    mx, my = jnp.mean(x / cx, axis=0), jnp.mean(y / cy, axis=0)
    xc, yc = x / cx - mx[None, :], y / cy - my[None, :]
    one = jnp.ones((), x.dtype)
    nx, ny = _norm(xc, cx, normalize), _norm(yc, cy, normalize)
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
        x, y, _ridge_array(ridge, x.dtype), family=family, normalize=bool(normalize)
    )
    weight, bias, scale = _ridge_in_range(ridge, (weight, bias, scale))
    flags = V.fetch_flags(flags, x, y, ridge)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, ("z_src", "z_tgt"), what="the stitcher fit")
        if not flags["result"]:
            _raise_not_finite("The fitted stitcher weight")
    return Stitcher(weight=weight, bias=bias, scale=scale, family=family)


def _train_varies(z: jax.Array, w_tr: jax.Array) -> jax.Array:
    """Whether the train rows of ``z`` are not all equal: the rule of :func:`similarity._validate.rep_flags`
    (some column's range above ``CONSTANT_RTOL`` times the largest magnitude) on the train rows, as the
    grid computes it from column ranges (exact, also when streamed)."""
    train = (w_tr > 0)[:, None]
    lo = jnp.min(jnp.where(train, z, jnp.inf), axis=0)
    hi = jnp.max(jnp.where(train, z, -jnp.inf), axis=0)
    top = jnp.maximum(jnp.max(jnp.abs(lo)), jnp.max(jnp.abs(hi)))
    return jnp.max(hi - lo) > V.CONSTANT_RTOL * top


# ----------------------------------------------------------------------------- the compiled core

#: The train fraction of the registered held-out measures (``reconstruction_score``'s default split).
DEFAULT_SPLIT = 0.5

_HASH_SEEDS = (0x3C6EF372, 0xA54FF53A)  # two independent row hashes (see _linalg.shared_rows)


class _StitchLayer(NamedTuple):
    """One layer's statistics for the reconstruction scores (zero padding leaves each unchanged).

    Attributes:
      moments: :class:`LayerMoments` on the train/test rows.
      u: ``(n, W)`` the rows centred on the train mean and divided by the train norm.
      w_train, w_test: ``(n,)`` the 0/1 row weights.
      chol: ``(W, W)`` the Cholesky factor of the affine normal equations (``affine`` only, else ``()``).
      hashes: ``(2, n)`` uint32 hashes of the rows' real features (to count held-out rows repeating a train row).
      flags: ``finite`` (all rows) and ``varies`` (the train rows).
      width: ``()`` the real width (the first ``width`` of the ``W`` features).
    """

    moments: LayerMoments
    u: jax.Array
    w_train: jax.Array
    w_test: jax.Array
    chol: jax.Array
    hashes: jax.Array
    flags: dict
    width: jax.Array


def _default_weights(n: int, dtype) -> tuple[jax.Array, jax.Array]:
    """``split_weights(n, DEFAULT_SPLIT, jax.random.key(0), dtype)`` inside a program (pure).

    Row ``i`` is a train row iff its position in ``jax.random.permutation(key, n)``
    is below ``round(DEFAULT_SPLIT * n)``: the rows ``split_weights`` draws.
    """
    n_tr = int(round(DEFAULT_SPLIT * n))
    perm = jax.random.permutation(jax.random.key(0), n)
    w_tr = jnp.zeros((n,), dtype).at[perm].set((jnp.arange(n) < n_tr).astype(dtype))
    return w_tr, 1.0 - w_tr


def _layer_from_weights(z, width, w_tr, w_te, ridge, *, family: str, factor: bool = True) -> _StitchLayer:
    """:class:`_StitchLayer` of ``z: (n, W)`` whose first ``width`` features are real (pure)."""
    m = layer_moments(z, w_tr, w_te)
    u = (z - m.mean[None, :]) / m.norm
    f = V.rep_flags(z)
    flags = {"finite": f["finite"], "varies": _train_varies(z, w_tr)}
    if family == "affine" and factor:
        chol = affine_system(m.gram_train, ridge=ridge, mask=protocol.feature_mask(width, z.shape[1], z.dtype))
    else:
        chol = jnp.zeros((), z.dtype)
    hashes = jnp.stack([row_hash(z, seed, width) for seed in _HASH_SEEDS])
    return _StitchLayer(m, u, w_tr, w_te, chol, hashes, flags, jnp.asarray(width, jnp.int32))


def _stitch_layer(z, width, opts, *, family: str, which: str) -> _StitchLayer:
    """The core's ``layer``: the default split's weights, drawn inside the program from the row count."""
    del which
    (ridge,) = opts
    w_tr, w_te = _default_weights(z.shape[0], z.dtype)
    return _layer_from_weights(z, width, w_tr, w_te, ridge, family=family)


def _pair_hash(hx: jax.Array, hy: jax.Array) -> jax.Array:
    """One uint32 hash per row of the pair ``(z_src, z_tgt)`` from each side's row hashes."""
    return fmix32(hx ^ fmix32(hy + jnp.uint32(0x9E3779B9)))


def _pair_parts(sx: _StitchLayer, sy: _StitchLayer, ridge, *, family: str):
    """``(ReconstructionScore, ambiguity, flags)`` of a pair: the scores before any NaN, and the
    flags every score shares (``x``, ``y``, ``n_rows``, ``n_test``, ``shared``)."""
    w_tr, w_te = sx.w_train, sx.w_test
    pm = PairMoments(
        cross_train=jnp.einsum("n,ni,nj->ij", w_tr, sx.u, sy.u),
        cross_test=jnp.einsum("n,ni,nj->ij", w_te, sx.u, sy.u),
    )
    score, amb = _scores(sx.moments, sy.moments, pm, family=family, ridge=ridge,
                         chol=sx.chol if family == "affine" else None)
    h1, h2 = (_pair_hash(sx.hashes[k], sy.hashes[k]) for k in range(2))
    train, test = w_tr > 0, w_te > 0
    n_train = jnp.sum(train).astype(jnp.int32)
    # the minimum-rows rule (_fit_rows_reason) in the program, where a traced ridge leaves it open
    rows = (n_train - 1 >= sx.width) | ((ridge > 0) if family == "affine" else False)
    flags = dict(x=sx.flags, y=sy.flags, n_rows=jnp.sum(train | test).astype(jnp.int32),
                 n_test=jnp.sum(test).astype(jnp.int32),
                 shared=shared_hashes(h1, h2, train, test).astype(jnp.int32), rows=rows)
    return score, amb, flags


def _stitch_pair(sx: _StitchLayer, sy: _StitchLayer, opts, *, family: str, which: str):
    """The core's ``pair``: ``(score (), flags)``, NaN wherever :func:`_stitch_reason` names a reason."""
    (ridge,) = opts
    score, amb, flags = _pair_parts(sx, sy, ridge, family=family)
    checks = _score_flags(score, amb, family=family, which=which)
    ok = V.flags_ok(sx.flags, sy.flags) & checks["determined"] & flags["rows"]
    return V.nan_unless(ok, getattr(score, which)), {**flags, **checks}


def _default_split_reason(n: int) -> str | None:
    """The message of ``split_weights(n, DEFAULT_SPLIT, ...)`` for too few rows, or None (host, no program)."""
    n_tr = int(round(DEFAULT_SPLIT * n))
    if n_tr >= 2 and n - n_tr >= 2:
        return None
    try:  # it raises before it computes anything
        split_weights(n, DEFAULT_SPLIT, None, np.float32)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"split_weights accepted {n} rows")  # pragma: no cover


def _stitch_reason(flags, shape_x, shape_y, opts, *, family: str, which: str) -> str | None:
    """The pairwise call's message for fetched flags, in the order of the eager checks.

    Too few train rows for the source's width (with ``flags=None``: the default
    split of ``shape_x[0]`` rows, which must also leave 2 rows on each side; with
    flags: their row counts), a constant ``z_src`` then ``z_tgt`` on the train
    rows, a held-out orthogonal score left to an arbitrary rotation
    (:func:`held_out_ambiguity`), a non-finite score. NaN/Inf in the inputs are
    the caller's (:func:`similarity.protocol.raise_from_flags`).
    """
    (ridge,) = opts
    if flags is None:
        msg = _default_split_reason(shape_x[0])
        if msg is not None:
            return msg
        n_tr = int(round(DEFAULT_SPLIT * shape_x[0]))
    else:
        n_tr = int(flags["n_rows"]) - int(flags["n_test"])
    msg = _fit_rows_reason(n_tr, shape_x[1], family, ridge, "the train split")
    if msg is not None or flags is None:
        return msg
    for key, name, shape in (("x", "z_src", shape_x), ("y", "z_tgt", shape_y)):
        msg = V.constant_reason(flags[key], f"{name} (train rows)", (n_tr, *shape[1:]), "the reconstruction score")
        if msg is not None:
            return msg
    if not flags["determined"]:
        return _ambiguity_message(family, float(flags["ambiguity"]))
    if not flags["result"]:
        return _not_finite_message("The reconstruction score")
    return None


@functools.lru_cache(maxsize=None)
def _stitch_parts(family: str, which: str) -> tuple:
    """The core's three functions for one family and score (one object each: shared programs)."""
    kw = dict(family=family, which=which)
    return (functools.partial(_stitch_layer, **kw), functools.partial(_stitch_pair, **kw),
            functools.partial(_stitch_reason, **kw))


def stitch_core(family: str = "affine", *, ridge: float = 0.0, which: str = "held_out") -> protocol.Core:
    """The compiled core of the ``stitch/*`` measures (:class:`similarity.protocol.Core`); ``ridge`` is traced.

    ``which="held_out"`` is ``reconstruction_score(x, y, family=family, ridge=ridge).held_out``
    (the default split: ``DEFAULT_SPLIT`` of the rows with ``jax.random.key(0)``, drawn inside
    the program from the row count), ``"in_sample"`` its in-sample figure. The pair's flags:
    ``x``, ``y`` (``finite`` on all rows, ``varies`` on the train rows), ``n_rows`` (train +
    test), ``n_test``, ``shared`` (held-out rows repeating a train row, for
    :class:`HeldOutOverlapWarning`), ``result`` (the score is finite), ``determined`` and
    ``ambiguity`` (see :func:`held_out_ambiguity`; always determined for ``affine`` and
    in-sample scores).

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(40, 3))
      >>> value, flags = protocol.evaluate(stitch_core("orthogonal"), x, 2 * x + 1)
      >>> round(float(value), 4), bool(flags["determined"]), int(flags["n_test"])
      (1.0, True, 20)
    """
    _check_options(family, ridge)
    V.check_choice(which, "which", ReconstructionScore._fields)
    layer, pair, reason = _stitch_parts(family, which)
    return protocol.Core(layer, pair, reason, (check_ridge(ridge),), (_RIDGE,))


def _warn_shared(flags: dict) -> None:
    if flags["shared"]:
        V.warn_at_caller(
            f"{int(flags['shared'])} of the {int(flags['n_test'])} held-out rows repeat a train row "
            "exactly (the same z_src and z_tgt: duplicated inputs), so the held-out score is partly "
            "in-sample and inflated. Deduplicate the inputs before splitting, or pass "
            "split=(train_idx, test_idx) with each distinct input on one side only.",
            HeldOutOverlapWarning,
        )


@functools.partial(jax.jit, static_argnames=("family",))
def _score_program(x, y, w_tr, w_te, ridge, *, family):
    """Both reconstruction scores for any split and their flags (those of :func:`stitch_core`'s
    held-out pair): ``(ReconstructionScore, flags)``; ``ridge`` traced."""
    sx = _layer_from_weights(x, x.shape[1], w_tr, w_te, ridge, family=family)
    sy = _layer_from_weights(y, y.shape[1], w_tr, w_te, ridge, family=family, factor=False)
    score, amb, flags = _pair_parts(sx, sy, ridge, family=family)
    checks = _score_flags(score, amb, family=family, which="held_out")
    score = V.nan_unless(V.flags_ok(sx.flags, sy.flags) & flags["rows"], score)
    score = score._replace(held_out=V.nan_unless(checks["determined"], score.held_out))
    return score, {**flags, **checks}


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
        mismatched samples, NaN/Inf, constant input (on the train rows), a
        non-finite score, or a held-out orthogonal score that the train rows
        leave to an arbitrary rotation (:func:`held_out_ambiguity`: e.g. a unit
        constant on the train rows that varies on the held-out rows).

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
    _check_fit_rows(int(round(float(np.sum(np.asarray(w_tr))))) if V.is_concrete(w_tr) else x.shape[0],
                    x.shape[1], family, ridge, "the train split")
    out, flags = _score_program(x, y, w_tr, w_te, _ridge_array(ridge, x.dtype), family=family)
    out = _ridge_in_range(ridge, out)
    flags = V.fetch_flags(flags, x, y, w_tr, ridge)
    if flags is not None:
        protocol.raise_from_flags(stitch_core(family, ridge=ridge), flags, x, y, ("z_src", "z_tgt"))
        _warn_shared(flags)
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


def _size_bucket(k: int) -> int:
    """The smallest size of the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (``2^m`` and ``3 * 2^m``) >= ``k``.

    The grid's shape policy: widths and counts are padded up to it (at most 1.5x), so
    that calls whose sizes fall in the same buckets share their compiled programs.

    Examples:
      >>> [_size_bucket(k) for k in (1, 4, 5, 7, 9, 13, 200)]
      [1, 4, 6, 8, 12, 16, 256]
    """
    if k <= 4:
        return k
    p = 1 << (k - 1).bit_length()
    return p * 3 // 4 if p * 3 // 4 >= k else p


def _host_float(z, name: str) -> np.ndarray:
    """A concrete array as NumPy in its compute dtype (:func:`similarity._validate.compute_dtype`),
    cast on the host: no device program, whatever the input dtype."""
    if isinstance(z, (list, tuple)):
        z = np.asarray(z)
    if not hasattr(z, "dtype") or not hasattr(z, "shape"):
        V.as_float_array(z, name)  # raises its TypeError
    dt = V.compute_dtype(z.dtype, name)
    if dt == jnp.dtype(jnp.float64) and not jax.config.jax_enable_x64:
        return np.asarray(V.as_float_array(z, name))  # float32 (cast on the host) and its PrecisionWarning
    return np.asarray(z, dtype=dt)


def _host_rep(z, name: str) -> np.ndarray:
    """:func:`_host_float` with the shape checks of :func:`similarity._validate.check_rep` (no NaN check)."""
    z = _host_float(z, name)
    if z.ndim != 2 or z.shape[1] == 0 or z.shape[0] < 2:
        V.check_rep(z, name, finite=False)  # raises its message
    return z


def _is_traced(*zs) -> bool:
    return any(isinstance(z, jax.core.Tracer) for z in zs)


@functools.partial(jax.jit, static_argnames=("families",))
def _fit_padded(xs, ys, mask_src, ridge, code, normalize, *, families):
    """Fit ``b`` zero-padded problems of any families in one vmapped program: ``((weight, bias, scale), flags)``.

    ``xs: (b, n, W1)``, ``ys: (b, n, W2)``, ``mask_src: (b, W1)`` (1 on each source's real
    features); per problem ``ridge: (b,)``, ``code: (b,)`` int (the index of its family in the
    static tuple ``families``) and ``normalize: (b,)`` bool. With several families every fit is
    computed for every problem and ``code`` selects (arithmetic is cheap, a compile is not).
    ``flags: (b, 3)`` bool, per problem: all finite, source varies, target varies (zero features
    change none of them). One program per tuple of families and padded shapes.
    """

    def fit(x, y, m, r, c, nz):
        outs = [_fit_impl(x, y, m, family=f, ridge=r, normalize=nz) for f in families]
        return functools.reduce(
            lambda acc, j: jax.tree.map(lambda a, o: jnp.where(c == j, o, a), acc, outs[j]),
            range(1, len(outs)), outs[0])

    out = jax.vmap(fit)(xs, ys, mask_src, ridge, code, normalize)
    fx, fy = jax.vmap(V.rep_flags)(xs), jax.vmap(V.rep_flags)(ys)
    return out, jnp.stack([fx["finite"] & fy["finite"], fx["varies"], fy["varies"]], axis=1)


def _default_names(i: int) -> tuple[str, str]:
    return f"zs_src[{i}]", f"zs_tgt[{i}]"


def _fit_batch(xs: list, ys: list, fams: Sequence[str], normalize: Sequence[bool], ridge: Sequence[float],
               bucket: bool, dt, names=_default_names) -> list[Stitcher]:
    """Every problem, of any families and options, padded to one width per side (and, with ``bucket``,
    the widths and the count up the ladder :func:`_size_bucket`), fitted in one call of :func:`_fit_padded`.

    Concrete inputs are padded and the results sliced on the host (NumPy), so that no program is
    compiled per width; traced inputs (under a caller's ``jit``) are padded in the caller's trace.
    ``names(i) -> (source name, target name)`` for the messages.
    """
    idx = list(range(len(xs)))
    families = tuple(sorted(set(fams)))
    d1s, d2s = [x.shape[1] for x in xs], [y.shape[1] for y in ys]
    w1, w2, count = max(d1s), max(d2s), len(idx)
    if bucket:
        w1, w2, count = _size_bucket(w1), _size_bucket(w2), _size_bucket(count)
    pidx = idx + [idx[-1]] * (count - len(idx))  # dummy problems repeat the last one; dropped
    n = xs[0].shape[0]
    widths = np.array([d1s[i] for i in pidx])
    mask = (np.arange(w1)[None, :] < widths[:, None]).astype(dt)
    per = dict(ridge=np.array([ridge[i] for i in pidx], dt),
               code=np.array([families.index(fams[i]) for i in pidx], np.int32),
               normalize=np.array([bool(normalize[i]) for i in pidx]))
    traced = _is_traced(*xs, *ys)
    if traced:
        pad = lambda z, w: jnp.pad(jnp.asarray(z, dt), ((0, 0), (0, w - z.shape[1])))  # noqa: E731
        xp = jnp.stack([pad(xs[i], w1) for i in pidx])
        yp = jnp.stack([pad(ys[i], w2) for i in pidx])
    else:
        xp, yp = np.zeros((count, n, w1), dt), np.zeros((count, n, w2), dt)
        for k, i in enumerate(pidx):
            xp[k, :, : d1s[i]] = xs[i]
            yp[k, :, : d2s[i]] = ys[i]
    (w, b, s), flags = _fit_padded(xp, yp, mask, per["ridge"], per["code"], per["normalize"], families=families)
    if traced:
        return [Stitcher(w[k, :d1, :d2], b[k, :d2], s[k], family=fams[k])
                for k, (d1, d2) in enumerate(zip(d1s, d2s))]
    (w, b, s), flags = jax.device_get(((w, b, s), flags))
    _raise_flags(flags, idx, names)
    parts = []
    for k, (d1, d2) in enumerate(zip(d1s, d2s)):
        weight = w[k, :d1, :d2]
        if not np.all(np.isfinite(weight)):
            _raise_not_finite(f"The fitted stitcher weight of {names(k)[0]}")
        parts.append((weight, b[k, :d2], s[k]))
    return [Stitcher(*p, family=f) for p, f in zip(jax.device_put(parts), fams)]


@full_precision
def fit_stitchers(
    zs_src: Sequence[ArrayLike] | ArrayLike,
    zs_tgt: Sequence[ArrayLike] | ArrayLike,
    /,
    *,
    family: str | Sequence[str] = "affine",
    ridge: float | Sequence[float] = 0.0,
    normalise: bool | Sequence[bool] = True,
    bucket: bool = True,
    names: Sequence[str] | None = None,
    **old_spelling,
) -> list[Stitcher]:
    """Fit many stitchers in one vmapped, jit-compiled call, whatever their widths and families.

    The problems are zero-padded to one source width and one target width, with
    feature masks (padded source features get a unit diagonal in the normal
    equations and weight 0; the orthogonal families are exact under zero
    padding), and fitted in one program, so each result equals the individual
    unpadded :func:`fit_stitcher` and a call compiles one program, however many
    widths and families it mixes (with several families each problem's fit is
    selected from all of them, computed side by side). Padding and slicing run
    on the host (NumPy), so no small program is compiled per width either.

    ``bucket`` (kept, with a new meaning): with ``True`` (default) the padded
    widths and the number of problems are rounded up the ladder 1, 2, 3, 4, 6, 8,
    12, 16, 24, ... (at most 1.5x per axis; the padded problems repeat the last
    one and are dropped), so that later calls with similar widths and counts reuse
    the compiled programs; with ``False`` the problems are padded to the call's
    largest widths only, and the program is for this exact batch.

    Args:
      zs_src: a sequence of b ``(n, d_src_i)`` arrays (same ``n``), or one stacked
        ``(b, n, d_src)`` array.
      zs_tgt: the matching ``(n, d_tgt_i)`` arrays, or ``(b, n, d_tgt)``.
      family: one family for all, or b families (see ``FAMILIES``).
      ridge, normalise: as in :func:`fit_stitcher`; one for all, or b of them.
      bucket: round the padded sizes up the ladder (see above).
      names: b labels for the error messages (default: the problems' indices,
        ``zs_src[i]``), e.g. the layer pairs.

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
    b = zs_src.shape[0] if stacked and zs_src.ndim else len(zs_src)
    fams = _per_problem(family, b, "family")
    ridges = _per_problem(ridge, b, "ridge")
    for fam, r in zip(fams, ridges):
        _check_options(fam, r)
    ridges = [float(r) for r in ridges]
    norms = _normalise_option(normalise, old_spelling, "fit_stitchers", check=lambda v, nm: [
        V.check_bool(x, nm) for x in _per_problem(v, b, nm)])
    labels = None if names is None else [str(v) for v in _per_problem(names, b, "names", scalar=False)]
    where = _default_names if labels is None else (lambda i: (f"the source of {labels[i]}", f"the target of {labels[i]}"))
    if stacked:
        if _is_traced(zs_src, zs_tgt):
            big_x, big_y = V.as_float_array(zs_src, "zs_src"), V.as_float_array(zs_tgt, "zs_tgt")
        else:
            big_x, big_y = _host_float(zs_src, "zs_src"), _host_float(zs_tgt, "zs_tgt")
        if big_x.ndim != 3 or big_y.ndim != 3 or big_x.shape[:2] != big_y.shape[:2]:
            raise ValueError(
                "Stacked zs_src and zs_tgt must be (b, n, d) arrays with the same b and n, got "
                f"{tuple(big_x.shape)} and {tuple(big_y.shape)}."
            )
        for i, (fam, r) in enumerate(zip(fams, ridges)):
            _check_fit_rows(big_x.shape[1], big_x.shape[2], fam, r, "zs_src" if labels is None else where(i)[0])
        xs, ys = [big_x[i] for i in range(b)], [big_y[i] for i in range(b)]
    else:
        zs_src, zs_tgt = list(zs_src), list(zs_tgt)
        if len(zs_src) != len(zs_tgt) or not zs_src:
            raise ValueError(
                f"zs_src and zs_tgt must be non-empty and of equal length, got {len(zs_src)} and "
                f"{len(zs_tgt)}."
            )
        xs, ys = [], []
        for i, (a, b_) in enumerate(zip(zs_src, zs_tgt)):
            # shapes and dtypes here (on the host for concrete input); values (NaN/Inf, constant
            # sides) are checked inside the batched call, in one pass, and raised below
            names = where(i)
            if _is_traced(a, b_):
                x, y = V.check_pair(a, b_, names, finite=False)
            else:
                x, y = _host_rep(a, names[0]), _host_rep(b_, names[1])
                if x.shape[0] != y.shape[0]:
                    V.check_pair(x, y, names, finite=False)  # raises its message
            _check_fit_rows(x.shape[0], x.shape[1], fams[i], ridges[i], names[0])
            xs.append(x)
            ys.append(y)
        ns = {x.shape[0] for x in xs}
        if len(ns) != 1:
            raise ValueError(f"All problems must share the sample count n; got n in {sorted(ns)}.")
    dt = np.dtype(functools.reduce(jnp.promote_types, [z.dtype for z in xs + ys]))
    return _fit_batch(xs, ys, fams, norms, ridges, bucket, dt, where)


def _per_problem(value, b: int, name: str, scalar: bool = True) -> list:
    """One option for all b problems (``scalar``: anything but a sequence, checked by the caller)
    or a sequence of b of them."""
    one = isinstance(value, (str, bytes)) or not hasattr(value, "__len__")
    if scalar and one:
        return [value] * b
    if one:
        raise TypeError(f"{name} must be a sequence of b = {b} values, got {value!r}.")
    value = list(np.asarray(value).tolist() if isinstance(value, np.ndarray) else value)
    if len(value) != b:
        raise ValueError(f"{name} has {len(value)} entries but there are {b} problems; pass one value "
                         f"or one per problem.")
    return value


def _raise_flags(flags, idx, names=_default_names) -> None:
    """The value checks of :func:`_fit_padded` (``(b, 3)``, fetched) for the problems ``idx``;
    ``names(i) -> (source name, target name)``."""
    flags = np.asarray(flags)
    for k, i in enumerate(idx):
        src, tgt = names(i)
        if not flags[k, 0]:
            raise ValueError(f"{src} or {tgt} contains NaN or Inf values; remove or impute them.")
        for col, nm in ((1, src), (2, tgt)):
            if not flags[k, col]:
                raise ValueError(
                    f"{nm} is constant across samples (zero variance after centring), so "
                    "the stitcher fit is undefined (0/0). Check that the layer is not dead."
                )


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


def _stitch_finish(ctx: MomentPair, *, family: str, ridge: float, which: str) -> tuple[jax.Array, dict]:
    def parts():
        chol = ctx.extra(_affine_hook(ridge))[0] if family == "affine" else None
        svd = None if family == "affine" else ctx.svd()
        return _scores(ctx.x, ctx.y, ctx.cross, family=family, ridge=ridge, chol=chol, svd=svd)

    score, amb = ctx.memo(("stitch", family, ridge), parts)
    checks = _score_flags(score, amb, family=family, which=which)
    # the moments hold no rows, so held-out rows that repeat a train row cannot be counted here
    # the minimum-rows rule is checked before the grid's programs run (``check``): rows always hold here
    flags = dict(shared=jnp.zeros((), jnp.int32), rows=jnp.ones((), bool), **checks)
    return V.nan_unless(checks["determined"], getattr(score, which)), flags


def stitch_moment_stats(family: str, *, ridge: float = 0.0, which: str = "held_out") -> MomentStats:
    """A reconstruction score as a moment measure on train/test ("split") moments.

    ``which="held_out"`` is ``reconstruction_score(x, y, family=family, ridge=ridge).held_out``,
    ``"in_sample"`` its in-sample figure. Measures with the same family and ridge
    share one fit per pair (and the orthogonal families share one SVD).

    ``finish`` returns ``(value, flags)`` with the keys of :func:`stitch_core`'s pair
    flags but ``x``, ``y``, ``n_rows`` and ``n_test`` (the grid's): ``result``,
    ``determined``, ``ambiguity`` and ``shared`` (always 0: moments hold no rows).
    The ambiguity (:func:`held_out_ambiguity`) is unchanged by the grid's zero
    padding, so a grid cell and the pairwise call agree on it.
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


@full_precision
def _score_of(x: ArrayLike, y: ArrayLike, /, *, family: str, ridge: float, which: str) -> jax.Array:
    """A registered ``stitch/*`` measure: the checks, then :func:`stitch_core` as ``protocol.call`` runs it,
    plus the :class:`HeldOutOverlapWarning` of :func:`reconstruction_score` (from the flags)."""
    x, y = V.check_pair(x, y, ("z_src", "z_tgt"), finite=False)
    core = stitch_core(family, ridge=ridge, which=which)
    msg = core.reason(None, tuple(x.shape), tuple(y.shape), core.opts)
    if msg is not None:
        raise ValueError(msg)
    value, flags = protocol.evaluate(core, x, y)
    flags = V.fetch_flags(flags, x, y)
    protocol.raise_from_flags(core, flags, x, y, ("z_src", "z_tgt"))
    if flags is not None and which == "held_out":
        _warn_shared(flags)
    return value


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
        core=stitch_core(family, ridge=ridge, which=which),
        # one value on rank-deficient layers: the in-sample orthogonal scores (functions of NBS) and the
        # ridge-regularised affine fits (a unique solution); a held-out orthogonal map is not unique there
        # (any rotation of the null space: the score is undefined where the held-out rows see it, see
        # held_out_ambiguity) and the plain affine fit's normal equations are singular
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
