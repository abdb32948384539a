"""Checkpoint x checkpoint similarity matrices: tensor similarity and its baselines.

Given the checkpoints of a training run as pure networks, this module computes every checkpoint x
checkpoint matrix, each in one jit-compiled call over all checkpoints. Two kinds of network are
accepted, as a list of checkpoints of one architecture or one stacked network (leading checkpoint axis):

* **multilinear** networks (tuples of :class:`similarity.BilinearLayer` /
  :class:`similarity.LinearLayer`, e.g. ``BilinearMLP.to_network()``);
* **bilinear-attention** transformers (:class:`similarity.AttentionNetwork`, e.g.
  ``BilinearTransformer(..., mlp=False).to_network()``), compared on a stated
  ``context`` of token positions and token-space ``scale``.

The matrices:

* **tensor similarity** (:func:`tensor_matrices`): ``similarity.similarity_matrix``
  under the ``symmetric``, ``gaussian`` or ``frobenius`` metric; for multilinear
  networks also the **per-output slices** (one ``(n, n)`` matrix per output class) from
  the same call: the last layer is sliced to one output and the slices are
  ``vmap``-ed, so the hidden-unit kernel, which does not depend on the slice, is
  computed once per pair of checkpoints. For attention networks,
  ``similarity.attention_similarity_matrix`` (Gaussian metric; exact at depth 1, the
  closure beyond);
* **Monte Carlo** tensor similarity of any depth (:func:`monte_carlo_matrices`): one
  set of common random Gaussian inputs for every checkpoint, with standard errors;
* **matrix cosine** of the flattened weights (``similarity.weight_cosine``);
* **behavioural similarity** on any data set: the mean per-sample (per-position)
  cosine of the two checkpoints' outputs (``similarity.behavioural_similarity``);
* **linear CKA** of the outputs (logits) on any data set (``similarity.cka``).

Every entry equals the pairwise function from ``similarity`` (tested). The matrices are keyed by one
scheme: ``"tensor/<metric>"`` (``"/outputs"`` for the per-output slices, ``"/<qualifier>"`` for a variant
such as a truncated network or another scale), ``"weight_cosine"``, ``"behavioral/<data set>"`` and
``"cka/<data set>"``.

Also here: the block structure of a matrix (:func:`block_summary`, the exact change-point
segmentation of ``similarity.change_points``) and the gap between two phases (:func:`block_gap`).

Devices: the tensor matrices take ``devices=`` as :func:`similarity.compare_grid` does, and share its
device plan (:mod:`similarity.grid.devices`): on one device, one compiled call of
``similarity.similarity_matrix`` over every pair; on several (by default every device of every process)
the upper-triangle pair list is sharded over their 1-D mesh (:func:`similarity.grid.pairs.map_pairs`),
and every process gets the whole matrix, equal to one device's.

Cost: ``O(h^2 d)`` per pair of one-bilinear-layer checkpoints (``h`` hidden units, ``d`` inputs): the
``n^2`` tensor pairs dominate; the baselines need each checkpoint's outputs once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._precision import full_precision
from funsim.similarity.attention import (
    AttentionNetwork,
    apply_attention_network,
    attention_inner,
    attention_similarity_matrix,
    stack_attention_networks,
    validate_attention_network,
)
from funsim.similarity.cka import cka as linear_cka
from funsim.similarity.grid.devices import make_plan
from funsim.similarity.grid.pairs import map_pairs
from funsim.similarity.multilinear import BilinearLayer, LinearLayer, apply_network, validate_network
from funsim.similarity.segmentation import change_points
from funsim.similarity.tensor_similarity import similarity_matrix, tensor_inner
from funsim.similarity.tensor_similarity import stack_networks as stack_multilinear_networks

__all__ = [
    "CHECKPOINT_METRICS",
    "stack_networks",
    "tensor_matrices",
    "tensor_similarity_to",
    "monte_carlo_matrices",
    "normalise_gram",
    "weight_cosine_matrix",
    "network_outputs",
    "behavioural_matrix",
    "behavioral_matrix",
    "cka_matrix",
    "checkpoint_matrices",
    "block_summary",
    "block_gap",
]

#: The tensor-similarity metrics of a checkpoint study by default (every metric:
#: ``similarity.TENSOR_METRICS``; attention networks have the Gaussian one only).
CHECKPOINT_METRICS = ("symmetric", "gaussian")


# --------------------------------------------------------------------------- networks


def stack_networks(nets, /):
    """A list of networks with one architecture -> one network whose leaves have a leading axis.

    Args:
      nets: a non-empty list of networks (tuples of layers, or :class:`similarity.AttentionNetwork`),
        same structure and shapes; or a network stacked already (returned after validation).

    Returns:
      The stacked network: every leaf ``(n, ...)``.

    Raises:
      ValueError: for an empty list, an invalid network or a different architecture.
    """
    if isinstance(nets, AttentionNetwork):
        return validate_attention_network(nets, "nets", batch_ndim=1)  # already stacked
    if isinstance(nets, tuple) and nets and isinstance(nets[0], (BilinearLayer, LinearLayer)):
        return validate_network(nets, "nets", batch_ndim=1)  # already stacked
    nets = list(nets)
    if nets and isinstance(nets[0], AttentionNetwork):
        for i, net in enumerate(nets):
            validate_attention_network(net, f"nets[{i}]")
        return stack_attention_networks(nets)
    return stack_multilinear_networks(nets)


def _is_attention(stacked) -> bool:
    return isinstance(stacked, AttentionNetwork)


def _n_checkpoints(stacked) -> int:
    return int(jax.tree.leaves(stacked)[0].shape[0])


def _n_outputs(net) -> int:
    return int(net[-1].d_out)


def _slice_output(net, c):
    """``net`` restricted to output ``c`` (traced int), by slicing its last layer's rows.

    Works on single and stacked networks (rows are axis -2 of the weight / down
    matrix, axis -1 of its bias). None when the last layer cannot be sliced (a
    residual bilinear layer, whose output rows are tied to its input).
    """
    *first, last = net

    def rows(a, axis):
        return None if a is None else jax.lax.dynamic_slice_in_dim(a, c, 1, axis=axis)

    if isinstance(last, LinearLayer):
        return (*first, LinearLayer(rows(last.weight, -2), rows(last.bias, -1)))
    if not last.residual:
        return (*first, dataclasses.replace(last, down=rows(last.down, -2), down_bias=rows(last.down_bias, -1)))
    return None


@functools.partial(jax.jit, static_argnames=("metric", "method"))
def _inner_matrices_per_output(stacked, metric, method):
    """``(o, n, n)`` inner products ``<A_i|M|A_j>`` restricted to each output, one call."""
    def one(c):
        return similarity_matrix(_slice_output(stacked, c), metric=metric, method=method, return_inner=True)

    return jax.vmap(one)(jnp.arange(_n_outputs(stacked)))


@functools.partial(jax.jit, static_argnames=("metric", "method"))
def _inner_rows_per_output(stacked, ref, metric, method):
    """``(o, n)`` cross, ``(o, n)`` self and ``(o,)`` reference inner products per output."""
    inner = functools.partial(tensor_inner, metric=metric, method=method)

    def one(c):
        nets, r = _slice_output(stacked, c), _slice_output(ref, c)
        cross = jax.vmap(lambda a: inner(a, r))(nets)
        own = jax.vmap(lambda a: inner(a, a))(nets)
        return cross, own, inner(r, r)

    return jax.vmap(one)(jnp.arange(_n_outputs(ref)))


# --------------------------------------------------------------------------- several devices


@functools.lru_cache(maxsize=32)
def _pair_inner(kind: str, metric: str, method: str, n_out: int, sliceable: bool, context, scale):
    """``(net_a, net_b) -> (o,)`` inner products of one checkpoint pair (``o = 1`` for whole networks).

    Cached: one function object per computation, so that its compiled program is reused."""
    if kind == "attention":
        return lambda a, b: attention_inner(a, b, context=context, method=method, scale=scale)[None]
    inner = functools.partial(tensor_inner, metric=metric, method=method)
    if sliceable:
        return lambda a, b: jax.vmap(lambda c: inner(_slice_output(a, c), _slice_output(b, c)))(jnp.arange(n_out))
    return lambda a, b: jnp.stack([inner(a, b, outputs=(c,)) for c in range(n_out)])


def _inner_on_mesh(stacked, plan, pair) -> np.ndarray:
    """``(o, n, n)`` inner products of every checkpoint pair: the ``n (n + 1) / 2`` pairs ``i <= j``
    sharded over the plan's devices (:func:`similarity.grid.pairs.map_pairs`), mirrored below the diagonal."""
    n = _n_checkpoints(stacked)
    iu, ju = np.triu_indices(n)
    vals = np.asarray(map_pairs(plan, pair, stacked, iu, ju), np.float64)
    out = np.zeros((vals.shape[1], n, n))
    out[:, iu, ju] = vals.T
    out[:, ju, iu] = vals.T
    return out


