"""Checkpoint x checkpoint similarity matrices: tensor similarity and its baselines.

Given the checkpoints of a training run as pure networks (tuples of
:class:`similarity.BilinearLayer` / :class:`similarity.LinearLayer`, e.g.
``BilinearMLP.to_network()`` of each loaded checkpoint), this module computes,
each in one jit-compiled call over all checkpoints:

* **tensor similarity** (``similarity.similarity_matrix``) under the
  ``symmetric`` and ``gaussian`` metrics, with the **per-output slices** (one
  ``(n, n)`` matrix per output class) from the same call: the last layer is
  sliced to one output and the slices are ``vmap``-ed, so the hidden-unit
  kernel, which does not depend on the slice, is computed once per pair of
  checkpoints. The full inner product is the sum of the per-output ones;
* **matrix cosine** of the flattened weights (``similarity.weight_cosine``);
* **behavioural similarity** on any data set: the mean per-sample cosine of
  the two checkpoints' outputs (``similarity.behavioral_similarity``);
* **linear CKA** of the outputs (logits) on any data set (``similarity.cka``).

Every entry equals the pairwise function from ``similarity`` (tested). Also
here: the block gap of a matrix between two phases of training, and the two
figures the drivers draw (heatmap panels with stage boundaries, and curves over
training steps with the stages shaded).

Cost: tensor similarity is ``O(h^2 d)`` per pair of one-bilinear-layer
checkpoints (``h`` hidden units, ``d`` inputs), so ``n^2`` of them dominate;
the baselines are cheap once each checkpoint's outputs are computed (once).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim import similarity
from funsim.similarity import BilinearLayer, LinearLayer
from funsim.similarity.tensor_similarity import stack_networks as _stack_list

__all__ = [
    "TENSOR_METRICS",
    "stack_networks",
    "tensor_matrices",
    "tensor_similarity_to",
    "weight_cosine_matrix",
    "network_outputs",
    "behavioral_matrix",
    "cka_matrix",
    "checkpoint_matrices",
    "block_gap",
    "heatmap_panels",
    "curves_over_steps",
]

TENSOR_METRICS = ("symmetric", "gaussian")


# --------------------------------------------------------------------------- networks


def stack_networks(nets: Sequence, /) -> tuple:
    """A list of networks with one architecture -> one network whose leaves have a leading axis.

    Args:
      nets: a non-empty list of networks (tuples of layers), same structure and shapes.

    Returns:
      The stacked network: every leaf ``(n, ...)``.

    Raises:
      ValueError: for an empty list, an invalid network or a different architecture.
    """
    if isinstance(nets, tuple) and nets and isinstance(nets[0], (BilinearLayer, LinearLayer)):
        return similarity.validate_network(nets, "nets", batch_ndim=1)  # already stacked
    return _stack_list(list(nets))


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
        return similarity.similarity_matrix(_slice_output(stacked, c), metric=metric, method=method, return_inner=True)

    return jax.vmap(one)(jnp.arange(_n_outputs(stacked)))


@functools.partial(jax.jit, static_argnames=("metric", "method"))
def _inner_rows_per_output(stacked, ref, metric, method):
    """``(o, n)`` cross, ``(o, n)`` self and ``(o,)`` reference inner products per output."""
    inner = functools.partial(similarity.tensor_inner, metric=metric, method=method)

    def one(c):
        nets, r = _slice_output(stacked, c), _slice_output(ref, c)
        cross = jax.vmap(lambda a: inner(a, r))(nets)
        own = jax.vmap(lambda a: inner(a, a))(nets)
        return cross, own, inner(r, r)

    return jax.vmap(one)(jnp.arange(_n_outputs(ref)))


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


def tensor_matrices(
    nets,
    /,
    *,
    metrics: Sequence[str] = TENSOR_METRICS,
    method: str = "auto",
    per_output: bool = True,
) -> dict[str, np.ndarray]:
    """Tensor-similarity matrices over checkpoints, whole and per output, from the weights.

    Args:
      nets: a list of networks with one architecture, or a stacked network.
      metrics: any of ``"symmetric"``, ``"gaussian"``, ``"frobenius"``.
      method: see :func:`similarity.tensor_inner`.
      per_output: also return one matrix per output (the slice similarity, each
        normalised on its own slice).

    Returns:
      ``{"tensor/<metric>": (n, n)}`` and, with ``per_output``,
      ``{"tensor/<metric>/outputs": (o, n, n)}``; float64, symmetric, unit diagonal.
      Entry ``[i, j]`` equals ``similarity.tensor_similarity(nets[i], nets[j], metric=...)``
      and ``[c, i, j]`` the same with ``outputs=[c]``.

    Raises:
      ValueError: for invalid or different networks, unknown metrics, or a
        checkpoint with zero norm on a slice.

    Examples:
      >>> import jax.numpy as jnp
      >>> sq = lambda w: (BilinearLayer(jnp.array(w), jnp.array(w), jnp.eye(2)),)
      >>> m = tensor_matrices([sq([[1.0, 0.0], [0.0, 1.0]]), sq([[1.0, 0.0], [0.0, 2.0]])], metrics=["symmetric"])
      >>> np.round(m["tensor/symmetric/outputs"][:, 0, 1], 4).tolist()   # x1^2 vs x1^2, x2^2 vs 4 x2^2
      [1.0, 1.0]
    """
    stacked = stack_networks(nets)
    n_out = _n_outputs(stacked)
    out = {}
    for metric in metrics:
        if _slice_output(stacked, 0) is not None:
            inner = np.asarray(_inner_matrices_per_output(stacked, metric, method), np.float64)
        else:  # a residual last layer cannot be sliced: one call per output
            inner = np.stack([
                np.asarray(similarity.similarity_matrix(stacked, metric=metric, method=method, outputs=(c,), return_inner=True))
                for c in range(n_out)])
        inner = (inner + np.swapaxes(inner, -1, -2)) / 2
        full = inner.sum(0)
        d = _require_positive(np.diagonal(full), f"tensor/{metric}", ("checkpoint",))
        out[f"tensor/{metric}"] = full / np.sqrt(d[:, None] * d[None, :])
        if per_output:
            d = _require_positive(np.diagonal(inner, axis1=1, axis2=2), f"tensor/{metric}/outputs", ("output", "checkpoint"))
            out[f"tensor/{metric}/outputs"] = inner / np.sqrt(d[:, :, None] * d[:, None, :])
    return out


def tensor_similarity_to(
    nets,
    reference,
    /,
    *,
    metrics: Sequence[str] = TENSOR_METRICS,
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
    ref = similarity.validate_network(reference, "reference")
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
        r[c] = float(similarity.tensor_inner(ref, ref, **kw))
        for i, a in enumerate(nets):
            cross[c, i] = float(similarity.tensor_inner(a, ref, **kw))
            own[c, i] = float(similarity.tensor_inner(a, a, **kw))
    return cross, own, r


# --------------------------------------------------------------------------- baselines


@jax.jit
def _weight_cosine_gram(stacked):
    flat = jnp.concatenate([x.reshape(x.shape[0], -1) for x in jax.tree.leaves(stacked)], axis=1)
    return flat @ flat.T


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
    gram = np.asarray(_weight_cosine_gram(stack_networks(nets)), np.float64)
    d = _require_positive(np.diagonal(gram), "weight_cosine", ("checkpoint",))
    return gram / np.sqrt(d[:, None] * d[None, :])


@jax.jit
def _outputs(stacked, x):
    return jax.vmap(similarity.apply_network, in_axes=(0, None))(stacked, x)


def network_outputs(nets, x: ArrayLike, /) -> jax.Array:
    """Every checkpoint's outputs on ``x``, in one call.

    Args:
      nets: a list of networks with one architecture, or a stacked network.
      x: ``(m, d)`` inputs (flattened).

    Returns:
      ``(n, m, o)``.
    """
    stacked = stack_networks(nets)
    x = jnp.asarray(x)
    d = stacked[0].d_in
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(
            f"x must be (m, {d}) flattened inputs for networks that take d={d}, got shape {tuple(x.shape)}; "
            "reshape images with x.reshape(len(x), -1)."
        )
    return _outputs(stacked, x.astype(jax.tree.leaves(stacked)[0].dtype))


def _check_outputs(outputs, name):
    y = jnp.asarray(outputs)
    if y.ndim != 3:
        raise ValueError(f"{name} must be (n_checkpoints, m, o) outputs, got shape {tuple(y.shape)}.")
    return y


@jax.jit
def _per_sample_cosine(y):
    u = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
    return jnp.einsum("amo,bmo->ab", u, u) / y.shape[1]


def behavioral_matrix(outputs: ArrayLike, /) -> np.ndarray:
    """Behavioural similarity of every pair of checkpoints: mean per-sample cosine of their outputs.

    Args:
      outputs: ``(n, m, o)`` outputs of n checkpoints on the same m inputs
        (:func:`network_outputs`).

    Returns:
      ``(n, n)`` float64; entry ``[i, j]`` equals
      ``similarity.behavioral_similarity(nets[i], nets[j], x)``.

    Raises:
      ValueError: when a checkpoint outputs the zero vector on some input (the cosine is undefined).

    Examples:
      >>> y = np.array([[[1.0, 0.0]], [[1.0, 1.0]]])   # two checkpoints, one input
      >>> behavioral_matrix(y).round(4).tolist()
      [[1.0, 0.7071], [0.7071, 1.0]]
    """
    y = _check_outputs(outputs, "outputs")
    norms = np.asarray(jnp.linalg.norm(y, axis=-1))
    if not np.all(norms > 0):
        i, m = np.argwhere(~(norms > 0))[0]
        raise ValueError(
            f"Checkpoint {i} outputs the zero vector on input {m}, where the cosine is undefined; "
            "drop those inputs or compare with tensor similarity."
        )
    s = np.asarray(_per_sample_cosine(y), np.float64)
    return (s + s.T) / 2


@jax.jit
def _cka_all_pairs(y):
    return jax.vmap(lambda a: jax.vmap(lambda b: similarity.cka(a, b))(y))(y)


def cka_matrix(outputs: ArrayLike, /) -> np.ndarray:
    """Linear CKA between the outputs (e.g. logits) of every pair of checkpoints.

    Args:
      outputs: ``(n, m, o)`` outputs of n checkpoints on the same m inputs.

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


