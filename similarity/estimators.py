"""Monte Carlo and quadrature estimators of the Gaussian inner product of two networks.

Public estimators in their own right (Monte Carlo reaches any depth and width, with a
standard error) and the independent references the exact methods are tested against:
they evaluate the networks only through :func:`similarity.apply_network` (and
:func:`similarity.apply_attention_network`), so they share no code with the lifted,
folded algebra of :mod:`similarity.tensor_similarity` or the cumulant engine of
:mod:`similarity.attention` (docs/design.md §4, "Estimators").

* :func:`monte_carlo_inner`: unbiased, with a standard error; any depth and width.
* :func:`attention_monte_carlo_inner` and :func:`attention_quadrature_inner`: the
  same for bilinear-attention networks (:mod:`similarity.attention`), on the
  token-space Gaussian of a stated context length, through
  :func:`similarity.attention.apply_attention_network` only.
* :func:`quadrature_inner`: tensor-product Gauss–Hermite (probabilists') quadrature
  with ``2^L + 1`` nodes per input dimension, ``L`` the depth. A depth-L network
  has degree ``<= 2^L`` in each input, the product of two has degree
  ``<= 2^(L+1) <= 2 (2^L + 1) - 1``, so the rule is exact up to rounding. It needs
  ``(2^L + 1)^d`` evaluations: small input widths only.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._precision import full_precision, sum_of_products
from funsim.similarity._validate import is_concrete
from funsim.similarity.attention_network import (
    apply_attention_network,
    check_attention_pair,
    check_finite_inner,
    check_scale,
    promote_networks,
    validate_attention_network,
)
from funsim.similarity.multilinear import apply_network, network_depth, resolve_outputs, validate_network_pair

__all__ = [
    "monte_carlo_inner",
    "quadrature_inner",
    "attention_monte_carlo_inner",
    "attention_quadrature_inner",
    "MAX_QUADRATURE_POINTS",
]

MAX_QUADRATURE_POINTS = 2_000_000


def _restrict(y, outputs):
    return y if outputs is None else y[..., np.asarray(outputs, dtype=np.int64)]


def _mc_scan(prod, key, n_samples, chunk, dtype):
    """Mean and standard error of ``prod(key_i) -> (chunk,)`` over ``n_samples`` draws.

    Chunk i uses ``fold_in(key, i)``; draws past ``n_samples`` in the last chunk
    are masked out. Means and variances are merged with Chan et al.'s pairwise
    update (no cancellation from raw sums of squares).
    """
    n_chunks = -(-n_samples // chunk)

    def body(carry, i):
        count, mean, m2 = carry
        p = prod(jax.random.fold_in(key, i))
        valid = (i * chunk + jnp.arange(chunk)) < n_samples
        nb = jnp.sum(valid).astype(dtype)
        mb = jnp.sum(jnp.where(valid, p, 0)) / nb
        m2b = jnp.sum(jnp.where(valid, (p - mb) ** 2, 0))
        tot = count + nb
        delta = mb - mean
        return (tot, mean + delta * nb / tot, m2 + m2b + delta**2 * count * nb / tot), None

    zero = jnp.zeros((), dtype)
    (count, mean, m2), _ = jax.lax.scan(body, (zero, zero, zero), jnp.arange(n_chunks))
    return mean, jnp.sqrt(m2 / (count - 1) / count)


@functools.partial(jax.jit, static_argnames=("n_samples", "chunk", "outputs"))
def _mc_core(net_a, net_b, key, n_samples, chunk, outputs):
    d = net_a[0].d_in
    dtype = jax.tree.leaves(net_a)[0].dtype

    def prod(k):
        x = jax.random.normal(k, (chunk, d), dtype)
        return jnp.einsum(
            "no,no->n", _restrict(apply_network(net_a, x), outputs),
            _restrict(apply_network(net_b, x), outputs),
        )

    return _mc_scan(prod, key, n_samples, chunk, dtype)


@full_precision
def monte_carlo_inner(
    net_a, net_b, /, *, n_samples: int, key: jax.Array, outputs=None, chunk: int = 8192
) -> tuple[jax.Array, jax.Array]:
    """Monte Carlo estimate of ``E_{x~N(0,I)} sum_p f_a(x)_p f_b(x)_p``.

    Samples are drawn in chunks of ``chunk`` (memory ``O(chunk d)``) and the mean
    and variance are merged with a numerically stable pairwise update.

    Args:
      net_a: a layer or tuple of layers with input width d.
      net_b: a network with the same input and output widths (any depth).
      n_samples: number of Gaussian samples (>= 2).
      key: a ``jax.random`` key.
      outputs: None, a slice or a sequence of output indices to sum over.
      chunk: samples evaluated per step.

    Returns:
      ``(estimate, standard_error)``, two scalars ``()``; the standard error is
      ``std / sqrt(n_samples)`` of the per-sample products.

    Raises:
      ValueError: for invalid or mismatched networks, or ``n_samples < 2``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from funsim.similarity.multilinear import LinearLayer
      >>> lin = LinearLayer(jnp.ones((1, 2)))          # x1 + x2, E[(x1 + x2)^2] = 2
      >>> est, se = monte_carlo_inner(lin, lin, n_samples=20000, key=jax.random.key(0))
      >>> bool(abs(est - 2.0) < 4 * se)
      True
    """
    net_a, net_b = validate_network_pair(net_a, net_b)
    chunk = _balanced_chunk(n_samples, chunk)
    outputs = resolve_outputs(outputs, net_a[-1].d_out)
    return _finite(_mc_core(net_a, net_b, key, int(n_samples), chunk, outputs), "monte_carlo_inner")


def _finite(result, what):
    """Refuse a multilinear estimate that overflowed its dtype (no-op under tracing)."""
    arrs = result if isinstance(result, tuple) else (result,)
    if all(is_concrete(a) for a in arrs) and not all(np.all(np.isfinite(np.asarray(a))) for a in arrs):
        dt = np.asarray(arrs[0]).dtype
        raise ValueError(
            f"{what}: the estimate is not finite in {dt}: the networks' outputs on N(0, I) inputs are so "
            f"large that their products exceed {float(np.finfo(dt).max):.1e}. Rescale the weights, or use "
            "float64: jax.config.update('jax_enable_x64', True) with float64 weights."
        )
    return result


def _balanced_chunk(n_samples, chunk) -> int:
    """Validate the Monte Carlo sizes; return equal chunks (at most n_chunks - 1 wasted draws)."""
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 2):
        raise ValueError(f"n_samples must be an int >= 2, got {n_samples!r}.")
    if not (isinstance(chunk, (int, np.integer)) and chunk >= 1):
        raise ValueError(f"chunk must be a positive int, got {chunk!r}.")
    n_chunks = -(-int(n_samples) // int(chunk))
    return -(-int(n_samples) // n_chunks)


def _gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss–Hermite nodes and weights for the standard normal density."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / np.sqrt(2 * np.pi)


@full_precision
def quadrature_inner(net_a, net_b, /, *, outputs=None, chunk: int = 65536) -> jax.Array:
    """Exact ``E_{x~N(0,I)} sum_p f_a(x)_p f_b(x)_p`` by tensor Gauss–Hermite quadrature.

    Uses ``2^L + 1`` probabilists' Hermite nodes per input dimension, ``L`` the
    larger depth (number of bilinear layers) of the two networks, which is exact
    for the product of two depth-L networks. The grid has ``(2^L + 1)^d`` points.

    Args:
      net_a: a layer or tuple of layers with a small input width d.
      net_b: a network with the same input and output widths (any depth).
      outputs: None, a slice or a sequence of output indices to sum over.
      chunk: grid points evaluated per step.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for invalid or mismatched networks, or when the grid would
        exceed ``MAX_QUADRATURE_POINTS`` points (use :func:`monte_carlo_inner`).

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import BilinearLayer
      >>> sq = BilinearLayer(jnp.ones((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1)))  # x^2
      >>> round(float(quadrature_inner(sq, sq)), 6)   # E[x^4]
      3.0
    """
    net_a, net_b = validate_network_pair(net_a, net_b)
    outputs = resolve_outputs(outputs, net_a[-1].d_out)
    depth = max(network_depth(net_a), network_depth(net_b))
    d = net_a[0].d_in
    n = 2**depth + 1
    if n**d > MAX_QUADRATURE_POINTS:
        raise ValueError(
            f"quadrature_inner needs (2^L + 1)^d = {n}^{d} grid points for depth L={depth} and "
            f"d={d} inputs, more than MAX_QUADRATURE_POINTS={MAX_QUADRATURE_POINTS}; it is for "
            "small input widths. Use monte_carlo_inner (with a standard error) instead."
        )
    dtype = jax.tree.leaves(net_a)[0].dtype

    def products(x):
        return sum_of_products(_restrict(apply_network(net_a, x), outputs),
                               _restrict(apply_network(net_b, x), outputs), axis=-1)

    return _finite(_grid_sum(products, n, d, chunk, dtype), "quadrature_inner")


def _grid_sum(products, n, dims, chunk, dtype):
    """``sum_grid w(x) products(x)`` over the tensor Gauss–Hermite grid of ``n`` nodes in ``dims`` dimensions.

    ``products`` maps ``(m, dims)`` grid points to ``(m,)``; the grid is walked in chunks.
    """
    nodes, weights = _gauss_hermite(n)
    total = 0.0
    grid = itertools.product(range(n), repeat=dims)
    while True:
        block = np.array(list(itertools.islice(grid, chunk)), dtype=np.int64)
        if block.size == 0:
            break
        w = jnp.asarray(np.prod(weights[block], axis=1), dtype)
        total = total + jnp.dot(w, products(jnp.asarray(nodes[block], dtype)))
    return jnp.asarray(total, dtype)


# ---------------------------------------------------------------------------
# Bilinear-attention networks (similarity.attention)
# ---------------------------------------------------------------------------


def _attention_prepare(net_a, net_b, context, scale, outputs):
    check_attention_pair(net_a, net_b, context)
    check_scale(scale)
    outputs = resolve_outputs(outputs, net_a.n_outputs)
    net_a, net_b = promote_networks(net_a, net_b)
    return net_a, net_b, outputs


def _attention_products(net_a, net_b, g, outputs):
    ya = _restrict(apply_attention_network(net_a, g), outputs)
    yb = _restrict(apply_attention_network(net_b, g), outputs)
    return ya, yb


@functools.partial(jax.jit, static_argnames=("context", "n_samples", "chunk", "outputs"))
def _attention_mc_core(net_a, net_b, key, scale, context, n_samples, chunk, outputs):
    dtype = net_a.embed.dtype

    def prod(k):
        g = scale * jax.random.normal(k, (chunk, context, net_a.vocab_size), dtype)
        ya, yb = _attention_products(net_a, net_b, g, outputs)
        return sum_of_products(ya, yb, axis=(-2, -1))

    return _mc_scan(prod, key, n_samples, chunk, dtype)


@full_precision
def attention_monte_carlo_inner(
    net_a, net_b, /, *, context: int, n_samples: int, key: jax.Array, scale: float = 1.0,
    outputs=None, chunk: int = 4096,
) -> tuple[jax.Array, jax.Array]:
    """Monte Carlo estimate of the attention inner product, any depth, with its standard error.

    Estimates ``E sum_{t < context} sum_v f_a(g)[t, v] f_b(g)[t, v]`` with
    ``g_t ~ N(0, scale^2 I_V)`` independent per position, the input distribution
    of :func:`similarity.attention_inner`.

    Args:
      net_a: an :class:`~similarity.attention.AttentionNetwork`.
      net_b: one with the same vocabulary, outputs and depth.
      context: number of positions.
      n_samples: number of Gaussian contexts (>= 2).
      key: a ``jax.random`` key.
      scale: token-space standard deviation.
      outputs: None, a slice or a sequence of output indices.
      chunk: contexts evaluated per step.

    Returns:
      ``(estimate, standard_error)``, two scalars ``()``.

    Raises:
      ValueError: for invalid or mismatched networks, a bad context, scale or sample size.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from funsim.similarity.attention import AttentionNetwork
      >>> net = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))
      >>> est, se = attention_monte_carlo_inner(net, net, context=3, n_samples=20000, key=jax.random.key(0))
      >>> bool(abs(est - 6.0) < 4 * se)
      True
    """
    net_a, net_b, outputs = _attention_prepare(net_a, net_b, context, scale, outputs)
    chunk = _balanced_chunk(n_samples, chunk)
    dtype = net_a.embed.dtype
    est, se = _attention_mc_core(net_a, net_b, key, jnp.asarray(scale, dtype), int(context), int(n_samples),
                                 chunk, outputs)
    check_finite_inner(jnp.stack([est, se]), "The Monte Carlo estimate of <net_a|net_b> (or its standard error)",
                       scale=scale, vocab=net_a.vocab_size, depth=max(net_a.depth, net_b.depth))
    return est, se


@full_precision
def attention_quadrature_inner(
    net_a, net_b, /, *, context: int, scale: float = 1.0, outputs=None, chunk: int = 65536
) -> jax.Array:
    """Exact attention inner product by tensor Gauss–Hermite quadrature (tiny vocabularies only).

    A network with L attention layers has degree at most ``5^L`` in each
    token-space coordinate (a layer has degree 5 in the context and up to 5 in
    one position), so ``5^L + 1`` probabilists' Hermite nodes per coordinate
    integrate the product of two networks exactly. The grid has
    ``(5^L + 1)^(context V)`` points.

    Args:
      net_a, net_b: :class:`~similarity.attention.AttentionNetwork` s (see
        :func:`attention_monte_carlo_inner`; the depths may differ).
      context: number of positions.
      scale: token-space standard deviation.
      outputs: None, a slice or a sequence of output indices.
      chunk: grid points evaluated per step.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for invalid networks, or a grid beyond ``MAX_QUADRATURE_POINTS``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.attention import AttentionNetwork
      >>> net = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))
      >>> round(float(attention_quadrature_inner(net, net, context=3)), 6)
      6.0
    """
    validate_attention_network(net_a, "net_a", context=context)
    validate_attention_network(net_b, "net_b", context=context)
    if net_a.vocab_size != net_b.vocab_size or net_a.n_outputs != net_b.n_outputs:
        raise ValueError(
            f"net_a (V={net_a.vocab_size}, {net_a.n_outputs} outputs) and net_b (V={net_b.vocab_size}, "
            f"{net_b.n_outputs} outputs) must share the vocabulary and the outputs."
        )
    check_scale(scale)
    outputs = resolve_outputs(outputs, net_a.n_outputs)
    depth = max(net_a.depth, net_b.depth)
    dims = int(context) * net_a.vocab_size
    n = 5**depth + 1
    if n**dims > MAX_QUADRATURE_POINTS:
        raise ValueError(
            f"attention_quadrature_inner needs (5^L + 1)^(context V) = {n}^{dims} grid points for depth "
            f"L={depth}, more than MAX_QUADRATURE_POINTS={MAX_QUADRATURE_POINTS}; it is for tiny "
            "vocabularies and contexts. Use attention_monte_carlo_inner instead."
        )
    net_a, net_b = promote_networks(net_a, net_b)
    dtype = net_a.embed.dtype

    def products(x):
        ya, yb = _attention_products(net_a, net_b, scale * x.reshape(-1, int(context), net_a.vocab_size), outputs)
        return sum_of_products(ya, yb, axis=(-2, -1))

    return check_finite_inner(_grid_sum(products, n, dims, chunk, dtype), "The quadrature of <net_a|net_b>",
                              scale=scale, vocab=net_a.vocab_size, depth=depth)
