"""Functional similarity by task-loss stitching (DESIGN.md §3).

Insert a stitcher ``g`` between model A's layer i and model B's layer j, run
B's frozen rest of network (its *tail*) on ``g(Z_A)``, and train only ``g``
with the task loss on a train split. How well B still does its task on a
held-out split, relative to B's own layer, is a functional similarity of the
two layers. With cross-entropies in nats, ``CE(stitched) - CE(B's own)`` reads
as the conditional usable information (Xu et al. 2020) about the labels that
B's layer has and A's layer, seen through the stitcher family, lacks.

Stitcher families are nested: ``orthogonal`` ⊂ ``scaled_orthogonal`` ⊂
``affine``. The orthogonal families are trained with the constraint built into
the parametrisation, never as a soft penalty: with ``m = max(d_src, d_tgt)``,

    Q = Q0 @ cayley(A),   cayley(A) = (I - A)^{-1} (I + A),   A = G - G^T  (G free),
    weight = Q[:d_src, :d_tgt]

where ``Q0`` is the ``(m, m)`` orthogonal starting point (the closed-form fit
completed to a square matrix, the identity, or a Haar-random rotation). The
Cayley transform of a skew-symmetric matrix is orthogonal (``I - A`` is always
invertible, with singular values >= 1), so ``weight`` has orthonormal columns
when ``d_src >= d_tgt`` and orthonormal rows when ``d_src < d_tgt`` at every
step, up to the rounding of one linear solve (about 1e-6 in float32). It
reaches every rotation of ``Q0`` by ``R`` in SO(m) without eigenvalue -1; in
particular, for square maps training stays in the connected component of
``Q0``, so a reflection is reachable from a closed-form or random start, not
from ``init="identity"``. (A Cayley map was chosen over ``expm``: its gradient
compiles about 6x faster and is as exact.)
``scaled_orthogonal`` multiplies by ``exp(log_scale)`` (a positive scale);
``affine`` is a free ``weight`` and ``bias``. Every family has a free bias.

Convolutional layers ``(n, H, W, C)`` (NHWC) are stitched by the same families
acting as 1x1 convolutions over channels. When the source and target spatial
sizes differ, the source is first resized by adaptive average pooling
(:func:`resize_spatial`, the bins of PyTorch's ``AdaptiveAvgPool2d``): output
cell ``i`` averages source rows ``floor(i H / H')`` to ``ceil((i + 1) H / H') - 1``
(the same along W). For integer ratios this is plain block averaging; when the
target is larger, cells are repeated (nearest neighbour). A dense target layer
``(n, d)`` takes a flattened source.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from similarity._validate import (
    as_float_array,
    check_choice,
    check_finite,
    check_int_labels,
)
from similarity.stitching import FAMILIES, Stitcher, fit_stitcher

INITS = ("closed_form", "identity", "random")
LOSSES = ("ce", "kl")
_CODE = {name: i for i, name in enumerate(FAMILIES)}
_DEFAULT_OPTIMIZER = optax.adam(1e-2)

__all__ = [
    "INITS",
    "LOSSES",
    "TrainHistory",
    "DirectionResult",
    "FunctionalSimilarity",
    "resize_spatial",
    "stitch_representation",
    "stitching_loss",
    "train_stitcher",
    "train_stitchers",
    "functional_similarity",
]


# ---------------------------------------------------------------------------
# Applying a stitcher to dense or NHWC activations
# ---------------------------------------------------------------------------


def _pool_matrix(n_in: int, n_out: int, dtype) -> np.ndarray:
    """Adaptive average-pooling matrix ``(n_out, n_in)``: row i averages its bin."""
    p = np.zeros((n_out, n_in))
    for i in range(n_out):
        lo = (i * n_in) // n_out
        hi = -((-(i + 1) * n_in) // n_out)  # ceil
        p[i, lo:hi] = 1.0 / (hi - lo)
    return p.astype(dtype)


def resize_spatial(z: ArrayLike, /, *, size: tuple[int, int]) -> jax.Array:
    """Resize NHWC activations to a spatial ``size`` by adaptive average pooling.

    Output cell ``(i, j)`` is the mean of source rows ``floor(i H / H')`` to
    ``ceil((i+1) H / H') - 1`` and the matching columns (PyTorch's
    ``AdaptiveAvgPool2d`` bins). Integer ratios give block averages; a larger
    target repeats cells. The map is linear and fixed (nothing is learned).

    Args:
      z: ``(n, H, W, C)``.
      size: ``(H', W')``, each >= 1.

    Returns:
      ``(n, H', W', C)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.arange(16.0).reshape(1, 4, 4, 1)
      >>> resize_spatial(z, size=(2, 2))[0, :, :, 0].tolist()
      [[2.5, 4.5], [10.5, 12.5]]
    """
    z = as_float_array(z, "z")
    if z.ndim != 4:
        raise ValueError(f"z must be NHWC activations (n, H, W, C), got shape {tuple(z.shape)}.")
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"size must be (H', W') with positive entries, got {size!r}.")
    _, h, w, _ = z.shape
    if (h, w) == tuple(size):
        return z
    ph = jnp.asarray(_pool_matrix(h, size[0], z.dtype))
    pw = jnp.asarray(_pool_matrix(w, size[1], z.dtype))
    return jnp.einsum("ih,jw,nhwc->nijc", ph, pw, z)


def _affine_channels(z: jax.Array, weight: jax.Array, scale, bias: jax.Array) -> jax.Array:
    """``scale * z @ weight + bias`` over the last axis of ``z`` (any rank)."""
    out = scale * jnp.einsum("...s,st->...t", z, weight)
    return out + bias.reshape((1,) * (out.ndim - 1) + bias.shape)


def stitch_representation(
    stitcher: Stitcher, z: ArrayLike, /, *, spatial: tuple[int, int] | None = None
) -> jax.Array:
    """Apply a stitcher to dense ``(n, d)`` or NHWC ``(n, H, W, C)`` activations.

    For NHWC input the stitcher acts as a 1x1 convolution over channels, after
    resizing to ``spatial`` with :func:`resize_spatial` when that is given and
    differs from ``(H, W)``.

    Args:
      stitcher: a :class:`~similarity.Stitcher` with ``weight (d_src, d_tgt)``.
      z: ``(n, d_src)`` or ``(n, H, W, d_src)``.
      spatial: optional target ``(H', W')`` for NHWC input.

    Returns:
      ``(n, d_tgt)`` or ``(n, H', W', d_tgt)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from similarity import Stitcher
      >>> s = Stitcher(jnp.eye(2), jnp.ones(2), jnp.asarray(2.0), "scaled_orthogonal")
      >>> stitch_representation(s, jnp.ones((1, 2, 2, 2)), spatial=(1, 1))[0, 0, 0].tolist()
      [3.0, 3.0]
    """
    z = as_float_array(z, "z")
    d_src = stitcher.weight.shape[0]
    if z.ndim not in (2, 4) or z.shape[-1] != d_src:
        raise ValueError(
            f"z must be (n, {d_src}) or NHWC (n, H, W, {d_src}) for a stitcher with weight "
            f"{tuple(stitcher.weight.shape)}, got shape {tuple(z.shape)}."
        )
    if spatial is not None:
        if z.ndim != 4:
            raise ValueError(f"spatial={spatial!r} needs NHWC z, got shape {tuple(z.shape)}.")
        z = resize_spatial(z, size=spatial)
    return _affine_channels(z, stitcher.weight, stitcher.scale, stitcher.bias)


# ---------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------


def _loss_from_logits(logits, y, teacher, loss: str) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    if loss == "ce":
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))
    logq = jax.nn.log_softmax(teacher, axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(logq) * (logq - logp), axis=-1))


def stitching_loss(
    stitcher: Stitcher,
    z_src: ArrayLike,
    y: ArrayLike,
    tail_fn: Callable[[jax.Array], jax.Array],
    /,
    *,
    loss: str = "ce",
    teacher_logits: ArrayLike | None = None,
) -> jax.Array:
    """Mean task loss of ``tail_fn(stitcher(z_src))``, in nats; differentiable in ``stitcher``.

    Args:
      stitcher: a :class:`~similarity.Stitcher`, ``weight (d_src, d_tgt)``.
      z_src: ``(n, d_src)`` or ``(n, H, W, d_src)`` source activations, already
        resized to the target's spatial size.
      y: ``(n,)`` integer labels (used by ``loss="ce"``).
      tail_fn: maps target-layer activations ``(n, ..., d_tgt)`` to logits ``(n, C)``.
      loss: ``"ce"`` (cross-entropy with ``y``) or ``"kl"`` (KL divergence from
        the softmax of ``teacher_logits`` to the stitched model's, per sample).
      teacher_logits: ``(n, C)``; required for ``loss="kl"``.

    Returns:
      ``()`` the mean loss.

    Examples:
      >>> import jax.numpy as jnp
      >>> from similarity import Stitcher
      >>> s = Stitcher(jnp.eye(2), jnp.zeros(2), jnp.asarray(1.0), "orthogonal")
      >>> z = jnp.array([[5.0, 0.0], [0.0, 5.0]])
      >>> float(stitching_loss(s, z, jnp.array([0, 1]), lambda h: h)) < 0.01
      True
    """
    check_choice(loss, "loss", LOSSES)
    y = jnp.asarray(y)
    if loss == "kl":
        if teacher_logits is None:
            raise ValueError('loss="kl" needs teacher_logits (n, C): model B\'s own logits.')
        teacher_logits = jnp.asarray(teacher_logits)
    logits = tail_fn(_affine_channels(jnp.asarray(z_src), stitcher.weight, stitcher.scale, stitcher.bias))
    return _loss_from_logits(logits, y, teacher_logits, loss)


# ---------------------------------------------------------------------------
# Parametrisation: params -> (weight, scale, bias); exact constraints
# ---------------------------------------------------------------------------


def _orthogonal_full(params, consts) -> jax.Array:
    """``(M, M)`` orthogonal matrix ``Q0 @ cayley(G - G^T)`` (masked to the stitcher's block)."""
    g = params["gen"]
    a = (g - g.T) * consts["mask"]
    eye = jnp.eye(a.shape[0], dtype=a.dtype)
    return consts["base"] @ jnp.linalg.solve(eye - a, eye + a)


def _materialise(params, consts, family: str, d_tgt: int):
    """Return ``(weight (D, T), scale (), bias (T,), Q_full (M, M) or None)``."""
    d_src = params["weight"].shape[0]
    one = jnp.ones((), params["bias"].dtype)
    if family == "affine":
        return params["weight"], one, params["bias"], None
    q = _orthogonal_full(params, consts)
    w_orth = q[:d_src, :d_tgt]
    if family == "orthogonal":
        return w_orth, one, params["bias"], q
    if family == "scaled_orthogonal":
        return w_orth, jnp.exp(params["log_scale"]), params["bias"], q
    # "mixed": the family is a per-stitcher code in consts (vmapped batches).
    code = consts["code"]
    is_affine = code == _CODE["affine"]
    weight = jnp.where(is_affine, params["weight"], w_orth)
    scale = jnp.where(
        code == _CODE["scaled_orthogonal"], jnp.exp(params["log_scale"]), one
    )
    return weight, scale, params["bias"], q


def _constraint_error(q, consts, family: str) -> jax.Array:
    """Max deviation of ``Q_full^T Q_full`` from I (0 for affine)."""
    if q is None:
        return jnp.zeros(())
    err = jnp.max(jnp.abs(q.T @ q - jnp.eye(q.shape[0], dtype=q.dtype)))
    if family == "mixed":
        err = jnp.where(consts["code"] == _CODE["affine"], 0.0, err)
    return err


def _objective(params, consts, z, y, teacher, *, tail_fn, family, loss, d_tgt):
    weight, scale, bias, q = _materialise(params, consts, family, d_tgt)
    logits = tail_fn(_affine_channels(z, weight, scale, bias))
    return _loss_from_logits(logits, y, teacher, loss), _constraint_error(q, consts, family)


def _chunk_one(params, opt_state, consts, key, active, z, y, teacher, start, total, *,
               tail_fn, optimizer, family, loss, d_tgt, batch_size, chunk):
    """``chunk`` optimizer steps of one stitcher (vmapped over stitchers by the caller)."""
    n = z.shape[0]
    grad_fn = jax.value_and_grad(
        functools.partial(_objective, tail_fn=tail_fn, family=family, loss=loss, d_tgt=d_tgt),
        has_aux=True,
    )

    def body(carry, i):
        params, opt_state = carry
        step = start + i
        live = jnp.logical_and(step < total, active)
        if batch_size is None:
            zb, yb, tb = z, y, teacher
        else:
            idx = jax.random.randint(jax.random.fold_in(key, step), (batch_size,), 0, n)
            zb, yb = z[idx], y[idx]
            tb = None if teacher is None else teacher[idx]
        (value, err), grads = grad_fn(params, consts, zb, yb, tb)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = functools.partial(jax.tree.map, lambda a, b: jnp.where(live, a, b))
        return (keep(new_params, params), keep(new_opt, opt_state)), (value, err)

    (params, opt_state), (values, errs) = jax.lax.scan(
        body, (params, opt_state), jnp.arange(chunk)
    )
    return params, opt_state, values, errs


_STATIC = ("tail_fn", "optimizer", "family", "loss", "d_tgt", "batch_size", "chunk")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _train_chunk(params, opt_state, consts, keys, active, z, y, teacher, start, total, *,
                 tail_fn, optimizer, family, loss, d_tgt, batch_size, chunk):
    fn = functools.partial(_chunk_one, tail_fn=tail_fn, optimizer=optimizer, family=family,
                           loss=loss, d_tgt=d_tgt, batch_size=batch_size, chunk=chunk)
    return jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None))(
        params, opt_state, consts, keys, active, z, y, teacher, start, total
    )


@functools.partial(jax.jit, static_argnames=("tail_fn", "family", "loss", "d_tgt"))
def _eval_losses(params, consts, z, y, teacher, *, tail_fn, family, loss, d_tgt):
    fn = functools.partial(_objective, tail_fn=tail_fn, family=family, loss=loss, d_tgt=d_tgt)
    return jax.vmap(lambda p, c, zz: fn(p, c, zz, y, teacher)[0])(params, consts, z)


def _materialise_numpy(params, consts, i: int, family: str, d_src: int, d_tgt: int):
    """Stitcher ``i``'s ``(weight (d_src, d_tgt), scale, bias)`` in float64 NumPy.

    The same map as :func:`_materialise`, evaluated once after training without
    compiling anything.
    """
    p = {k: np.asarray(v[i], np.float64) for k, v in params.items()}
    if family == "affine":
        return p["weight"][:d_src], 1.0, p["bias"]
    g = p["gen"]
    a = (g - g.T) * np.asarray(consts["mask"][i], np.float64)
    eye = np.eye(a.shape[0])
    q = np.asarray(consts["base"][i], np.float64) @ np.linalg.solve(eye - a, eye + a)
    scale = float(np.exp(p["log_scale"])) if family == "scaled_orthogonal" else 1.0
    return q[:d_src, :d_tgt], scale, p["bias"]


# ---------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------


def _complete_orthogonal(weight: np.ndarray) -> np.ndarray:
    """Complete a semi-orthogonal ``(d_s, d_t)`` block to an ``(m, m)`` orthogonal matrix."""
    d_s, d_t = weight.shape
    tall = d_s >= d_t
    u = weight if tall else weight.T  # (m, k) with orthonormal columns
    m, k = u.shape
    u, _ = np.linalg.qr(u)  # re-orthonormalise, keep the span
    u = u * np.sign(np.sum(u * (weight if tall else weight.T), axis=0))
    _, vecs = np.linalg.eigh(np.eye(m) - u @ u.T)  # eigenvalues: k zeros, then m - k ones
    full = np.concatenate([u, vecs[:, k:]], axis=1)
    return full if tall else full.T


def _init_one(family, init, d_src, d_tgt, m, z_src, z_tgt, ridge, key):
    """Unpadded params and base rotation for one stitcher (numpy)."""
    weight = np.eye(d_src, d_tgt)
    bias = np.zeros(d_tgt)
    scale = 1.0
    base = np.eye(m)
    if init == "closed_form":
        # Orthogonal families: raw-activation Procrustes (normalize=False), so that the
        # orthogonal family has scale 1. Affine: normalised fit, so `ridge` is scale-free.
        affine = family == "affine"
        fitted = fit_stitcher(z_src, z_tgt, family=family, ridge=ridge if affine else 0.0,
                              normalize=affine)
        weight, bias = np.asarray(fitted.weight, np.float64), np.asarray(fitted.bias, np.float64)
        scale = float(fitted.scale)
        if family != "affine":
            base = _complete_orthogonal(weight)
    elif init == "random":
        if family == "affine":
            weight = np.asarray(jax.random.normal(key, (d_src, d_tgt)), np.float64) / math.sqrt(d_src)
        else:
            g = np.asarray(jax.random.normal(key, (m, m)), np.float64)
            q, r = np.linalg.qr(g)
            base = q * np.sign(np.diag(r))
            weight = base[:d_src, :d_tgt]
    if family != "affine" and init == "identity":
        base = np.eye(m)
    if scale <= 0:
        raise ValueError(
            f"The closed-form {family} fit has scale {scale} <= 0 (the source is constant or "
            "uncorrelated with the target); use init='identity' or 'random'."
        )
    return dict(weight=weight, bias=bias, log_scale=np.log(scale)), base


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainHistory:
    """What happened while one stitcher trained.

    Attributes:
      train_loss: ``(steps_run,)`` the (minibatch) training loss before each step.
      constraint_error: ``(steps_run,)`` ``max |Q^T Q - I|`` of the square
        orthogonal matrix the weight is a block of, at each step (0 for affine).
      eval_steps: ``(n_evals,)`` step counts at which the held-out loss was measured.
      eval_loss: ``(n_evals,)`` the held-out loss there (empty without ``eval_data``).
      best_step: the step count of the returned parameters.
      stopped_early: whether early stopping ended training before ``steps``.
    """

    train_loss: np.ndarray
    constraint_error: np.ndarray
    eval_steps: np.ndarray
    eval_loss: np.ndarray
    best_step: int
    stopped_early: bool


def _target_shape(z_tgt, target_shape) -> tuple[int, ...]:
    if z_tgt is not None:
        return tuple(int(s) for s in np.shape(z_tgt)[1:])
    if target_shape is None:
        raise ValueError(
            "Pass z_tgt (model B's own target-layer activations, needed for "
            "init='closed_form') or target_shape (the per-sample target shape, e.g. (d_tgt,) "
            "or (H, W, C)) so the stitcher's output width is known."
        )
    return tuple(int(s) for s in target_shape)


def _prepare_source(z, name: str, tshape: tuple[int, ...], n: int | None) -> jax.Array:
    z = as_float_array(z, name)
    check_finite(z, name)
    if n is not None and z.shape[0] != n:
        raise ValueError(
            f"{name} has {z.shape[0]} samples (shape {tuple(z.shape)}) but the labels have {n}; "
            "rows must be the same inputs in the same order."
        )
    if len(tshape) == 1:
        if z.ndim < 2:
            raise ValueError(f"{name} must be (n, d) or (n, ..., C), got shape {tuple(z.shape)}.")
        return z.reshape(z.shape[0], -1)
    if len(tshape) == 3:
        if z.ndim != 4:
            raise ValueError(
                f"{name} has shape {tuple(z.shape)}, but the target layer is NHWC with per-sample "
                f"shape {tshape}: a conv target needs an NHWC source (n, H, W, C)."
            )
        return resize_spatial(z, size=tshape[:2])
    raise ValueError(f"Target per-sample shape {tshape} must be (d,) or (H, W, C).")


def _pad_stack(zs: Sequence[jax.Array], width: int) -> jax.Array:
    """Zero-pad each ``(n, ..., d_k)`` on the last axis to ``width`` and stack: ``(K, n, ..., width)``."""
    return jnp.stack([jnp.pad(z, [(0, 0)] * (z.ndim - 1) + [(0, width - z.shape[-1])]) for z in zs])


def _flat(z: jax.Array) -> jax.Array:
    return z.reshape(-1, z.shape[-1])


def train_stitchers(
    z_srcs_train: Sequence[ArrayLike],
    y_train: ArrayLike,
    tail_fn: Callable[[jax.Array], jax.Array],
    /,
    *,
    families: str | Sequence[str] = "affine",
    init: str = "closed_form",
    z_tgt: ArrayLike | None = None,
    target_shape: Sequence[int] | None = None,
    steps: int = 500,
    optimizer: optax.GradientTransformation | None = None,
    key: jax.Array | None = None,
    keys: Sequence[jax.Array] | None = None,
    loss: str = "ce",
    teacher_logits: ArrayLike | None = None,
    batch_size: int | None = None,
    eval_data: tuple | None = None,
    early_stopping: int | None = None,
    eval_every: int = 50,
    ridge: float = 1e-6,
    progress: bool = True,
) -> tuple[list[Stitcher], list[TrainHistory]]:
    """Train K stitchers into one target layer in a single vmapped, jitted loop.

    The stitchers may differ in source (any widths and spatial sizes: sources
    are zero-padded to a common width, with the orthogonal parametrisation
    masked so that each equals its unpadded fit), in family and in key. The
    result equals training each with :func:`train_stitcher` one by one.

    Args:
      z_srcs_train: K source activations, each ``(n, d_k)`` or NHWC ``(n, H_k, W_k, C_k)``.
      y_train: ``(n,)`` integer labels.
      tail_fn: model B's frozen rest of network: target activations
        ``(b, *target_shape)`` to logits ``(b, C)``. It is a static argument of
        the compiled loop (hashed by identity): arrays it closes over are baked
        in, so pass a new function after changing them.
      families: one family for all, or K families (see ``similarity.FAMILIES``).
      init: ``"closed_form"`` (start at :func:`~similarity.fit_stitcher`'s
        least-squares reconstruction of ``z_tgt``: ``normalize=False`` for the
        orthogonal families, so that ``orthogonal`` has scale 1; ``normalize=True``
        with ``ridge`` for ``affine``), ``"identity"`` (the padded identity block) or
        ``"random"`` (Haar-random rotation; Gaussian ``N(0, 1/d_src)`` affine weight).
      z_tgt: ``(n, *target_shape)`` model B's own target-layer activations on
        the same inputs; required for ``init="closed_form"``.
      target_shape: the per-sample target shape, ``(d_tgt,)`` or ``(H, W, C)``,
        when ``z_tgt`` is not given.
      steps: optimizer steps.
      optimizer: an optax transformation (default ``optax.adam(1e-2)``). Reuse
        the same object across calls to reuse the compiled loop.
      key: one key, split into K (default ``jax.random.key(0)``). Used for
        random inits and minibatch sampling.
      keys: K keys, instead of ``key``.
      loss: ``"ce"`` (task cross-entropy) or ``"kl"`` (to ``teacher_logits``).
      teacher_logits: ``(n, C)`` model B's own logits, for ``loss="kl"``.
      batch_size: minibatch size (indices drawn uniformly, with replacement, each step), or
        ``None`` for full-batch steps.
      eval_data: ``(z_srcs_eval, y_eval)`` or ``(z_srcs_eval, y_eval,
        teacher_logits_eval)``, with K held-out source arrays; the held-out loss
        is logged every ``eval_every`` steps.
      early_stopping: patience in evaluations; stop a stitcher when its held-out
        loss has not improved for that many evaluations and return its best
        parameters. Needs ``eval_data``.
      eval_every: steps per jitted chunk (``lax.scan``) and between evaluations.
      ridge: ridge of the closed-form affine init, in the scale-free units of
        :func:`~similarity.fit_stitcher` (the centred source has unit Frobenius
        norm). The small default keeps dead or collinear units (common in ReLU
        layers) from making the normal equations singular.
      progress: show a tqdm progress bar over the steps.

    Returns:
      ``(stitchers, histories)``: K :class:`~similarity.Stitcher` (acting on
      sources resized to the target's spatial size, see
      :func:`stitch_representation`) and K :class:`TrainHistory`.

    Raises:
      ValueError: unknown options, mismatched shapes or sample counts, missing
        ``z_tgt``/``teacher_logits``/``eval_data``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (64, 3))
      >>> y = (x[:, 0] > 0).astype(jnp.int32)
      >>> tail = lambda h: jnp.stack([-h[:, 0], h[:, 0]], axis=-1) * 5
      >>> sts, hists = train_stitchers([x, x[:, ::-1]], y, tail, families="orthogonal",
      ...                              init="identity", target_shape=(3,), steps=100,
      ...                              progress=False)
      >>> [bool(h.train_loss[-1] < h.train_loss[0]) for h in hists]
      [True, True]
    """
    if not isinstance(z_srcs_train, (list, tuple)) or len(z_srcs_train) == 0:
        raise TypeError(
            "z_srcs_train must be a non-empty list or tuple of source arrays; for one source use "
            "train_stitcher."
        )
    k_count = len(z_srcs_train)
    fams = (families,) * k_count if isinstance(families, str) else tuple(families)
    if len(fams) != k_count:
        raise ValueError(f"families has {len(fams)} entries but there are {k_count} sources.")
    for f in fams:
        check_choice(f, "family", FAMILIES)
    check_choice(init, "init", INITS)
    check_choice(loss, "loss", LOSSES)
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}.")
    if not isinstance(eval_every, (int, np.integer)) or eval_every < 1:
        raise ValueError(f"eval_every must be a positive int, got {eval_every!r}.")
    if early_stopping is not None and eval_data is None:
        raise ValueError("early_stopping needs eval_data=(z_srcs_eval, y_eval) held-out data.")
    if init == "closed_form" and z_tgt is None:
        raise ValueError(
            "init='closed_form' needs z_tgt: model B's own target-layer activations on the same "
            "training inputs. Pass z_tgt, or use init='identity' or 'random' with target_shape."
        )

    y = check_int_labels(y_train, "y_train")
    n = y.shape[0]
    tshape = _target_shape(z_tgt, target_shape)
    d_tgt = tshape[-1]
    srcs = [_prepare_source(z, f"z_srcs_train[{i}]", tshape, n) for i, z in enumerate(z_srcs_train)]
    dtype = jnp.result_type(*srcs)
    out = jax.eval_shape(tail_fn, jax.ShapeDtypeStruct((2, *tshape), dtype))
    if getattr(out, "ndim", None) != 2:
        raise ValueError(
            f"tail_fn must map target activations (b, *{tshape}) to logits (b, C); it returned "
            f"{getattr(out, 'shape', type(out).__name__)} for b = 2."
        )
    n_classes = int(out.shape[1])
    y = check_int_labels(y, "y_train", n_classes=n_classes)
    if z_tgt is not None:
        z_tgt = as_float_array(z_tgt, "z_tgt")
        if z_tgt.shape[0] != n:
            raise ValueError(
                f"z_tgt has {z_tgt.shape[0]} samples (shape {tuple(z_tgt.shape)}) but y_train has {n}."
            )
    teacher = None
    if loss == "kl":
        if teacher_logits is None:
            raise ValueError('loss="kl" needs teacher_logits (n, C): model B\'s own logits.')
        teacher = as_float_array(teacher_logits, "teacher_logits").astype(dtype)
        if teacher.ndim != 2 or teacher.shape[0] != n:
            raise ValueError(
                f"teacher_logits must be (n, C) with n = {n}, got shape {tuple(teacher.shape)}."
            )
    if batch_size is not None:
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}.")
        if batch_size >= n:
            batch_size = None
    optimizer = _DEFAULT_OPTIMIZER if optimizer is None else optimizer

    if keys is None:
        keys = jax.random.split(jax.random.key(0) if key is None else key, k_count)
    else:
        keys = jnp.stack(list(keys)) if not hasattr(keys, "shape") else keys
        if keys.shape[0] != k_count:
            raise ValueError(f"keys has {keys.shape[0]} entries but there are {k_count} sources.")
    keys_init = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    # Initialise each stitcher unpadded, then pad to the common width.
    d_max = max(s.shape[-1] for s in srcs)
    m_max = max(d_max, d_tgt)
    plist, clist = [], []
    for i, (src, fam) in enumerate(zip(srcs, fams)):
        d_k = src.shape[-1]
        m_k = max(d_k, d_tgt)
        p, base = _init_one(
            fam, init, d_k, d_tgt, m_k,
            None if z_tgt is None else _flat(src),
            None if z_tgt is None else _flat(z_tgt),
            ridge, keys_init[i],
        )
        base_full = np.eye(m_max)
        base_full[:m_k, :m_k] = base
        mask = np.zeros((m_max, m_max))
        mask[:m_k, :m_k] = 1.0
        weight = np.zeros((d_max, d_tgt))
        weight[:d_k] = p["weight"]
        plist.append(dict(gen=np.zeros((m_max, m_max)), log_scale=np.asarray(p["log_scale"]),
                          weight=weight, bias=np.asarray(p["bias"])))
        clist.append(dict(base=base_full, mask=mask, code=np.asarray(_CODE[fam])))
    stack = lambda trees: jax.tree.map(lambda *a: jnp.asarray(np.stack(a)), *trees)  # noqa: E731
    params = jax.tree.map(lambda a: a.astype(dtype), stack(plist))
    consts = stack(clist)
    consts = dict(base=consts["base"].astype(dtype), mask=consts["mask"].astype(dtype),
                  code=consts["code"].astype(jnp.int32))
    z_all = _pad_stack(srcs, d_max)
    family = fams[0] if len(set(fams)) == 1 else "mixed"

    z_eval = y_eval = t_eval = None
    if eval_data is not None:
        if not isinstance(eval_data, tuple) or len(eval_data) not in (2, 3):
            raise TypeError("eval_data must be (z_srcs_eval, y_eval) or "
                            "(z_srcs_eval, y_eval, teacher_logits_eval).")
        z_ev_list = eval_data[0]
        y_eval = check_int_labels(eval_data[1], "eval_data[1] (y_eval)", n_classes=n_classes)
        if not isinstance(z_ev_list, (list, tuple)) or len(z_ev_list) != k_count:
            raise ValueError(f"eval_data[0] must be a list of {k_count} held-out source arrays.")
        evs = [_prepare_source(z, f"eval_data[0][{i}]", tshape, y_eval.shape[0])
               for i, z in enumerate(z_ev_list)]
        for i, (e, s) in enumerate(zip(evs, srcs)):
            if e.shape[1:] != s.shape[1:]:
                raise ValueError(f"eval_data[0][{i}] has per-sample shape {e.shape[1:]} but the "
                                 f"training source has {s.shape[1:]}.")
        z_eval = _pad_stack(evs, d_max).astype(dtype)
        if loss == "kl":
            if len(eval_data) != 3:
                raise ValueError('loss="kl" with eval_data needs (z_srcs_eval, y_eval, teacher_logits_eval).')
            t_eval = as_float_array(eval_data[2], "eval_data[2]").astype(dtype)

    opt_state = jax.vmap(optimizer.init)(params)
    z_all = z_all.astype(dtype)
    active = np.ones(k_count, bool)
    chunk = min(eval_every, steps)
    static = dict(tail_fn=tail_fn, optimizer=optimizer, family=family, loss=loss, d_tgt=d_tgt)
    ev_kw = dict(tail_fn=tail_fn, family=family, loss=loss, d_tgt=d_tgt)

    best_params = params
    best_loss = np.full(k_count, np.inf)
    best_step = np.zeros(k_count, int)
    stale = np.zeros(k_count, int)
    stopped_at = np.full(k_count, steps)
    ev_steps, ev_losses, tr_losses, tr_errs = [], [], [], []

    def evaluate(step):
        nonlocal best_params
        losses = np.asarray(_eval_losses(params, consts, z_eval, y_eval, t_eval, **ev_kw))
        ev_steps.append(step)
        ev_losses.append(losses)
        better = active & (losses < best_loss)
        best_params = jax.tree.map(
            lambda b, p: jnp.where(better.reshape((-1,) + (1,) * (p.ndim - 1)), p, b), best_params, params)
        best_loss[better] = losses[better]
        best_step[better] = step
        stale[:] = np.where(better, 0, stale + active)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"stitch x{k_count}", leave=False)
    if z_eval is not None:
        evaluate(0)
    start = 0
    try:
        while start < steps and active.any():
            params, opt_state, vals, errs = _train_chunk(
                params, opt_state, consts, keys, jnp.asarray(active), z_all, y, teacher,
                jnp.asarray(start), jnp.asarray(steps), batch_size=batch_size, chunk=chunk, **static)
            tr_losses.append(np.where(active[:, None], np.asarray(vals), np.nan))
            tr_errs.append(np.where(active[:, None], np.asarray(errs), np.nan))
            start = min(start + chunk, steps)
            if bar is not None:
                bar.update(start - bar.n)
            if z_eval is not None:
                evaluate(start)
                if early_stopping is not None:
                    done = active & (stale >= early_stopping)
                    stopped_at[done] = start
                    active = active & ~done
    finally:
        if bar is not None:
            bar.close()

    final = best_params if early_stopping is not None else params
    tl = np.concatenate(tr_losses, axis=1)[:, :steps]
    te = np.concatenate(tr_errs, axis=1)[:, :steps]
    stitchers, histories = [], []
    for i, (src, fam) in enumerate(zip(srcs, fams)):
        weight, scale, bias = _materialise_numpy(final, consts, i, fam, src.shape[-1], d_tgt)
        stitchers.append(Stitcher(jnp.asarray(weight, dtype), jnp.asarray(bias, dtype),
                                  jnp.asarray(scale, dtype), fam))
        ran = int(stopped_at[i])
        histories.append(TrainHistory(
            train_loss=tl[i, :ran], constraint_error=te[i, :ran],
            eval_steps=np.asarray([s for s in ev_steps if s <= ran], int),
            eval_loss=np.asarray([e[i] for s, e in zip(ev_steps, ev_losses) if s <= ran]),
            best_step=int(best_step[i]) if early_stopping is not None else ran,
            stopped_early=bool(ran < steps),
        ))
    return stitchers, histories


