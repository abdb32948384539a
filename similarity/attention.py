"""Bilinear-attention transformers as pure pytrees, and their Gaussian inner products.

docs/design.md §4, "Bilinear attention". One attention layer maps the residual stream
``x: (T, d)`` of a context of T positions to

    ``y_t = x_t + sum_h O_h sum_{s <= t} (q1_t . k1_s)(q2_t . k2_s) / e^2  v_s``,

with ``q1_t = Q1_h x_t`` etc. (``a`` heads of size ``e``; causal; no softmax). It
is a polynomial of degree 5 in the context: two legs at the query position, three
at the key position. An :class:`AttentionNetwork` is a token embedding (plus an
optional learned positional embedding), a stack of such layers and an unembedding.

**Input distribution.** A language model reads one-hot tokens. As the
tensor-similarity authors do (their ``CheckpointTransformer`` starts the
second-moment propagation from ``I ⊗ I`` on the *token* input of the
embedding), every position ``t < context`` gets an independent Gaussian vector in
token space, ``g_t ~ N(0, scale^2 I_V)``, in place of its one-hot row. The
embedding is linear, so the residual stream entering the first layer is exactly
Gaussian: ``x_t = E^T g_t + p_t`` with mean ``p_t`` (the positional embedding, or 0)
and covariance ``scale^2 E^T E``, independent across positions. The inner product is

    ``<A|B> = E sum_{t < context} sum_v f_a(g)[t, v] f_b(g)[t, v]``

(``v`` over the unembedding's outputs, or the slice ``outputs``), and the
similarity is ``<A|B> / sqrt(<A|A><B|B>)``. It depends only on the two functions
on ``R^{context x V}``: any reparametrisation (heads permuted, ``(q1, k1)`` swapped
with ``(q2, k2)``, a basis change inside a head, a basis change of the residual
stream) leaves it unchanged. ``scale=1`` is the authors' choice; it makes
``|g_t|^2 ~ V`` where a one-hot token has norm 1, which multiplies the amplitude
of the degree-5 attention term by about ``V^2`` relative to the degree-1 direct
path, compared with text. ``scale = 1/sqrt(V)`` matches the second moment of a
uniformly random one-hot token (``E[e e^T] = I/V``). We did not implement the
alternative, the exact average over the ``V^context`` token sequences: the
closure's moment propagation does not apply to it, and it is not what the paper
computed.

**Methods** (all for a stated ``context``):

* ``exact`` (depth 0 and 1): the expectation is a sum, over heads and positions
  ``(t, s, s')``, of expected products of five quadratic forms of the Gaussian
  input (``q1.k1``, ``q2.k2`` of each network, and the value read-out
  ``v_a^T O_a^T U_a^T U_b O_b v_b``). Each product is computed exactly from the
  forms' joint cumulants (``2^{m-1}`` times traces and chains of the form matrices,
  the formula of :mod:`similarity.tensor_similarity`'s depth-2 method), written
  on the forms' low-rank factors, so the cost is ``O(context^3 a_a a_b (2e)^3)``
  and ``d`` and ``V`` enter only through ``E^T E``. Means (the positional
  embedding) are included exactly. Independence across positions enters through
  the block-diagonal input covariance.
* ``closure`` (any depth >= 1): the tensor-similarity authors' algorithm. The
  exact mean and full second moment ``(T d x T d)`` of every layer's output are
  propagated (they are the gradient of the same scalar with respect to a
  read-out matrix), and each next layer's input is treated as the Gaussian with
  those moments. Exact at depth 1; at depth >= 2 it drops the higher cumulants
  of the hidden residual stream.
* Monte Carlo (any depth, with a standard error):
  :func:`similarity.estimators.attention_monte_carlo_inner`.

**Layout.** The types, their evaluation and validation are in
:mod:`funsim.similarity.attention_network`; the cumulant engine (expected products of
Gaussian quadratic forms) in ``_gaussian_forms``; one layer under a Gaussian input and
the closure over layers in ``_attention_closure``. This module holds the entry points
and re-exports the types.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._attention_closure import cross_inner, map_same, self_moments
from funsim.similarity._precision import full_precision
from funsim.similarity._validate import check_choice, check_positive_result
from funsim.similarity.attention_network import (
    AttentionLayer,
    AttentionNetwork,
    apply_attention_layer,
    apply_attention_network,
    bilinear_attention,
    check_attention_pair,
    check_finite_inner,
    check_scale,
    promote_networks,
    stack_attention_networks,
    validate_attention_network,
)
from funsim.similarity.multilinear import resolve_outputs as _resolve_outputs

__all__ = [
    "AttentionLayer",
    "AttentionNetwork",
    "ATTENTION_METHODS",
    "bilinear_attention",
    "apply_attention_layer",
    "apply_attention_network",
    "validate_attention_network",
    "stack_attention_networks",
    "attention_inner",
    "attention_similarity",
    "attention_similarity_matrix",
    "attention_moments",
]

ATTENTION_METHODS = ("auto", "exact", "closure")


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def _resolve(depth, method):
    check_choice(method, "method", ATTENTION_METHODS)
    if depth >= 2 and method in ("auto", "exact"):
        raise ValueError(
            f"The networks have {depth} attention layers; the exact Gaussian inner product is "
            "offered for depth <= 1 (exactness is exponential in depth: the layer-2 output has "
            "degree 25). Options: method='closure' (the second-moment approximation, exact at "
            "depth 1) or similarity.attention_monte_carlo_inner (unbiased, with a standard error)."
        )
    if depth <= 1:
        return "exact"
    return "closure"


def _selves(nets, scale, context):
    fn = functools.partial(self_moments, context=context)
    return map_same(fn, [(net, scale) for net in nets])


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _inner_jit(net_a, net_b, scale, context, outputs):
    self_a, self_b = _selves((net_a, net_b), scale, context)
    return cross_inner(net_a, net_b, self_a, self_b, scale, context=context, outputs=outputs)


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _similarity_jit(net_a, net_b, scale, context, outputs):
    self_a, self_b = _selves((net_a, net_b), scale, context)
    fn = functools.partial(cross_inner, context=context, outputs=outputs)
    return map_same(fn, [(net_a, net_b, self_a, self_b, scale), (net_a, net_a, self_a, self_a, scale),
                          (net_b, net_b, self_b, self_b, scale)])


@full_precision
def attention_inner(
    net_a: AttentionNetwork,
    net_b: AttentionNetwork,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
) -> jax.Array:
    """Gaussian inner product ``<A|B>`` of two attention networks over ``context`` positions.

    ``E sum_{t < context} sum_v f_a(g)[t, v] f_b(g)[t, v]`` with independent
    token-space Gaussians ``g_t ~ N(0, scale^2 I_V)`` (see the module docstring).
    Cost: depth 1, ``O(context^3 a_a a_b (2e)^3)``; the closure adds, per extra
    layer, three gradients of the full ``(context d)^2`` read-out, each
    ``O(context^4 a^2 (2e)^3)``.

    Args:
      net_a: an :class:`AttentionNetwork`.
      net_b: one with the same vocabulary, outputs and depth (widths and heads may differ).
      context: number of positions T (at most the positional embedding's length).
      method: ``"auto"`` (``exact``; depth >= 2 raises), ``"exact"`` (depth <= 1) or
        ``"closure"`` (any depth; exact at depth <= 1).
      scale: standard deviation of the token-space Gaussian.
      outputs: None, a slice, or a sequence of output (vocabulary) indices.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for invalid or mismatched networks, a bad context or scale, or
        ``exact`` at depth >= 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> net = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))   # logits = token vector
      >>> float(attention_inner(net, net, context=3))   # E |g|^2 summed over 3 positions
      6.0
    """
    check_attention_pair(net_a, net_b, context)
    _resolve(net_a.depth, method)
    check_scale(scale)
    outputs = _resolve_outputs(outputs, net_a.n_outputs)
    net_a, net_b = promote_networks(net_a, net_b)
    out = _inner_jit(net_a, net_b, jnp.asarray(scale, net_a.embed.dtype), int(context), outputs)
    return check_finite_inner(out, "<net_a|net_b>", scale=scale, vocab=net_a.vocab_size, depth=net_a.depth)


@full_precision
def attention_similarity(
    net_a: AttentionNetwork,
    net_b: AttentionNetwork,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
) -> jax.Array:
    """``<A|B> / sqrt(<A|A><B|B>)`` of two attention networks, a score in [-1, 1].

    A function of the two input-output maps only (heads permuted, ``(q1, k1)``
    swapped with ``(q2, k2)``, basis changes inside a head or of the residual
    stream all give 1 against the original).

    Args:
      net_a, net_b: :class:`AttentionNetwork` s (see :func:`attention_inner`).
      context: number of positions.
      method: see :func:`attention_inner`.
      scale: token-space standard deviation.
      outputs: output slice (the norms use the same slice).

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: as :func:`attention_inner`, and for a network that is zero on
        the selected outputs.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))
      >>> b = AttentionNetwork(2 * jnp.eye(2), (), jnp.eye(2))
      >>> float(attention_similarity(a, b, context=2))
      1.0
    """
    check_attention_pair(net_a, net_b, context)
    _resolve(net_a.depth, method)
    check_scale(scale)
    outputs = _resolve_outputs(outputs, net_a.n_outputs)
    net_a, net_b = promote_networks(net_a, net_b)
    ab, aa, bb = _similarity_jit(net_a, net_b, jnp.asarray(scale, net_a.embed.dtype), int(context), outputs)
    check_finite_inner(jnp.stack([ab, aa, bb]), "<net_a|net_b>, <net_a|net_a> or <net_b|net_b>", scale=scale,
                       vocab=net_a.vocab_size, depth=net_a.depth)
    cause = "the network is zero on the selected outputs; its similarity is undefined (0/0)."
    check_positive_result(aa, "<net_a|net_a>", cause)
    check_positive_result(bb, "<net_b|net_b>", cause)
    return ab / jnp.sqrt(aa * bb)


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _matrix_jit(stacked, scale, context, outputs):
    n = jax.tree.leaves(stacked)[0].shape[0]
    selves = jax.lax.map(lambda net: self_moments(net, scale, context=context), stacked)
    iu, ju = np.triu_indices(n)
    take = lambda tree, i: jax.tree.map(lambda x: x[i], tree)

    def pair(ij):
        i, j = ij[0], ij[1]
        return cross_inner(take(stacked, i), take(stacked, j), take(selves, i), take(selves, j), scale,
                            context=context, outputs=outputs)

    vals = jax.lax.map(pair, jnp.asarray(np.stack([iu, ju], 1)))
    gram = jnp.zeros((n, n), vals.dtype).at[iu, ju].set(vals)
    return gram + jnp.triu(gram, 1).T


@full_precision
def attention_similarity_matrix(
    nets,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
    return_inner: bool = False,
) -> jax.Array:
    """Similarity matrix of many checkpoints of one architecture, in one compiled call.

    The ``n (n + 1) / 2`` inner products are evaluated in a ``lax.map`` inside one
    jit-compiled program (one compilation per architecture and context), then
    normalised by the diagonal.

    Args:
      nets: a list of :class:`AttentionNetwork` with identical shapes, or one whose
        every leaf has a leading stacking axis of length n.
      context: number of positions.
      method: see :func:`attention_inner`.
      scale: token-space standard deviation.
      outputs: output slice.
      return_inner: return the inner products instead of similarities.

    Returns:
      ``(n, n)`` symmetric matrix (unit diagonal unless ``return_inner``).

    Raises:
      ValueError: for differently shaped checkpoints, the errors of
        :func:`attention_inner`, and a checkpoint with zero norm.

    Examples:
      >>> import jax.numpy as jnp
      >>> nets = [AttentionNetwork(jnp.eye(2), (), w) for w in (jnp.eye(2), jnp.ones((2, 2)))]
      >>> np.asarray(attention_similarity_matrix(nets, context=1), float).round(4).tolist()
      [[1.0, 0.7071], [0.7071, 1.0]]
    """
    if isinstance(nets, (list, tuple)):
        for i, n in enumerate(nets):
            validate_attention_network(n, f"nets[{i}]", context=context)
        stacked = stack_attention_networks(list(nets))
    else:
        stacked = validate_attention_network(nets, "nets", context=context, batch_ndim=1)
    one = jax.tree.map(lambda x: x[0], stacked)
    _resolve(one.depth, method)
    check_scale(scale)
    outputs = _resolve_outputs(outputs, one.n_outputs)
    (stacked,) = promote_networks(stacked)
    gram = _matrix_jit(stacked, jnp.asarray(scale, stacked.embed.dtype), int(context), outputs)
    check_finite_inner(gram, "An inner product <net_i|net_j>", scale=scale, vocab=one.vocab_size, depth=one.depth)
    if return_inner:
        return gram
    diag = jnp.diagonal(gram)
    check_positive_result(diag, "<net_i|net_i>", "a checkpoint is zero on the selected outputs; its similarity is undefined (0/0).")
    return gram / jnp.sqrt(diag[:, None] * diag[None, :])


@full_precision
def attention_moments(net: AttentionNetwork, /, *, context: int, scale: float = 1.0, layer: int = 0):
    """Exact mean and covariance of the residual stream after attention layer ``layer``.

    With the Gaussian token-space input (see the module docstring). For
    ``layer == 0`` these are exact; for ``layer >= 1`` they are the closure's
    (exact moments of the layer's output *given* a Gaussian input with the
    previous layer's moments).

    Args:
      net: an :class:`AttentionNetwork`.
      context: number of positions.
      scale: token-space standard deviation.
      layer: which layer's output, ``0 <= layer < depth``.

    Returns:
      ``(mean (T, d), cov (T, d, T, d))``.

    Raises:
      ValueError: for an invalid network, context or layer.
    """
    validate_attention_network(net, "net", context=context)
    check_scale(scale)
    if not (isinstance(layer, (int, np.integer)) and 0 <= layer < net.depth):
        raise ValueError(f"layer must be an int in [0, {net.depth}) (the network's depth), got {layer!r}.")
    (net,) = promote_networks(net)
    return _moments_jit(net, jnp.asarray(scale, net.embed.dtype), int(context), int(layer))


@functools.partial(jax.jit, static_argnames=("context", "layer"))
def _moments_jit(net, scale, context, layer):
    return self_moments(net, scale, context=context, n_layers=layer + 1)[-1]