def checkpoint_matrices(
    nets,
    /,
    *,
    data: Mapping[str, ArrayLike] | None = None,
    metrics: Sequence[str] = TENSOR_METRICS,
    per_output: bool = True,
    cka: bool = True,
) -> dict[str, np.ndarray]:
    """Every checkpoint x checkpoint matrix: tensor similarity and the baselines.

    Args:
      nets: a list of networks with one architecture (checkpoints), or a stacked network.
      data: ``{name: (m, d) inputs}``: behavioural similarity (and CKA of the
        outputs) is computed on each data set, e.g. ``{"clean": x, "poisoned": x_p}``.
      metrics: tensor-similarity metrics.
      per_output: also the per-output slice matrices of each metric.
      cka: also linear CKA of the outputs on each data set.

    Returns:
      ``{"tensor/<metric>": (n, n), "tensor/<metric>/outputs": (o, n, n),
      "weight_cosine": (n, n), "behavioral/<name>": (n, n), "cka/<name>": (n, n)}``.
    """
    stacked = stack_networks(nets)
    out = tensor_matrices(stacked, metrics=metrics, per_output=per_output)
    out["weight_cosine"] = weight_cosine_matrix(stacked)
    for name, x in (data or {}).items():
        y = network_outputs(stacked, x)
        out[f"behavioral/{name}"] = behavioral_matrix(y)
        if cka:
            out[f"cka/{name}"] = cka_matrix(y)
    return out


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


