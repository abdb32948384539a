"""Bilinear networks: a bilinear MLP and a bilinear-attention transformer.

Both are polynomials in their input: no elementwise nonlinearity, no softmax,
no normalisation. Each bilinear layer is a :class:`similarity.BilinearLayer`
evaluated by :func:`similarity.apply_layer`, each attention layer a
:class:`similarity.AttentionLayer` evaluated by
:func:`similarity.bilinear_attention`; the modules only own the ``nnx.Param``s
(a thin NNX module over a pure function).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from funsim.models.base import FeatureModel
from funsim.models.mlp import per_sample_shape
from funsim.similarity.attention import AttentionLayer, AttentionNetwork, apply_attention_layer
from funsim.similarity.attention import bilinear_attention as bilinear_attention  # re-exported by models
from funsim.similarity.multilinear import BilinearLayer, LinearLayer, apply_layer


def _normal(rngs: nnx.Rngs, shape, scale: float) -> nnx.Param:
    return nnx.Param(scale * jax.random.normal(rngs.params(), shape, jnp.float32))


def _zeros_or_none(n: int, use: bool):
    return nnx.Param(jnp.zeros((n,), jnp.float32)) if use else None


def _val(p):
    return None if p is None else p[...]


class LinearParams(nnx.Module):
    """An affine map ``W x + b`` with ``W: (o, d)``, exported as :class:`similarity.LinearLayer`."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool, rngs: nnx.Rngs):
        self.weight = _normal(rngs, (d_out, d_in), 1.0 / np.sqrt(d_in))
        self.bias = _zeros_or_none(d_out, bias)

    def to_layer(self) -> LinearLayer:
        return LinearLayer(self.weight[...], _val(self.bias))

    def __call__(self, x):
        return apply_layer(self.to_layer(), x)


