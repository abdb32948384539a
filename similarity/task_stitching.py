"""Functional similarity by task-loss stitching (docs/design.md §3): the public functions.

Insert a stitcher ``g`` between a source layer (model A's layer i) and model
B's layer j, run B's frozen rest of network (its *tail*) on ``g(Z_A)``, and
train only ``g`` with the task loss on a train split. How well B still does
its task on held-out data, relative to B's own layer, is a functional
similarity of the two layers; ``CE(stitched) - CE(B's own)`` in nats reads as
the conditional usable information (Xu et al. 2020) about the labels that B's
layer has and A's layer, seen through the stitcher family, lacks. The
model-driving comparison of two layers in both directions, with data splits,
early stopping and a printed table, is ``models.functional``.

**The tail is a pure function plus data.** ``tail_apply(tail_params, h) ->
logits`` maps target-layer activations ``h (b, *target_shape)`` to logits
``(b, C)``; ``tail_params`` is any pytree of arrays. ``tail_apply`` is a static
argument of the compiled loop, so it must be hashable, and equal tails must
compare equal: a module-level function, or ``models.split_tail(model, layer)``
(a Flax NNX graphdef plus the layer name, equal for every model of the same
architecture). Then a second call with the same shapes, an equal tail (another
model of that architecture, or the same one re-split) and new optimiser
hyperparameters compiles nothing. A fresh ``lambda`` per call compiles again.
The optimiser is a *name* (``OPTIMIZERS``) plus numeric hyperparameters, which
are traced data.

**Families** are nested: ``orthogonal`` ⊂ ``scaled_orthogonal`` ⊂ ``affine``,
each with a free bias. The orthogonal families are exactly (semi-)orthogonal
at every step, by a Cayley parametrisation on the Stiefel manifold,
``U = Q0 (I - A)^{-1} (I + A) E``, ``A`` skew, ``Q0`` the start's orthogonal completion,
``E`` the first ``min(d_src, d_tgt)`` columns of the identity, ``weight = U`` (or ``U^T``
when ``d_src < d_tgt``; see :mod:`similarity._stitch_param`), never by a soft penalty;
``scaled_orthogonal`` multiplies by ``exp(log_scale)``.

**Convolutional layers** ``(n, H, W, C)`` (NHWC) are stitched by the same
families acting as 1x1 convolutions over channels. When the spatial sizes
differ, the source is first resized by adaptive average pooling
(:func:`resize_spatial`, PyTorch ``AdaptiveAvgPool2d`` bins). A dense target
layer ``(n, d)`` takes a flattened source.

The options (:class:`StitchTraining`) and result types are defined in
:mod:`similarity._stitch_options` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._precision import full_precision
from funsim.similarity._stitch_options import StitchTraining, TrainedStitcher, TrainHistory, training_options
from funsim.similarity._stitch_param import INITS, apply_channels, closed_form_starts, init_params, merge_families
from funsim.similarity._stitch_train import LOSSES, OPTIMIZERS, fit_loop, loss_from_logits
from funsim.similarity._validate import as_float_array, check_choice, check_finite, check_int_labels, is_concrete
from funsim.similarity.stitching import FAMILIES, Stitcher

__all__ = [
    "INITS",
    "LOSSES",
    "OPTIMIZERS",
    "StitchTraining",
    "TrainHistory",
    "TrainedStitcher",
    "resize_spatial",
    "stitch_representation",
    "stitching_loss",
    "train_stitcher",
    "train_stitchers",
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


@full_precision
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


@full_precision
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
      >>> from funsim.similarity import Stitcher
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
    return apply_channels(z, stitcher.weight, stitcher.scale, stitcher.bias)


@full_precision
def stitching_loss(
    stitcher: Stitcher,
    z_src: ArrayLike,
    y: ArrayLike,
    tail_apply: Callable[[Any, jax.Array], jax.Array],
    tail_params: Any,
    /,
    *,
    loss: str = "ce",
    teacher_logits: ArrayLike | None = None,
) -> jax.Array:
    """Mean task loss of ``tail_apply(tail_params, stitcher(z_src))`` in nats; differentiable.

    Args:
      stitcher: a :class:`~similarity.Stitcher`, ``weight (d_src, d_tgt)``.
      z_src: ``(n, d_src)`` or ``(n, H, W, d_src)`` source activations, already
        resized to the target's spatial size.
      y: ``(n,)`` integer labels (used by ``loss="ce"``).
      tail_apply: ``tail_apply(tail_params, h) -> logits (n, C)`` for target
        activations ``h (n, ..., d_tgt)``.
      tail_params: the tail's parameter pytree.
      loss: ``"ce"`` (cross-entropy with ``y``) or ``"kl"`` (KL divergence from
        the softmax of ``teacher_logits`` to the stitched model's, per sample).
      teacher_logits: ``(n, C)``; required for ``loss="kl"``.

    Returns:
      ``()`` the mean loss.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity import Stitcher
      >>> s = Stitcher(jnp.eye(2), jnp.zeros(2), jnp.asarray(1.0), "orthogonal")
      >>> z = jnp.array([[5.0, 0.0], [0.0, 5.0]])
      >>> head = lambda w, h: h @ w
      >>> float(stitching_loss(s, z, jnp.array([0, 1]), head, jnp.eye(2))) < 0.01
      True
    """
    check_choice(loss, "loss", LOSSES)
    if loss == "kl":
        if teacher_logits is None:
            raise ValueError('loss="kl" needs teacher_logits (n, C): model B\'s own logits.')
        teacher_logits = jnp.asarray(teacher_logits)
    h = apply_channels(jnp.asarray(z_src), stitcher.weight, stitcher.scale, stitcher.bias)
    return loss_from_logits(tail_apply(tail_params, h), jnp.asarray(y), teacher_logits, loss)



# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _target_shape(z_tgts, target_shape) -> tuple[int, ...]:
    """The per-sample target shape, from ``z_tgts (M, n, ...)`` or ``target_shape``."""
    if z_tgts is not None:
        return tuple(int(s) for s in z_tgts.shape[2:])
    if target_shape is None:
        raise ValueError(
            "Pass z_tgt (model B's own target-layer activations, needed for "
            "init='closed_form') or target_shape (the per-sample target shape, e.g. (d_tgt,) "
            "or (H, W, C)) so the stitcher's output width is known."
        )
    return tuple(int(s) for s in target_shape)


def _prepare_source(z, name: str, tshape: tuple[int, ...], n: int | None) -> jax.Array:
    """Validate a source and bring it to the target's form: flattened (dense) or resized (NHWC)."""
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


def _pad_stack(zs: Sequence[jax.Array], width: int, dtype) -> jax.Array:
    """Zero-pad each ``(n, ..., d_k)`` on the last axis to ``width``: ``(K, n, ..., width)``.

    On the host when the sources are concrete (one transfer, no compiled program per source width).
    """
    if is_concrete(*zs):
        host = [np.asarray(z, dtype=dtype) for z in zs]
        return jnp.asarray(np.stack([np.pad(z, [(0, 0)] * (z.ndim - 1) + [(0, width - z.shape[-1])]) for z in host]))
    pad = [jnp.pad(z, [(0, 0)] * (z.ndim - 1) + [(0, width - z.shape[-1])]) for z in zs]
    return jnp.stack(pad).astype(dtype)


def _n_tails(tail_params, stacked: bool) -> int:
    if not stacked:
        return 1
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree.leaves(tail_params)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "stacked_tails=True needs every leaf of tail_params to have the same leading axis "
            f"(the number of tails M); got leading sizes {sorted(map(str, sizes))}. Stack the "
            "tails with jax.tree.map(lambda *a: jnp.stack(a), *params)."
        )
    return sizes.pop()


