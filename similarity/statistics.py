"""Statistics of the usable-information report (``funsim report usable-information``).

Small pure functions on 1-D arrays of comparisons, in JAX so that every
resampling is one compiled, vmapped program:

* :func:`r2`: the coefficient of determination of a least-squares line
  ``y ~ a + b x`` (the squared Pearson correlation), with frequency weights;
* :func:`resample_weights`, :func:`bootstrap`: percentile bootstrap intervals,
  optionally resampling whole clusters (e.g. model pairs: the layer pairs of one
  model pair are not independent), every resample a row of frequency weights;
* :func:`permutation_test`: the permutation null of :func:`r2` (``y`` shuffled);
* :func:`excess_kurtosis`, :func:`tail_statistics`: how heavy-tailed a
  distribution of differences is, against the normal distribution;
* :func:`binned_probability`: ``P(hit | x in bin)``, the sufficiency curve;
* :func:`count_violations`: pairs where a nested-family chain decreases.

Each is checked against NumPy/SciPy in ``tests/test_study_stats.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = [
    "Interval", "PermutationResult", "r2", "weighted_moments", "excess_kurtosis", "resample_weights",
    "bootstrap", "permutation_test", "tail_statistics", "binned_probability", "count_violations",
    "NORMAL_TAIL", "weighted_mean", "r2_margin",
]

# For a normal distribution: P(|z| > 3) and (q99 - q01) / (q75 - q25), the references of tail_statistics.
NORMAL_TAIL = {"beyond_3sd": 0.0026997960632601866, "quantile_ratio": 3.449048519068741}


def _vec(x: ArrayLike, name: str) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 1 or x.shape[0] < 2:
        raise ValueError(f"{name} must be a 1-D array of at least 2 values, got shape {tuple(x.shape)}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return x


def _same_length(**arrays) -> None:
    lengths = {k: v.shape[0] for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the arrays must have the same length, got {lengths}.")


def weighted_moments(x: ArrayLike, /, *, weights: ArrayLike | None = None) -> tuple[jax.Array, jax.Array]:
    """Weighted mean and the weighted central moments 2..4 of ``x (n,)``.

    Returns:
      ``(mean, (m2, m3, m4))``, each ``()``; frequency ``weights (n,)`` (None: all 1).
    """
    x = jnp.asarray(x)
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights, x.dtype)
    tot = jnp.sum(w)
    mu = jnp.sum(w * x) / tot
    c = x - mu
    return mu, tuple(jnp.sum(w * c**k) / tot for k in (2, 3, 4))


def r2(x: ArrayLike, y: ArrayLike, /, *, weights: ArrayLike | None = None) -> jax.Array:
    """R^2 of the least-squares line ``y ~ a + b x``: the squared Pearson correlation.

    Args:
      x, y: ``(n,)``.
      weights: ``(n,)`` frequency weights (a row counted ``w`` times); None: all 1.

    Returns:
      ``()`` in [0, 1]; NaN when x or y is constant (:func:`bootstrap` and
      :func:`permutation_test` refuse that case with a clear error).

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(r2(jnp.array([0., 1., 2., 3.]), jnp.array([1., 3., 5., 7.1]))), 4)
      0.9999
    """
    x, y = _vec(x, "x"), _vec(y, "y")
    _same_length(x=x, y=y)
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights, x.dtype)
    tot = jnp.sum(w)
    xc, yc = x - jnp.sum(w * x) / tot, y - jnp.sum(w * y) / tot
    sxy, sxx, syy = jnp.sum(w * xc * yc), jnp.sum(w * xc * xc), jnp.sum(w * yc * yc)
    return sxy * sxy / (sxx * syy)


def weighted_mean(x: ArrayLike, /, *, weights: ArrayLike | None = None) -> jax.Array:
    """The (frequency-)weighted mean of ``x`` (a statistic for :func:`bootstrap`).

    Examples:
      >>> import jax.numpy as jnp
      >>> float(weighted_mean(jnp.array([1., 3.]), weights=jnp.array([3., 1.])))
      1.5
    """
    x = _vec(x, "x")
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights, x.dtype)
    return jnp.sum(w * x) / jnp.sum(w)


def r2_margin(a: ArrayLike, b: ArrayLike, c: ArrayLike, y: ArrayLike, /, *,
              weights: ArrayLike | None = None) -> jax.Array:
    """``min(R^2(a, y), R^2(b, y)) - R^2(c, y)`` (:func:`r2`): how much better the weaker of two measures
    predicts ``y`` than a third; one statistic, so :func:`bootstrap` resamples the pairs jointly.

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.array([0., 1., 2., 3.])
      >>> round(float(r2_margin(y, 2 * y, jnp.array([1., 0., 1., 0.]), y)), 2)
      0.8
    """
    return jnp.minimum(r2(a, y, weights=weights), r2(b, y, weights=weights)) - r2(c, y, weights=weights)


def excess_kurtosis(x: ArrayLike, /, *, weights: ArrayLike | None = None) -> jax.Array:
    """Excess kurtosis ``m4 / m2^2 - 3`` (0 for a normal; > 0: heavier tails). SciPy's ``kurtosis`` default.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(excess_kurtosis(jnp.array([-1., 1., -1., 1.])))
      -2.0
    """
    _, (m2, _, m4) = weighted_moments(_vec(x, "x"), weights=weights)
    return m4 / (m2 * m2) - 3.0


class Interval(NamedTuple):
    """A point estimate with its percentile bootstrap interval.

    Attributes:
      estimate: the statistic on the data.
      low, high: the interval's ends.
      level: its coverage (e.g. 0.95).
      n_resamples: bootstrap resamples.
    """

    estimate: float
    low: float
    high: float
    level: float
    n_resamples: int


class PermutationResult(NamedTuple):
    """A permutation test of a statistic.

    Attributes:
      observed: the statistic on the data.
      null_mean: mean of the statistic over permutations.
      null_q95: 95th percentile of the null.
      p_value: ``(1 + #{null >= observed}) / (1 + n_permutations)``.
      n_permutations: permutations.
    """

    observed: float
    null_mean: float
    null_q95: float
    p_value: float
    n_permutations: int


def _clusters(clusters, n: int) -> tuple[np.ndarray, int]:
    if clusters is None:
        return np.arange(n), n
    ids = np.asarray(clusters)
    if ids.shape != (n,):
        raise ValueError(f"clusters must be (n,) = ({n},), one label per value, got shape {ids.shape}.")
    _, inverse = np.unique(ids, return_inverse=True)
    return inverse.reshape(-1), int(inverse.max()) + 1


def resample_weights(key: jax.Array, n: int, /, *, n_resamples: int, clusters: ArrayLike | None = None) -> jax.Array:
    """Frequency weights of ``n_resamples`` bootstrap resamples of ``n`` rows, ``(n_resamples, n)``.

    Each resample draws as many clusters as there are, uniformly with
    replacement; a row's weight is how often its cluster was drawn (with no
    clusters, each row is its own cluster: the ordinary bootstrap).

    Examples:
      >>> import jax
      >>> w = resample_weights(jax.random.key(0), 5, n_resamples=3)
      >>> w.shape, [int(s) for s in w.sum(axis=1)]
      ((3, 5), [5, 5, 5])
    """
    inverse, n_clusters = _clusters(clusters, n)
    draws = jax.random.randint(key, (n_resamples, n_clusters), 0, n_clusters)
    counts = jax.vmap(lambda d: jnp.zeros(n_clusters, jnp.float32).at[d].add(1.0))(draws)
    return counts[:, jnp.asarray(inverse)]


@functools.partial(jax.jit, static_argnames=("stat",))
def _weighted_stats(stat, arrays, weights):
    return jax.vmap(lambda w: stat(*arrays, weights=w))(weights)


def bootstrap(
    stat: Callable[..., jax.Array],
    arrays: tuple[ArrayLike, ...],
    /,
    *,
    key: jax.Array,
    n_resamples: int = 2000,
    clusters: ArrayLike | None = None,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap interval of ``stat(*arrays, weights=w)``, all resamples in one vmapped program.

    Args:
      stat: a statistic taking the arrays positionally and ``weights=`` (frequency
        weights ``(n,)``), e.g. :func:`r2` or :func:`excess_kurtosis`. A
        module-level function (it is a static argument of the compiled program).
      arrays: ``(n,)`` arrays.
      key: PRNG key of the resamples.
      n_resamples: resamples.
      clusters: ``(n,)`` cluster labels: resample whole clusters (see :func:`resample_weights`).
      level: coverage of the interval.

    Returns:
      :class:`Interval`.

    Raises:
      ValueError: arrays that are not 1-D of one length, a bad ``level`` or
        ``n_resamples``, or a statistic that is not finite on the data itself
        (e.g. :func:`r2` of a constant array).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(1), (200,))
      >>> ci = bootstrap(r2, (x, 2 * x + 0.1 * x**2), key=jax.random.key(2), n_resamples=200)
      >>> ci.low <= ci.estimate <= ci.high
      True
    """
    arrays = tuple(_vec(a, f"arrays[{i}]") for i, a in enumerate(arrays))
    _same_length(**{f"arrays[{i}]": a for i, a in enumerate(arrays)})
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}.")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}.")
    estimate = float(stat(*arrays))
    if not np.isfinite(estimate):
        raise ValueError(
            f"{getattr(stat, '__name__', 'the statistic')} is {estimate} on the data itself (arrays of length "
            f"{arrays[0].shape[0]}), e.g. a constant array has no variance; there is nothing to bootstrap."
        )
    n = arrays[0].shape[0]
    w = resample_weights(key, n, n_resamples=n_resamples, clusters=clusters)
    samples = np.asarray(_weighted_stats(stat, arrays, w))
    lo, hi = np.nanquantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(lo), float(hi), float(level), int(n_resamples))


