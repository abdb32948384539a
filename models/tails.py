"""A model's rest of network from a layer, as a pure function plus parameters.

``similarity.train_stitchers`` takes the tail as ``tail_apply(tail_params, h)``
with ``tail_apply`` static (hashed) and ``tail_params`` traced. For a Flax NNX
model, :func:`split_tail` returns ``(TailApply(graphdef, layer), state)`` from
``nnx.split``: the graphdef is equal for every model of the same architecture,
so stitching into another model of that architecture reuses the compiled loop,
and the states of several such models stack along a leading axis
(:func:`stack_tails`) to train into all of them at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@dataclasses.dataclass(frozen=True)
class TailApply:
    """``tail(params, h) = nnx.merge(graphdef, params).tail(layer, h)``; hashable by value.

    Attributes:
      graphdef: the model's ``nnx.GraphDef`` (its architecture, no arrays).
      layer: the layer whose activations ``h`` the tail takes.
    """

    graphdef: Any
    layer: str

    def __call__(self, params: Any, h: jax.Array) -> jax.Array:
        return nnx.merge(self.graphdef, params).tail(self.layer, h)


@dataclasses.dataclass(frozen=True, eq=False)
class _BoundTail:
    """A duck-typed (non-NNX) model's tail, hashed by the model's identity; params unused."""

    model: Any
    layer: str

    def __eq__(self, other):
        return isinstance(other, _BoundTail) and other.model is self.model and other.layer == self.layer

    def __hash__(self):
        return hash((id(self.model), self.layer))

    def __call__(self, params: Any, h: jax.Array) -> jax.Array:
        return self.model.tail(self.layer, h)


def split_tail(model: Any, layer: str, /) -> tuple[Any, Any]:
    """``(tail_apply, tail_params)`` for stitching into ``model`` at ``layer``.

    Args:
      model: a Flax NNX model with ``.tail(layer, h)`` (every ``models.*``
        network), or any object with ``.tail(layer, h)`` (then its arrays are
        constants of the compiled loop and only the same object reuses it).
      layer: one of ``model.layer_names()``.

    Returns:
      ``(tail_apply, tail_params)`` with ``tail_apply(tail_params, h) == model.tail(layer, h)``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> from funsim.models import MLP
      >>> a, b = (MLP(4, 3, widths=(8,), rngs=nnx.Rngs(s)) for s in (0, 1))
      >>> (fa, pa), (fb, pb) = split_tail(a, "fc0"), split_tail(b, "fc0")
      >>> fa == fb, fa(pb, jnp.ones((2, 8))).shape
      (True, (2, 3))
    """
    if not callable(getattr(model, "tail", None)):
        raise TypeError(f"model must have .tail(layer, h) -> logits; {type(model).__name__} has not.")
    names = getattr(model, "layer_names", None)
    if callable(names) and layer not in tuple(names()):
        raise ValueError(f"layer={layer!r} is not a layer of the model; its layers are: "
                         f"{', '.join(repr(x) for x in names())}.")
    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
        return TailApply(graphdef, layer), state
    return _BoundTail(model, layer), ()


def stack_tails(models: Sequence[Any], layer: str, /) -> tuple[TailApply, Any]:
    """One ``tail_apply`` and the M models' parameters stacked on a leading axis.

    For ``train_stitchers(..., stacked_tails=True)``: train every source into
    the same layer of M models of one architecture (e.g. several seeds) at once.

    Args:
      models: M Flax NNX models of the same architecture.
      layer: the layer.

    Returns:
      ``(tail_apply, tail_params)``, every leaf of ``tail_params`` ``(M, ...)``.

    Raises:
      ValueError: models of different architectures, or not NNX models.
    """
    splits = [split_tail(m, layer) for m in models]
    if not splits or any(not isinstance(f, TailApply) or f != splits[0][0] for f, _ in splits):
        raise ValueError("stack_tails needs one or more Flax NNX models of the same architecture "
                         "(equal nnx graphdefs); stitch into different architectures in separate calls.")
    # stacked on the host and put on the device once: no compiled program per leaf shape
    return splits[0][0], jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(x) for x in a])),
                                      *(p for _, p in splits))


@dataclasses.dataclass(frozen=True)
class HeadTail:
    """A model's tail up to stage ``until``, then a new linear head: ``tail(params, h) -> (n, C)`` logits.

    The usable-information paper's coarse task: a new head trained on the frozen
    backbone's penultimate features (:func:`train_head`), and stitching trains through
    the backbone's tail and that head. ``params = {"model": nnx state, "head": {"weight":
    (d, C), "bias": (C,)}}``; hashable by value (one compiled loop per architecture).

    Attributes:
      graphdef: the model's ``nnx.GraphDef``.
      layer: the layer whose activations ``h`` the tail takes.
      until: the stage the head reads (e.g. ``"pool"``), flattened.
    """

    graphdef: Any
    layer: str
    until: str

    def __call__(self, params: Any, h: jax.Array) -> jax.Array:
        z = nnx.merge(self.graphdef, params["model"]).tail(self.layer, h, until=self.until)
        z = z.reshape(z.shape[0], -1)
        return z @ params["head"]["weight"] + params["head"]["bias"][None, :]


def penultimate(model: Any) -> str | None:
    """The stage before the logits (a new head's input), or None for a model with one stage."""
    names = tuple(model.layer_names())
    return names[-2] if len(names) > 1 else None


def train_head(z, y, n_classes: int, /, *, steps: int = 500, learning_rate: float = 1e-2) -> dict:
    """A softmax-regression head on frozen features: full-batch Adam on the mean cross-entropy.

    Args:
      z: ``(n, d)`` features (e.g. a model's penultimate stage on its training rows).
      y: ``(n,)`` integer labels in ``[0, n_classes)``.
      n_classes: outputs of the head.
      steps, learning_rate: Adam (from zero weights: the problem is convex).

    Returns:
      ``{"weight": (d, n_classes), "bias": (n_classes,)}`` (NumPy).

    Examples:
      >>> import numpy as np
      >>> z = np.array([[0.0], [1.0], [2.0], [3.0]]); y = np.array([0, 0, 1, 1])
      >>> h = train_head(z, y, 2, steps=300, learning_rate=0.1)
      >>> bool((np.argmax(z @ h["weight"] + h["bias"], 1) == y).all())
      True
    """
    import numpy as np

    z = np.asarray(z)
    y = np.asarray(y)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise ValueError(f"train_head needs z (n, d) and y (n,), got {z.shape} and {y.shape}.")
    if y.min() < 0 or y.max() >= n_classes:
        raise ValueError(f"train_head: labels must lie in [0, {n_classes}), got [{y.min()}, {y.max()}].")
    mu, sd = z.mean(0), z.std(0) + 1e-6  # standardised inside, folded back into the head
    w, b = _fit_head(jnp.asarray((z - mu) / sd), jnp.asarray(y), n_classes, steps, float(learning_rate))
    w, b = np.asarray(w) / sd[:, None], np.asarray(b)
    return {"weight": w.astype(z.dtype), "bias": (b - mu @ w).astype(z.dtype)}


def _fit_head(z, y, n_classes, steps, learning_rate):
    return _fit_head_jit(z, y, learning_rate, n_classes=n_classes, steps=steps)


def _head_loss(p, z, y):
    logits = z @ p["weight"] + p["bias"][None, :]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def _head_step(p, m, v, t, z, y, lr):
    g = jax.grad(_head_loss)(p, z, y)
    m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
    v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
    step = jax.tree.map(lambda a, b: lr * (a / (1 - 0.9**t)) / (jnp.sqrt(b / (1 - 0.999**t)) + 1e-8), m, v)
    return jax.tree.map(lambda a, s: a - s, p, step), m, v


def _fit_head_jit(z, y, lr, *, n_classes, steps):
    # the start on the host (a zeros or a cast on the device is a compiled program per shape)
    zeros = lambda: {"weight": jnp.asarray(np.zeros((z.shape[1], n_classes), z.dtype)),  # noqa: E731
                     "bias": jnp.asarray(np.zeros((n_classes,), z.dtype))}
    p, m, v = zeros(), zeros(), zeros()
    lr = jnp.asarray(np.asarray(lr, z.dtype))
    for t in range(1, steps + 1):
        p, m, v = _head_step(p, m, v, jnp.asarray(t, z.dtype), z, y, lr)
    return p["weight"], p["bias"]


def stack_head_tails(models: Sequence[Any], layer: str, heads: Sequence[dict], /) -> tuple[HeadTail, Any]:
    """:func:`stack_tails` with a new head per model on its penultimate stage: ``(HeadTail, params (M, ...))``."""
    tail, state = stack_tails(models, layer)
    until = penultimate(models[0])
    if until is None:
        raise ValueError("stack_head_tails: the model has a single stage, so no penultimate features for a head.")
    head = jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(x) for x in a])), *heads)
    return HeadTail(tail.graphdef, layer, until), {"model": state, "head": head}


