"""Bilinear-attention transformers as pure pytrees: the types, their evaluation and validation.

The networks whose Gaussian inner products :mod:`funsim.similarity.attention` computes
(docs/design.md §4, "Bilinear attention"). Also here: the checks and the stacking that
the exact method, the closure and the estimators share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._precision import full_precision
from funsim.similarity._validate import check_finite, is_concrete

__all__ = [
    "AttentionLayer",
    "AttentionNetwork",
    "bilinear_attention",
    "apply_attention_layer",
    "apply_attention_network",
    "validate_attention_network",
    "stack_attention_networks",
]

# ---------------------------------------------------------------------------
# Pytrees and evaluation
# ---------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionLayer:
    """One bilinear-attention layer (see :func:`bilinear_attention`).

    Attributes:
      q1, k1, q2, k2, v: ``(a, e, d)`` per-head projections (a heads of size e).
      o: ``(d, a, e)`` output projection.
    """

    q1: jax.Array
    k1: jax.Array
    q2: jax.Array
    k2: jax.Array
    v: jax.Array
    o: jax.Array

    @property
    def n_heads(self) -> int:
        return self.q1.shape[-3]

    @property
    def d_head(self) -> int:
        return self.q1.shape[-2]

    @property
    def d_model(self) -> int:
        return self.q1.shape[-1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionNetwork:
    """An attention-only bilinear transformer: embed, attention layers, unembed.

    ``x_t = embed[token_t] (+ pos_embed[t])``, then each layer, then
    ``logits_t = unembed @ x_t``. On token-space vectors ``g: (T, V)`` (one-hot
    rows or Gaussian ones) the embedding is ``g @ embed``.

    Attributes:
      embed: ``(V, d)`` token embedding (one row per token).
      layers: tuple of :class:`AttentionLayer`, all with model width d.
      unembed: ``(o, d)`` unembedding (o outputs, usually V).
      pos_embed: ``(T_max, d)`` learned positional embedding, or None.
    """

    embed: jax.Array
    layers: tuple
    unembed: jax.Array
    pos_embed: Optional[jax.Array] = None

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[-2]

    @property
    def d_model(self) -> int:
        return self.embed.shape[-1]

    @property
    def n_outputs(self) -> int:
        return self.unembed.shape[-2]

    @property
    def depth(self) -> int:
        return len(self.layers)


@full_precision
def bilinear_attention(
    x: ArrayLike,
    q1: ArrayLike,
    k1: ArrayLike,
    q2: ArrayLike,
    k2: ArrayLike,
    v: ArrayLike,
    o: ArrayLike,
    /,
) -> jax.Array:
    """Causal bilinear attention without softmax, added to the residual stream.

    ``pattern[h, t, s] = (q1_t . k1_s)(q2_t . k2_s) / e^2`` for ``s <= t``
    (0 otherwise), ``out_t = x_t + sum_h O_h sum_s pattern[h, t, s] v_s``,
    where ``q1_t = Q1_h x_t`` etc.

    Args:
      x: ``(n, t, d)`` residual stream.
      q1, k1, q2, k2, v: ``(a, e, d)`` per-head projections (a heads of size e).
      o: ``(d, a, e)`` output projection.

    Returns:
      ``(n, t, d)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> w = jnp.ones((1, 2, 3))
      >>> bilinear_attention(jnp.zeros((1, 4, 3)), w, w, w, w, w, jnp.ones((3, 1, 2))).shape
      (1, 4, 3)
    """
    x = jnp.asarray(x)
    e = jnp.shape(q1)[1]
    proj = lambda w: jnp.einsum("aed,ntd->nate", w, x)
    s1 = jnp.einsum("nate,nase->nats", proj(q1), proj(k1))
    s2 = jnp.einsum("nate,nase->nats", proj(q2), proj(k2))
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    pattern = jnp.where(causal, s1 * s2 / e**2, 0.0)
    z = jnp.einsum("nats,nase->nate", pattern, proj(v))
    return x + jnp.einsum("dae,nate->ntd", o, z)


@full_precision
def apply_attention_layer(layer: AttentionLayer, x: ArrayLike, /) -> jax.Array:
    """Evaluate one :class:`AttentionLayer` on a residual stream ``x: (n, T, d)`` -> ``(n, T, d)``."""
    return bilinear_attention(x, layer.q1, layer.k1, layer.q2, layer.k2, layer.v, layer.o)


@full_precision
def apply_attention_network(net: AttentionNetwork, x: ArrayLike, /) -> jax.Array:
    """Logits of an :class:`AttentionNetwork`.

    Args:
      net: the network.
      x: integer tokens ``(n, T)`` in ``[0, V)``, or real token-space vectors
        ``(n, T, V)`` (one-hot rows give the same logits as the tokens).

    Returns:
      ``(n, T, o)`` logits at every position.

    Raises:
      ValueError: for a wrong rank or width, or more positions than ``pos_embed`` has.

    Examples:
      >>> import jax.numpy as jnp
      >>> lay = AttentionLayer(*(jnp.ones((1, 2, 3)),) * 5, jnp.ones((3, 1, 2)))
      >>> net = AttentionNetwork(jnp.eye(4, 3), (lay,), jnp.ones((4, 3)))
      >>> toks = jnp.array([[0, 2, 1]])
      >>> bool(jnp.allclose(apply_attention_network(net, toks),
      ...                   apply_attention_network(net, jax.nn.one_hot(toks, 4))))
      True
    """
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.integer):
        if x.ndim != 2:
            raise ValueError(f"Integer tokens must have shape (n, T), got {tuple(x.shape)}.")
        emb = jnp.take(jnp.asarray(net.embed), x, axis=0)
    else:
        if x.ndim != 3 or x.shape[-1] != net.vocab_size:
            raise ValueError(
                f"Token-space inputs must have shape (n, T, V={net.vocab_size}), got "
                f"{tuple(x.shape)}; pass integer tokens (n, T) or one-hot/Gaussian rows."
            )
        emb = jnp.einsum("ntv,vd->ntd", x, net.embed)
    t = x.shape[1]
    if net.pos_embed is not None:
        if t > net.pos_embed.shape[-2]:
            raise ValueError(
                f"x has T={t} positions but pos_embed has only {net.pos_embed.shape[-2]} rows."
            )
        emb = emb + jnp.asarray(net.pos_embed)[:t][None]
    for layer in net.layers:
        emb = apply_attention_layer(layer, emb)
    return jnp.einsum("od,ntd->nto", net.unembed, emb)


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


@full_precision
def validate_attention_network(
    net, name: str = "net", *, context: int | None = None, batch_ndim: int = 0
) -> AttentionNetwork:
    """Check an :class:`AttentionNetwork`'s shapes, dtypes and values; return it.

    Args:
      net: the network.
      name: the argument name used in error messages.
      context: if given, the number of positions it will be evaluated on
        (must not exceed ``pos_embed``'s rows).
      batch_ndim: leading stacking axes on every leaf (1 for a stack of checkpoints).

    Returns:
      ``net``.

    Raises:
      TypeError: not an :class:`AttentionNetwork`, a layer that is not an
        :class:`AttentionLayer`, or a non-float leaf.
      ValueError: inconsistent shapes, a bad ``context`` or non-finite weights.
    """
    if not isinstance(net, AttentionNetwork):
        raise TypeError(
            f"{name} must be an AttentionNetwork (e.g. BilinearTransformer(..., mlp=False)"
            f".to_network()), got {type(net).__name__}."
        )
    bd = batch_ndim
    leaves = {"embed": net.embed, "unembed": net.unembed, "pos_embed": net.pos_embed}
    if not isinstance(net.layers, tuple):
        raise TypeError(f"{name}.layers must be a tuple of AttentionLayer, got {type(net.layers).__name__}.")
    for i, layer in enumerate(net.layers):
        if not isinstance(layer, AttentionLayer):
            raise TypeError(f"{name}.layers[{i}] must be an AttentionLayer, got {type(layer).__name__}.")
        for f in ("q1", "k1", "q2", "k2", "v", "o"):
            leaves[f"layers[{i}].{f}"] = getattr(layer, f)
    batch = None
    shapes = {}
    for field, value in leaves.items():
        if value is None:
            continue
        shp = _shape(value)
        rank = 3 if field.startswith("layers") else 2
        if len(shp) != rank + bd:
            raise ValueError(f"{name}.{field} must have rank {rank + bd}, got shape {shp}.")
        if batch is None:
            batch = shp[:bd]
        elif shp[:bd] != batch:
            raise ValueError(
                f"{name}.{field} has stacking shape {shp[:bd]} but other leaves have {batch}; "
                "stack every checkpoint the same way."
            )
        dt = jnp.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
        if not jnp.issubdtype(dt, jnp.floating):
            raise TypeError(f"{name}.{field} must be a float array, got dtype {dt}.")
        shapes[field] = shp[bd:]
    d = shapes["embed"][1]
    for field in ("unembed", "pos_embed"):
        if field in shapes and shapes[field][1] != d:
            raise ValueError(
                f"{name}.{field} has shape {shapes[field]} but embed {shapes['embed']} gives "
                f"model width d={d}; its last axis must be {d}."
            )
    for i in range(len(net.layers)):
        a, e, dq = shapes[f"layers[{i}].q1"]
        for f in ("k1", "q2", "k2", "v"):
            if shapes[f"layers[{i}].{f}"] != (a, e, dq):
                raise ValueError(
                    f"{name}.layers[{i}].{f} has shape {shapes[f'layers[{i}].{f}']}, expected "
                    f"{(a, e, dq)} like q1."
                )
        if dq != d or shapes[f"layers[{i}].o"] != (d, a, e):
            raise ValueError(
                f"{name}.layers[{i}] has q1 {(a, e, dq)} and o {shapes[f'layers[{i}].o']}; with "
                f"model width d={d} they must be (a, e, {d}) and ({d}, a, e)."
            )
    if context is not None:
        if not isinstance(context, (int, np.integer)) or isinstance(context, bool) or context < 1:
            raise ValueError(f"context must be a positive int (number of positions), got {context!r}.")
        if "pos_embed" in shapes and context > shapes["pos_embed"][0]:
            raise ValueError(
                f"context={context} exceeds {name}.pos_embed's {shapes['pos_embed'][0]} positions; "
                "use a context no longer than the model's sequence length."
            )
    for field, value in leaves.items():
        if value is not None:
            check_finite(jnp.asarray(value), f"{name}.{field}")
    return net



def check_attention_pair(net_a, net_b, context, names=("net_a", "net_b")):
    """Validate two networks compared on one input distribution (same vocabulary, outputs, depth)."""
    validate_attention_network(net_a, names[0], context=context)
    validate_attention_network(net_b, names[1], context=context)
    if net_a.vocab_size != net_b.vocab_size or net_a.n_outputs != net_b.n_outputs:
        raise ValueError(
            f"{names[0]} reads V={net_a.vocab_size} tokens and has {net_a.n_outputs} outputs, "
            f"{names[1]} reads V={net_b.vocab_size} and has {net_b.n_outputs}; networks compared "
            "on one input distribution must share the vocabulary and the outputs."
        )
    if net_a.depth != net_b.depth:
        raise ValueError(
            f"{names[0]} has {net_a.depth} attention layers but {names[1]} has {net_b.depth}; compare "
            "networks of equal depth (an AttentionLayer with o = 0 is the identity: append it to the "
            "shallower one) or use attention_monte_carlo_inner."
        )


def check_scale(scale):
    """Refuse a token-space scale that is not a positive finite number."""
    if not (isinstance(scale, (int, float, np.floating, np.integer)) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number (the token-space std), got {scale!r}.")


def promote_networks(*trees):
    """Every leaf of the trees cast to their common float dtype."""
    dt = jnp.result_type(*jax.tree.leaves(trees))
    return jax.tree.map(lambda x: jnp.asarray(x, dt), trees)


@full_precision
def stack_attention_networks(nets, /) -> AttentionNetwork:
    """A list of checkpoints of one architecture -> one :class:`AttentionNetwork` with a leading axis.

    Args:
      nets: a non-empty sequence of :class:`AttentionNetwork` with the same structure and shapes.

    Returns:
      The stacked network: every leaf ``(n, ...)``.

    Raises:
      ValueError: an empty list, or a network whose structure or shapes differ from the first's.

    Examples:
      >>> import jax.numpy as jnp
      >>> nets = [AttentionNetwork(s * jnp.eye(2), (), jnp.eye(2)) for s in (1.0, 2.0)]
      >>> stack_attention_networks(nets).embed.shape
      (2, 2, 2)
    """
    nets = list(nets)
    if not nets:
        raise ValueError("nets is empty; pass at least one AttentionNetwork.")
    ref = jax.tree.structure(nets[0])
    shapes = [_shape(x) for x in jax.tree.leaves(nets[0])]
    for i, n in enumerate(nets[1:], 1):
        s = [_shape(x) for x in jax.tree.leaves(n)]
        if jax.tree.structure(n) != ref or s != shapes:
            raise ValueError(
                f"nets[{i}] does not have the structure and shapes of nets[0] ({s} vs {shapes}); "
                "checkpoints must share one architecture to be stacked."
            )
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *nets)


def check_finite_inner(value, what: str, *, scale, vocab: int, depth: int):
    """Refuse an inner product (or estimate) that overflowed its dtype; return it when finite.

    No-op under tracing. The message gives the fixes: a smaller token-space scale, or float64.
    """
    if not is_concrete(value):
        return value
    arr = np.asarray(value)
    if np.all(np.isfinite(arr)):
        return value
    big = float(np.finfo(arr.dtype).max)
    raise ValueError(
        f"{what} is not finite in {arr.dtype}: the networks' outputs on the token-space Gaussian "
        f"(scale={scale:g}) are so large that their products exceed {big:.1e}. A network of {depth} attention "
        f"layer(s) has degree up to 5^{depth} in its input, so the inner product grows like scale^(2 * 5^{depth}). "
        f"Fixes: a smaller scale (scale=V**-0.5 = {vocab ** -0.5:.4g} matches the second moment of a uniformly "
        "random one-hot token), or float64: jax.config.update('jax_enable_x64', True) before creating the "
        "networks, with float64 weights."
    )

