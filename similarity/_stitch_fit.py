"""Closed-form stitcher fits from moments: the families, the fits, the scores and their checks.

The pure, jit-able pieces behind :mod:`similarity.stitching` (whose module docstring states the
conventions: scale-free fits, zero padding to the common width, scores in the padded space,
held-out scores and when they are undetermined): per-layer and per-pair second moments
(:func:`layer_moments`, :func:`pair_moments`), the closed-form fit of each family
(:func:`fit_from_moments`, :func:`fit_impl` on raw rows), the reconstruction scores
(:func:`score_from_moments`) and the ambiguity of a held-out score (:func:`held_out_ambiguity`,
:func:`affine_ambiguity`), with the option checks and messages the public functions share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity import _validate as V
from funsim.similarity._linalg import cho_solve as _cho_solve
from funsim.similarity._linalg import cholesky as _cholesky
from funsim.similarity._linalg import eigh as _eigh
from funsim.similarity._linalg import pow2_scale
from funsim.similarity._linalg import qr as _qr
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._linalg import triangular_solve as _triangular_solve
from funsim.similarity._precision import sum_of_products
from funsim.similarity.moments import LayerMoments, PairMoments

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


class ReconstructionScore(NamedTuple):
    """A directed reconstruction score and its in-sample (leaky) counterpart.

    Attributes:
      held_out: ``()`` score on the held-out split (the estimate to report).
      in_sample: ``()`` score on the train split the map was fitted on.
    """

    held_out: jax.Array
    in_sample: jax.Array


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
    normalise = normalise_option(normalise, old_spelling, "layer_moments")
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
    return _trace_shift(jnp.trace(gram), gram.dtype)


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
    part = sum_of_products(vec * null[None, :], g_te @ vec)
    total = jnp.trace(g_te)
    amb = jnp.sqrt(jnp.clip(part / jnp.where(total > 0, total, 1.0), 0.0, 1.0))
    return jnp.where(jax.lax.stop_gradient(ridge) > 0, jnp.zeros((), g.dtype), amb)


class AffineRoots(NamedTuple):
    """Square roots of the affine fit's shifted train and test moments, from a QR of the rows.

    The normal equations of the affine fit lose twice the digits of the data (their condition
    number is the square of the rows'): float32 moments ``U^T U`` of rows whose singular values
    span a factor ``kappa`` carry an error ``eps kappa^2`` relative to the fit. A QR of the rows
    gives an upper triangular ``R`` with ``R^T R = U^T U`` that is accurate to ``eps kappa``, and
    :func:`fit_from_moments` and :func:`score_from_moments` use it in place of the Gram matrices
    (the fit through ``R``, the scores' quadratic terms as ``||R W||^2``). Each root carries the
    diagonal shift of :func:`_affine_shift` (so that it is invertible and its derivative finite
    for any rows: a dead unit, fewer held-out rows than features); the shift is subtracted
    where it enters a score.

    Attributes:
      train: ``(d, d)`` upper triangular, ``R^T R = G_tr + s_tr D``.
      test: ``(d, d)`` upper triangular, ``R^T R = G_te + s_te D``.
      shift_train: ``()`` ``s_tr``, :func:`_affine_shift` of ``G_tr``.
      shift_test: ``()`` ``s_te``, :func:`_affine_shift` of ``G_te``.

    ``D`` is the identity on the real features and carries a unit diagonal on zero-padded ones
    (whose weights are exactly 0, so the padding changes no score).
    """

    train: jax.Array
    test: jax.Array
    shift_train: jax.Array
    shift_test: jax.Array


def _shifted_root(rows: jax.Array, shift: jax.Array, mask: jax.Array) -> jax.Array:
    """``(d, d)`` upper ``R`` with ``R^T R = rows^T rows + diag(shift mask + 1 - mask)``: the R of a
    QR of the rows stacked on the square root of the shift (one Householder QR, accurate to the
    rows' own condition number)."""
    diag = jnp.sqrt(shift) * mask + (1.0 - mask)
    return _qr(jnp.concatenate([rows, jnp.diag(diag)], axis=0))[1]


def affine_roots(
    u: jax.Array, w_train: jax.Array, w_test: jax.Array, mask: jax.Array | None = None, /
) -> AffineRoots:
    """:class:`AffineRoots` of normalised rows (pure).

    Args:
      u: ``(n, d)`` the rows centred on the train mean and divided by the train norm (as
        :class:`LayerMoments`' ``gram_train = sum_train u u^T``).
      w_train, w_test: ``(n,)`` the 0/1 row weights.
      mask: ``(d,)`` 1 on real features, 0 on zero-padded ones (None: all real).

    Returns:
      :class:`AffineRoots`.
    """
    return affine_roots_from_factors(u * w_train[:, None], u * w_test[:, None], mask)


def affine_roots_from_factors(r_train: jax.Array, r_test: jax.Array, mask: jax.Array | None = None, /) -> AffineRoots:
    """:class:`AffineRoots` from any ``(k, d)`` factors ``F`` of the train and test moments, ``F^T F = G``
    (pure): the R factors of the normalised rows accumulated over row chunks, as the grid streams them.
    The same roots as :func:`affine_roots` on the rows, to rounding."""
    d = r_train.shape[-1]
    mask = jnp.ones((d,), r_train.dtype) if mask is None else mask.astype(r_train.dtype)
    s_tr = _trace_shift(jnp.sum(r_train * r_train), r_train.dtype)
    s_te = _trace_shift(jnp.sum(r_test * r_test), r_test.dtype)
    return AffineRoots(_shifted_root(r_train, s_tr, mask), _shifted_root(r_test, s_te, mask), s_tr, s_te)


def _trace_shift(tr: jax.Array, dtype) -> jax.Array:
    """:func:`_affine_shift` from the trace ``tr(G)`` (the squared norm of any factor of ``G``)."""
    return (_RANK_RTOL * jnp.finfo(dtype).eps) * jnp.where(tr > 0, tr, 1.0)


class RootsSolver(NamedTuple):
    """The affine fit from :class:`AffineRoots` as two per-layer matrices: ``W = rinv poly rinv^T C``.

    Attributes:
      rinv: ``(d, d)`` upper triangular ``R^-1``, ``R^T R = G_tr + max(ridge, s_tr) D``.
      poly: ``(d, d)`` the refinement ``sum_{j < 2^K} (delta B)^j``, ``B = rinv^T rinv``,
        ``delta = max(ridge, s_tr) - ridge`` (the identity for a ridge above the shift).
    """

    rinv: jax.Array
    poly: jax.Array


# Refinement steps of the affine fit from roots: each multiplies the error along an eigenvalue
# lambda of G by shift / (lambda + shift), as the moment refinement does, but it never forms G, so
# the steps converge to the least-squares fit to the rows' own accuracy. On a float32 source of
# moment condition 1.4e5 (shift / lambda = 0.23) three steps left the held-out score 4e-3 off the
# float64 one and eight 2e-4; over 40 seeds of that data the largest error was 8e-4 after eight
# steps, 3.3e-4 after fifteen, and thirty did no better. The steps are one per-layer matrix
# polynomial (:class:`RootsSolver`, three squarings), so a pair pays three matrix products.
_ROOT_REFINE_LOG2 = 4  # 2 ** 4 = 16 terms: fifteen steps


def roots_system(roots: AffineRoots, *, ridge) -> RootsSolver:
    """The :class:`RootsSolver` of one layer for one ridge (pure; the grid computes it once per layer).

    With ``A = R^T R = G_tr + max(ridge, s_tr) D`` (``R = roots.train`` for a ridge at most the
    shift, else the R of a QR of ``roots.train`` stacked on ``sqrt(ridge - s_tr) I``: no Gram
    matrix is formed) the fit of ``(G_tr + ridge) W = C`` is the fixed point of
    ``W_{k+1} = W_0 + A^-1 (delta W_k)``, ``W_0 = A^-1 C``. In the coordinates ``W = R^-1 Z``
    that is ``Z_{k+1} = Z_0 + delta B Z_k`` with ``B = R^-T R^-1`` (``||delta B|| <= 1``), so
    ``2^K`` steps are ``Z = poly Z_0``, ``poly = prod_{i < K} (I + (delta B)^(2^i))``.
    """
    r = roots.train
    if V.is_traced(ridge) or float(ridge) != 0.0:
        extra = jnp.maximum(ridge - roots.shift_train, 0.0)
        pos = extra > 0
        root = jnp.where(pos, jnp.sqrt(jnp.where(pos, extra, 1.0)), 0.0).astype(r.dtype)
        r = _qr(jnp.concatenate([r, root * jnp.eye(r.shape[-1], dtype=r.dtype)], axis=0))[1]
    return _solver(r, (jnp.maximum(ridge, roots.shift_train) - ridge).astype(r.dtype))


def _solver(r: jax.Array, delta: jax.Array) -> RootsSolver:
    """:class:`RootsSolver` of an upper factor ``r`` whose shift exceeds the ridge by ``delta``."""
    eye = jnp.eye(r.shape[-1], dtype=r.dtype)
    rinv = _triangular_solve(r, eye, lower=False)
    x = delta * jnp.einsum("ki,kj->ij", rinv, rinv)
    poly = eye + x
    for _ in range(_ROOT_REFINE_LOG2 - 1):
        x = jnp.einsum("ij,jk->ik", x, x)
        poly = poly + jnp.einsum("ij,jk->ik", x, poly)
    return RootsSolver(rinv, poly)


def _fit_from_roots(solver: RootsSolver, cross: jax.Array) -> jax.Array:
    """``W = rinv poly rinv^T C`` (three products per pair)."""
    z = jnp.einsum("ki,kj->ij", solver.rinv, cross)
    return jnp.einsum("ij,jk,kl->il", solver.rinv, solver.poly, z)


def _quad_from_root(root: jax.Array, shift: jax.Array, w: jax.Array) -> jax.Array:
    """``||U W||^2 = ||R W||^2 - shift ||W||^2`` (zero-padded rows of ``W`` are 0)."""
    rw = jnp.einsum("ij,jk->ik", root, w)
    return jnp.sum(rw * rw) - shift * jnp.sum(w * w)


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
    roots: AffineRoots | None = None,
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
      roots: optional :class:`AffineRoots` of the source (``affine``): the fit goes through
        them (accurate to the rows' condition number, not its square), and ``chol``, if
        given, must be their :class:`RootsSolver` (:func:`roots_system`).

    Returns:
      ``(W, s)``: ``W`` is ``(d1, d2)`` (the block ``Q[:d1, :d2]`` for the
      orthogonal families), ``s`` the isotropic scale (1 for ``affine`` and
      ``orthogonal``).
    """
    dt = cross_train.dtype
    if family == "affine" and roots is not None:
        solver = roots_system(roots, ridge=ridge) if chol is None else chol
        return _fit_from_roots(solver, cross_train), jnp.ones((), dt)
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
    lin = sum_of_products(w, cross)
    if family == "affine":
        quad = sum_of_products(w, gram @ w)
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
    precomputed factors, see :func:`fit_from_moments`. Where the source's moments carry
    :class:`AffineRoots` (``m_src.roots``), the affine fit and both scores' quadratic terms
    go through them.
    """
    roots = m_src.roots if family == "affine" else None
    w, s = fit_from_moments(
        m_src.gram_train, pm.cross_train, family=family, chol=chol, ridge=ridge, mask_src=mask_src,
        svd=svd, roots=roots,
    )
    vv_tr = jnp.trace(m_tgt.gram_train)  # the target is exactly centred on train rows
    vv_te = jnp.trace(m_tgt.gram_test)
    sst_te = vv_te - jnp.sum(m_tgt.sum_test**2) / m_tgt.n_test
    if roots is not None:
        quad_tr = _quad_from_root(roots.train, roots.shift_train, w)
        quad_te = _quad_from_root(roots.test, roots.shift_test, w)
        sse_tr = vv_tr - 2.0 * sum_of_products(w, pm.cross_train) + quad_tr
        sse_te = vv_te - 2.0 * sum_of_products(w, pm.cross_test) + quad_te
    else:
        sse_tr = _sse(w, s, m_src.gram_train, pm.cross_train, vv_tr, family)
        sse_te = _sse(w, s, m_src.gram_test, pm.cross_test, vv_te, family)
    return ReconstructionScore(held_out=1.0 - sse_te / sst_te, in_sample=1.0 - sse_tr / vv_tr)


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


def scores_with_ambiguity(m_src, m_tgt, pm, *, family, ridge, chol=None, svd=None):
    """``(ReconstructionScore, ambiguity ())``: :func:`score_from_moments` and the held-out score's
    ambiguity: :func:`held_out_ambiguity` from the same SVD (orthogonal families) or
    :func:`affine_ambiguity` (``affine``, 0 for ``ridge > 0``)."""
    if family != "affine" and svd is None:
        svd = _svd(pm.cross_train)
    score = score_from_moments(m_src, m_tgt, pm, family=family, ridge=ridge, chol=chol, svd=svd)
    if family == "affine":
        return score, affine_ambiguity(m_src.gram_train, m_src.gram_test, ridge)
    return score, held_out_ambiguity(svd, pm.cross_test, m_src.gram_test, m_tgt.gram_test)


def score_flags(score: ReconstructionScore, ambiguity: jax.Array, *, family: str, which: str) -> dict:
    """The checks of one score (``which``): ``result`` (finite), ``determined`` (not left to an
    arbitrary choice of the fit: only a held-out score can fail it) and ``ambiguity`` itself."""
    del family
    value = getattr(score, which)
    if which == "held_out":  # NaN (a failed SVD) is left to ``result``
        determined = ~(ambiguity > ambiguity_threshold(value.dtype))
    else:
        determined = jnp.ones((), bool)
    return dict(result=jnp.isfinite(value), determined=determined, ambiguity=ambiguity)


def ambiguity_message(family: str, ambiguity: float) -> str:
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


RIDGE = V.Bound("ridge", 0.0, math.inf, message="{name} must be a non-negative finite float, got {value!r}.")


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
    bound = RIDGE._replace(name=name, message=RIDGE.message.replace("{name}", name))
    return bound.check(ridge)


def ridge_array(ridge, dtype):
    """A checked ridge as a ``()`` array of ``dtype`` (NumPy for a Python float: placing it compiles nothing)."""
    return jnp.asarray(ridge, dtype) if V.is_traced(ridge) else np.asarray(ridge, dtype)


def ridge_in_range(ridge, out):
    """``out`` as it is for a concrete ridge (checked eagerly); for a traced one, NaN (NaN derivatives
    too) where the ridge is out of range."""
    if not V.is_traced(ridge):
        return out
    return V.nan_reaches_inputs(V.nan_unless(RIDGE.ok(ridge), out), ridge)


def check_options(family: str, ridge: float) -> None:
    V.check_choice(family, "family", FAMILIES)
    check_ridge(ridge)


def fit_rows_reason(n_fit: int, d_src: int, family: str, ridge: float, where: str) -> str | None:
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


def check_fit_rows(n_fit: int, d_src: int, family: str, ridge: float, where: str) -> None:
    """:func:`fit_rows_reason` as a ``ValueError``."""
    msg = fit_rows_reason(n_fit, d_src, family, ridge, where)
    if msg is not None:
        raise ValueError(msg)


def not_finite_message(what: str) -> str:
    return (
        f"{what} is not finite: the normal equations are numerically singular "
        "(collinear features, or float32 with an ill-conditioned source). Pass ridge > 0 "
        "or use float64."
    )


def raise_not_finite(what: str) -> None:
    raise ValueError(not_finite_message(what))


def _check_finite_result(x: jax.Array, what: str) -> None:
    if V.is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        raise_not_finite(what)


# ----------------------------------------------------------------------------- the fit on raw rows


def normalise_option(normalise, old_spelling: dict, fn: str, check=V.check_bool):
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


def _affine_in_row_span(u: jax.Array, v: jax.Array, mask_src: jax.Array | None, ridge) -> jax.Array:
    """The affine fit of ``v`` on ``u`` with fewer rows than features, in the span of the rows.

    With the thin QR ``U^T = Q R`` (``Q`` ``(d, n)`` orthonormal, ``R`` ``(n, n)``), ``G = U^T U = Q (R R^T) Q^T``
    and ``C = U^T V = Q (R V)``, so ``(G + ridge I) W = C`` is solved by ``W = Q B`` with
    ``(R R^T + ridge I) B = R V``: :func:`fit_from_moments` (its shift, ``10 eps tr G``, and its refinement)
    on the ``n`` coordinates that ``Q`` spans. The same fit as on the ``d`` features (exactly so in exact
    arithmetic, where the ridge is above 0 or the rows span every real feature), for ``O(n^2 d)`` work and
    memory ``O(n d)``, where the normal equations take ``O(n d^2 + d^3)`` and a ``(d, d)`` matrix (a source of
    2,048 features and 100 rows: about 40x less arithmetic). Directions that no row spans get weight 0
    (the normal equations put rounding there, divided by the shift). ``mask_src`` zeroes the padded
    features' weights.

    Args:
      u, v: ``(n, d)`` and ``(n, d2)``, the normalised centred rows, ``n < d``.
      mask_src: ``(d,)`` 1 on real features (None: all real).
      ridge: ``()`` the ridge (may be traced).

    Returns:
      ``(d, d2)`` weights.
    """
    q, r = _qr(u.T)  # (d, n), (n, n)
    b, _ = fit_from_moments(jnp.einsum("ik,jk->ij", r, r), jnp.einsum("ik,kj->ij", r, v), family="affine",
                            ridge=ridge)
    w = jnp.einsum("ik,kj->ij", q, b)
    return w if mask_src is None else w * mask_src.astype(w.dtype)[:, None]


def fit_impl(x, y, mask_src, *, family, ridge, normalize):
    cx, cy = pow2_scale(x), pow2_scale(y)  # exact; the sums of squares of x / c cannot overflow
    mx, my = jnp.mean(x / cx, axis=0), jnp.mean(y / cy, axis=0)
    xc, yc = x / cx - mx[None, :], y / cy - my[None, :]
    one = jnp.ones((), x.dtype)
    nx, ny = _norm(xc, cx, normalize), _norm(yc, cy, normalize)
    u, v = xc / nx, yc / ny
    mx, my, nx, ny = mx * cx, my * cy, nx * cx, ny * cy
    # the orthogonal families only need tr(U^T U), not the Gram matrix. The affine fit stays on the normal
    # equations here (the scores go through AffineRoots): through a QR its float32 predictions were 10-25x
    # closer to float64 on a source of moment condition 1e5, but 64 fits took 40% longer on the CPU and
    # the weights of a duplicated column split unevenly (0.45 / 0.29 where these give 0.37 / 0.37). With more
    # (padded) features than rows the affine fit goes through a QR of the rows (_affine_in_row_span): there the
    # normal equations would be a (d, d) system for n rows' information.
    if family == "affine" and u.shape[0] < u.shape[1]:  # more (padded) features than rows
        w, s = _affine_in_row_span(u, v, mask_src, ridge), one
    else:
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