def train_stitcher(
    z_src_train: ArrayLike,
    y_train: ArrayLike,
    tail_fn: Callable[[jax.Array], jax.Array],
    /,
    *,
    family: str = "affine",
    init: str = "closed_form",
    z_tgt: ArrayLike | None = None,
    target_shape: Sequence[int] | None = None,
    steps: int = 500,
    optimizer: optax.GradientTransformation | None = None,
    key: jax.Array | None = None,
    loss: str = "ce",
    teacher_logits: ArrayLike | None = None,
    batch_size: int | None = None,
    eval_data: tuple | None = None,
    early_stopping: int | None = None,
    eval_every: int = 50,
    ridge: float = 1e-6,
    progress: bool = True,
) -> tuple[Stitcher, TrainHistory]:
    """Train one stitcher from a source layer into model B's layer with the task loss.

    Only the stitcher is trained; ``tail_fn`` (B's rest of network) is frozen.
    The orthogonal families stay exactly (semi-)orthogonal at every step (see
    the module docstring). The loop is a pure jitted step, run as
    ``lax.scan`` over chunks of ``eval_every`` steps.

    Args:
      z_src_train: ``(n, d_src)`` or NHWC ``(n, H, W, C_src)`` source activations.
      y_train: ``(n,)`` integer labels.
      tail_fn: target activations ``(b, *target_shape)`` to logits ``(b, C)``.
      family: ``"orthogonal"``, ``"scaled_orthogonal"`` or ``"affine"``.
      init, z_tgt, target_shape, steps, optimizer, key, loss, teacher_logits,
      batch_size, early_stopping, eval_every, ridge, progress: as in
        :func:`train_stitchers`.
      eval_data: ``(z_src_eval, y_eval)`` or ``(z_src_eval, y_eval, teacher_logits_eval)``.

    Returns:
      ``(stitcher, history)``: a :class:`~similarity.Stitcher` with ``weight
      (d_src, d_tgt)`` (channels for NHWC) and a :class:`TrainHistory`.

    Raises:
      ValueError: see :func:`train_stitchers`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (64, 2))
      >>> y = (x[:, 0] > 0).astype(jnp.int32)
      >>> tail = lambda h: jnp.stack([-h[:, 0], h[:, 0]], axis=-1) * 5
      >>> s, hist = train_stitcher(x[:, ::-1], y, tail, family="orthogonal", init="identity",
      ...                          target_shape=(2,), steps=200, progress=False)
      >>> bool(jnp.allclose(s.weight.T @ s.weight, jnp.eye(2), atol=1e-5))
      True
      >>> bool(hist.train_loss[-1] < 0.5 * hist.train_loss[0])
      True
    """
    if eval_data is not None:
        if not isinstance(eval_data, tuple) or len(eval_data) not in (2, 3):
            raise TypeError("eval_data must be (z_src_eval, y_eval) or "
                            "(z_src_eval, y_eval, teacher_logits_eval).")
        eval_data = ([eval_data[0]],) + tuple(eval_data[1:])
    stitchers, histories = train_stitchers(
        [z_src_train], y_train, tail_fn, families=family, init=init, z_tgt=z_tgt,
        target_shape=target_shape, steps=steps, optimizer=optimizer,
        keys=None if key is None else jnp.stack([key]), loss=loss,
        teacher_logits=teacher_logits, batch_size=batch_size, eval_data=eval_data,
        early_stopping=early_stopping, eval_every=eval_every, ridge=ridge, progress=progress,
    )
    return stitchers[0], histories[0]