def _require_positive(own, what: str, axes: Sequence[str]) -> np.ndarray:
    """``own`` (self inner products, float64) after checking every entry is positive.

    ``axes`` names its axes for the message, e.g. ``("output", "checkpoint")``.
    """
    own = np.asarray(own, np.float64)
    bad = np.argwhere(~(own > 0))
    if bad.size:
        where = ", ".join(f"{a} {int(i)}" for a, i in zip(axes, bad[0])) or "the reference"
        raise ValueError(
            f"{what}: {where} has zero (or undefined) norm <A|A> = {own[tuple(bad[0])]!r}, so its "
            "similarity is undefined (0/0). A network whose output (slice) is exactly zero "
            "cannot be compared on it; leave that slice out (per_output=False) or drop the checkpoint."
        )
    return own


@full_precision
def tensor_matrices(
    nets,
    /,
    *,
    metrics: Sequence[str] = CHECKPOINT_METRICS,
    method: str = "auto",
    per_output: bool = True,
    context: int | None = None,
    scale: float = 1.0,
    return_inner: bool = False,
    devices: Sequence[jax.Device] | None = None,
) -> dict[str, np.ndarray]:
    """Tensor-similarity matrices over checkpoints, whole and per output, from the weights.

    Args:
      nets: a list of networks with one architecture, or a stacked network
        (multilinear or attention, see the module docstring).
      metrics: any of ``"symmetric"``, ``"gaussian"``, ``"frobenius"``
        (attention networks: ``"gaussian"`` only).
      method: see :func:`similarity.tensor_inner` (attention networks:
        :func:`similarity.attention_inner`).
      per_output: also return one matrix per output (the slice similarity, each
        normalised on its own slice). Multilinear networks only.
      context: attention networks only (required there): the number of token positions.
      scale: attention networks only: the token-space standard deviation.
      return_inner: return the inner products ``<A_i|A_j>`` instead of similarities.
      devices: devices to shard the pair list over, as :func:`similarity.compare_grid`
        (default: all of ``jax.devices()``, every process's); one device: one compiled
        call of ``similarity.similarity_matrix``. Every process passes the same checkpoints.

    Returns:
      ``{"tensor/<metric>": (n, n)}`` and, with ``per_output``,
      ``{"tensor/<metric>/outputs": (o, n, n)}``; float64, symmetric, unit diagonal.
      Entry ``[i, j]`` equals ``similarity.tensor_similarity(nets[i], nets[j], metric=...)``
      (``similarity.attention_similarity(..., context=context, scale=scale)``)
      and ``[c, i, j]`` the same with ``outputs=[c]``.

    Raises:
      ValueError: for invalid or different networks, unknown metrics, or a
        checkpoint with zero norm on a slice; for attention networks, a missing
        ``context``, a metric other than ``"gaussian"`` or ``per_output=True``.

    Examples:
      >>> import jax.numpy as jnp
      >>> sq = lambda w: (BilinearLayer(jnp.array(w), jnp.array(w), jnp.eye(2)),)
      >>> m = tensor_matrices([sq([[1.0, 0.0], [0.0, 1.0]]), sq([[1.0, 0.0], [0.0, 2.0]])], metrics=["symmetric"])
      >>> np.round(m["tensor/symmetric/outputs"][:, 0, 1], 4).tolist()   # x1^2 vs x1^2, x2^2 vs 4 x2^2
      [1.0, 1.0]
    """
    stacked = stack_networks(nets)
    plan = make_plan(devices)
    if _is_attention(stacked):
        return _attention_matrices(stacked, metrics, method, per_output, context, scale, return_inner, plan)
    if context is not None:
        raise ValueError("context is for attention networks (the number of token positions); multilinear "
                         "networks are compared on a Gaussian input of their own width. Leave it out.")
    n_out = _n_outputs(stacked)
    out = {}
    for metric in metrics:
        if plan.mesh is not None:  # several devices: the pair list over their mesh
            sliceable = _slice_output(stacked, 0) is not None
            pair = _pair_inner("multilinear", metric, method, n_out, sliceable, None, 1.0)
            inner = _inner_on_mesh(stacked, plan, pair)
        elif _slice_output(stacked, 0) is not None:
            inner = np.asarray(_inner_matrices_per_output(stacked, metric, method), np.float64)
        else:  # a residual last layer cannot be sliced: one call per output
            inner = np.stack([
                np.asarray(similarity_matrix(stacked, metric=metric, method=method, outputs=(c,), return_inner=True))
                for c in range(n_out)])
        inner = (inner + np.swapaxes(inner, -1, -2)) / 2
        full = inner.sum(0)
        d = _require_positive(np.diagonal(full), f"tensor/{metric}", ("checkpoint",))
        out[f"tensor/{metric}"] = full if return_inner else full / np.sqrt(d[:, None] * d[None, :])
        if per_output:
            d = _require_positive(np.diagonal(inner, axis1=1, axis2=2), f"tensor/{metric}/outputs", ("output", "checkpoint"))
            out[f"tensor/{metric}/outputs"] = inner if return_inner else inner / np.sqrt(d[:, :, None] * d[:, None, :])
    return out


