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
    return splits[0][0], jax.tree.map(lambda *a: jnp.stack(a), *(p for _, p in splits))