# ---------------------------------------------------------------------------
# Functional similarity of two models' layers
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DirectionResult:
    """One stitching direction, source layer -> target model, scored on held-out data.

    Attributes:
      source, target: ``"A:layer"`` and ``"B:layer"`` labels.
      family: the stitcher family.
      n_train, n_eval: samples used to fit the stitcher and to score it.
      own_accuracy, stitched_accuracy: held-out accuracy of the target model
        with its own layer, and with the stitched source layer.
      relative_accuracy: ``stitched_accuracy / own_accuracy``.
      own_ce, stitched_ce: held-out mean cross-entropies in nats.
      ce_gap: ``stitched_ce - own_ce`` (nats): the usable information about the
        labels that the target layer has and the source layer, through this
        family, lacks. Near 0 means the source layer is functionally as good.
      relative_ce: ``stitched_ce / own_ce``.
      train_stitched_accuracy, train_stitched_ce: the same on the training
        split (in-sample, optimistic; shown for diagnosis, not the score).
      stitcher: the trained :class:`~similarity.Stitcher`.
      history: its :class:`TrainHistory`.
    """

    source: str
    target: str
    family: str
    n_train: int
    n_eval: int
    own_accuracy: float
    stitched_accuracy: float
    relative_accuracy: float
    own_ce: float
    stitched_ce: float
    ce_gap: float
    relative_ce: float
    train_stitched_accuracy: float
    train_stitched_ce: float
    stitcher: Stitcher = dataclasses.field(repr=False)
    history: TrainHistory = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class FunctionalSimilarity:
    """Task-loss stitching in both directions between two layers.

    Attributes:
      a_to_b: A's layer stitched into B (scored with B's tail and B's own accuracy).
      b_to_a: B's layer stitched into A, or ``None`` when one direction was asked.
    """

    a_to_b: DirectionResult
    b_to_a: DirectionResult | None

    @property
    def accuracy_asymmetry(self) -> float:
        """``relative_accuracy(A->B) - relative_accuracy(B->A)``; > 0: A's layer serves B better."""
        self._need_reverse()
        return self.a_to_b.relative_accuracy - self.b_to_a.relative_accuracy

    @property
    def ce_asymmetry(self) -> float:
        """``ce_gap(B->A) - ce_gap(A->B)`` in nats; > 0: B's layer lacks more of what A needs."""
        self._need_reverse()
        return self.b_to_a.ce_gap - self.a_to_b.ce_gap

    def _need_reverse(self):
        if self.b_to_a is None:
            raise ValueError("Only one direction was computed; call with both_directions=True.")

    def summary(self) -> str:
        """A small fixed-width table of both directions and the asymmetry."""
        d = self.a_to_b
        lines = [
            f"Functional similarity by task-loss stitching ({d.family}; fit on {d.n_train}, "
            f"scored on {d.n_eval} held-out samples)",
            f"{'direction':<24} {'own acc':>8} {'stitch acc':>10} {'rel acc':>8} "
            f"{'own CE':>8} {'stitch CE':>9} {'CE gap':>8}",
        ]
        for r in (self.a_to_b, self.b_to_a):
            if r is None:
                continue
            lines.append(
                f"{r.source + ' -> ' + r.target:<24} {r.own_accuracy:>8.3f} "
                f"{r.stitched_accuracy:>10.3f} {r.relative_accuracy:>8.3f} {r.own_ce:>8.3f} "
                f"{r.stitched_ce:>9.3f} {r.ce_gap:>8.3f}"
            )
        if self.b_to_a is not None:
            lines.append(
                f"asymmetry: rel acc (A->B) - (B->A) = {self.accuracy_asymmetry:+.3f}; "
                f"CE gap (B->A) - (A->B) = {self.ce_asymmetry:+.3f} nats"
            )
        return "\n".join(lines)

    __str__ = summary