def _attention_matrices(stacked, metrics, method, per_output, context, scale, return_inner, plan):
    """:func:`tensor_matrices` of a stacked :class:`similarity.AttentionNetwork`."""
    if context is None:
        raise ValueError("Attention networks are compared on a stated number of token positions: pass "
                         "context=... (e.g. the model's n_ctx, or fewer).")
    bad = [m for m in metrics if m != "gaussian"]
    if bad:
        raise ValueError(f"Attention networks have the Gaussian inner product only (metric 'gaussian'), got "
                         f"{bad!r}; pass metrics=('gaussian',).")
    if per_output:
        raise ValueError("per_output slices are offered for multilinear networks only (an attention network's "
                         "slice is one compiled program per output); pass per_output=False, or call "
                         "similarity.attention_similarity_matrix with outputs=... for the slices you need.")
    out = {}
    for metric in metrics:
        if plan.mesh is not None:  # several devices: the pair list over their mesh
            pair = _pair_inner("attention", metric, method, 1, False, context, scale)
            inner = _inner_on_mesh(stacked, plan, pair)[0]
        else:
            inner = np.asarray(attention_similarity_matrix(
                stacked, context=context, method=method, scale=scale, return_inner=True), np.float64)
        inner = (inner + inner.T) / 2
        d = _require_positive(np.diagonal(inner), f"tensor/{metric}", ("checkpoint",))
        out[f"tensor/{metric}"] = inner if return_inner else inner / np.sqrt(d[:, None] * d[None, :])
    return out


