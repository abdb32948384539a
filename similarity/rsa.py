"""Representational similarity analysis (docs/design.md §2).

An RDM (representational dissimilarity matrix) holds the dissimilarity of
every pair of samples. :func:`rsa` compares two RDMs by their upper triangles
(``i < j``) with Spearman (average ranks for ties), Pearson, Kendall tau-a or
cosine; or, with ``compare="cosine_cov"``, by the cosine of the two
double-centred full RDMs ``H D H``. For squared-Euclidean RDMs that last
comparison is exactly linear CKA, because ``H D H = -2 H X X^T H``.

Costs: an RDM is one Gram matrix (a GEMM, ``O(n^2 d)``), exactly symmetric,
with identical samples given exactly equal rows (found by an exact, hash-assisted
row comparison) and integer-valued data shifted by an integer, so that tied
distances stay exactly tied, as in ``scipy.spatial.distance.pdist``, and
Spearman/Kendall see the ties. The ``m = n(n-1)/2`` pairs are taken in
circulant order (no index table). Spearman ranks each side with one integer
sort, ``O(m log m)``. Kendall tau-a compares all pairs of pairs,
``O(m^2) = O(n^4)`` time in ``O(m)`` memory, and is refused above
``KENDALL_MAX_ENTRIES`` entries (n of about 630).

Scale: :func:`rsa` computes each RDM from the data divided by the power of two
at its largest magnitude (after the exact integer shift), which changes no
comparison (each is invariant to scaling an RDM) and keeps float32 data at
1e-20 or 1e20 from overflowing or underflowing.

Validation follows :mod:`similarity._validate`: NaN/Inf, constant
representations and degenerate rows are checked inside the compiled program
and raised after it returns; under a user's ``jit``/``vmap``/``grad`` such
input gives NaN. :func:`rsa` is its compiled core (:func:`rsa_core`, see
:mod:`similarity.protocol`) plus those checks; the core takes zero-padded layers
(the RDM does not depend on zero features: the correlation distance centres each
row over its real features) and the RDM metric as data, so one compiled program
serves every metric and every width up to the padded one. Spearman and Kendall comparisons are not differentiable (they
see the data only through orderings): ``jax.grad`` through them raises.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity import protocol
from funsim.similarity._linalg import pow2_scale, row_hash
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import LayerStats
from funsim.similarity.protocol import Core

__all__ = ["RDM_METRICS", "COMPARISONS", "rdm", "rsa", "rank_average", "compare_vectors", "rsa_layer_stats",
           "rsa_core"]

RDM_METRICS = ("correlation", "euclidean", "sqeuclidean", "cosine")
COMPARISONS = ("spearman", "pearson", "kendall", "cosine", "cosine_cov")


def _first_equal_row(x: jax.Array) -> jax.Array:
    """``rep[i]``: the first row equal to row ``i`` (all features exactly equal; ``-0.0 == 0.0``).

    Two independent order-free row hashes find candidates in ``O(n d + n^2)``;
    each candidate is verified exactly, so a hash collision can only leave a
    duplicate unmerged (its ties then rest on rounding), never merge distinct rows.
    """
    n = x.shape[0]
    h1, h2 = row_hash(x, 0x3C6EF372), row_hash(x, 0xA54FF53A)
    same = (h1[:, None] == h1[None, :]) & (h2[:, None] == h2[None, :])
    rep = jnp.argmax(same, axis=1)  # the first True; the diagonal is always True
    ok = jnp.all(x[rep] == x, axis=1)
    return jnp.where(ok, rep, jnp.arange(n))


def _centre_exact(x: jax.Array) -> jax.Array:
    """Column-centred ``x`` (for accuracy); integer-valued data is shifted by the rounded mean.

    Shifting integers by integers is exact, so every Gram entry and squared
    distance of integer data (pixels, counts, binary codes) is an exact integer
    whenever ``4 d max|x - round(mean)|^2`` fits in the mantissa, and tied
    distances stay exactly tied, as with ``scipy.spatial.distance.pdist``.
    """
    mean = jnp.mean(x, axis=0, keepdims=True)
    integral = jnp.all(x == jnp.round(x))
    return x - jnp.where(integral, jnp.round(mean), mean)


def _rdm_raw(x: jax.Array, metric: str, unit: bool = False, width=None) -> jax.Array:
    """The RDM of :func:`_rdm` before it is symmetrised and duplicates are tied."""
    if metric in ("correlation", "cosine"):
        x0 = x / pow2_scale(x)  # the correlation and cosine distances ignore the scale
        if metric == "cosine":
            z = x0
        elif width is None:
            z = x0 - jnp.mean(x0, axis=1, keepdims=True)
        else:
            real = protocol.feature_mask(width, x.shape[1], x.dtype) > 0
            mean = jnp.sum(x0, axis=1, keepdims=True) / jnp.asarray(width).astype(x.dtype)
            z = jnp.where(real[None, :], x0 - mean, jnp.zeros((), x.dtype))
        # unit rows first, then their products, so that rows of one direction give exactly tied
        # distances, as pdist does: on one feature x / sqrt(x^2) is exactly +-1. Scaling the
        # product afterwards broke those ties by rounding (9 distinct distances for pdist's 2, and
        # Spearman 0.713 for scipy's 0.792). The barrier keeps XLA from rewriting the division
        # as a multiplication by rsqrt, which is not exact (it does so once the sum is over one
        # feature).
        u = z / jax.lax.optimization_barrier(jnp.sqrt(jnp.sum(z * z, axis=1, keepdims=True)))
        d = 1.0 - jnp.einsum("id,jd->ij", u, u)
    else:
        z = _centre_exact(x)
        if unit:
            z = z / pow2_scale(z)
        sq = jnp.sum(z * z, axis=1)
        g = jnp.einsum("id,jd->ij", z, z)
        d = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)
        if metric == "euclidean":  # sqrt with a zero-safe gradient (the diagonal, duplicates)
            pos = d > 0
            d = jnp.where(pos, jnp.sqrt(jnp.where(pos, d, 1.0)), 0.0)
    return d


def _rdm(x: jax.Array, metric: str, unit: bool = False, width=None) -> jax.Array:
    """``(n, n)`` RDM from one Gram matrix (a GEMM), exactly symmetric with a zero diagonal.

    Identical samples get exactly equal rows and columns and distance 0 between
    them (see :func:`_first_equal_row`), so rank comparisons see their ties.
    With ``unit`` the data is divided by the power of two at its largest magnitude
    first (after the exact integer shift), so the RDM is that of the rescaled data
    (the same for "correlation" and "cosine", divided by a power of two otherwise).
    ``width`` (traced): only the first ``width`` features are real, the others zero
    padding; the correlation distance centres each row over the real ones (zero
    features change no other metric, nor the duplicate search).
    """
    return _tie_duplicates(_rdm_raw(x, metric, unit, width), x)


def _tie_duplicates(d: jax.Array, x: jax.Array) -> jax.Array:
    """``d`` made exactly symmetric, with identical samples of ``x`` given equal rows and distance 0."""
    d = (d + d.T) / 2
    rep = _first_equal_row(x)
    d = d[rep][:, rep]
    return jnp.where(rep[:, None] == rep[None, :], jnp.zeros((), d.dtype), d)


def _upper(d: jax.Array) -> jax.Array:
    """The ``m = n (n - 1) / 2`` entries ``d[i, j]``, ``i != j``, each unordered pair once.

    The pairs are taken in circulant order, ``(i, i + s mod n)`` for
    ``s = 1 .. n/2``, so that no ``m``-sized index table is built; every
    comparison in :func:`compare_vectors` is invariant to the order of the
    entries, as long as both RDMs use the same one.
    """
    n = d.shape[0]
    h = n // 2
    cols = (jnp.arange(n)[:, None] + 1 + jnp.arange(h)[None, :]) % n
    e = jnp.take_along_axis(d, cols, axis=1)  # (n, h)
    if n % 2:
        return e.reshape(-1)
    return jnp.concatenate([e[:, : h - 1].reshape(-1), e[:h, h - 1]])


def _row_flags(x: jax.Array, width=None) -> dict[str, jax.Array]:
    """Rows on which the correlation distance (constant across features) or the cosine distance
    (all zero) is undefined, to ``CONSTANT_RTOL`` of ``max |x|``: ``{metric: (count, first row)}``.

    ``width`` (traced): only the first ``width`` features are real (zero padding beyond
    them, which a row's spread across features ignores)."""
    tol = V.CONSTANT_RTOL * jnp.max(jnp.abs(x))
    spread = jnp.abs(x - x[:, :1])
    if width is not None:
        real = protocol.feature_mask(width, x.shape[1], x.dtype) > 0
        spread = jnp.where(real[None, :], spread, jnp.zeros((), x.dtype))
    out = {}
    for metric, dev in (("correlation", spread), ("cosine", jnp.abs(x))):
        bad = ~(jnp.max(dev, axis=1) > tol)
        out[metric] = (jnp.sum(bad), jnp.argmax(bad))
    return out


def _rows_reason(count, first, name: str, shape, metric: str) -> str | None:
    """The message for ``count`` degenerate rows of ``name`` under ``metric``, or ``None``."""
    if metric not in ("correlation", "cosine") or not int(count):
        return None
    what = "constant across features" if metric == "correlation" else "all zero"
    return (
        f"{name} of shape {tuple(shape)} has {int(count)} rows that are {what} "
        f"(first: row {int(first)}), so the {metric} distance is undefined for them. "
        "Drop those samples or use metric='euclidean'."
    )


def _raise_rows(flags, name: str, shape, metric: str) -> None:
    if metric not in ("correlation", "cosine"):
        return
    msg = _rows_reason(*flags[metric], name, shape, metric)
    if msg is not None:
        raise ValueError(msg)


_row_flags_jit = jax.jit(_row_flags)


def _check_rdm_input(x: jax.Array, name: str, metric: str) -> None:
    if metric in ("correlation", "cosine") and V.is_concrete(x):
        _raise_rows(V.fetch_flags(_row_flags_jit(x)), name, x.shape, metric)


@full_precision
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
    return _rdm_jit(x, RDM_METRICS.index(metric))


def _rdm_by_index(x: jax.Array, metric_index: jax.Array) -> jax.Array:
    """:func:`_rdm` with the metric as data (its index in ``RDM_METRICS``): one compiled program
    per input shape serves every metric (``lax.switch`` runs only the chosen one)."""
    return jax.lax.switch(metric_index, [functools.partial(_rdm, metric=m) for m in RDM_METRICS], x)


_rdm_jit = jax.jit(_rdm_by_index)


def _order_key(v: jax.Array) -> jax.Array:
    """Integers whose order is the order of the float values (``-0.0`` and ``0.0`` equal).

    Integer sorts are several times faster than float sorts on XLA's CPU backend.
    """
    v = jnp.where(v == 0, jnp.zeros((), v.dtype), v)
    it = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[v.dtype.itemsize]
    k = jax.lax.bitcast_convert_type(v, it)
    return jnp.where(k < 0, k ^ jnp.iinfo(it).max, k)  # negative floats: reverse their order


def _run_bounds(same_as_prev: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For a sequence cut into runs (``same_as_prev[p]``: p continues p - 1's run), each
    position's run start ``a`` and end ``b`` (exclusive)."""
    m = same_as_prev.shape[0]
    pos = jnp.arange(m)
    a = jax.lax.cummax(jnp.where(same_as_prev, 0, pos))
    last = jnp.concatenate([~same_as_prev[1:], jnp.ones((1,), bool)])
    b = jax.lax.cummin(jnp.where(last, pos + 1, m), reverse=True)
    return a, b


def _ranks_by_search(k: jax.Array) -> jax.Array:
    """Average ranks from one sort of the keys and one binary search: any dtype, any size."""
    s = jnp.sort(k)
    _, b = _run_bounds(jnp.concatenate([jnp.zeros((1,), bool), s[1:] == s[:-1]]))
    lo = jnp.searchsorted(s, k, side="left")
    return (lo + b[lo] + 1) / 2


_WINDOW = 4  # longest run of distinct keys that share a coarse key, resolved without a second search


def _ranks_by_packed_sort(k: jax.Array) -> jax.Array:
    """Average ranks from one single-operand int64 sort of ``(coarse key | index)``.

    The low ``b`` bits of each key (``m <= 2^b``) are replaced by its index, so one
    fast integer sort gives the order by the coarse key. Runs of equal coarse key
    whose full keys are all equal (exact ties) take their ranks from the run's
    bounds; runs with distinct full keys (near-ties) of length <= ``_WINDOW`` are
    counted exactly in a small window; longer ones (rare) fall back to
    :func:`_ranks_by_search` through ``lax.cond``. For 32-bit values the coarse key
    is the full key and there are no near-ties.
    """
    m = k.shape[0]
    bits = max(1, (m - 1).bit_length())
    exact = 8 * k.dtype.itemsize + bits <= 64  # the whole key fits beside the index
    k = k.astype(jnp.int64)
    idx = jnp.arange(m, dtype=jnp.int64)
    low = jnp.int64((1 << bits) - 1)
    packed = ((k << bits) if exact else (k & ~low)) | idx
    order = jnp.sort(packed) & low
    ks = k[order]
    coarse = ks if exact else ks >> bits
    same_run = jnp.concatenate([jnp.zeros((1,), bool), coarse[1:] == coarse[:-1]])
    a, b = _run_bounds(same_run)
    if exact:
        lo, hi = a, b
    else:
        mixed = same_run & jnp.concatenate([jnp.zeros((1,), bool), ks[1:] != ks[:-1]])
        n_mixed = jnp.cumsum(mixed)
        impure = (n_mixed[b - 1] - n_mixed[a]) > 0  # some run member differs from its predecessor
        pos = jnp.arange(m)
        less = jnp.zeros((m,), jnp.int32)
        leq = jnp.ones((m,), jnp.int32)
        for o in range(1, min(_WINDOW, m)):
            big = jnp.full((o,), jnp.iinfo(jnp.int64).max, jnp.int64)
            after = jnp.concatenate([ks[o:], big])  # ks[p + o]
            before = jnp.concatenate([big, ks[:-o]])  # ks[p - o]
            for kq, inside in ((after, pos + o < b), (before, pos - o >= a)):
                less = less + (inside & (kq < ks))
                leq = leq + (inside & (kq <= ks))
        lo = jnp.where(impure, a + less, a)
        hi = jnp.where(impure, a + leq, b)
    r = jnp.zeros((m,), jnp.float64).at[order].set((lo + hi + 1) / 2, unique_indices=True)
    if exact:
        return r
    too_long = jnp.max(jnp.where(impure, b - a, 0)) > _WINDOW
    return jax.lax.cond(too_long, lambda: _ranks_by_search(k), lambda: r)


@full_precision
def rank_average(v: ArrayLike, /) -> jax.Array:
    """Ranks 1..m of a vector, ties sharing their average rank (jit-able).

    ``rank = (#smaller + #(smaller or equal) + 1) / 2``, as
    ``scipy.stats.rankdata(v, method="average")``. The values are mapped to
    order-preserving integers and sorted once, ``O(m log m)``: with x64 enabled,
    by one integer sort of the keys packed with their indices; otherwise by a
    sort plus a binary search.

    Args:
      v: ``(m,)``; half precision is ranked as float32, integers as floats.

    Returns:
      ``(m,)`` ranks, in the compute dtype of ``v`` (see :mod:`similarity._validate`).

    Examples:
      >>> rank_average(jnp.array([10.0, 20.0, 10.0, 5.0])).tolist()
      [2.5, 4.0, 2.5, 1.0]
    """
    v = V.as_float_array(v, "v")
    if v.ndim != 1:
        raise ValueError(f"v must be a 1-D vector (m,), got shape {tuple(v.shape)}.")
    if v.shape[0] == 0:
        return v
    return _ranks_jit(v)


_NOT_DIFFERENTIABLE = (
    "{what} is not differentiable: it depends on the data only through ranks (orderings), "
    "which are piecewise constant, so its gradient is zero wherever it exists and undefined at "
    "ties; jax.grad would silently return zeros. Differentiate a value-based comparison instead: "
    "rsa(..., compare='pearson'), 'cosine' or 'cosine_cov' (all differentiable)."
)


@jax.custom_jvp
def _ranks(v: jax.Array) -> jax.Array:
    k = _order_key(v)
    r = _ranks_by_packed_sort(k) if jax.config.jax_enable_x64 else _ranks_by_search(k)
    return r.astype(v.dtype)


@_ranks.defjvp
def _ranks_jvp(primals, tangents):
    raise ValueError(_NOT_DIFFERENTIABLE.format(what="Spearman RSA (rsa(compare='spearman'), rank_average)"))


_ranks_jit = jax.jit(_ranks)


def _sum(v: jax.Array) -> jax.Array:
    """Sum of a long vector in two stages (blocks of 1024, then the block sums).

    Over millions of RDM entries a float32 running sum loses about 1e-4 of
    relative accuracy; summing blocks first keeps it near 1e-6.
    """
    m = v.shape[0]
    k = 1024 if m > 4096 else max(m, 1)
    v = jnp.pad(v, (0, (-m) % k))
    return jnp.sum(jnp.sum(v.reshape(-1, k), axis=1))


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return _sum(a * b)


def _pearson(a: jax.Array, b: jax.Array) -> jax.Array:
    a = a - _sum(a) / a.shape[0]
    b = b - _sum(b) / b.shape[0]
    return _dot(a, b) / jnp.sqrt(_dot(a, a) * _dot(b, b))


# Kendall's tau-a compares every pair of RDM entries: O(m^2) for m = n (n - 1) / 2
# entries, i.e. O(n^4). Past this many entries (n of about 630 samples) it would
# run for minutes to hours, so it is refused with a clear message instead.
KENDALL_MAX_ENTRIES = 200_000


def _kendall_reason(m: int) -> str | None:
    """Why Kendall's tau-a refuses ``m`` RDM entries, or ``None``."""
    if m <= KENDALL_MAX_ENTRIES:
        return None
    return (
        f"Kendall's tau-a on {m} RDM entries would compare {m * (m - 1) // 2:.3e} pairs "
        f"(O(n^4) in the number of samples); the limit is {KENDALL_MAX_ENTRIES} entries "
        "(about 630 samples). Use compare='spearman', or subsample the rows."
    )


def _kendall_tau_a(a: jax.Array, b: jax.Array) -> jax.Array:
    msg = _kendall_reason(a.shape[0])
    if msg is not None:
        raise ValueError(msg)
    return _kendall_core(a, b)


@jax.custom_jvp
def _kendall_core(a: jax.Array, b: jax.Array) -> jax.Array:
    m = a.shape[0]

    def row(ab):
        ai, bi = ab
        return jnp.sum(jnp.sign(ai - a) * jnp.sign(bi - b))

    total = jnp.sum(jax.lax.map(row, (a, b), batch_size=min(m, 256)))
    return total / (float(m) * (m - 1))  # a Python int would overflow int32 in jit


@_kendall_core.defjvp
def _kendall_jvp(primals, tangents):
    raise ValueError(_NOT_DIFFERENTIABLE.format(what="Kendall RSA (rsa(compare='kendall'))"))


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
    a, b = V.as_float_array(a, "a"), V.as_float_array(b, "b")
    if compare == "spearman":
        return _pearson(rank_average(a), rank_average(b))
    if compare == "pearson":
        return _pearson(a, b)
    if compare == "kendall":
        return _kendall_tau_a(a, b)
    if compare == "cosine":
        return _dot(a, b) / jnp.sqrt(_dot(a, a) * _dot(b, b))
    raise ValueError(f"compare_vectors: unknown compare {compare!r}; use rsa(...) for 'cosine_cov'.")


def _centre2(d: jax.Array) -> jax.Array:
    d = d - jnp.mean(d, axis=0, keepdims=True)
    return d - jnp.mean(d, axis=1, keepdims=True)


_RSA_WHY = "RSA (an RDM needs at least 3 samples)"


class _RSALayer(NamedTuple):
    """Per-layer statistics of the RSA core: what is compared, and the layer's value checks."""

    side: jax.Array  # (m,) the RDM's entries, ranked or standardised as ``compare`` needs; (n, n) for cosine_cov
    ok: jax.Array  # () bool: finite, and no degenerate row (correlation, cosine) or not constant (euclidean)
    flags: dict  # V.rep_flags of the layer
    rows: jax.Array  # () int: rows on which the metric is undefined (0 for the euclidean metrics)
    first: jax.Array  # () int: the first such row


def _rdm_of(z: jax.Array, width, k: jax.Array) -> jax.Array:
    """:func:`_rdm` (at unit scale) with the metric as data (its index ``k`` in ``RDM_METRICS``):
    ``lax.switch`` runs only the chosen metric's Gram matrix."""
    branches = [functools.partial(lambda z, w, m: _rdm_raw(z, m, unit=True, width=w), m=m) for m in RDM_METRICS]
    return _tie_duplicates(jax.lax.switch(k, branches, z, width), z)


def _rsa_layer(z, width, opts, *, compare: str) -> _RSALayer:
    """One layer ``(n, W)`` with ``width`` real features (zero padding beyond); ``opts = (metric index,)``.

    The RDM does not depend on the padding: the correlation distance centres each row
    over its real features, and a row's spread across features ignores the padding."""
    k = jnp.asarray(opts[0]).astype(jnp.int32)
    f, rows = V.rep_flags(z), _row_flags(z, width)
    zero = jnp.zeros((), jnp.int32)
    count = jnp.stack([rows[m][0].astype(jnp.int32) if m in rows else zero for m in RDM_METRICS])[k]
    first = jnp.stack([rows[m][1].astype(jnp.int32) if m in rows else zero for m in RDM_METRICS])[k]
    # which check applies is data too: degenerate rows (correlation, cosine) or a constant layer
    row_ok = jnp.stack([rows[m][0] == 0 if m in rows else f["varies"] for m in RDM_METRICS])[k]
    return _RSALayer(_side(_rdm_of(z, width, k), compare), f["finite"] & row_ok, f, count, first)


def _side(d: jax.Array, compare: str) -> jax.Array:
    """What one RDM ``(n, n)`` contributes to the comparison: its entries ranked, centred and
    normalised as ``compare`` needs (the comparison is then a dot product), or raw for Kendall."""
    if compare == "cosine_cov":
        return _unit(_centre2(d))
    v = _upper(d)
    if compare == "kendall":
        return v
    if compare == "spearman":
        v = _ranks(v)
    if compare in ("spearman", "pearson"):  # no spread (all entries equal): 0/0, whatever the rounding of the mean
        flat = jnp.max(v) == jnp.min(v)
        v = jnp.where(flat, jnp.full((), jnp.nan, v.dtype), v - _sum(v) / v.shape[0])
    return _unit(v)


def _rsa_pair(sx: _RSALayer, sy: _RSALayer, opts, *, compare: str):
    """RSA of two layers' statistics: ``(value, flags)``; ``flags["defined"]``: the comparison
    is not 0/0 (an RDM with no spread)."""
    del opts
    if compare == "kendall":
        raw = _kendall_tau_a(sx.side, sy.side)
    else:
        raw = _dot(sx.side.reshape(-1), sy.side.reshape(-1))
    flags = dict(x=sx.flags, y=sy.flags, rows_x=sx.rows, first_x=sx.first, rows_y=sy.rows, first_y=sy.first,
                 defined=jnp.isfinite(raw))
    return V.nan_unless(sx.ok & sy.ok, raw), flags


def _rsa_reason(flags, shape_x, shape_y, opts, *, compare: str) -> str | None:
    """The pairwise call's message for fetched flags (``None``: only what the shapes decide)."""
    metric = RDM_METRICS[int(opts[0])]
    for name, shape in (("x", shape_x), ("y", shape_y)):
        msg = V.min_samples_reason(shape, name, 3, _RSA_WHY)
        if msg is not None:
            return msg
    for name, shape in (("x", shape_x), ("y", shape_y)):
        if metric == "correlation" and shape[1] < 2:
            return (f"{name} has shape {tuple(shape)}: the correlation distance needs at least "
                    "2 features; use rdm_metric='euclidean'.")
    if compare == "kendall":
        n = shape_x[0]
        msg = _kendall_reason(n * (n - 1) // 2)
        if msg is not None:
            return msg
    if flags is None:
        return None
    for name, shape in (("x", shape_x), ("y", shape_y)):
        if metric in ("correlation", "cosine"):
            msg = _rows_reason(flags[f"rows_{name}"], flags[f"first_{name}"], name, shape, metric)
        else:
            msg = V.constant_reason(flags[name], name, shape, "RSA")
        if msg is not None:
            return msg
    if not flags["defined"]:
        return (f"RSA is undefined (0/0) for x.shape={tuple(shape_x)}, y.shape={tuple(shape_y)}: "
                f"an RDM ({metric}) has no spread across sample pairs under compare={compare!r}, "
                "e.g. all samples are equidistant or identical. Use other samples or metrics.")
    return None


@functools.lru_cache(maxsize=None)
def _rsa_parts(compare: str) -> tuple:
    """The core's three functions for one comparison (one object each: shared programs)."""
    return (functools.partial(_rsa_layer, compare=compare), functools.partial(_rsa_pair, compare=compare),
            functools.partial(_rsa_reason, compare=compare))


def rsa_core(*, rdm_metric: str = "correlation", compare: str = "spearman") -> Core:
    """The compiled core of :func:`rsa` (:class:`similarity.protocol.Core`).

    The RDM metric is data (its index in ``RDM_METRICS``, in ``opts``): the four metrics
    of one comparison share every compiled program. A layer's statistics are its RDM's
    entries (``n (n - 1) / 2`` numbers; ``n^2`` for "cosine_cov"), whatever its width.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import protocol
      >>> x = np.random.default_rng(0).normal(size=(10, 4))
      >>> value, flags = protocol.evaluate(rsa_core(rdm_metric="euclidean", compare="pearson"), x, 2 * x)
      >>> round(float(value), 6), bool(flags["defined"])
      (1.0, True)
    """
    V.check_choice(rdm_metric, "rdm_metric", RDM_METRICS)
    V.check_choice(compare, "compare", COMPARISONS)
    return Core(*_rsa_parts(compare), (float(RDM_METRICS.index(rdm_metric)),))


@full_precision
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
    core = rsa_core(rdm_metric=rdm_metric, compare=compare)
    x, y = V.check_pair(x, y, min_samples=3, why=_RSA_WHY, finite=False)
    return protocol.call(core, x, y)


def _unit(v: jax.Array) -> jax.Array:
    v = v.reshape(-1)
    return v / jnp.sqrt(_dot(v, v))


def rsa_layer_stats(*, rdm_metric: str, compare: str) -> LayerStats:
    """Per-layer statistics of :func:`rsa`: the RDM, ranked or standardised as ``compare`` needs.

    ``pair(layer(x), layer(y)) == rsa(x, y, rdm_metric=rdm_metric, compare=compare)``
    (the same entries, ranks and two-stage sums as :func:`rsa`).
    Memory: ``n (n - 1) / 2`` numbers per layer (``n^2`` for ``cosine_cov``).
    """

    def layer(x):
        return _side(_rdm(x, rdm_metric, unit=True), compare)

    def pair(sx, sy):
        if compare == "kendall":
            return _kendall_tau_a(sx, sy)
        return _dot(sx, sy)

    return LayerStats(layer, pair)