def _per_tail(x, name: str, m: int, n: int, stacked: bool, what: str) -> jax.Array:
    """``(M, n, ...)`` from a per-tail ``(M, n, ...)`` or single ``(n, ...)`` array."""
    x = as_float_array(x, name)
    lead = (m, n) if stacked else (n,)
    if x.shape[: len(lead)] != lead:
        raise ValueError(
            f"{name} must be {what} with leading shape {lead} "
            f"({'tails, samples' if stacked else 'samples'}), got shape {tuple(x.shape)}."
        )
    return x if stacked else x[None]


def _keys(key, k_count: int) -> jax.Array:
    """K keys from one key (split) or K keys (as given)."""
    key = jax.random.key(0) if key is None else key
    if isinstance(key, (list, tuple)):
        key = jnp.stack(key)
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    single = key.ndim == (0 if typed else 1)
    if single:
        return jax.random.split(key, k_count)
    if key.shape[0] != k_count:
        raise ValueError(f"key holds {key.shape[0]} keys but there are {k_count} sources; pass "
                         "one key (it is split) or one per source.")
    return key


def _optimizer(opts: StitchTraining, dtype):
    """``(traced hyperparameters, static options)`` of the optimiser: numbers cast to ``dtype`` on the host."""
    hyper = {"learning_rate": opts.learning_rate}
    static = []
    for k, v in opts.optimizer_options:
        if isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)):
            hyper[k] = v  # a number: traced data
        else:
            static.append((k, v))  # e.g. nesterov=True: part of the compiled program
    return {k: jnp.asarray(np.asarray(v, dtype)) for k, v in hyper.items()}, tuple(static)


