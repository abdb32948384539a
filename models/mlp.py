"""Softmax regression and multilayer perceptrons.

Inputs are ``(n, *input_shape)`` floats; they are flattened to
``(n, prod(input_shape))`` first, so images can be passed as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from funsim.models.base import FeatureModel, unknown_name_error

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "tanh": jnp.tanh,
    "silu": jax.nn.silu,
    "identity": lambda z: z,
}


def get_activation(name: str):
    """Look up an activation function by name (see ``ACTIVATIONS``)."""
    if name not in ACTIVATIONS:
        raise unknown_name_error("activation", name, ACTIVATIONS)
    return ACTIVATIONS[name]


def per_sample_shape(input_shape) -> tuple[int, ...]:
    """A per-sample input shape given as an int or a sequence, as a tuple of ints."""
    return (int(input_shape),) if np.ndim(input_shape) == 0 else tuple(int(s) for s in input_shape)


class Linear(FeatureModel):
    """Softmax regression: ``logits = W flatten(x) + b``.

    Layers: ``("logits",)``.

    Args:
      input_shape: per-sample shape (int or tuple).
      n_classes: number of outputs.
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> Linear(4, 3, rngs=nnx.Rngs(0))(jnp.ones((2, 4))).shape
      (2, 3)
    """

    def __init__(self, input_shape, n_classes: int, *, rngs: nnx.Rngs):
        self.input_shape = per_sample_shape(input_shape)
        self.head = nnx.Linear(int(np.prod(self.input_shape)), n_classes, rngs=rngs)

    def _stage_names(self):
        return ("logits",)

    def _stage(self, i, z):
        return self.head(z.reshape(z.shape[0], -1))


class MLP(FeatureModel):
    """Multilayer perceptron ``flatten -> [dense -> activation] * len(widths) -> dense``.

    Layers: ``("fc0", ..., "fc{k-1}", "logits")``; ``fc{i}`` is the output of
    the i-th hidden layer after its activation (``features(x, point="pre_activation")``:
    before it, the dense layer's raw output).

    Args:
      input_shape: per-sample shape (int or tuple).
      n_classes: number of outputs.
      widths: hidden widths.
      activation: a name in ``ACTIVATIONS`` (relu, gelu, tanh, silu, identity).
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> m = MLP(4, 3, widths=(8, 8), rngs=nnx.Rngs(0))
      >>> m.layer_names()
      ('fc0', 'fc1', 'logits')
      >>> m.features(jnp.ones((2, 4)))["fc1"].shape
      (2, 8)
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        widths: Sequence[int] = (64, 64),
        activation: str = "relu",
        rngs: nnx.Rngs,
    ):
        self.input_shape = per_sample_shape(input_shape)
        get_activation(activation)
        self.activation = activation
        dims = [int(np.prod(self.input_shape)), *[int(w) for w in widths]]
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:])])
        self.head = nnx.Linear(dims[-1], n_classes, rngs=rngs)

    def _stage_names(self):
        return (*(f"fc{i}" for i in range(len(self.hidden))), "logits")

    def _stage(self, i, z):
        if i == 0:
            z = z.reshape(z.shape[0], -1)
        if i < len(self.hidden):
            return get_activation(self.activation)(self.hidden[i](z))
        return self.head(z)

    def _pre_activation(self, i):
        return get_activation(self.activation) if i < len(self.hidden) else None

    def _stage_pre(self, i, z):
        if i == 0:
            z = z.reshape(z.shape[0], -1)
        return self.hidden[i](z)