@full_precision
def normalise_gram(gram: ArrayLike, /, *, what: str = "gram") -> np.ndarray:
    """``G_ij / sqrt(G_ii G_jj)``: similarities from inner products, in float64.

    Raises:
      ValueError: when a diagonal entry is not positive (the message names the checkpoint).

    Examples:
      >>> normalise_gram(np.array([[4.0, 2.0], [2.0, 1.0]])).tolist()
      [[1.0, 1.0], [1.0, 1.0]]
    """
    g = np.asarray(gram, np.float64)
    d = _require_positive(np.diagonal(g), what, ("checkpoint",))
    return g / np.sqrt(d[:, None] * d[None, :])


@full_precision
def tensor_similarity_to(
    nets,
    reference,
    /,
    *,
    metrics: Sequence[str] = CHECKPOINT_METRICS,
    method: str = "auto",
    per_output: bool = True,
) -> dict[str, np.ndarray]:
    """Tensor similarity of every checkpoint to one reference network (any architecture).

    The reference only needs the same input and output widths and depth, e.g.
    the difference of two checkpoints of another model
    (:func:`similarity.difference`).

    Args:
      nets: a list of networks with one architecture, or a stacked network.
      reference: a network.
      metrics: see :func:`tensor_matrices`.
      method: see :func:`similarity.tensor_inner`.
      per_output: also return the per-output slice similarities.

    Returns:
      ``{"tensor/<metric>": (n,)}`` and, with ``per_output``,
      ``{"tensor/<metric>/outputs": (o, n)}``; entry ``i`` equals
      ``similarity.tensor_similarity(nets[i], reference, metric=...)``.
    """
    stacked = stack_networks(nets)
    if _is_attention(stacked):
        raise ValueError("tensor_similarity_to is for multilinear networks; for attention networks use "
                         "similarity.attention_similarity per checkpoint, or tensor_matrices.")
    ref = validate_network(reference, "reference")
    n_out = _n_outputs(ref)
    if n_out != _n_outputs(stacked):
        raise ValueError(
            f"reference has {n_out} outputs but the checkpoints have {_n_outputs(stacked)}; "
            "they must share their outputs to be compared."
        )
    out = {}
    for metric in metrics:
        if _slice_output(stacked, 0) is not None and _slice_output(ref, 0) is not None:
            cross, own, r = (np.asarray(a, np.float64) for a in _inner_rows_per_output(stacked, ref, metric, method))
        else:
            cross, own, r = _rows_by_loop(stacked, ref, metric, method, n_out)
        what = f"tensor/{metric}"
        own_full = _require_positive(own.sum(0), what, ("checkpoint",))
        r_full = _require_positive(r.sum(0), what + " (reference)", ())
        out[what] = cross.sum(0) / np.sqrt(own_full * r_full)
        if per_output:
            own = _require_positive(own, what + "/outputs", ("output", "checkpoint"))
            r = _require_positive(r, what + "/outputs (reference)", ("output",))
            out[what + "/outputs"] = cross / np.sqrt(own * r[:, None])
    return out