def _check_tail(tail_apply, tail_params, tshape, dtype, stacked) -> int:
    try:
        hash(tail_apply)
    except TypeError:
        raise TypeError(
            f"tail_apply must be hashable (it is a static argument of the compiled loop), got "
            f"{type(tail_apply).__name__}; use a module-level function or models.split_tail."
        ) from None
    # one tail's parameters as shapes only (indexing the stack would compile a program per leaf shape)
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), tail_params) \
        if stacked else tail_params
    out = jax.eval_shape(tail_apply, one, jax.ShapeDtypeStruct((2, *tshape), dtype))
    if getattr(out, "ndim", None) != 2:
        raise ValueError(
            f"tail_apply(tail_params, h) must map target activations h (b, *{tshape}) to logits "
            f"(b, C); it returned {getattr(out, 'shape', type(out).__name__)} for b = 2."
        )
    return int(out.shape[1])


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@full_precision
def train_stitchers(
    zs_src: Sequence[ArrayLike],
    y: ArrayLike,
    tail_apply: Callable[[Any, jax.Array], jax.Array],
    tail_params: Any,
    /,
    *,
    family: str | Sequence[str] = "affine",
    z_tgt: ArrayLike | None = None,
    target_shape: Sequence[int] | None = None,
    stacked_tails: bool = False,
    key: jax.Array | None = None,
    teacher_logits: ArrayLike | None = None,
    eval_data: tuple | None = None,
    label_groups: Sequence[Sequence[int] | None] | None = None,
    options: StitchTraining | None = None,
    **training: Any,
) -> list[TrainedStitcher]:
    """Train K stitchers into one target layer (of one or M stacked tails) in one compiled program.

    The stitchers may differ in source (any widths and spatial sizes: sources
    are zero-padded to width buckets, the call's widest width, a half of it, a
    quarter, ... on the CPU (a quarter, a sixteenth, ... on an accelerator, where
    arithmetic costs less than compiling a larger program), with the
    orthogonal parametrisation masked so that each
    equals its unpadded fit), in family and in key. Each width bucket is one
    vmapped ``lax.scan`` loop for the affine stitchers and one for the
    orthogonal ones, all in one jitted program: an ``orthogonal`` stitcher
    trains there as a scaled one whose scale is held at exactly 1. The
    result equals training each with :func:`train_stitcher` one by one. With ``stacked_tails=True``
    every source is also trained into each of M tails of one architecture at
    once (the tails vmapped), equal to M separate calls.

    Args:
      zs_src: K source activations, each ``(n, d_k)`` or NHWC ``(n, H_k, W_k, C_k)``.
      y: ``(n,)`` integer labels.
      tail_apply: ``tail_apply(tail_params, h) -> logits (b, C)`` for target
        activations ``h (b, *target_shape)``: model B's frozen rest of network.
        Hashable, and equal for equal tails (see the module docstring).
      tail_params: its parameter pytree; with ``stacked_tails``, every leaf has
        a leading axis of M tails.
      family: one family for all, or K families (see ``similarity.FAMILIES``).
      z_tgt: ``(n, *target_shape)`` model B's own target-layer activations on
        the same inputs (``(M, n, *target_shape)`` for stacked tails); required
        for ``init="closed_form"``.
      target_shape: the per-sample target shape, ``(d_tgt,)`` or ``(H, W, C)``,
        when ``z_tgt`` is not given.
      stacked_tails: ``tail_params`` holds M tails stacked on a leading axis.
      key: one key (split into K) or K keys (default ``jax.random.key(0)``);
        used for random inits and minibatch sampling, the same for every tail.
      teacher_logits: ``(n, C)`` model B's own logits (``(M, n, C)`` stacked), for ``loss="kl"``.
      eval_data: ``(zs_src_eval, y_eval)`` or ``(zs_src_eval, y_eval,
        teacher_logits_eval)``, with K held-out source arrays; the held-out
        loss is logged every ``eval_every`` steps (and early stopping watches it).
      label_groups: ``None`` (every stitcher on the tail's own task), or K
        entries, each ``None`` or a grouping of the tail's C classes: stitcher
        k then trains on the coarser task whose label for row i is
        ``label_groups[k][y[i]]``, through the same tail, with the coarse
        label's probability the summed softmax of its classes (``loss="ce"``
        only; held-out losses likewise). Stitchers of several tasks into one
        tail thus train in one compiled loop; a stitcher with ``None`` equals
        its call without groups.
      options: how the stitchers train: a :class:`StitchTraining` (default
        ``StitchTraining()``): init, steps, optimiser, loss, minibatches, early
        stopping, evaluation period and the closed-form init's ridge.
      **training: :class:`StitchTraining` fields as keyword arguments (``steps=100``),
        replacing those of ``options``.

    Returns:
      K :class:`TrainedStitcher` ``(stitcher, history)``, in source order. The
      stitchers act on sources resized to the target's spatial size (see
      :func:`stitch_representation`). For stacked tails every field has a
      leading M axis.

    Raises:
      ValueError: unknown options, mismatched shapes or sample counts, missing
        ``z_tgt``/``teacher_logits``/``eval_data``.
      TypeError: an unhashable ``tail_apply``, malformed ``zs_src``/``eval_data``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (64, 3))
      >>> y = (x[:, 0] > 0).astype(jnp.int32)
      >>> def tail(w, h): return h[:, :1] * w[None, :]  # logits (b, 2)
      >>> out = train_stitchers([x, x[:, ::-1]], y, tail, jnp.array([-5.0, 5.0]),
      ...                       family="orthogonal", init="identity", target_shape=(3,),
      ...                       steps=100)
      >>> [bool(h.train_loss[-1] < h.train_loss[0]) for _, h in out]
      [True, True]
    """
    fams = _families(zs_src, family)
    opts = training_options(options, training)
    _check_needs(opts, eval_data, z_tgt)
    stacked = bool(stacked_tails)
    data = _inputs(zs_src, y, tail_apply, tail_params, z_tgt, target_shape, stacked, key, teacher_logits,
                   eval_data, label_groups, opts)
    static = dict(tail_apply=tail_apply, optimizer=opts.optimizer, opt_static=data.opt_static, loss=opts.loss,
                  batch_size=data.batch_size, steps=int(opts.steps), chunk=int(min(opts.eval_every, opts.steps)),
                  patience=None if opts.early_stopping is None else int(opts.early_stopping))
    loop_families, widths, params, consts, members = _starts(fams, opts, data)
    z = tuple(_pad_stack([data.srcs[i] for i in idx], w, data.dtype) for idx, w in zip(members, widths))
    z_ev = None if data.evs is None else tuple(_pad_stack([data.evs[i] for i in idx], w, data.dtype)
                                               for idx, w in zip(members, widths))
    fitted, hist = fit_loop(
        params, consts, tuple(jnp.asarray(np.asarray(idx, np.int32)) for idx in members), data.keys, z, data.y,
        data.teacher, z_ev, data.y_eval, data.t_eval, data.tails, data.hyper, data.groups, family=loop_families,
        **static,
    )
    return _trained(fitted, hist, members, data, fams, stacked, static["chunk"], opts.steps)


