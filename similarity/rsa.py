"""Representational similarity analysis (DESIGN.md §2).

An RDM (representational dissimilarity matrix) holds the dissimilarity of
every pair of samples. :func:`rsa` compares two RDMs by their upper triangles
(``i < j``) with Spearman (average ranks for ties), Pearson, Kendall tau-a or
cosine; or, with ``compare="cosine_cov"``, by the cosine of the two
double-centred full RDMs ``H D H``. For squared-Euclidean RDMs that last
comparison is exactly linear CKA, because ``H D H = -2 H X X^T H``.

Costs: an RDM is ``O(n^2 d)``, computed row by row from direct differences
(not a matrix product), so that identical samples give exactly tied distances,
as in ``scipy.spatial.distance.pdist``, and Spearman/Kendall see the ties; Spearman sorts the ``m = n(n-1)/2`` pairs;
Kendall tau-a compares all pairs of pairs, ``O(m^2) = O(n^4)`` time in
``O(m)`` memory, so keep n below a few hundred for it.

Validation follows :mod:`similarity._validate`: under a user's ``jit``/``vmap``
the value checks are skipped and degenerate input gives NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from similarity import _validate as V
from similarity._layer_stats import LayerStats

__all__ = ["RDM_METRICS", "COMPARISONS", "rdm", "rsa", "rank_average", "compare_vectors", "rsa_layer_stats"]

RDM_METRICS = ("correlation", "euclidean", "sqeuclidean", "cosine")
COMPARISONS = ("spearman", "pearson", "kendall", "cosine", "cosine_cov")


def _rows(f, x: jax.Array) -> jax.Array:
    """``out[i, j] = f(x[i], x)[j]``, a block of rows at a time.

    Each entry is reduced over features in the same order whatever its position,
    so identical samples get bit-identical distances (exact ties, as in
    ``scipy.spatial.distance.pdist``); a matrix product does not promise that.
    """
    return jax.lax.map(lambda xi: f(xi[None, :], x), x, batch_size=min(x.shape[0], 64))


def _rdm(x: jax.Array, metric: str) -> jax.Array:
    n = x.shape[0]
    eye = jnp.eye(n, dtype=bool)
    if metric in ("correlation", "cosine"):
        z = x - jnp.mean(x, axis=1, keepdims=True) if metric == "correlation" else x
        g = _rows(lambda zi, z: jnp.sum(zi * z, axis=1), z)
        sq = jnp.diagonal(g)
        # identical samples are at distance exactly 0 (rounding would break their ties)
        same = _rows(lambda xi, x: jnp.all(xi == x, axis=1), x)
        return jnp.where(same, 0.0, 1.0 - g / jnp.sqrt(sq[:, None] * sq[None, :]))
    d2 = _rows(lambda xi, x: jnp.sum((xi - x) ** 2, axis=1), x)
    if metric == "sqeuclidean":
        return d2
    # sqrt with a zero-safe gradient on the diagonal
    safe = jnp.where(eye, 1.0, d2)
    return jnp.where(eye, 0.0, jnp.sqrt(safe))


def _check_rdm_input(x: jax.Array, name: str, metric: str) -> None:
    if not V.is_concrete(x) or metric not in ("correlation", "cosine"):
        return
    a = np.asarray(x, dtype=np.float64)
    z = a - a.mean(axis=1, keepdims=True) if metric == "correlation" else a
    norms = np.sqrt((z * z).sum(axis=1))
    scale = max(float(np.abs(a).max()), 1.0)
    bad = np.flatnonzero(norms <= 1e-12 * scale)
    if bad.size:
        what = "constant across features" if metric == "correlation" else "all zero"
        raise ValueError(
            f"{name} of shape {tuple(a.shape)} has {bad.size} rows that are {what} "
            f"(first: row {bad[0]}), so the {metric} distance is undefined for them. "
            "Drop those samples or use metric='euclidean'."
        )


def rdm(x: ArrayLike, /, *, metric: str = "correlation") -> jax.Array:
    """Representational dissimilarity matrix of the samples (rows) of ``x``.

    Metrics: "correlation" ``1 - pearson(x_i, x_j)`` (across features),
    "euclidean", "sqeuclidean" and "cosine" ``1 - cos(x_i, x_j)``. The
    diagonal is exactly zero.

    Args:
      x: ``(n, d)``.
      metric: one of ``RDM_METRICS``.

    Returns:
      ``(n, n)`` symmetric.

    Raises:
      ValueError: bad shape, NaN/Inf, rows with zero norm (cosine) or zero
        variance across features (correlation).

    Examples:
      >>> import jax.numpy as jnp
      >>> rdm(jnp.array([[0.0, 0.0], [3.0, 4.0]]), metric="euclidean").tolist()
      [[0.0, 5.0], [5.0, 0.0]]
    """
    V.check_choice(metric, "metric", RDM_METRICS)
    x = V.check_rep(x, "x", min_samples=2)
    if metric == "correlation" and x.shape[1] < 2:
        raise ValueError(
            f"x has shape {tuple(x.shape)}: the correlation distance needs at least 2 features."
        )
    _check_rdm_input(x, "x", metric)
    return _rdm_jit(x, metric)


_rdm_jit = jax.jit(_rdm, static_argnames=("metric",))


def rank_average(v: ArrayLike, /) -> jax.Array:
    """Ranks 1..m of a vector, ties sharing their average rank (jit-able).

    For each value, ``rank = (#smaller + (#smaller or equal) + 1) / 2``,
    found by binary search in the sorted vector: ``O(m log m)``.

    Args:
      v: ``(m,)``.

    Returns:
      ``(m,)`` ranks as floats.

    Examples:
      >>> rank_average(jnp.array([10.0, 20.0, 10.0, 5.0])).tolist()
      [2.5, 4.0, 2.5, 1.0]
    """
    v = jnp.asarray(v)
    s = jnp.sort(v)
    lo = jnp.searchsorted(s, v, side="left")
    hi = jnp.searchsorted(s, v, side="right")
    return (lo + hi + 1).astype(v.dtype if jnp.issubdtype(v.dtype, jnp.floating) else float) / 2


def _pearson(a: jax.Array, b: jax.Array) -> jax.Array:
    a = a - jnp.mean(a)
    b = b - jnp.mean(b)
    return jnp.dot(a, b) / jnp.sqrt(jnp.dot(a, a) * jnp.dot(b, b))


# Kendall's tau-a compares every pair of RDM entries: O(m^2) for m = n (n - 1) / 2
# entries, i.e. O(n^4). Past this many entries (n of about 630 samples) it would
# run for minutes to hours, so it is refused with a clear message instead.
KENDALL_MAX_ENTRIES = 200_000


def _kendall_tau_a(a: jax.Array, b: jax.Array) -> jax.Array:
    m = a.shape[0]
    if m > KENDALL_MAX_ENTRIES:
        raise ValueError(
            f"Kendall's tau-a on {m} RDM entries would compare {m * (m - 1) // 2:.3e} pairs "
            f"(O(n^4) in the number of samples); the limit is {KENDALL_MAX_ENTRIES} entries "
            "(about 630 samples). Use compare='spearman', or subsample the rows."
        )

    def row(ab):
        ai, bi = ab
        return jnp.sum(jnp.sign(ai - a) * jnp.sign(bi - b))

    total = jnp.sum(jax.lax.map(row, (a, b), batch_size=min(m, 256)))
    return total / (float(m) * (m - 1))  # a Python int would overflow int32 in jit


def compare_vectors(a: ArrayLike, b: ArrayLike, /, *, compare: str = "spearman") -> jax.Array:
    """Compare two vectors (e.g. RDM upper triangles). Pure, no validation.

    Args:
      a: ``(m,)``.
      b: ``(m,)``.
      compare: "spearman" | "pearson" | "kendall" (tau-a: ties count 0 in the
        numerator, the denominator is all ``m(m-1)/2`` pairs) | "cosine".

    Returns:
      ``()``.

    Examples:
      >>> float(compare_vectors(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 4.0, 9.0])))
      1.0
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if compare == "spearman":
        return _pearson(rank_average(a), rank_average(b))
    if compare == "pearson":
        return _pearson(a, b)
    if compare == "kendall":
        return _kendall_tau_a(a, b)
    if compare == "cosine":
        return jnp.dot(a, b) / jnp.sqrt(jnp.dot(a, a) * jnp.dot(b, b))
    raise ValueError(f"compare_vectors: unknown compare {compare!r}; use rsa(...) for 'cosine_cov'.")