def _check_layer(model, layer, arg: str, model_arg: str) -> None:
    for attr in ("features", "tail", "layer_names"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(
                f"{model_arg} must have .features(x) -> {{layer: activations}}, .tail(layer, z) "
                f"-> logits and .layer_names(); {type(model).__name__} has no callable .{attr}."
            )
    names = list(model.layer_names())
    if layer not in names:
        raise ValueError(
            f"{arg}={layer!r} is not a layer of {model_arg}; its layers are: "
            f"{', '.join(repr(x) for x in names)}."
        )


def _split_data(data, test_fraction, min_eval, key):
    if (isinstance(data, (tuple, list)) and len(data) == 2
            and all(isinstance(p, (tuple, list)) for p in data)):
        (x_tr, y_tr), (x_te, y_te) = data
        parts = [(np.asarray(x_tr), np.asarray(y_tr), "train"), (np.asarray(x_te), np.asarray(y_te), "test")]
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = np.asarray(data[0]), np.asarray(data[1])
        parts = [(x, y, "")]
    else:
        raise TypeError("data must be (x, y) or ((x_train, y_train), (x_test, y_test)).")
    for x, y, what in parts:
        tag = f" ({what} split)" if what else ""
        if y.ndim != 1:
            raise ValueError(f"data labels{tag} must be 1-D (n,), got shape {tuple(y.shape)}.")
        if x.ndim < 2 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"data inputs{tag} must be (n, ...) with the same n as the labels {tuple(y.shape)}, "
                f"got shape {tuple(x.shape)}."
            )
        check_int_labels(y, f"data labels{tag}")
    if len(parts) == 2:
        if parts[0][0].shape[1:] != parts[1][0].shape[1:]:
            raise ValueError(f"train and test inputs differ in per-sample shape: "
                             f"{parts[0][0].shape[1:]} vs {parts[1][0].shape[1:]}.")
        (x_tr, y_tr, _), (x_te, y_te, _) = parts
    else:
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.")
        n = y.shape[0]
        perm = np.asarray(jax.random.permutation(key, n))
        n_te = int(round(test_fraction * n))
        x_tr, y_tr, x_te, y_te = x[perm[n_te:]], y[perm[n_te:]], x[perm[:n_te]], y[perm[:n_te]]
    if y_te.shape[0] < min_eval:
        raise ValueError(
            f"Only {y_te.shape[0]} held-out samples, fewer than min_eval_samples={min_eval}: "
            "the held-out accuracy and cross-entropy would be too noisy. Pass more data, a larger "
            "test_fraction, or lower min_eval_samples."
        )
    if y_tr.shape[0] < 2:
        raise ValueError(f"Only {y_tr.shape[0]} training samples; pass more data.")
    return x_tr, y_tr, x_te, y_te