def _rows_by_loop(stacked, ref, metric, method, n_out):
    """Fallback of :func:`tensor_similarity_to` for a residual last layer: ``outputs=(c,)`` per call."""
    n = jax.tree.leaves(stacked)[0].shape[0]
    nets = [jax.tree.map(lambda x: x[i], stacked) for i in range(n)]
    cross = np.zeros((n_out, n))
    own = np.zeros((n_out, n))
    r = np.zeros(n_out)
    for c in range(n_out):
        kw = dict(metric=metric, method=method, outputs=(c,))
        r[c] = float(tensor_inner(ref, ref, **kw))
        for i, a in enumerate(nets):
            cross[c, i] = float(tensor_inner(a, ref, **kw))
            own[c, i] = float(tensor_inner(a, a, **kw))
    return cross, own, r


# --------------------------------------------------------------------------- Monte Carlo


def _apply(stacked):
    return apply_attention_network if _is_attention(stacked) else apply_network


@functools.partial(jax.jit, static_argnames=("shape",))
def _mc_batch_gram(stacked, key, scale, shape):
    """``(n, n)`` mean of ``<f_i(g), f_j(g)>`` over one batch of Gaussian inputs ``g`` of ``shape``."""
    g = scale * jax.random.normal(key, shape, jax.tree.leaves(stacked)[0].dtype)
    out = jax.vmap(lambda net: _apply(stacked)(net, g))(stacked)
    flat = out.reshape(out.shape[0], -1)
    return flat @ flat.T / shape[0]