class BilinearParams(nnx.Module):
    """One bilinear layer ``down((left x + lb) * (right x + rb)) + db [+ x]``.

    Shapes: ``left, right: (h, d)``, ``down: (o, h)``; exported as
    :class:`similarity.BilinearLayer`.
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int, *, bias: bool, residual: bool, rngs: nnx.Rngs):
        if residual and d_in != d_out:
            raise ValueError(f"A residual bilinear layer needs d_in == d_out, got {d_in} and {d_out}.")
        self.left = _normal(rngs, (d_hidden, d_in), 1.0 / np.sqrt(d_in))
        self.right = _normal(rngs, (d_hidden, d_in), 1.0 / np.sqrt(d_in))
        self.down = _normal(rngs, (d_out, d_hidden), (0.5 if residual else 1.0) / np.sqrt(d_hidden))
        self.left_bias = _zeros_or_none(d_hidden, bias)
        self.right_bias = _zeros_or_none(d_hidden, bias)
        self.down_bias = _zeros_or_none(d_out, bias)
        self.residual = residual

    def to_layer(self) -> BilinearLayer:
        return BilinearLayer(
            self.left[...],
            self.right[...],
            self.down[...],
            _val(self.left_bias),
            _val(self.right_bias),
            _val(self.down_bias),
            residual=self.residual,
        )

    def __call__(self, x):
        return apply_layer(self.to_layer(), x)


class BilinearMLP(FeatureModel):
    """Embedding -> ``n_layers`` bilinear layers -> linear head.

    ``embed(x) = E flatten(x) [+ e]``; each layer is
    ``down((left z + lb) * (right z + rb)) + db [+ z]`` (biases if ``bias``,
    the ``+ z`` if ``residual``); ``logits = U z [+ u]``.

    Layers: ``("embed", "bilinear0", ..., "logits")``. Without the embedding
    (``embed=False``) the first bilinear layer reads the flattened input;
    without the head (``head=False``) the last bilinear layer's ``down`` maps
    to the ``n_classes`` outputs and that layer is the ``"logits"`` stage. So
    ``embed=False, head=False, n_layers=1, residual=False`` is a single
    bilinear layer ``d_in -> d_hidden -> n_classes`` (the grokking model:
    one-hot ``(a, b)`` of width ``2p``, hidden 64, outputs ``p``).

    Args:
      input_shape: per-sample shape (int or tuple); inputs are flattened.
      n_classes: number of outputs.
      d_model: width of the embedding and of every layer output.
      d_hidden: hidden units per bilinear layer.
      n_layers: number of bilinear layers.
      residual: add each layer's input to its output.
      bias: biases in the embedding, the bilinear layers and the head.
      embed: start with the linear embedding (False: the first bilinear layer
        takes the flattened input, of width ``prod(input_shape)``).
      head: end with the linear head (False: the last bilinear layer outputs
        the ``n_classes`` logits).
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import apply_network
      >>> m = BilinearMLP(4, 3, d_model=8, d_hidden=8, n_layers=2, rngs=nnx.Rngs(0))
      >>> x = jnp.ones((2, 4))
      >>> bool(jnp.allclose(apply_network(m.to_network(), x), m(x), atol=1e-5))
      True
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        d_model: int = 64,
        d_hidden: int = 64,
        n_layers: int = 1,
        residual: bool = True,
        bias: bool = False,
        embed: bool = True,
        head: bool = True,
        rngs: nnx.Rngs,
    ):
        self.input_shape = per_sample_shape(input_shape)
        d_in = int(np.prod(self.input_shape))
        if not head and n_layers < 1:
            raise ValueError(f"head=False needs n_layers >= 1 (the last bilinear layer gives the logits), got n_layers={n_layers}.")
        self.embed = LinearParams(d_in, d_model, bias=bias, rngs=rngs) if embed else None
        widths = [d_model if embed else d_in] + [d_model] * n_layers
        if not head:
            widths[-1] = n_classes
        for i in range(n_layers):
            if residual and widths[i] != widths[i + 1]:
                raise ValueError(
                    f"bilinear{i} maps width {widths[i]} to {widths[i + 1]}, so it cannot be residual "
                    f"(embed={embed}, head={head}, d_model={d_model}, input width {d_in}, n_classes={n_classes}). "
                    "Pass residual=False, or make the widths equal."
                )
        self.layers = nnx.List(
            [BilinearParams(widths[i], d_hidden, widths[i + 1], bias=bias, residual=residual, rngs=rngs) for i in range(n_layers)]
        )
        self.head = LinearParams(widths[-1], n_classes, bias=bias, rngs=rngs) if head else None

    def _stage_names(self):
        names = [f"bilinear{i}" for i in range(len(self.layers))]
        if self.head is None:
            names[-1] = "logits"
        return (*(("embed",) if self.embed is not None else ()), *names, *(("logits",) if self.head is not None else ()))

    def _stage(self, i, z):
        if self.embed is not None:
            if i == 0:
                return self.embed(z.reshape(z.shape[0], -1))
            i -= 1
        elif i == 0:
            z = z.reshape(z.shape[0], -1)
        if i < len(self.layers):
            return self.layers[i](z)
        return self.head(z)

    def to_network(self) -> tuple:
        """The pure network ``(LinearLayer, BilinearLayer, ..., LinearLayer)``.

        Without the embedding or the head, their ``LinearLayer`` is left out
        (``embed=False, head=False, n_layers=1`` gives ``(BilinearLayer,)``).

        ``similarity.apply_network(model.to_network(), x.reshape(n, -1))``
        equals ``model(x)``.
        """
        return (
            *((self.embed.to_layer(),) if self.embed is not None else ()),
            *(l.to_layer() for l in self.layers),
            *((self.head.to_layer(),) if self.head is not None else ()),
        )