@jax.jit
def _permuted_r2(x, y, keys):
    return jax.vmap(lambda k: r2(x, jax.random.permutation(k, y)))(keys)


def permutation_test(x: ArrayLike, y: ArrayLike, /, *, key: jax.Array, n_permutations: int = 2000) -> PermutationResult:
    """Permutation null of :func:`r2`: ``y`` shuffled against ``x``, all permutations in one vmapped program.

    Returns:
      :class:`PermutationResult`; ``p_value`` counts the observed value as one
      permutation, so it is never 0.

    Raises:
      ValueError: arrays that are not 1-D of one length, or x or y constant (R^2 undefined).

    Examples:
      >>> import jax
      >>> x = jax.random.normal(jax.random.key(0), (100,))
      >>> permutation_test(x, x + 0.5 * jax.random.normal(jax.random.key(1), (100,)),
      ...                  key=jax.random.key(2), n_permutations=99).p_value
      0.01
    """
    x, y = _vec(x, "x"), _vec(y, "y")
    _same_length(x=x, y=y)
    if not isinstance(n_permutations, int) or n_permutations < 1:
        raise ValueError(f"n_permutations must be a positive int, got {n_permutations!r}.")
    obs = float(r2(x, y))
    if not np.isfinite(obs):
        raise ValueError(f"R^2 is undefined: x or y (length {x.shape[0]}) is constant, with no variance.")
    null = np.asarray(_permuted_r2(x, y, jax.random.split(key, n_permutations)))
    return PermutationResult(obs, float(null.mean()), float(np.quantile(null, 0.95)),
                             float((1 + np.sum(null >= obs)) / (1 + n_permutations)), int(n_permutations))