def _scores(logits, y):
    logits = np.asarray(logits, np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    ce = float(-np.mean(logp[np.arange(len(y)), y]))
    acc = float(np.mean(np.argmax(logits, axis=-1) == y))
    return acc, ce


def _features(model, layer, x, arg):
    feats = model.features(x)
    if layer not in feats:
        raise ValueError(f"{arg}.features(x) has no entry {layer!r}; it returned {sorted(feats)}.")
    z = jnp.asarray(feats[layer])
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"{arg}.features(x)[{layer!r}] has shape {tuple(z.shape)}; expected "
                         f"{x.shape[0]} rows, one per input.")
    return z


def _direction(src_name, tgt_name, z_src, z_tgt, tgt_model, tgt_layer, y_tr, y_te, sl_tr, sl_te,
               own_tr, own_te, *, family, early_stopping, val_fraction, key, train_kw):
    tail = lambda z: tgt_model.tail(tgt_layer, z)  # noqa: E731  fresh per call: no stale cache
    src_tr, src_te = z_src[sl_tr], z_src[sl_te]
    tgt_tr = z_tgt[sl_tr]
    fit_idx = np.arange(y_tr.shape[0])
    eval_data = None
    if early_stopping is not None:
        n_val = max(1, int(round(val_fraction * y_tr.shape[0])))
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 7), y_tr.shape[0]))
        val_idx, fit_idx = perm[:n_val], perm[n_val:]
        eval_data = (src_tr[val_idx], y_tr[val_idx])
        if train_kw["loss"] == "kl":
            eval_data += (own_tr[val_idx],)
    stitcher, history = train_stitcher(
        src_tr[fit_idx], y_tr[fit_idx], tail, family=family, z_tgt=tgt_tr[fit_idx],
        teacher_logits=own_tr[fit_idx] if train_kw["loss"] == "kl" else None,
        eval_data=eval_data, early_stopping=early_stopping, key=key, **train_kw,
    )
    tshape = tuple(tgt_tr.shape[1:])
    stitched = lambda z: tail(_affine_channels(  # noqa: E731
        _prepare_source(z, "source", tshape, None), stitcher.weight, stitcher.scale, stitcher.bias))
    own_acc, own_ce = _scores(own_te, y_te)
    st_acc, st_ce = _scores(stitched(src_te), y_te)
    tr_acc, tr_ce = _scores(stitched(src_tr), y_tr)
    if own_acc == 0:
        raise ValueError(f"{tgt_name} has held-out accuracy 0, so relative accuracy is undefined; "
                         "check that the model is trained and the labels match its outputs.")
    return DirectionResult(
        source=src_name, target=tgt_name, family=family, n_train=int(fit_idx.shape[0]),
        n_eval=int(y_te.shape[0]), own_accuracy=own_acc, stitched_accuracy=st_acc,
        relative_accuracy=st_acc / own_acc, own_ce=own_ce, stitched_ce=st_ce,
        ce_gap=st_ce - own_ce, relative_ce=st_ce / own_ce if own_ce > 0 else math.inf,
        train_stitched_accuracy=tr_acc, train_stitched_ce=tr_ce, stitcher=stitcher,
        history=history,
    )