# ---------------------------------------------------------------------------
# The steps of train_stitchers
# ---------------------------------------------------------------------------


def _families(zs_src, family) -> tuple[str, ...]:
    """The K checked families of :func:`train_stitchers`' K sources (one name for all, or K names)."""
    if not isinstance(zs_src, (list, tuple)) or len(zs_src) == 0:
        raise TypeError("zs_src must be a non-empty list or tuple of source arrays; for one "
                        "source use train_stitcher.")
    k_count = len(zs_src)
    fams = (family,) * k_count if isinstance(family, str) else tuple(family)
    if len(fams) != k_count:
        raise ValueError(f"family has {len(fams)} entries but there are {k_count} sources.")
    for f in fams:
        check_choice(f, "family", FAMILIES)
    return fams


def _check_needs(opts: StitchTraining, eval_data, z_tgt) -> None:
    """The data the options need: held-out data for early stopping, ``z_tgt`` for the closed-form init."""
    if opts.early_stopping is not None and eval_data is None:
        raise ValueError("early_stopping needs eval_data=(zs_src_eval, y_eval) held-out data.")
    if opts.init == "closed_form" and z_tgt is None:
        raise ValueError(
            "init='closed_form' needs z_tgt: model B's own target-layer activations on the same "
            "training inputs. Pass z_tgt, or use init='identity' or 'random' with target_shape."
        )