def token_pair_logits(layer: BilinearLayer, tokens: jax.Array, p: int) -> jax.Array:
    """``apply_layer(layer, one_hot(tokens))`` for ``tokens (n, 2)`` in ``[0, p)``, without the one-hot product.

    ``one_hot(a, b)`` is the ``2p``-wide row with ones at ``a`` and ``p + b``, so
    ``one_hot(a, b) @ W^T`` is ``W[:, a] + W[:, p + b]``: gathering two columns
    replaces the ``(n, 2p) x (2p, h)`` product (and its gradient becomes a
    scatter-add); a full-batch AdamW step at p = 113 ran 2.6x faster
    (``benchmarks/bench_grokking.py``).

    Args:
      layer: a non-residual :class:`similarity.BilinearLayer` reading ``2p`` inputs.
      tokens: ``(n, 2)`` integers in ``[0, p)``.
      p: the modulus (half the one-hot width).

    Returns:
      ``(n, o)`` logits.
    """
    cols = jnp.stack([tokens[:, 0], tokens[:, 1] + p], axis=1)  # (n, 2) columns of the one-hot

    def project(w, b):
        z = jnp.take(w.T, cols, axis=0).sum(axis=1)  # (n, h)
        return z if b is None else z + b[None, :]

    out = jnp.einsum("nh,oh->no", project(layer.left, layer.left_bias) * project(layer.right, layer.right_bias),
                     layer.down)
    return out if layer.down_bias is None else out + layer.down_bias[None, :]


class TokenPairs(nnx.Module):
    """A one-bilinear-layer :class:`BilinearMLP` on one-hot ``(a, b)``, fed the tokens instead.

    ``TokenPairs(m, p)(tokens) == m(one_hot(tokens))`` (:func:`token_pair_logits`);
    the parameters, the optimiser state and the checkpoints are those of ``m``
    (attribute ``model``), so ``model.to_network()`` is the trained network.

    Args:
      model: ``BilinearMLP(2 * p, ..., n_layers=1, residual=False, embed=False, head=False)``.
      p: the modulus: tokens are integers in ``[0, p)``.

    Examples:
      >>> from flax import nnx
      >>> m = BilinearMLP(2 * 5, 5, d_hidden=4, n_layers=1, residual=False, embed=False, head=False,
      ...                 rngs=nnx.Rngs(0))
      >>> TokenPairs(m, 5)(jnp.asarray([[1, 2], [4, 0]])).shape
      (2, 5)
    """

    def __init__(self, model: BilinearMLP, p: int):
        if model.embed is not None or model.head is not None or len(model.layers) != 1 or model.layers[0].residual:
            raise ValueError("TokenPairs needs BilinearMLP(..., n_layers=1, residual=False, embed=False, head=False).")
        width = model.layers[0].left.shape[1]
        if width != 2 * int(p):
            raise ValueError(f"TokenPairs(model, p={p}) needs a model reading the one-hot width 2p = {2 * int(p)}, "
                             f"got a first layer of input width {width}.")
        self.model = model
        self.p = int(p)

    def __call__(self, tokens) -> jax.Array:
        """``(n, o)`` logits of ``tokens (n, 2)``, integers in ``[0, p)``."""
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[1] != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be integer pairs (n, 2), got shape {tuple(tokens.shape)} and dtype "
                             f"{tokens.dtype}; pass the (a, b) token ids, not their one-hot rows.")
        if not isinstance(tokens, jax.core.Tracer) and tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.p):
            raise ValueError(f"tokens must lie in [0, p) = [0, {self.p}), got values from {int(tokens.min())} "
                             f"to {int(tokens.max())}.")
        (layer,) = self.model.to_network()
        return token_pair_logits(layer, tokens, self.p)