@full_precision
def monte_carlo_matrices(
    nets,
    /,
    *,
    n_samples: int,
    n_batches: int,
    key: jax.Array,
    context: int | None = None,
    scale: float = 1.0,
) -> dict[str, np.ndarray]:
    """Gaussian tensor similarity of every pair of checkpoints by Monte Carlo, any depth, with standard errors.

    Every checkpoint sees the same Gaussian inputs (common random numbers): ``n_batches``
    batches of ``n_samples // n_batches`` draws, batch ``b`` from
    ``jax.random.fold_in(key, b)``. The inner product is the mean over the draws of
    ``sum f_i(g) . f_j(g)`` (over outputs, and over positions for attention networks),
    with ``g ~ N(0, scale^2 I)`` of the networks' input shape: ``(d,)`` for multilinear
    networks, ``(context, V)`` token-space rows for attention networks (the input
    distribution of :func:`similarity.tensor_inner` with ``metric="gaussian"`` and
    :func:`similarity.attention_inner`). Standard errors come from the batch means, and
    those of the similarities from a delete-one-batch jackknife.

    Args:
      nets: a list of networks with one architecture, or a stacked network.
      n_samples: total draws (a multiple of ``n_batches`` is used: ``n_batches * (n_samples // n_batches)``).
      n_batches: batches (>= 2) for the standard errors; each is one compiled call.
      key: a ``jax.random`` key.
      context: attention networks only (required there): the number of token positions.
      scale: the inputs' standard deviation (attention: token-space; multilinear networks: 1).

    Returns:
      ``{"inner": (n, n), "inner_se": (n, n), "similarity": (n, n), "similarity_se": (n, n)}``,
      float64.

    Raises:
      ValueError: too few samples or batches, a missing ``context`` for attention networks
        (or one given for multilinear networks), or a checkpoint with zero estimated norm.
    """
    stacked = stack_networks(nets)
    if not (isinstance(n_batches, (int, np.integer)) and n_batches >= 2):
        raise ValueError(f"n_batches must be an int >= 2 (for the standard errors), got {n_batches!r}.")
    per = int(n_samples) // int(n_batches) if isinstance(n_samples, (int, np.integer)) else 0
    if per < 1:
        raise ValueError(f"n_samples={n_samples!r} gives no draw per batch with n_batches={n_batches}; "
                         "pass n_samples >= n_batches.")
    if _is_attention(stacked):
        if context is None:
            raise ValueError("Attention networks are compared on a stated number of token positions: pass "
                             "context=... (e.g. the model's n_ctx, or fewer).")
        one = jax.tree.map(lambda x: x[0], stacked)
        validate_attention_network(one, "nets", context=context)
        shape = (per, int(context), one.vocab_size)
    else:
        if context is not None:
            raise ValueError("context is for attention networks; leave it out for multilinear networks.")
        shape = (per, stacked[0].d_in)
    if not (isinstance(scale, (int, float, np.floating, np.integer)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}.")
    dtype = jax.tree.leaves(stacked)[0].dtype
    grams = np.stack([
        np.asarray(_mc_batch_gram(stacked, jax.random.fold_in(key, b), jnp.asarray(scale, dtype), shape), np.float64)
        for b in range(int(n_batches))])
    grams = (grams + np.swapaxes(grams, 1, 2)) / 2
    b = int(n_batches)
    mean = grams.mean(0)
    sim = normalise_gram(mean, what="tensor/gaussian (Monte Carlo)")
    jack = np.stack([normalise_gram((mean * b - grams[i]) / (b - 1), what="tensor/gaussian (Monte Carlo)")
                     for i in range(b)])
    return {
        "inner": mean,
        "inner_se": grams.std(0, ddof=1) / np.sqrt(b),
        "similarity": sim,
        "similarity_se": np.sqrt((b - 1) / b * ((jack - jack.mean(0)) ** 2).sum(0)),
    }


# --------------------------------------------------------------------------- baselines


def _weight_cosine_gram(stacked) -> np.ndarray:
    """``(n, n)`` inner products of the flattened weights, in float64 (cosines of checkpoints of one run sit
    near 1, where float32 rounding of a long dot product is a visible part of their spread)."""
    n = _n_checkpoints(stacked)
    flat = np.concatenate([np.asarray(x, np.float64).reshape(n, -1) for x in jax.tree.leaves(stacked)], axis=1)
    return flat @ flat.T


@full_precision
def weight_cosine_matrix(nets, /) -> np.ndarray:
    """Matrix cosine of the flattened weights (biases included) for every pair of checkpoints.

    Args:
      nets: a list of networks with one architecture, or a stacked network.

    Returns:
      ``(n, n)`` float64; entry ``[i, j]`` equals ``similarity.weight_cosine(nets[i], nets[j])``.

    Examples:
      >>> import jax.numpy as jnp
      >>> lin = lambda w: (LinearLayer(jnp.array(w)),)
      >>> weight_cosine_matrix([lin([[1.0, 0.0]]), lin([[1.0, 1.0]])]).round(4).tolist()
      [[1.0, 0.7071], [0.7071, 1.0]]
    """
    gram = _weight_cosine_gram(stack_networks(nets))
    d = _require_positive(np.diagonal(gram), "weight_cosine", ("checkpoint",))
    return gram / np.sqrt(d[:, None] * d[None, :])


@jax.jit
def _outputs(stacked, x):
    return jax.vmap(_apply(stacked), in_axes=(0, None))(stacked, x)


@full_precision
def network_outputs(nets, x: ArrayLike, /) -> jax.Array:
    """Every checkpoint's outputs on ``x``, in one call.

    Args:
      nets: a list of networks with one architecture, or a stacked network.
      x: ``(m, d)`` inputs (flattened); for attention networks ``(m, T)`` integer
        tokens (or ``(m, T, V)`` token-space rows).

    Returns:
      ``(n, m, o)``; for attention networks ``(n, m, T, o)`` (the logits at every position).
    """
    stacked = stack_networks(nets)
    if _is_attention(stacked):
        x = jnp.asarray(x)
        one = jax.tree.map(lambda a: a[0], stacked)
        if jnp.issubdtype(x.dtype, jnp.integer):
            apply_attention_network(one, x[:1])  # checks the shape with a clear message
            return _outputs(stacked, x)
        apply_attention_network(one, x[:1].astype(one.embed.dtype))
        return _outputs(stacked, x.astype(one.embed.dtype))
    x = jnp.asarray(x)
    d = stacked[0].d_in
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(
            f"x must be (m, {d}) flattened inputs for networks that take d={d}, got shape {tuple(x.shape)}; "
            "reshape images with x.reshape(len(x), -1)."
        )
    return _outputs(stacked, x.astype(jax.tree.leaves(stacked)[0].dtype))


def _check_outputs(outputs, name):
    """``(n, m, o)``: outputs of n checkpoints, with any sample axes (inputs, positions) flattened into m."""
    y = jnp.asarray(outputs)
    if y.ndim < 3:
        raise ValueError(f"{name} must be (n_checkpoints, m, o) outputs (or (n_checkpoints, m, T, o) per "
                         f"position), got shape {tuple(y.shape)}.")
    return y.reshape(y.shape[0], -1, y.shape[-1])


def _per_sample_cosine(y: np.ndarray) -> np.ndarray:
    """``(n, n)`` mean per-sample cosines, in float64 on the host: a float32 sum over many samples
    and positions drifts from 1 on the diagonal by more than 1e-6."""
    y = np.asarray(y, np.float64)
    u = y / np.linalg.norm(y, axis=-1, keepdims=True)
    return np.einsum("amo,bmo->ab", u, u, optimize=True) / y.shape[1]


@full_precision
def behavioural_matrix(outputs: ArrayLike, /) -> np.ndarray:
    """Behavioural similarity of every pair of checkpoints: mean per-sample cosine of their outputs.

    Args:
      outputs: ``(n, m, o)`` outputs of n checkpoints on the same m inputs
        (:func:`network_outputs`); ``(n, m, T, o)`` per position is averaged over
        inputs and positions alike.

    Returns:
      ``(n, n)`` float64; entry ``[i, j]`` equals
      ``similarity.behavioural_similarity(nets[i], nets[j], x)``.

    Raises:
      ValueError: when a checkpoint outputs the zero vector on some input (the cosine is undefined).

    Examples:
      >>> y = np.array([[[1.0, 0.0]], [[1.0, 1.0]]])   # two checkpoints, one input
      >>> behavioural_matrix(y).round(4).tolist()
      [[1.0, 0.7071], [0.7071, 1.0]]
    """
    y = _check_outputs(outputs, "outputs")
    y = np.asarray(y)
    norms = np.linalg.norm(y, axis=-1)
    if not np.all(norms > 0):
        i, m = np.argwhere(~(norms > 0))[0]
        raise ValueError(
            f"Checkpoint {i} outputs the zero vector on input {m}, where the cosine is undefined; "
            "drop those inputs or compare with tensor similarity."
        )
    s = _per_sample_cosine(y)
    return (s + s.T) / 2


@full_precision
def behavioral_matrix(outputs: ArrayLike, /) -> np.ndarray:
    """Deprecated spelling of :func:`behavioural_matrix` (the same function); it will be removed."""
    warnings.warn("behavioral_matrix is deprecated: use behavioural_matrix (the same function).",
                  DeprecationWarning, stacklevel=2)
    return behavioural_matrix(outputs)


@jax.jit
def _cka_all_pairs(y):
    return jax.vmap(lambda a: jax.vmap(lambda b: linear_cka(a, b))(y))(y)


@full_precision
def cka_matrix(outputs: ArrayLike, /) -> np.ndarray:
    """Linear CKA between the outputs (e.g. logits) of every pair of checkpoints.

    Args:
      outputs: ``(n, m, o)`` outputs of n checkpoints on the same m inputs
        (``(n, m, T, o)``: inputs and positions are the samples).

    Returns:
      ``(n, n)`` float64; entry ``[i, j]`` equals ``similarity.cka(outputs[i], outputs[j])``.

    Raises:
      ValueError: when a checkpoint's outputs are constant over the inputs (CKA is undefined).
    """
    y = _check_outputs(outputs, "outputs")
    if y.shape[1] < 2:
        raise ValueError(f"CKA needs at least 2 inputs, got outputs of shape {tuple(y.shape)}.")
    yc = np.asarray(y - y.mean(axis=1, keepdims=True))
    flat = np.abs(yc).reshape(len(yc), -1).max(axis=1)
    if not np.all(flat > 0):
        raise ValueError(
            f"Checkpoint {int(np.argmin(flat))} has constant outputs over the inputs; CKA is undefined (0/0)."
        )
    s = np.asarray(_cka_all_pairs(y), np.float64)
    return (s + s.T) / 2


@full_precision
def checkpoint_matrices(
    nets,
    /,
    *,
    data: Mapping[str, ArrayLike] | None = None,
    metrics: Sequence[str] = CHECKPOINT_METRICS,
    per_output: bool = True,
    cka: bool = True,
    context: int | None = None,
    scale: float = 1.0,
    devices: Sequence[jax.Device] | None = None,
) -> dict[str, np.ndarray]:
    """Every checkpoint x checkpoint matrix: tensor similarity and the baselines.

    Args:
      nets: a list of networks with one architecture (checkpoints), or a stacked network.
      data: ``{name: inputs}``: behavioural similarity (and CKA of the outputs) is
        computed on each data set, e.g. ``{"clean": x, "poisoned": x_p}``; inputs as
        :func:`network_outputs` takes them.
      metrics: tensor-similarity metrics.
      per_output: also the per-output slice matrices of each metric (multilinear networks).
      cka: also linear CKA of the outputs on each data set.
      context, scale: attention networks: see :func:`tensor_matrices`.
      devices: the devices of the tensor matrices' pair list: see :func:`tensor_matrices`.

    Returns:
      ``{"tensor/<metric>": (n, n), "tensor/<metric>/outputs": (o, n, n),
      "weight_cosine": (n, n), "behavioral/<name>": (n, n), "cka/<name>": (n, n)}``.
    """
    stacked = stack_networks(nets)
    out = tensor_matrices(stacked, metrics=metrics, per_output=per_output, devices=devices,
                          **({"context": context, "scale": scale} if _is_attention(stacked) else {}))
    out["weight_cosine"] = weight_cosine_matrix(stacked)
    for name, x in (data or {}).items():
        y = network_outputs(stacked, x)
        out[f"behavioral/{name}"] = behavioural_matrix(y)
        if cka:
            out[f"cka/{name}"] = cka_matrix(y)
    return out


@full_precision
def block_summary(matrix: ArrayLike, steps: Sequence[int], ks: Sequence[int], /, *,
                  cost: str = "kernel") -> dict[int, dict]:
    """The block structure of a checkpoint x checkpoint matrix: its best K-block segmentation for every K.

    The segmentation is exact (:func:`similarity.change_points`, computed in float64).
    With the ``"kernel"`` cost, a block's cost is its kernel dispersion
    ``sum_{i in B} S_ii - (1/|B|) sum_{i, j in B} S_ij`` (the within-block sum of
    squares of the checkpoints' feature vectors when ``S`` is a Gram matrix), and
    "explained" is the fraction of the one-block cost the K blocks remove.

    Args:
      matrix: ``(n, n)`` similarity matrix over checkpoints in training order.
      steps: ``(n,)`` the global step of each checkpoint.
      ks: numbers of blocks; those above n are skipped.
      cost: a cost of :data:`similarity.SEGMENT_COSTS`.

    Returns:
      ``{K: {"boundaries_steps": [step where blocks 2..K start], "explained": float,
      "within_mean": float, "between_mean": float, "contrast": within - between}}``
      (means over the off-diagonal pairs inside blocks and across them).

    Examples:
      >>> s = np.kron(np.eye(2), np.ones((2, 2)))   # two perfect blocks
      >>> b = block_summary(s, [0, 10, 20, 30], [2])[2]
      >>> b["boundaries_steps"], b["explained"], b["contrast"]
      ([20], 1.0, 1.0)
    """
    sim = np.asarray(matrix, np.float64)
    n = len(sim)
    if sim.ndim != 2 or sim.shape != (n, n) or len(steps) != n:
        raise ValueError(f"matrix must be (n, n) and steps (n,); got {sim.shape} and {len(steps)} steps.")
    todo = [int(k) for k in ks if k <= n]
    out: dict[int, dict] = {}
    if not todo:
        return out
    with jax.enable_x64(True):  # costs of long segments nearly tie in float32
        segs = {k: change_points(sim, n_segments=k, cost=cost) for k in todo}
        segs = {k: (np.asarray(sg.starts), np.asarray(sg.costs, np.float64)) for k, sg in segs.items()}
    costs = segs[max(todo)][1]  # costs[k - 1]: the least total cost with k blocks
    total = max(float(costs[0]), 0.0)
    off = ~np.eye(n, dtype=bool)
    for k in todo:
        starts = segs[k][0][1:]
        labels = np.searchsorted(starts, np.arange(n), side="right")
        same = labels[:, None] == labels[None, :]
        within = sim[same & off].mean() if (same & off).any() else float("nan")
        between = sim[~same].mean() if (~same).any() else float("nan")
        out[k] = {
            "boundaries_steps": [int(steps[i]) for i in starts],
            "explained": float(1 - max(float(costs[k - 1]), 0.0) / total) if total > 0 else float("nan"),
            "within_mean": float(within),
            "between_mean": float(between),
            "contrast": float(within - between),
        }
    return out


@full_precision
def block_gap(matrix: ArrayLike, in_block: ArrayLike, /) -> float:
    """Mean similarity within the block minus mean similarity across it.

    ``mean(M[B, B]) - mean(M[A, B])`` with ``B`` the checkpoints where ``in_block``
    is True (the diagonal included) and ``A`` the others: how much more alike the
    checkpoints of one phase are to each other than to those of the other phase.

    Args:
      matrix: ``(n, n)`` similarity matrix.
      in_block: ``(n,)`` bool, the checkpoints of phase B.

    Returns:
      A float.

    Examples:
      >>> m = np.array([[1.0, 0.2, 0.2], [0.2, 1.0, 0.8], [0.2, 0.8, 1.0]])
      >>> round(block_gap(m, [False, True, True]), 6)   # (1 + 0.8 + 0.8 + 1) / 4 - 0.2
      0.7
    """
    m = np.asarray(matrix, np.float64)
    b = np.asarray(in_block, bool)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or b.shape != (m.shape[0],):
        raise ValueError(f"matrix must be (n, n) and in_block (n,); got {m.shape} and {b.shape}.")
    if b.all() or not b.any():
        raise ValueError("in_block must mark some checkpoints but not all; both phases need a checkpoint.")
    return float(m[np.ix_(b, b)].mean() - m[np.ix_(~b, b)].mean())