class _Inputs(NamedTuple):
    """:func:`train_stitchers`' data, checked and prepared (see :func:`_inputs`)."""

    y: jax.Array  # (n,) labels
    srcs: list  # K sources in the target's form (flattened or resized), unpadded
    dtype: Any
    m_count: int  # tails
    z_tgts: jax.Array | None  # (M, n, *tshape)
    tshape: tuple[int, ...]
    teacher: jax.Array | None  # (M, n, C) for loss="kl"
    groups: np.ndarray | None  # (K, C) label groupings
    batch_size: int | None  # None: full-batch steps
    hyper: dict  # the optimiser's traced hyperparameters
    opt_static: tuple  # its static options
    keys: jax.Array  # (K,) keys
    evs: list | None  # K held-out sources
    y_eval: jax.Array | None
    t_eval: jax.Array | None
    tails: Any  # the tails' parameters with a leading M axis


def _inputs(zs_src, y, tail_apply, tail_params, z_tgt, target_shape, stacked: bool, key, teacher_logits,
            eval_data, label_groups, opts: StitchTraining) -> _Inputs:
    """Check and prepare :func:`train_stitchers`' data, in the order of its messages: labels, tails,
    targets, sources, the tail's output, label groups, teacher, optimiser, keys, held-out data."""
    k_count = len(zs_src)
    y = check_int_labels(y, "y")
    n = y.shape[0]
    m_count = _n_tails(tail_params, stacked)
    z_tgts = None
    if z_tgt is not None:
        z_tgts = _per_tail(z_tgt, "z_tgt", m_count, n, stacked, "target activations")
    tshape = _target_shape(z_tgts, target_shape)
    # a source given several times (e.g. for several families or tasks) is checked and prepared once, and
    # its closed-form starts are fitted once (see similarity._stitch_param._closed_form)
    prepared: dict[int, jax.Array] = {}
    srcs = [prepared[id(z)] if id(z) in prepared else prepared.setdefault(id(z), _prepare_source(
        z, f"zs_src[{i}]", tshape, n)) for i, z in enumerate(zs_src)]
    dtype = jnp.result_type(*srcs)
    n_classes = _check_tail(tail_apply, tail_params, tshape, dtype, stacked)
    y = check_int_labels(y, "y", n_classes=n_classes)
    groups = _label_groups(label_groups, k_count, n_classes, opts.loss)
    teacher = None
    if opts.loss == "kl":
        if teacher_logits is None:
            raise ValueError('loss="kl" needs teacher_logits (n, C): model B\'s own logits.')
        teacher = _per_tail(teacher_logits, "teacher_logits", m_count, n, stacked, "logits")
        teacher = teacher.astype(dtype)
    batch_size = opts.batch_size
    if batch_size is not None and batch_size >= n:
        batch_size = None
    hyper, opt_static = _optimizer(opts, dtype)
    keys = _keys(key, k_count)
    evs = y_eval = t_eval = None
    if eval_data is not None:
        evs, y_eval, t_eval = _eval_data(eval_data, srcs, tshape, n_classes, m_count, stacked, opts.loss)
        t_eval = None if t_eval is None else t_eval.astype(dtype)
    tails = jax.tree.map(lambda a: jnp.asarray(a) if stacked else jnp.asarray(a)[None], tail_params)
    return _Inputs(y, srcs, dtype, m_count, z_tgts, tshape, teacher, groups, batch_size, hyper, opt_static, keys,
                   evs, y_eval, t_eval, tails)