class BilinearAttention(nnx.Module):
    """Parameters of one :func:`bilinear_attention` block."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, *, rngs: nnx.Rngs):
        s = 1.0 / np.sqrt(d_model)
        self.q1, self.k1, self.q2, self.k2, self.v = (
            _normal(rngs, (n_heads, d_head, d_model), s) for _ in range(5)
        )
        self.o = _normal(rngs, (d_model, n_heads, d_head), 0.5 / np.sqrt(n_heads * d_head))

    def to_layer(self) -> AttentionLayer:
        return AttentionLayer(*(p[...] for p in (self.q1, self.k1, self.q2, self.k2, self.v, self.o)))

    def __call__(self, x):
        return apply_attention_layer(self.to_layer(), x)


class BilinearTransformer(FeatureModel):
    """Token + position embedding -> [bilinear attention (+ bilinear MLP)] * n_layers -> unembed.

    Inputs are integer tokens ``(n, seq_len)`` in ``[0, vocab_size)``; the
    logits are ``(n, seq_len, vocab_size)`` (next-token prediction at every
    position). Stage outputs are residual streams ``(n, seq_len, d_model)``.

    Layers: ``("embed", "attn0", ["mlp0",] ..., "logits")``.

    Args:
      vocab_size: number of tokens.
      seq_len: context length (inputs must have exactly this length).
      d_model: residual width.
      n_layers: number of blocks.
      n_heads, d_head: attention heads and their size.
      mlp: add a residual bilinear MLP after each attention block.
      d_hidden: hidden units of the bilinear MLPs.
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> m = BilinearTransformer(5, 4, d_model=8, n_layers=1, n_heads=2, d_head=4, rngs=nnx.Rngs(0))
      >>> m(jnp.zeros((3, 4), jnp.int32)).shape
      (3, 4, 5)
      >>> m.layer_names()
      ('embed', 'attn0', 'mlp0', 'logits')
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        *,
        d_model: int = 64,
        n_layers: int = 1,
        n_heads: int = 4,
        d_head: int = 16,
        mlp: bool = True,
        d_hidden: int = 128,
        rngs: nnx.Rngs,
    ):
        self.input_shape = (int(seq_len),)
        self.vocab_size = int(vocab_size)
        self.token_embed = _normal(rngs, (vocab_size, d_model), 1.0)
        self.pos_embed = _normal(rngs, (seq_len, d_model), 0.1)
        self.attn = nnx.List([BilinearAttention(d_model, n_heads, d_head, rngs=rngs) for _ in range(n_layers)])
        self.mlps = nnx.List(
            [BilinearParams(d_model, d_hidden, d_model, bias=False, residual=True, rngs=rngs) for _ in range(n_layers)]
            if mlp
            else []
        )
        self.unembed = _normal(rngs, (vocab_size, d_model), 1.0 / np.sqrt(d_model))

    def _input_dtype(self):
        return jnp.int32

    def _prepare(self, x):
        x = jnp.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_shape[0] or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(
                f"BilinearTransformer expects integer tokens of shape (n, {self.input_shape[0]}), "
                f"got {tuple(x.shape)} with dtype {x.dtype}. Cut the text into windows of seq_len "
                "tokens (funsim.data.load('shakespeare', seq_len=...))."
            )
        return x

    def _stage_names(self):
        names = ["embed"]
        for i in range(len(self.attn)):
            names.append(f"attn{i}")
            if len(self.mlps):
                names.append(f"mlp{i}")
        return (*names, "logits")

    def _stage(self, i, z):
        names = self._stage_names()
        name = names[i]
        if name == "embed":
            return jnp.take(self.token_embed[...], z, axis=0) + self.pos_embed[...][None]
        if name == "logits":
            return jnp.einsum("vd,ntd->ntv", self.unembed[...], z)
        j = int(name[4:] if name.startswith("attn") else name[3:])
        if name.startswith("attn"):
            return self.attn[j](z)
        n, t, d = z.shape
        return self.mlps[j](z.reshape(n * t, d)).reshape(n, t, d)

    def mlp_network(self, i: int) -> tuple:
        """The i-th bilinear MLP block as a pure network ``(BilinearLayer,)`` acting per token."""
        if not len(self.mlps):
            raise ValueError("This BilinearTransformer was built with mlp=False; it has no MLP blocks.")
        return (self.mlps[i].to_layer(),)

    def to_network(self) -> AttentionNetwork:
        """The pure :class:`similarity.AttentionNetwork` of an attention-only transformer.

        ``similarity.apply_attention_network(model.to_network(), tokens)`` equals
        ``model(tokens)``.

        Raises:
          NotImplementedError: for a transformer built with ``mlp=True``; the
            attention similarity covers attention-only transformers (use
            :meth:`mlp_network` for the bilinear MLP blocks on their own).
        """
        if len(self.mlps):
            raise NotImplementedError(
                "BilinearTransformer.to_network() covers attention-only transformers (mlp=False); this one "
                "has bilinear MLP blocks, which similarity.AttentionNetwork does not model. Build it with "
                "mlp=False, or compare the MLP blocks with mlp_network(i) and tensor_similarity."
            )
        return AttentionNetwork(
            self.token_embed[...], tuple(a.to_layer() for a in self.attn), self.unembed[...], self.pos_embed[...]
        )