def tail_statistics(d: ArrayLike, /) -> dict[str, float]:
    """How heavy-tailed a distribution of differences is, each beside its value for a normal distribution.

    Args:
      d: ``(n,)`` values (e.g. forward minus reverse stitching scores).

    Returns:
      ``{"n", "mean", "sd", "median", "excess_kurtosis" (normal: 0), "beyond_3sd"
      (fraction with ``|d - mean| > 3 sd``; normal: 0.0027), "quantile_ratio"
      (``(q99 - q01) / (q75 - q25)``; normal: 3.45), "max_abs"}``.

    Examples:
      >>> import numpy as np
      >>> t = tail_statistics(np.random.default_rng(0).standard_t(2, size=5000))
      >>> t["excess_kurtosis"] > 3 and t["quantile_ratio"] > 3.45
      True
    """
    d = np.asarray(_vec(d, "d"), np.float64)
    mu, sd = d.mean(), d.std()
    q01, q25, q50, q75, q99 = np.quantile(d, [0.01, 0.25, 0.5, 0.75, 0.99])
    return {
        "n": int(d.size), "mean": float(mu), "sd": float(sd), "median": float(q50),
        "excess_kurtosis": float(excess_kurtosis(jnp.asarray(d))),
        "beyond_3sd": float(np.mean(np.abs(d - mu) > 3 * sd)),
        "quantile_ratio": float((q99 - q01) / (q75 - q25)) if q75 > q25 else float("inf"),
        "max_abs": float(np.abs(d).max()),
    }


def binned_probability(x: ArrayLike, hit: ArrayLike, /, *, edges: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``P(hit | x in bin)`` for the bins ``[edges[k], edges[k+1])`` (the last bin closed), as ``np.histogram``.

    Args:
      x: ``(n,)`` values (e.g. representational similarity).
      hit: ``(n,)`` booleans (e.g. functional similarity above a threshold).
      edges: ``(B + 1,)`` increasing bin edges.

    Returns:
      ``(counts (B,), probability (B,))``; the probability is NaN for an empty bin.

    Examples:
      >>> c, p = binned_probability([0.1, 0.2, 0.9], [False, True, True], edges=[0, 0.5, 1])
      >>> c.tolist(), p.tolist()
      ([2, 1], [0.5, 1.0])
    """
    x, hit, edges = np.asarray(x, np.float64), np.asarray(hit, bool), np.asarray(edges, np.float64)
    if x.shape != hit.shape or x.ndim != 1:
        raise ValueError(f"x and hit must be 1-D of the same length, got {x.shape} and {hit.shape}.")
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"edges must be at least 2 increasing values, got {edges.tolist()}.")
    counts, _ = np.histogram(x, bins=edges)
    hits, _ = np.histogram(x[hit], bins=edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        prob = np.where(counts > 0, hits / counts, np.nan)
    return counts, prob


def count_violations(*chain: ArrayLike, tol: float = 0.0) -> int:
    """Entries where ``chain[k] > chain[k + 1] + tol`` for some k (a nested-family order broken).

    Examples:
      >>> count_violations([0.1, 0.5], [0.2, 0.4], [0.3, 0.6])
      1
    """
    arrs = [np.asarray(c, np.float64) for c in chain]
    if len(arrs) < 2 or any(a.shape != arrs[0].shape for a in arrs):
        raise ValueError(f"pass two or more arrays of one shape, got shapes {[a.shape for a in arrs]}.")
    bad = np.zeros(arrs[0].shape, bool)
    for lo, hi in zip(arrs[:-1], arrs[1:]):
        bad |= lo > hi + tol
    return int(bad.sum())