def _width_buckets(widths: Sequence[int], ratio: int = 4) -> list[int]:
    """The padded width of each source in a ``train_stitchers`` call: the smallest of the call's widest
    width, that width divided by ``ratio``, by ``ratio`` squared, ... (rounded up, down to 8) that holds
    the source.

    Sources of one bucket train as one vmapped loop, padded to the bucket's width; the buckets are loops
    of the same compiled program (more buckets: a larger program, not more programs). The work of an
    orthogonal stitcher grows with its padded width, so a narrow source beside a flattened conv map does
    not pay for the map's width, and padding leaves every stitcher unchanged. :func:`_bucket_ratio` picks
    ``ratio`` for the backend.

    Examples:
      >>> _width_buckets([10, 64, 256, 2048])
      [32, 128, 512, 2048]
      >>> _width_buckets([10, 64, 256, 2048], ratio=2)
      [16, 64, 256, 2048]
    """
    if int(ratio) < 2:
        raise ValueError(f"ratio must be an int >= 2, got {ratio!r}.")
    ladder = [max(int(w) for w in widths)]
    while ladder[-1] > 8:
        ladder.append(max(-(-ladder[-1] // int(ratio)), 8))
    return [min(b for b in ladder if b >= w) for w in widths]


def _bucket_ratio() -> int:
    """The width-bucket ladder's ratio for the default backend: 2 on the CPU, 4 elsewhere.

    Halves on the CPU, where a training step's arithmetic is what costs: 80 orthogonal stitchers of 10 to
    2,048 features into a 256-wide layer of two tails took 1.42 s a step in halving buckets against 2.14 s
    in quartering ones (1.5x), for about 11 s more compiling (``python -m benchmarks.bench_task_stitch
    --only buckets --before 611dd9c``), so halving wins from about 16 steps on (the default is 500). On an
    accelerator the arithmetic is cheap and a larger program compiles longer, so quartering stays there.
    """
    return 2 if jax.default_backend() == "cpu" else 4


def _starts(fams: tuple[str, ...], opts: StitchTraining, data: _Inputs):
    """``(loop families, widths, params, consts, members)``: the loop groups of one compiled program.

    A group is one width bucket (:func:`_width_buckets`) of affine stitchers, or of orthogonal ones (the
    two orthogonal families merged: similarity._stitch_param.merge_families); each family's start is
    computed on the host, padded to its bucket's width. ``members[g]`` are group ``g``'s stitchers'
    indices in the call's source order, increasing."""
    init = opts.init
    keys_init = jax.vmap(lambda k: jax.random.fold_in(k, 1))(data.keys) if init == "random" else None
    subs = {f: [i for i, g in enumerate(fams) if g == f] for f in dict.fromkeys(fams)}
    z_host = None if data.z_tgts is None else list(np.asarray(data.z_tgts))
    srcs = data.srcs
    starts = dict.fromkeys(subs)
    if init == "closed_form":  # every family's starts in one compiled fit
        starts = dict(zip(subs, closed_form_starts(
            [(f, [srcs[i] for i in sub], [f"zs_src[{i}]" for i in sub]) for f, sub in subs.items()], z_host, opts.ridge)))
    bucket = _width_buckets([s.shape[-1] for s in srcs], _bucket_ratio())
    loops, widths, params, consts, members = [], [], [], [], []
    for width in sorted(set(bucket), reverse=True):
        for group in (("affine",), ("orthogonal", "scaled_orthogonal")):
            batches, idx = [], []
            for f in group:
                pos = [j for j, i in enumerate(subs.get(f, [])) if bucket[i] == width]  # within the family
                if not pos:
                    continue
                sub = [subs[f][j] for j in pos]
                fits = None if starts[f] is None else [[row[j] for j in pos] for row in starts[f]]
                batches.append((f, *init_params(
                    f, init, [srcs[i] for i in sub], z_host, d_tgt=data.tshape[-1], n_tails=data.m_count,
                    ridge=opts.ridge, keys=None if keys_init is None else keys_init[np.asarray(sub)], dtype=data.dtype,
                    pad_to=width, labels=[f"zs_src[{i}]" for i in sub], fits=fits,
                )))
                idx += sub
            if not batches:
                continue
            loop_family, p, c = merge_families(batches)
            order = np.argsort(idx)  # family by family -> source order within the group
            loops.append(loop_family)
            widths.append(width)
            params.append(jax.tree.map(lambda a, order=order: jnp.asarray(a[:, order]), p))
            consts.append(jax.tree.map(lambda a, order=order: jnp.asarray(a[:, order]), c))
            members.append(tuple(int(i) for i in np.sort(idx)))
    return tuple(loops), tuple(widths), tuple(params), tuple(consts), tuple(members)


def _trained(fitted, hist, members, data: _Inputs, fams, stacked: bool, chunk: int,
             steps: int) -> list[TrainedStitcher]:
    """The K :class:`TrainedStitcher` of the loop groups' ``fitted = (weight, bias, scale)`` and histories
    (one per group, its stitchers ``members[g]``), each stitcher unpadded to its source's width, in source
    order."""
    hist = [jax.tree.map(np.asarray, h) for h in hist]
    # each stitcher's slice taken on the host (slicing on the device compiles a program per shape)
    fitted = [tuple(np.asarray(a) for a in f) for f in fitted]
    where = {i: (g, j) for g, idx in enumerate(members) for j, i in enumerate(idx)}
    results = []
    for i, src in enumerate(data.srcs):
        g, j = where[i]
        (weight, bias, scale), h = fitted[g], hist[g]
        n_ev = h["eval_loss"].shape[-1]
        ev_steps = np.minimum(np.arange(n_ev) * chunk, steps)
        pick = (lambda a, j=j: a[:, j]) if stacked else (lambda a, j=j: a[0, j])  # noqa: E731
        d_k = src.shape[-1]
        results.append(TrainedStitcher(
            Stitcher(jnp.asarray(pick(weight)[..., :d_k, :]), jnp.asarray(pick(bias)), jnp.asarray(pick(scale)),
                     fams[i]),
            TrainHistory(
                train_loss=pick(h["train_loss"]),
                constraint_error=pick(h["constraint_error"]),
                eval_steps=np.broadcast_to(ev_steps, (data.m_count, n_ev)) if stacked else ev_steps,
                eval_loss=pick(h["eval_loss"]),
                best_step=pick(h["best_step"]),
                steps_run=pick(h["steps_run"]),
            ),
        ))
    return results


def _label_groups(label_groups, k_count: int, n_classes: int, loss: str) -> np.ndarray | None:
    """``(K, C)`` int32 groupings (identity rows for ``None`` entries), or ``None`` when no stitcher has one."""
    if label_groups is None:
        return None
    if isinstance(label_groups, (str, bytes)) or not isinstance(label_groups, Sequence) \
            or len(label_groups) != k_count:
        raise ValueError(f"label_groups must be None or a list of {k_count} entries (one per source), each "
                         f"None or a grouping of the tail's {n_classes} classes; got {label_groups!r:.200}.")
    if all(g is None for g in label_groups):
        return None
    if loss != "ce":
        raise ValueError(f'label_groups trains on coarser labels with the cross-entropy; it needs loss="ce", '
                         f"got loss={loss!r}.")
    out = np.tile(np.arange(n_classes, dtype=np.int32), (k_count, 1))
    for k, g in enumerate(label_groups):
        if g is None:
            continue
        a = np.asarray(g)
        if a.shape != (n_classes,) or not np.issubdtype(a.dtype, np.integer) or (a < 0).any():
            raise ValueError(f"label_groups[{k}] must be {n_classes} non-negative integers (the coarse class "
                             f"of each of the tail's classes), got shape {a.shape} and dtype {a.dtype}.")
        out[k] = a
    return out


def _eval_data(eval_data, srcs, tshape, n_classes, m_count, stacked, loss):
    if not isinstance(eval_data, tuple) or len(eval_data) not in (2, 3):
        raise TypeError("eval_data must be (zs_src_eval, y_eval) or "
                        "(zs_src_eval, y_eval, teacher_logits_eval).")
    zs_ev = eval_data[0]
    y_eval = check_int_labels(eval_data[1], "eval_data[1] (y_eval)", n_classes=n_classes)
    if not isinstance(zs_ev, (list, tuple)) or len(zs_ev) != len(srcs):
        raise ValueError(f"eval_data[0] must be a list of {len(srcs)} held-out source arrays.")
    evs = [_prepare_source(z, f"eval_data[0][{i}]", tshape, y_eval.shape[0])
           for i, z in enumerate(zs_ev)]
    for i, (e, s) in enumerate(zip(evs, srcs)):
        if e.shape[1:] != s.shape[1:]:
            raise ValueError(f"eval_data[0][{i}] has per-sample shape {e.shape[1:]} but the "
                             f"training source has {s.shape[1:]}.")
    t_eval = None
    if loss == "kl":
        if len(eval_data) != 3:
            raise ValueError('loss="kl" with eval_data needs (zs_src_eval, y_eval, '
                             "teacher_logits_eval).")
        t_eval = _per_tail(eval_data[2], "eval_data[2]", m_count, y_eval.shape[0], stacked,
                           "held-out logits")
    return evs, y_eval, t_eval


@full_precision
def train_stitcher(
    z_src: ArrayLike,
    y: ArrayLike,
    tail_apply: Callable[[Any, jax.Array], jax.Array],
    tail_params: Any,
    /,
    *,
    family: str = "affine",
    key: jax.Array | None = None,
    eval_data: tuple | None = None,
    **kwargs: Any,
) -> TrainedStitcher:
    """Train one stitcher from a source layer into model B's layer with the task loss: ``train_stitchers([z_src], ...)[0]``.

    Only the stitcher is trained; the tail (B's rest of network) is frozen.
    The orthogonal families stay exactly (semi-)orthogonal at every step. The
    loop is a pure jitted step, run as a ``lax.scan`` over chunks of
    ``eval_every`` steps.

    Args:
      z_src: ``(n, d_src)`` or NHWC ``(n, H, W, C_src)`` source activations.
      y: ``(n,)`` integer labels.
      tail_apply, tail_params: the tail, ``tail_apply(tail_params, h) -> logits``.
      family: ``"orthogonal"``, ``"scaled_orthogonal"`` or ``"affine"``.
      key: one key (default ``jax.random.key(0)``), used as it is (not split).
      eval_data: ``(z_src_eval, y_eval)`` or ``(z_src_eval, y_eval, teacher_logits_eval)``.
      **kwargs: any other keyword argument of :func:`train_stitchers`: ``z_tgt``,
        ``target_shape``, ``stacked_tails``, ``teacher_logits``, ``options`` (a
        :class:`StitchTraining`) and its fields (``steps=...``, ``learning_rate=...``).

    Returns:
      A :class:`TrainedStitcher` ``(stitcher, history)``: a
      :class:`~similarity.Stitcher` with ``weight (d_src, d_tgt)`` (channels
      for NHWC) and a :class:`TrainHistory`.

    Raises:
      ValueError: see :func:`train_stitchers` and :class:`StitchTraining`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (64, 2))
      >>> y = (x[:, 0] > 0).astype(jnp.int32)
      >>> def tail(w, h): return h[:, :1] * w[None, :]
      >>> s, hist = train_stitcher(x[:, ::-1], y, tail, jnp.array([-5.0, 5.0]),
      ...                          family="orthogonal", init="identity", target_shape=(2,),
      ...                          steps=200)
      >>> bool(jnp.allclose(s.weight.T @ s.weight, jnp.eye(2), atol=1e-5))
      True
      >>> bool(hist.train_loss[-1] < 0.5 * hist.train_loss[0])
      True
    """
    if not isinstance(family, str):
        raise TypeError(f"family must be one family name, got {family!r}; for several use "
                        "train_stitchers.")
    if eval_data is not None:
        if not isinstance(eval_data, tuple) or len(eval_data) not in (2, 3):
            raise TypeError("eval_data must be (z_src_eval, y_eval) or "
                            "(z_src_eval, y_eval, teacher_logits_eval).")
        eval_data = ([eval_data[0]],) + tuple(eval_data[1:])
    return train_stitchers([z_src], y, tail_apply, tail_params, family=family,
                           key=None if key is None else jnp.stack([key]), eval_data=eval_data, **kwargs)[0]