@dataclasses.dataclass(frozen=True)
class CoarseTail:
    """A tail followed by the marginalisation of its softmax over label groups: coarse logits.

    ``coarse_logits[c] = logsumexp_{k in group c} logits[k]``, so ``softmax(coarse_logits)``
    is the fine softmax summed within each group. Hashable by value (for ``train_stitchers``).

    Attributes:
      tail: ``tail(params, h) -> (b, n_fine)`` logits.
      groups: the coarse class of each fine class.
    """

    tail: Any
    groups: tuple[int, ...]

    def __call__(self, params: Any, h):
        return coarsen_logits(self.tail(params, h), self.groups)


def coarsen_logits(logits, groups):
    """``(..., n_fine) -> (..., n_coarse)``: log of the fine softmax summed within each group (up to a constant).

    Examples:
      >>> import numpy as np
      >>> np.round(np.asarray(coarsen_logits(np.log(np.array([[0.1, 0.2, 0.7]])), (0, 0, 1))), 3).tolist()
      [[-1.204, -0.357]]
    """
    groups = np.asarray(groups)
    if isinstance(logits, np.ndarray):  # on the host: no compiled program per shape
        return np.stack([np.logaddexp.reduce(logits[..., groups == c], axis=-1)
                         for c in range(groups.max() + 1)], axis=-1)
    onehot = jnp.asarray(np.arange(groups.max() + 1)[:, None] == groups[None, :])  # (n_coarse, n_fine)
    masked = jnp.where(onehot, jnp.asarray(logits)[..., None, :], -jnp.inf)
    return jax.nn.logsumexp(masked, axis=-1)
