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
samples in chunks, and still agree with the pairwise functions. The affine
family's per-layer statistics also carry square roots of its moments from a QR of
the rows (:class:`AffineRoots`; the grid streams that QR over row chunks too):
normal equations formed from float32 moments would lose the square of the
source's condition number.

This module holds the public functions and re-exports the rest of the public
names from where they live: the types, moments, closed-form fits, scores and
their checks in :mod:`similarity._stitch_fit`, the compiled core and the moment
statistics in :mod:`similarity._stitch_core`, and the batched fit
:func:`fit_stitchers` in :mod:`similarity._stitch_batch`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._precision import full_precision
from funsim.similarity._stitch_batch import fit_stitchers
from funsim.similarity._stitch_core import (
    DEFAULT_SPLIT,
    score_program,
    stitch_core,
    stitch_moment_stats,
    warn_shared,
)
from funsim.similarity._stitch_fit import (
    FAMILIES,
    AffineRoots,
    HeldOutOverlapWarning,
    ReconstructionScore,
    Stitcher,
    affine_ambiguity,
    affine_roots,
    affine_system,
    ambiguity_threshold,
    check_fit_rows,
    check_options,
    check_ridge,
    fit_from_moments,
    fit_impl,
    held_out_ambiguity,
    layer_moments,
    normalise_option,
    pair_moments,
    raise_not_finite,
    ridge_array,
    ridge_in_range,
    roots_system,
    score_from_moments,
)
from funsim.similarity.moments import LayerMoments as LayerMoments
from funsim.similarity.moments import split_weights

__all__ = [
    "FAMILIES",
    "HeldOutOverlapWarning",
    "Stitcher",
    "apply_stitcher",
    "ReconstructionScore",
    "StitchingAsymmetry",
    "layer_moments",
    "pair_moments",
    "affine_system",
    "AffineRoots",
    "affine_roots",
    "roots_system",
    "affine_ambiguity",
    "fit_from_moments",
    "score_from_moments",
    "ambiguity_threshold",
    "held_out_ambiguity",
    "check_ridge",
    "fit_stitcher",
    "DEFAULT_SPLIT",
    "stitch_core",
    "reconstruction_score",
    "stitching_asymmetry",
    "fit_stitchers",
    "stitch_moment_stats",
]


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


# ----------------------------------------------------------------------------- public API


@functools.partial(jax.jit, static_argnames=("family", "normalize"))
def _fit_program(x, y, ridge, *, family, normalize):
    """One closed-form fit and its value checks: ``((weight, bias, scale), flags)``; ``ridge`` traced."""
    fx, fy = V.rep_flags(x), V.rep_flags(y)
    out = fit_impl(x, y, None, family=family, ridge=ridge, normalize=normalize)
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
    check_options(family, ridge)
    normalize = normalise_option(normalise, old_spelling, "fit_stitcher")
    x, y = V.check_pair(z_src, z_tgt, ("z_src", "z_tgt"), finite=False)
    check_fit_rows(x.shape[0], x.shape[1], family, ridge, "z_src")
    (weight, bias, scale), flags = _fit_program(
        x, y, ridge_array(ridge, x.dtype), family=family, normalize=bool(normalize)
    )
    weight, bias, scale = ridge_in_range(ridge, (weight, bias, scale))
    flags = V.fetch_flags(flags, x, y, ridge)
    if flags is not None:
        V.raise_pair_flags(flags["x"], flags["y"], x, y, ("z_src", "z_tgt"), what="the stitcher fit")
        if not flags["result"]:
            raise_not_finite("The fitted stitcher weight")
    return Stitcher(weight=weight, bias=bias, scale=scale, family=family)


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
    check_options(family, ridge)
    x, y = V.check_pair(z_src, z_tgt, ("z_src", "z_tgt"), finite=False)
    w_tr, w_te = split_weights(x.shape[0], split, key, x.dtype)
    check_fit_rows(int(round(float(np.sum(np.asarray(w_tr))))) if V.is_concrete(w_tr) else x.shape[0],
                    x.shape[1], family, ridge, "the train split")
    out, flags = score_program(x, y, w_tr, w_te, ridge_array(ridge, x.dtype), family=family)
    out = ridge_in_range(ridge, out)
    flags = V.fetch_flags(flags, x, y, w_tr, ridge)
    if flags is not None:
        protocol.raise_from_flags(stitch_core(family, ridge=ridge), flags, x, y, ("z_src", "z_tgt"))
        warn_shared(flags)
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


# ----------------------------------------------------------------------------- registry


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
        warn_shared(flags)
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