def functional_similarity(
    model_a: Any,
    layer_a: str,
    model_b: Any,
    layer_b: str,
    data: tuple,
    /,
    *,
    family: str = "affine",
    both_directions: bool = True,
    init: str = "closed_form",
    loss: str = "ce",
    steps: int = 500,
    optimizer: optax.GradientTransformation | None = None,
    batch_size: int | None = None,
    test_fraction: float = 0.25,
    min_eval_samples: int = 20,
    early_stopping: int | None = None,
    val_fraction: float = 0.15,
    eval_every: int = 50,
    ridge: float = 1e-6,
    key: jax.Array | None = None,
    progress: bool = True,
) -> FunctionalSimilarity:
    """Stitch A's ``layer_a`` into B at ``layer_b`` (and back), fit on train, score held out.

    The models are duck-typed: each needs ``.features(x) -> {layer: activations}``,
    ``.tail(layer, z) -> logits`` (its frozen rest of network from that layer)
    and ``.layer_names()``. Both must output logits over the same label set.
    The stitcher is trained with :func:`train_stitcher` on the training split
    only (minus a validation split when ``early_stopping`` is set); every
    reported number is measured on the held-out test split.

    Args:
      model_a, model_b: the two models.
      layer_a, layer_b: layer names (see ``.layer_names()``).
      data: ``(x, y)``, split at random into train and test with
        ``test_fraction``, or an explicit ``((x_train, y_train), (x_test, y_test))``.
        ``x`` is whatever the models take, ``(n, ...)``; ``y`` is ``(n,)`` int.
      family: stitcher family, one of ``similarity.FAMILIES``.
      both_directions: also stitch B's layer into A (needed for the asymmetry).
      init, loss, steps, optimizer, batch_size, eval_every, ridge, progress: as in
        :func:`train_stitcher`. With ``loss="kl"`` the teacher is the target
        model's own logits.
      test_fraction: held-out fraction when ``data`` is ``(x, y)``.
      min_eval_samples: fewest held-out samples accepted.
      early_stopping: patience (in evaluations every ``eval_every`` steps) on a
        validation split of ``val_fraction`` of the training data.
      key: randomness for the split, inits and minibatches (default ``jax.random.key(0)``).

    Returns:
      A :class:`FunctionalSimilarity` (``print`` it for a table).

    Raises:
      ValueError: unknown layer (the valid names are listed), wrongly shaped data,
        too few held-out samples, models with different label sets.
      TypeError: a model without ``features``/``tail``/``layer_names``.

    Examples:
      >>> import jax.numpy as jnp, numpy as np
      >>> class Linear:  # a toy "model": layer "h" = x, logits = 4 * h
      ...     def layer_names(self): return ("h",)
      ...     def features(self, x): return {"h": x}
      ...     def tail(self, layer, z): return 4.0 * z
      >>> x = np.random.default_rng(0).normal(size=(200, 3))
      >>> y = np.argmax(x, axis=1)
      >>> res = functional_similarity(Linear(), "h", Linear(), "h", (x, y), family="orthogonal",
      ...                             init="identity", steps=20, progress=False)
      >>> bool(res.a_to_b.relative_accuracy > 0.95), bool(abs(res.b_to_a.ce_gap) < 0.05)
      (True, True)
    """
    _check_layer(model_a, layer_a, "layer_a", "model_a")
    _check_layer(model_b, layer_b, "layer_b", "model_b")
    check_choice(family, "family", FAMILIES)
    key = jax.random.key(0) if key is None else key
    k_split, k_ab, k_ba = jax.random.split(key, 3)
    x_tr, y_tr, x_te, y_te = _split_data(data, test_fraction, min_eval_samples, k_split)
    x_all = np.concatenate([x_tr, x_te])
    n_tr = y_tr.shape[0]
    sl_tr, sl_te = slice(0, n_tr), slice(n_tr, None)
    za = _features(model_a, layer_a, x_all, "model_a")
    zb = _features(model_b, layer_b, x_all, "model_b")
    own_a = np.asarray(model_a.tail(layer_a, za))
    own_b = np.asarray(model_b.tail(layer_b, zb))
    if own_a.ndim != 2 or own_b.ndim != 2 or own_a.shape[1] != own_b.shape[1]:
        raise ValueError(
            f"model_a and model_b must predict the same label set: their logits have shapes "
            f"{own_a.shape} and {own_b.shape}. Stitching compares models trained on the same task."
        )
    y_max = int(max(y_tr.max(), y_te.max()))
    if y_max >= own_b.shape[1] or int(min(y_tr.min(), y_te.min())) < 0:
        raise ValueError(f"data labels range up to {y_max} but the models predict "
                         f"{own_b.shape[1]} classes; labels must be in [0, {own_b.shape[1]}).")
    train_kw = dict(init=init, loss=loss, steps=steps, optimizer=optimizer, batch_size=batch_size,
                    eval_every=eval_every, ridge=ridge, progress=progress)
    common = dict(family=family, early_stopping=early_stopping, val_fraction=val_fraction,
                  train_kw=train_kw)
    name_a, name_b = f"A:{layer_a}", f"B:{layer_b}"
    ab = _direction(name_a, name_b, za, zb, model_b, layer_b, y_tr, y_te, sl_tr, sl_te,
                    own_b[sl_tr], own_b[sl_te], key=k_ab, **common)
    ba = None
    if both_directions:
        ba = _direction(name_b, name_a, zb, za, model_a, layer_a, y_tr, y_te, sl_tr, sl_te,
                        own_a[sl_tr], own_a[sl_te], key=k_ba, **common)
    return FunctionalSimilarity(a_to_b=ab, b_to_a=ba)
