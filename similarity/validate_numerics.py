"""Independent estimators of the Gaussian inner product, used to check the exact ones.

Both evaluate the networks only through :func:`similarity.apply_network`, so
they share no code with the lifted, folded algebra of
:mod:`similarity.tensor_similarity` (DESIGN.md §4, "Validators").

* :func:`monte_carlo_inner`: unbiased, with a standard error; any depth and width.
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

from similarity.multilinear import apply_network, network_depth, resolve_outputs, validate_network_pair

__all__ = ["monte_carlo_inner", "quadrature_inner", "MAX_QUADRATURE_POINTS"]

MAX_QUADRATURE_POINTS = 2_000_000


def _restrict(y, outputs):
    return y if outputs is None else y[:, np.asarray(outputs, dtype=np.int64)]


@functools.partial(jax.jit, static_argnames=("n_samples", "chunk", "outputs"))
def _mc_core(net_a, net_b, key, n_samples, chunk, outputs):
    d = net_a[0].d_in
    dtype = jax.tree_util.tree_leaves(net_a)[0].dtype
    n_chunks = -(-n_samples // chunk)

    def body(carry, i):
        count, mean, m2 = carry
        x = jax.random.normal(jax.random.fold_in(key, i), (chunk, d), dtype)
        prod = jnp.einsum(
            "no,no->n", _restrict(apply_network(net_a, x), outputs),
            _restrict(apply_network(net_b, x), outputs),
        )
        valid = (i * chunk + jnp.arange(chunk)) < n_samples
        nb = jnp.sum(valid).astype(dtype)
        mb = jnp.sum(jnp.where(valid, prod, 0)) / nb
        m2b = jnp.sum(jnp.where(valid, (prod - mb) ** 2, 0))
        tot = count + nb
        delta = mb - mean
        # Chan et al.'s pairwise update: no cancellation from raw sums of squares.
        return (tot, mean + delta * nb / tot, m2 + m2b + delta**2 * count * nb / tot), None

    zero = jnp.zeros((), dtype)
    (count, mean, m2), _ = jax.lax.scan(body, (zero, zero, zero), jnp.arange(n_chunks))
    return mean, jnp.sqrt(m2 / (count - 1) / count)


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
      >>> from similarity.multilinear import LinearLayer
      >>> lin = LinearLayer(jnp.ones((1, 2)))          # x1 + x2, E[(x1 + x2)^2] = 2
      >>> est, se = monte_carlo_inner(lin, lin, n_samples=20000, key=jax.random.key(0))
      >>> bool(abs(est - 2.0) < 4 * se)
      True
    """
    net_a, net_b = validate_network_pair(net_a, net_b)
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 2):
        raise ValueError(f"n_samples must be an int >= 2, got {n_samples!r}.")
    if not (isinstance(chunk, (int, np.integer)) and chunk >= 1):
        raise ValueError(f"chunk must be a positive int, got {chunk!r}.")
    outputs = resolve_outputs(outputs, net_a[-1].d_out)
    n_chunks = -(-int(n_samples) // int(chunk))
    chunk = -(-int(n_samples) // n_chunks)  # balanced chunks: at most n_chunks - 1 wasted draws
    return _mc_core(net_a, net_b, key, int(n_samples), chunk, outputs)


def _gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss–Hermite nodes and weights for the standard normal density."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / np.sqrt(2 * np.pi)


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
      >>> from similarity.multilinear import BilinearLayer
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
    dtype = jax.tree_util.tree_leaves(net_a)[0].dtype
    nodes, weights = _gauss_hermite(n)
    total = 0.0
    grid = itertools.product(range(n), repeat=d)
    while True:
        block = np.array(list(itertools.islice(grid, chunk)), dtype=np.int64)
        if block.size == 0:
            break
        x = jnp.asarray(nodes[block], dtype)
        w = jnp.asarray(np.prod(weights[block], axis=1), dtype)
        ya = _restrict(apply_network(net_a, x), outputs)
        yb = _restrict(apply_network(net_b, x), outputs)
        total = total + jnp.einsum("n,no,no->", w, ya, yb)
    return jnp.asarray(total, dtype)