# --------------------------------------------------------------------------- figures


def _stage_ticks(steps, spans):
    """Checkpoint indices where each stage starts (for tick labels) and ends (for lines)."""
    steps = np.asarray(steps)
    starts, ends = [], []
    for first, last, name in spans or ():
        inside = np.flatnonzero((steps > first) & (steps <= last))
        if inside.size:
            starts.append((inside[0], name))
            ends.append(inside[-1])
    return starts, ends[:-1]


def heatmap_panels(
    matrices: Mapping[str, ArrayLike],
    steps: Sequence[int],
    path: str | os.PathLike,
    *,
    spans: Sequence[tuple[int, int, str]] | None = None,
    suptitle: str,
    ncols: int = 3,
    cmap: str = "viridis",
) -> pathlib.Path:
    """One heatmap per checkpoint x checkpoint matrix, with the stages marked.

    Args:
      matrices: ``{title: (n, n)}``.
      steps: ``(n,)`` global step of each checkpoint (tick labels).
      path: where the PNG goes.
      spans: ``[(first_step, last_step, name)]`` stages; their boundaries are
        drawn as white lines and their names label the ticks.
      suptitle: the figure title.
      ncols: panels per row.
      cmap: colour map; each panel has its own colour scale and colour bar.

    Returns:
      The path written.
    """
    from funsim.experiments.plotting import plt, save

    n = len(matrices)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.9 * nrows), squeeze=False)
    starts, ends = _stage_ticks(steps, spans)
    for ax, (title, m) in zip(axes.ravel(), matrices.items()):
        m = np.asarray(m, float)
        im = ax.imshow(m, cmap=cmap, interpolation="nearest", vmax=1.0 if np.nanmax(m) <= 1 + 1e-9 else None)
        for e in ends:
            ax.axhline(e + 0.5, color="white", lw=0.7)
            ax.axvline(e + 0.5, color="white", lw=0.7)
        if starts:
            idx, names = zip(*starts)
            ax.set_xticks(idx, names, rotation=60, ha="right", fontsize=7)
            ax.set_yticks(idx, [f"{nm} ({steps[i]})" for i, nm in starts], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("checkpoint (stage start)", fontsize=8)
        ax.set_ylabel("checkpoint (stage, global step)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def curves_over_steps(
    steps: Sequence[int],
    series: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    spans: Sequence[tuple[int, int, str]] | None = None,
    title: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    styles: Mapping[str, dict] | None = None,
) -> pathlib.Path:
    """Curves against the global training step, with the stages shaded and named.

    Args:
      steps: ``(n,)`` x values.
      series: ``{label: (n,)}``.
      path: where the PNG goes.
      spans: ``[(first_step, last_step, name)]`` stages, shaded alternately.
      title: axes title.
      ylabel: y-axis label.
      ylim: y range.
      styles: per-label matplotlib keyword arguments (colour, width, ...).

    Returns:
      The path written.
    """
    from funsim.experiments.plotting import plt, save

    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for k, (first, last, name) in enumerate(spans or ()):
        if k % 2:
            ax.axvspan(first, last, color="0.92", lw=0)
        ax.text((first + last) / 2, 1.01, name, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=7, rotation=0)
    for label, ys in series.items():
        ax.plot(steps, np.asarray(ys, float), label=label, marker=".", ms=3, **(styles or {}).get(label, {}))
    ax.set_xlabel("global training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, pad=16)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(series) > 5 else 1, loc="best")
    fig.tight_layout()
    return save(fig, path)
