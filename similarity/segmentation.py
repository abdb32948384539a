"""Change-point segmentation of a similarity matrix into contiguous blocks.

A similarity matrix ``S (n, n)`` over an ordered sequence (checkpoints over
training, layers of a network, time steps) often has block structure: runs of
items that resemble each other more than they resemble the rest. This module
finds the best split of ``0..n-1`` into ``K`` contiguous segments
``[s_0, s_1), [s_1, s_2), ..., [s_{K-1}, n)`` (``s_0 = 0``) exactly, by
dynamic programming over an additive segment cost (optimal partitioning,
Bellman 1961; Jackson et al. 2005): ``O(n^2)`` to tabulate the costs of all
segments and ``O(K n^2)`` for the recursion.

Segment costs, for a segment ``I = [a, b)`` of length ``m = b - a``:

* ``"kernel"``: ``sum_{i in I} S_ii - (1/m) sum_{i,j in I} S_ij``. When ``S``
  is a Gram (kernel) matrix of feature vectors ``phi_i``, as every normalised
  inner-product similarity is (tensor similarity, linear CKA, cosine), this is
  the within-segment scatter ``sum_{i in I} ||phi_i - mean_I phi||^2``: kernel
  change-point detection (Harchaoui & Cappe 2007; Arlot, Celisse & Harchaoui
  2019). The segmentation is unchanged when a constant is added to every entry
  of ``S`` or when ``S`` is scaled by a positive number.
* ``"pairwise"``: ``sum_{i<j in I} (1 - S_ij)``, the summed dissimilarity of
  the pairs inside the segment. It grows with the square of the length, so it
  favours segments of similar length. This is the cost the tensor-similarity
  authors used to find the phases of grokking.

Only the diagonal and the sums over square blocks enter, and a square block
sums to the same value in ``S`` and ``S^T``: a non-symmetric matrix is
segmented as its symmetric part ``(S + S^T) / 2``. The block sums are
accumulated with running sums (no differences of large prefix sums), so the
costs carry no cancellation error beyond that of the ``"kernel"`` formula
itself; pass float64 for nearly tied segmentations.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._precision import full_precision

__all__ = ["SEGMENT_COSTS", "Segmentation", "segment_costs", "change_points"]

SEGMENT_COSTS = ("kernel", "pairwise")


class Segmentation(NamedTuple):
    """The optimal split of ``0..n-1`` into ``K`` contiguous segments.

    Attributes:
      starts: ``(K,)`` int32, the first index of each segment, increasing,
        ``starts[0] == 0``; segment ``k`` is ``[starts[k], starts[k+1])`` (the
        last ends at ``n``).
      cost: ``()``, the total cost of this segmentation (the minimum).
      costs: ``(K,)``, ``costs[k-1]`` is the minimum total cost with ``k``
        segments, for ``k = 1..K``; use it to choose ``K``. It never increases
        with ``k`` when splitting a segment cannot raise its cost: for
        ``"kernel"`` when ``S`` is positive semi-definite, for ``"pairwise"``
        when every entry is at most 1.
    """

    starts: jax.Array
    cost: jax.Array
    costs: jax.Array


def _block_sums(s):
    """``(blocks, diags)``, each ``(n, n+1)``: sums over ``[a, b) x [a, b)`` and over the diagonal of ``[a, b)``.

    Entries with ``b <= a`` are 0. Running sums only: ``U[a, c] = sum_{a<=i<c} S_ic``
    accumulates upwards from ``c``, and a block is a running sum over its columns.
    """
    n = s.shape[0]
    s = 0.5 * (s + s.T)
    d = jnp.diagonal(s)
    upper = jnp.triu(s, 1)
    col_above = jnp.flip(jnp.cumsum(jnp.flip(upper, 0), axis=0), 0)  # [a, c] = sum_{i=a}^{c-1} s[i, c]
    keep = jnp.arange(n)[None, :] >= jnp.arange(n)[:, None]  # column c >= row a
    per_col = jnp.where(keep, 2.0 * col_above + d[None, :], 0.0)
    zero = jnp.zeros((n, 1), s.dtype)
    blocks = jnp.concatenate([zero, jnp.cumsum(per_col, axis=1)], axis=1)
    diags = jnp.concatenate([zero, jnp.cumsum(jnp.where(keep, d[None, :], 0.0), axis=1)], axis=1)
    return blocks, diags


def _costs(s, cost: str):
    n = s.shape[0]
    blocks, diags = _block_sums(s)
    length = (jnp.arange(n + 1)[None, :] - jnp.arange(n)[:, None]).astype(s.dtype)
    valid = length > 0
    safe = jnp.where(valid, length, 1.0)
    if cost == "kernel":
        c = diags - blocks / safe
    else:  # pairwise: m(m-1)/2 pairs minus the off-diagonal half-block sum
        c = 0.5 * safe * (safe - 1.0) - 0.5 * (blocks - diags)
    return jnp.where(valid, c, jnp.inf)


@functools.partial(jax.jit, static_argnames=("n_segments", "cost"))
def _change_points(s, n_segments: int, cost: str):
    n = s.shape[0]
    c = _costs(s, cost)  # (n, n+1): c[a, b] for the segment [a, b)
    c_ext = jnp.concatenate([c, jnp.full((1, n + 1), jnp.inf, c.dtype)], axis=0)  # a = n never starts a segment
    first = c_ext[0]  # one segment [0, b)

    def step(f_prev, _):
        total = f_prev[:, None] + c_ext  # [a, b]: best k-1 segments of [0, a), then [a, b)
        return jnp.min(total, axis=0), (jnp.min(total, axis=0), jnp.argmin(total, axis=0))

    _, (fs, args) = jax.lax.scan(step, first, None, length=n_segments - 1)
    fs = jnp.concatenate([first[None], fs], axis=0)  # (K, n+1)

    def back(b, arg_k):
        a = arg_k[b]
        return a, a

    _, starts_rev = jax.lax.scan(back, jnp.asarray(n), args, reverse=True)
    starts = jnp.concatenate([jnp.zeros((1,), starts_rev.dtype), starts_rev]).astype(jnp.int32)
    return Segmentation(starts, fs[-1, n], fs[:, n])


def _check(similarity: ArrayLike, name: str = "similarity") -> jax.Array:
    s = V.as_float_array(similarity, name)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] == 0:
        raise ValueError(
            f"{name} must be a square (n, n) matrix with n >= 1, got shape {tuple(s.shape)}. "
            "Pass one similarity matrix (vmap over a stack of them)."
        )
    V.check_finite(s, name)
    return s


@full_precision
def segment_costs(similarity: ArrayLike, /, *, cost: str = "kernel") -> jax.Array:
    """The cost of every contiguous segment of a similarity matrix.

    Args:
      similarity: ``(n, n)``; only its symmetric part matters.
      cost: ``"kernel"`` or ``"pairwise"`` (see the module docstring).

    Returns:
      ``(n, n+1)``: entry ``[a, b]`` is the cost of the segment ``[a, b)``;
      ``+inf`` where ``b <= a``.

    Raises:
      ValueError: a non-square matrix, NaN/Inf, or an unknown cost.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[1.0, 0.5], [0.5, 1.0]])
      >>> segment_costs(s, cost="pairwise").tolist()   # [0, 2) holds one pair, 1 - 0.5
      [[inf, 0.0, 0.5], [inf, inf, 0.0]]
    """
    s = _check(similarity)
    V.check_choice(cost, "segment cost", SEGMENT_COSTS)
    return _costs(s, cost)


@full_precision
def change_points(similarity: ArrayLike, /, *, n_segments: int, cost: str = "kernel") -> Segmentation:
    """Split ``0..n-1`` into ``n_segments`` contiguous blocks of minimal total cost.

    The exact optimum over all ``C(n-1, K-1)`` segmentations, by dynamic
    programming (``O(K n^2)`` time, ``O(K n)`` memory beyond the ``(n, n+1)``
    cost table). Ties go to the earliest boundary. Jit-compiled once per
    ``(n, n_segments, cost)`` and dtype; composes with ``jax.vmap`` over a
    stack of matrices.

    Args:
      similarity: ``(n, n)`` similarity matrix over an ordered sequence (a
        score: higher is more similar); only its symmetric part matters.
      n_segments: ``K``, the number of segments, ``1 <= K <= n``.
      cost: ``"kernel"`` (within-segment scatter; invariant to adding a
        constant to ``S`` and to scaling it) or ``"pairwise"`` (summed
        ``1 - S_ij`` over the pairs inside each segment).

    Returns:
      :class:`Segmentation` ``(starts (K,), cost (), costs (K,))``.

    Raises:
      ValueError: a non-square matrix, NaN/Inf, ``n_segments`` outside
        ``[1, n]``, or an unknown cost.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.kron(jnp.eye(3), jnp.ones((2, 2))) * 0.8 + 0.2   # three blocks of two
      >>> change_points(s, n_segments=3).starts.tolist()
      [0, 2, 4]
    """
    s = _check(similarity)
    V.check_choice(cost, "segment cost", SEGMENT_COSTS)
    n = s.shape[0]
    if isinstance(n_segments, bool) or not isinstance(n_segments, numbers.Integral) or not 1 <= n_segments <= n:
        raise ValueError(
            f"n_segments must be an integer in [1, n] = [1, {n}] for a similarity matrix of shape "
            f"{tuple(s.shape)}, got {n_segments!r}."
        )
    return _change_points(s, int(n_segments), cost)
