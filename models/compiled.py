"""A model's feature extraction and tails as compiled programs, run in chunks of rows.

``model.features(x)`` and ``model.tail(layer, z)`` run eagerly, one operation at
a time. :func:`compiled` splits the model once (``nnx.split``: the graphdef is
static, the arrays are traced) and runs both through ``jax.jit``. The graphdef
of every model of one architecture is equal, so all seeds of an architecture
share one program per input shape. Rows go through in chunks of ``chunk``
(the last one padded by repeating its last row, so every chunk has one
shape); rows are independent in every funsim model, so the padding changes
nothing, and the results equal the eager ones up to float rounding.

The compiled model holds a snapshot of the model's arrays: after training the
model further, call :func:`compiled` again.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["CompiledModel", "compiled"]


@functools.partial(jax.jit, static_argnames=("graphdef", "point"))
def _features(graphdef, state, x, point=None):
    # as a list in the model's order: a dict would come back with its keys sorted
    model = nnx.merge(graphdef, state)
    return list((model.features(x) if point is None else model.features(x, point=point)).values())


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _logits(graphdef, state, x):
    return nnx.merge(graphdef, state)(x)


@functools.partial(jax.jit, static_argnames=("graphdef", "layer", "point"))
def _tail(graphdef, state, z, layer, point=None):
    model = nnx.merge(graphdef, state)
    return model.tail(layer, z) if point is None else model.tail(layer, z, point=point)


def _array(x):
    """NumPy stays NumPy (each chunk goes to the device on its own); anything else becomes a JAX array."""
    return x if isinstance(x, (np.ndarray, jax.Array)) else np.asarray(x)


def _chunked(fn, x, chunk: int, as_numpy: bool):
    """``fn`` on ``x`` in chunks of ``chunk`` rows (the last padded to ``chunk``), concatenated."""
    n = x.shape[0]
    if n <= chunk:
        out = fn(x)
        return jax.tree.map(np.asarray, out) if as_numpy else out
    parts = []
    for i in range(0, n, chunk):
        part = x[i:i + chunk]
        m = part.shape[0]
        if m < chunk:  # one shape for every chunk: repeat the last row
            xp = np if isinstance(part, np.ndarray) else jnp
            part = xp.concatenate([part, xp.repeat(part[-1:], chunk - m, axis=0)])
        try:
            out = fn(part)
        except ValueError:  # bad input: let the message show the caller's shape, not the chunk's
            jax.eval_shape(fn, jax.ShapeDtypeStruct(x.shape, x.dtype))
            raise
        parts.append(jax.tree.map(np.asarray, out) if as_numpy else out)
    if as_numpy:
        return jax.tree.map(lambda *a: np.concatenate(a)[:n], *parts)
    return _concat_rows(parts, n)


@functools.partial(jax.jit, static_argnums=1)
def _concat_rows(parts, n: int):
    """The chunks' outputs joined along the rows, cut to ``n`` rows (one small program per shape)."""
    return jax.tree.map(lambda *a: jnp.concatenate(a)[:n], *parts)


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledModel:
    """A funsim model's ``features``, ``tail`` and forward pass as jitted programs (see :func:`compiled`).

    Attributes:
      graphdef: the model's ``nnx.GraphDef`` (static: its architecture).
      state: the model's arrays (``nnx.State``), a snapshot taken by :func:`compiled`.
      chunk: rows per call of a compiled program.
      layers: the keys of ``features``, in order (the model's ``layer_names()``).
    """

    graphdef: Any
    state: Any
    chunk: int
    layers: tuple[str, ...] = ()

    def features(self, x, /, *, as_numpy: bool = False, point: str | None = None) -> dict[str, Any]:
        """``model.features(x)``: every stage's output, ``{layer: (n, ...)}``.

        Args:
          x: ``(n, *input_shape)``.
          as_numpy: return NumPy arrays, each chunk moved off the device as it is done.
          point: ``model.features(x, point=point)`` (None: the model's default, post-activation).
        """
        if not self.layers:
            raise TypeError("CompiledModel.features needs a model with layer_names() (every funsim model has it).")
        values = _chunked(lambda a: _features(self.graphdef, self.state, a, point), _array(x), self.chunk, as_numpy)
        return dict(zip(self.layers, values, strict=True))

    def tail(self, layer: str, z, /, *, as_numpy: bool = False, point: str | None = None):
        """``model.tail(layer, z)``: logits from the activations of ``layer`` (or their flattened form);
        ``point``: where ``z`` was tapped (``model.tail(layer, z, point=point)``; None: post-activation)."""
        return _chunked(lambda a: _tail(self.graphdef, self.state, a, layer, point), _array(z), self.chunk, as_numpy)

    def __call__(self, x, /, *, as_numpy: bool = False):
        """``model(x)``: the logits."""
        return _chunked(lambda a: _logits(self.graphdef, self.state, a), _array(x), self.chunk, as_numpy)


def compiled(model: nnx.Module, /, *, chunk: int = 1024) -> CompiledModel:
    """``model``'s feature extraction, tails and forward pass, jitted, in chunks of ``chunk`` rows.

    Args:
      model: a funsim model (any NNX module with ``features(x)`` and ``tail(layer, z)``;
        ``__call__`` alone suffices for the forward pass).
      chunk: the most rows per compiled call (bounds the memory of the activations).

    Returns:
      a :class:`CompiledModel` holding a snapshot of the model's arrays.

    Raises:
      TypeError: not a Flax NNX module.
      ValueError: ``chunk < 1``.

    Examples:
      >>> import numpy as np
      >>> from flax import nnx
      >>> from funsim.models import MLP
      >>> m = MLP(4, 3, widths=(8,), rngs=nnx.Rngs(0))
      >>> x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
      >>> fast = compiled(m, chunk=2)
      >>> bool(np.allclose(fast.features(x)["fc0"], m.features(x)["fc0"], atol=1e-6))
      True
      >>> fast.tail("fc0", m.features(x)["fc0"]).shape
      (5, 3)
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"compiled needs a Flax NNX model, got {type(model).__name__}.")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer (rows per compiled call), got {chunk!r}.")
    names = getattr(model, "layer_names", None)
    graphdef, state = nnx.split(model)
    return CompiledModel(graphdef, state, int(chunk), tuple(names()) if callable(names) else ())
