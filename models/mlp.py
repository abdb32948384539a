"""Softmax regression and multilayer perceptrons.

Inputs are ``(n, *input_shape)`` floats; they are flattened to
``(n, prod(input_shape))`` first, so images can be passed as they are.
"""

from __future__ import annotations

import functools
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
    """Multilayer perceptron ``flatten -> [dense -> (BatchNorm) -> activation -> (dropout)] * len(widths) -> dense``.

    Layers: ``("fc0", ..., "fc{k-1}", "logits")``; ``fc{i}`` is the output of
    the i-th hidden layer after its activation (``features(x, point="pre_activation")``:
    before it, the dense layer's raw output, before any BatchNorm: what the usable-information
    paper's code reads as its MLPs' layers).

    With ``batch_norm`` and ``dropout`` it is the paper code's MLP (its ``LinearNet``: dense ->
    BatchNorm -> ReLU -> dropout per hidden layer). BatchNorm (``nnx.BatchNorm`` with momentum 0.9,
    PyTorch's default ``momentum=0.1`` in Flax's convention, and epsilon 1e-5) keeps running averages
    of the mean and variance (``nnx.BatchStat``; Flax averages the biased minibatch variance, PyTorch
    the unbiased one): a training step (:meth:`training_logits`, called by ``models.train``)
    normalises with the minibatch's statistics and updates the averages; every other use
    (``__call__``, ``features``, ``tail``, hence evaluation and stitching) normalises with the
    running averages and draws no dropout, so it is deterministic.

    Args:
      input_shape: per-sample shape (int or tuple).
      n_classes: number of outputs.
      widths: hidden widths.
      activation: a name in ``ACTIVATIONS`` (relu, gelu, tanh, silu, identity).
      batch_norm: BatchNorm after each hidden dense layer (a bool).
      dropout: dropout rate after each hidden activation, in ``[0, 1)``; 0: none.
      rngs: ``nnx.Rngs``. The dense layers are drawn first, so with ``batch_norm`` they start
        as those of the plain MLP of the same seed.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> m = MLP(4, 3, widths=(8, 8), rngs=nnx.Rngs(0))
      >>> m.layer_names()
      ('fc0', 'fc1', 'logits')
      >>> m.features(jnp.ones((2, 4)))["fc1"].shape
      (2, 8)
      >>> MLP(4, 3, widths=(8,), batch_norm=True, dropout=0.1, rngs=nnx.Rngs(0))(jnp.ones((2, 4))).shape
      (2, 3)
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        widths: Sequence[int] = (64, 64),
        activation: str = "relu",
        batch_norm: bool = False,
        dropout: float = 0.0,
        rngs: nnx.Rngs,
    ):
        if not isinstance(batch_norm, (bool, np.bool_)):
            raise ValueError(f"batch_norm must be True or False, got {batch_norm!r}.")
        if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, (int, float, np.integer, np.floating)) \
                or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be a rate in [0, 1), got {dropout!r}.")
        self.input_shape = per_sample_shape(input_shape)
        get_activation(activation)
        self.activation = activation
        self.batch_norm, self.dropout = bool(batch_norm), float(dropout)
        dims = [int(np.prod(self.input_shape)), *[int(w) for w in widths]]
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:])])
        self.head = nnx.Linear(dims[-1], n_classes, rngs=rngs)
        self.norms = nnx.List([nnx.BatchNorm(b, use_running_average=True, momentum=0.9, epsilon=1e-5, rngs=rngs)
                               for b in dims[1:]]) if self.batch_norm else None
        self.drop = nnx.Dropout(self.dropout) if self.dropout else None

    def _stage_names(self):
        return (*(f"fc{i}" for i in range(len(self.hidden))), "logits")

    def _after_dense(self, i, z, key=None):
        """Hidden stage ``i`` after its dense layer: [BatchNorm ->] activation [-> dropout]. ``key`` None:
        BatchNorm on its running averages, no dropout; a key: a training step (see :meth:`training_logits`)."""
        if self.norms is not None:
            z = self.norms[i](z, use_running_average=key is None)
        z = get_activation(self.activation)(z)
        if key is not None and self.drop is not None:
            z = self.drop(z, deterministic=False, rngs=jax.random.fold_in(key, i))
        return z

    def _stage(self, i, z):
        if i == 0:
            z = z.reshape(z.shape[0], -1)
        if i < len(self.hidden):
            return self._after_dense(i, self.hidden[i](z))
        return self.head(z)

    def _pre_activation(self, i):
        return functools.partial(self._after_dense, i) if i < len(self.hidden) else None

    def _stage_pre(self, i, z):
        if i == 0:
            z = z.reshape(z.shape[0], -1)
        return self.hidden[i](z)

    def training_logits(self, x, key):
        """The logits of a training step on the minibatch ``x``: BatchNorm normalises with the minibatch's
        mean and (biased) variance and updates its running averages in place; dropout (inverted: the kept
        units scaled by ``1 / (1 - dropout)``) is drawn from ``key``, folded with the layer's index."""
        if self.norms is None and self.drop is None:
            return self(x)
        z = self._prepare(x)
        z = z.reshape(z.shape[0], -1)
        for i, dense in enumerate(self.hidden):
            z = self._after_dense(i, dense(z), key)
        return self.head(z)
