"""Bilinear and linear layers as pure pytrees, and their evaluation.

A network is a tuple of :class:`BilinearLayer` and :class:`LinearLayer`
applied in order (DESIGN.md §4).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BilinearLayer:
    """One bilinear layer ``f(x) = down @ ((left x + lb) * (right x + rb)) + db [+ x]``.

    Attributes:
      left: ``(h, d)``.
      right: ``(h, d)``.
      down: ``(o, h)``.
      left_bias: ``(h,)`` or None.
      right_bias: ``(h,)`` or None.
      down_bias: ``(o,)`` or None.
      residual: static bool; adds the input to the output (requires ``o == d``).
    """

    left: jax.Array
    right: jax.Array
    down: jax.Array
    left_bias: Optional[jax.Array] = None
    right_bias: Optional[jax.Array] = None
    down_bias: Optional[jax.Array] = None
    residual: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def d_in(self) -> int:
        return self.left.shape[-1]

    @property
    def d_hidden(self) -> int:
        return self.left.shape[-2]

    @property
    def d_out(self) -> int:
        return self.down.shape[-2]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearLayer:
    """An affine layer ``f(x) = weight @ x + bias``.

    Attributes:
      weight: ``(o, d)``.
      bias: ``(o,)`` or None.
    """

    weight: jax.Array
    bias: Optional[jax.Array] = None

    @property
    def d_in(self) -> int:
        return self.weight.shape[-1]

    @property
    def d_out(self) -> int:
        return self.weight.shape[-2]


Layer = Union[BilinearLayer, LinearLayer]
Network = tuple  # tuple[Layer, ...]


def apply_layer(layer: Layer, x: ArrayLike) -> jax.Array:
    """Evaluate one layer on a batch.

    Args:
      layer: a :class:`BilinearLayer` or :class:`LinearLayer`.
      x: ``(n, d)``.

    Returns:
      ``(n, o)``.
    """
    x = jnp.asarray(x)
    if isinstance(layer, LinearLayer):
        y = jnp.einsum("od,nd->no", layer.weight, x)
        return y if layer.bias is None else y + layer.bias
    if isinstance(layer, BilinearLayer):
        a = jnp.einsum("hd,nd->nh", layer.left, x)
        b = jnp.einsum("hd,nd->nh", layer.right, x)
        if layer.left_bias is not None:
            a = a + layer.left_bias
        if layer.right_bias is not None:
            b = b + layer.right_bias
        y = jnp.einsum("oh,nh->no", layer.down, a * b)
        if layer.down_bias is not None:
            y = y + layer.down_bias
        if layer.residual:
            y = y + x
        return y
    raise TypeError(
        f"Expected a BilinearLayer or LinearLayer, got {type(layer).__name__}."
    )


def apply_network(net: Network, x: ArrayLike) -> jax.Array:
    """Evaluate a network (a tuple of layers applied in order).

    Args:
      net: tuple of :class:`BilinearLayer` / :class:`LinearLayer`.
      x: ``(n, d)``.

    Returns:
      ``(n, o)``: the network's outputs.

    Examples:
      >>> import jax.numpy as jnp
      >>> layer = BilinearLayer(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((1, 2)))
      >>> apply_network((layer,), jnp.ones((1, 3))).tolist()
      [[18.0]]
    """
    if isinstance(net, (BilinearLayer, LinearLayer)):
        net = (net,)
    for layer in net:
        x = apply_layer(layer, x)
    return x