def _centre2(d: jax.Array) -> jax.Array:
    d = d - jnp.mean(d, axis=0, keepdims=True)
    return d - jnp.mean(d, axis=1, keepdims=True)


@functools.partial(jax.jit, static_argnames=("rdm_metric", "compare"))
def _rsa(x, y, rdm_metric: str, compare: str):
    dx = _rdm(x, rdm_metric)
    dy = _rdm(y, rdm_metric)
    if compare == "cosine_cov":
        cx, cy = _centre2(dx), _centre2(dy)
        return jnp.sum(cx * cy) / jnp.sqrt(jnp.sum(cx * cx) * jnp.sum(cy * cy))
    iu, ju = np.triu_indices(x.shape[0], k=1)
    return compare_vectors(dx[iu, ju], dy[iu, ju], compare=compare)


def rsa(
    x: ArrayLike, y: ArrayLike, /, *, rdm_metric: str = "correlation", compare: str = "spearman"
) -> jax.Array:
    """Compare the RDMs of two representations of the same samples (a score).

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``, the same n inputs in the same order.
      rdm_metric: one of ``RDM_METRICS`` (see :func:`rdm`).
      compare: how to compare the RDMs:
        "spearman" (average ranks for ties), "pearson", "kendall" (tau-a,
        ``O(n^4)`` time), "cosine" (all on the upper triangles ``i < j``), or
        "cosine_cov": cosine of the double-centred full RDMs ``H D H``
        (with ``rdm_metric="sqeuclidean"`` this equals linear CKA).

    Returns:
      ``()`` in [-1, 1] (cosine of nonnegative RDMs is in [0, 1]).

    Raises:
      ValueError: bad shapes, different sample counts, n < 3 (one pair of
        samples has no spread), NaN/Inf, degenerate rows, an RDM with no
        spread (constant representation), or unknown options.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(10, 4))
      >>> round(float(rsa(x, 2 * x, rdm_metric="euclidean", compare="pearson")), 6)
      1.0
    """
    V.check_choice(rdm_metric, "rdm_metric", RDM_METRICS)
    V.check_choice(compare, "compare", COMPARISONS)
    x, y = V.check_pair(x, y, min_samples=3, why="RSA (an RDM needs at least 3 samples)")
    for name, a in (("x", x), ("y", y)):
        if rdm_metric == "correlation" and a.shape[1] < 2:
            raise ValueError(
                f"{name} has shape {tuple(a.shape)}: the correlation distance needs at least "
                "2 features; use rdm_metric='euclidean'."
            )
        _check_rdm_input(a, name, rdm_metric)
        if rdm_metric != "correlation" and rdm_metric != "cosine":
            V.check_not_constant(a, name, what="RSA")
    out = _rsa(x, y, rdm_metric, compare)
    if V.is_concrete(out) and not np.isfinite(np.asarray(out)):
        raise ValueError(
            f"RSA is undefined (0/0) for x.shape={tuple(x.shape)}, y.shape={tuple(y.shape)}: "
            f"an RDM ({rdm_metric}) has no spread across sample pairs under compare={compare!r}, "
            "e.g. all samples are equidistant or identical. Use other samples or metrics."
        )
    return out


def _unit(v: jax.Array) -> jax.Array:
    return v / jnp.sqrt(jnp.sum(v * v))


def rsa_layer_stats(*, rdm_metric: str, compare: str) -> LayerStats:
    """Per-layer statistics of :func:`rsa`: the RDM, ranked or standardised as ``compare`` needs.

    ``pair(layer(x), layer(y)) == rsa(x, y, rdm_metric=rdm_metric, compare=compare)``.
    Memory: ``n (n - 1) / 2`` numbers per layer (``n^2`` for ``cosine_cov``).
    """

    def layer(x):
        d = _rdm(x, rdm_metric)
        if compare == "cosine_cov":
            return _unit(_centre2(d))
        iu, ju = np.triu_indices(x.shape[0], k=1)
        v = d[iu, ju]
        if compare == "kendall":
            return v
        if compare == "spearman":
            v = rank_average(v)
        if compare in ("spearman", "pearson"):
            v = v - jnp.mean(v)
        return _unit(v)

    def pair(sx, sy):
        if compare == "kendall":
            return compare_vectors(sx, sy, compare="kendall")
        return jnp.sum(sx * sy)

    return LayerStats(layer, pair)
