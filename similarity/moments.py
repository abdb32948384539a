"""Moment types and per-layer statistics: how a measure shares work across a grid of layers.

One public home for the types the comparison grid (:func:`similarity.compare_grid`)
and the measure modules exchange (docs/design.md §2-3):

* :class:`LayerStats` ``(layer, pair)``: the measure factors as
  ``f(x, y) == pair(layer(x), layer(y))``. ``layer`` is the expensive part (an
  RDM, a kernel matrix, a QR or SVD of the samples), ``pair`` the cheap one.
  A grid of ``La x Lb`` layers costs ``La + Lb`` calls of ``layer`` and
  ``La * Lb`` calls of ``pair``.
* :class:`MomentStats` ``(moments, finish, layer, check)``: the measure is a
  function of centred second moments only, so the grid can stream the samples
  in chunks, shard the pairs over devices and get the cross moments of every
  pair from one large matrix product. ``moments`` says which moments:

  - ``"full"``: all rows, centred on the all-rows mean, each side scaled to
    unit Frobenius norm: per layer :class:`FullMoments`, per pair the
    ``(d1, d2)`` cross moment ``Xc^T Yc / (||Xc|| ||Yc||)`` (CKA, NBS,
    Procrustes, the alpha = 1 shape metrics);
  - ``"split"``: train and test rows (:func:`split_weights`), centred on the
    train mean and scaled by the train norm: per layer :class:`LayerMoments`,
    per pair :class:`PairMoments` (the held-out and in-sample reconstruction
    scores).

  ``finish(ctx)`` maps a :class:`MomentPair` (one source/target pair) to
  ``()``, or to ``(value, flags)``: the measure's own checks of the pair (a
  dict of ``()`` arrays with the keys of its core's ``pair`` flags, see
  :mod:`similarity.protocol`, except ``"x"`` and ``"y"``: the grid adds each
  side's ``finite``/``varies`` flags on the rows of its moment kind, and for
  ``"split"`` the row counts ``"n_rows"`` (train + test) and ``"n_test"``).
  The measure's ``core.reason`` reads them; ``value`` is NaN where it says
  undefined. ``layer`` optionally derives a per-layer value from the layer's
  moments once per layer (the affine stitcher's solver); a ``layer`` function
  with the attribute ``needs_roots = True`` gets ``"split"`` moments that also
  carry :class:`similarity.stitching.AffineRoots` (a QR of the layer's rows,
  streamed over chunks too). ``check(n_fit, d_src, where)`` optionally raises for
  widths the measure cannot handle (an unregularised affine fit with too few rows).

  **Zero features.** The grid pads each layer's width up to a size bucket with
  zero features, so that grids of other architectures reuse its compiled
  programs. A moment measure must therefore not change when a layer gains
  zero features: ``finish`` sees moments with zero rows and columns for them,
  and ``layer`` sees each Gram matrix with a unit diagonal on them (so that a
  factorisation stays definite and they decouple). Every built-in moment
  measure qualifies (the grid tests check each against its unpadded value);
  a measure that reads the width itself does not, and needs
  ``compare_grid(..., buckets=False)``.

Each measure module exports its own statistics (``cka.cka_layer_stats``,
``rsa.rsa_layer_stats``, ``cca.pwcca_layer_stats``, ``shape.nbs_moment_stats``,
``stitching.stitch_moment_stats``, ...). Like the other pure kernels these
functions do no validation, except :func:`split_weights`, which checks the
split it is given; the registry tests check ``pair(layer(x), layer(y)) == f(x, y)``
and the grid tests check the moment measures against their pairwise functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._linalg import pow2_scale as _pow2_scale
from funsim.similarity._linalg import svd as _svd
from funsim.similarity._precision import full_precision, sum_of_products

__all__ = [
    "MOMENT_KINDS",
    "LayerStats",
    "MomentStats",
    "MomentPair",
    "FullMoments",
    "LayerMoments",
    "PairMoments",
    "full_moments",
    "full_pair",
    "split_weights",
    "check_split",
]

MOMENT_KINDS = ("full", "split")


class LayerStats(NamedTuple):
    """``f(x, y) == pair(layer(x), layer(y))``.

    Attributes:
      layer: ``(n, d) -> pytree`` of per-layer statistics (pure, jit-able).
      pair: ``(stats_x, stats_y) -> ()`` (pure, jit-able).
    """

    layer: Callable
    pair: Callable


class MomentStats(NamedTuple):
    """A measure computed from centred second moments (see the module docstring).

    Attributes:
      moments: ``"full"`` or ``"split"``: which moments ``finish`` reads.
      finish: ``MomentPair -> ()`` or ``-> ((), flags)`` (pure, jit-able).
      layer: optional ``layer moments -> pytree``, evaluated once per layer and
        read with ``ctx.extra(layer)``; measures that share the same function
        object share the values.
      check: optional ``(n_fit, d_src, where) -> None`` that raises a
        ``ValueError`` when a source of width ``d_src`` cannot be handled with
        ``n_fit`` rows (the train rows for ``"split"``, all rows for ``"full"``).
    """

    moments: str
    finish: Callable[[MomentPair], jax.Array]
    layer: Callable | None = None
    check: Callable[[int, int, str], None] | None = None


class FullMoments(NamedTuple):
    """All-rows moments of one layer ``x (n, d)`` (a pytree; stack them for many layers).

    Attributes:
      norm: ``()`` ``||Xc||_F``, the Frobenius norm of the column-centred ``x``.
      gram: ``(d, d)`` ``Xc^T Xc / ||Xc||_F^2`` (trace 1).
      gram_norm: ``()`` ``||gram||_F`` (linear CKA's denominator), formed where ``gram`` is, so that a
        grid computes it once per layer in the program that computes the layer's moments.
    """

    norm: jax.Array
    gram: jax.Array
    gram_norm: jax.Array


def full_moments_of(norm, gram) -> FullMoments:
    """:class:`FullMoments` from ``norm`` and the normalised ``gram`` (``(..., d, d)``): adds ``gram_norm``."""
    return FullMoments(norm, gram, jnp.sqrt(sum_of_products(gram, gram, axis=(-2, -1))))


class LayerMoments(NamedTuple):
    """Per-layer statistics on normalised, train-centred data ``u = (z - mean)/norm``.

    Attributes:
      mean: ``(d,)`` train mean.
      norm: ``()`` Frobenius norm of the train-centred train rows (1 if not normalising).
      gram_train: ``(d, d)`` ``sum_train u u^T``.
      gram_test: ``(d, d)`` ``sum_test u u^T``.
      sum_test: ``(d,)`` ``sum_test u``.
      n_test: ``()`` number of test rows.
      roots: optional :class:`similarity.stitching.AffineRoots`, square roots of the shifted
        ``gram_train`` and ``gram_test`` from a QR of the rows (the affine stitcher's accurate
        float32 fit and scores); None where only the moments are known.
    """

    mean: jax.Array
    norm: jax.Array
    gram_train: jax.Array
    gram_test: jax.Array
    sum_test: jax.Array
    n_test: jax.Array
    roots: Any = None


class PairMoments(NamedTuple):
    """Cross moments of a (source, target) pair: ``sum u v^T`` over train and test rows."""

    cross_train: jax.Array
    cross_test: jax.Array


def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def _scaled_centre(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(Xc / c, ||Xc|| / c, c)`` with ``c`` the power-of-two scale of ``x`` (exact: products of
    ``x / c`` neither overflow nor underflow, float32 data at 1e-20 ... 1e20 included)."""
    c = _pow2_scale(x)
    xc = _centre(x / c)
    return xc, jnp.sqrt(jnp.sum(xc * xc)), c


def full_moments(x: jax.Array, /) -> FullMoments:
    """:class:`FullMoments` of ``x: (n, d)`` (pure; a constant ``x`` gives NaN).

    The products are formed on ``x`` divided by its power-of-two scale (exact), so
    they cannot overflow or underflow; ``norm`` is in the units of ``x``.
    """
    xc, norm, c = _scaled_centre(x)
    return full_moments_of(norm * c, jnp.einsum("ni,nj->ij", xc, xc) / norm**2)


def full_pair(x: jax.Array, y: jax.Array, /) -> MomentPair:
    """The ``"full"`` :class:`MomentPair` of ``x: (n, d1)`` and ``y: (n, d2)`` (pure).

    Examples:
      >>> import jax.numpy as jnp
      >>> ctx = full_pair(jnp.array([[0.0], [1.0], [3.0]]), jnp.array([[1.0], [0.0], [-2.0]]))
      >>> [round(float(v), 6) for v in ctx.svd()[1]]  # singular values of the normalised cross moment
      [1.0]
    """
    (xc, nx, cx), (yc, ny, cy) = _scaled_centre(x), _scaled_centre(y)
    mx = full_moments_of(nx * cx, jnp.einsum("ni,nj->ij", xc, xc) / nx**2)
    my = full_moments_of(ny * cy, jnp.einsum("ni,nj->ij", yc, yc) / ny**2)
    return MomentPair(mx, my, jnp.einsum("ni,nj->ij", xc, yc) / (nx * ny))


class _Cell:
    """A value computed once and shared by a pair and its transpose."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = None


class MomentPair:
    """What a moment measure's ``finish`` sees for one ``(source, target)`` pair.

    A trace-time helper (not a pytree): the grid builds one per pair and
    direction inside its compiled program and hands the same object to every
    requested measure, so work they share (an SVD, an affine fit) is traced once.

    Attributes:
      x: the source's per-layer moments (:class:`FullMoments` or
        :class:`LayerMoments`).
      y: the target's per-layer moments.
      cross: ``(d1, d2)`` normalised cross moment (``"full"``) or
        :class:`PairMoments` (``"split"``).
      fit_cross: the ``(d1, d2)`` matrix whose SVD :meth:`svd` returns: ``cross``
        itself, or the train cross moment for ``"split"``.
    """

    def __init__(self, x, y, cross, fit_cross=None, *, extras=None, _svd_cell=None, _flipped=False):
        self.x, self.y, self.cross = x, y, cross
        self.fit_cross = cross if fit_cross is None else fit_cross
        self._extras = {} if extras is None else dict(extras)  # hook -> (extra_x, extra_y)
        self._svd_cell = _Cell() if _svd_cell is None else _svd_cell
        self._flipped = _flipped
        self._memo: dict[Any, Any] = {}
        self._transposed: MomentPair | None = None

    def svd(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(u (d1, k), s (k,), vt (k, d2))`` of :attr:`fit_cross`, ``k = min(d1, d2)``.

        Computed once per pair (batch-safe, :func:`similarity._linalg.svd`); the
        transposed pair reads the same factorisation with ``u`` and ``v`` swapped.
        """
        if self._svd_cell.value is None:
            m = self.fit_cross.T if self._flipped else self.fit_cross
            self._svd_cell.value = _svd(m)
        u, s, vt = self._svd_cell.value
        return (vt.T, s, u.T) if self._flipped else (u, s, vt)

    def extra(self, hook: Callable) -> tuple[Any, Any]:
        """``(hook(x), hook(y))``: per-layer values, precomputed by the grid when it can."""
        if hook not in self._extras:
            self._extras[hook] = (hook(self.x), hook(self.y))
        return self._extras[hook]

    def memo(self, key: Any, thunk: Callable[[], Any]) -> Any:
        """``thunk()``, evaluated once per pair and direction for each hashable ``key``."""
        if key not in self._memo:
            self._memo[key] = thunk()
        return self._memo[key]

    def transposed(self) -> MomentPair:
        """The same pair with source and target swapped (the reverse direction).

        The moments are reused (cross moments transposed) and so is the SVD.
        """
        if self._transposed is None:
            t = MomentPair(
                self.y,
                self.x,
                jax.tree.map(lambda a: jnp.swapaxes(a, -1, -2), self.cross),
                extras={h: (ey, ex) for h, (ex, ey) in self._extras.items()},
                _svd_cell=self._svd_cell,
                _flipped=not self._flipped,
            )
            t.fit_cross = jnp.swapaxes(self.fit_cross, -1, -2)
            t._transposed = self
            self._transposed = t
        return self._transposed


# ----------------------------------------------------------------------------- train/test splits


@full_precision
def split_weights(
    n: int, split: float | tuple[ArrayLike, ArrayLike], key: jax.Array | None, dtype
) -> tuple[jax.Array, jax.Array]:
    """Turn ``split`` into 0/1 train and test row weights ``(n,)``, validating it.

    The held-out reconstruction scores (:func:`similarity.reconstruction_score`,
    the ``stitch/*`` measures) and the grid's ``"split"`` moments use it.

    Args:
      n: the number of rows.
      split: the train fraction (rows drawn at random with ``key``; the default
        key is ``jax.random.key(0)``, so the split is deterministic), or a pair
        ``(train_idx, test_idx)`` of integer index arrays.
      key: PRNG key for a fractional split, or None.
      dtype: the weights' dtype.

    Returns:
      ``(w_train, w_test)``, each ``(n,)``, 1.0 on the rows of that part and 0.0 elsewhere.

    Raises:
      ValueError: a fraction outside (0, 1), bad or overlapping indices, or fewer
        than 2 rows on either side.

    Examples:
      >>> import numpy as np
      >>> w_tr, w_te = split_weights(6, (np.array([0, 1, 2]), np.array([4, 5])), None, np.float32)
      >>> np.asarray(w_tr).tolist(), np.asarray(w_te).tolist()
      ([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    """
    n_tr, n_te, idx = _checked_split(n, split)
    if idx is not None:
        w_tr, w_te = _index_split(*idx, n, jnp.dtype(dtype))
    if not isinstance(split, tuple):
        w_tr, w_te = _random_split(jax.random.key(0) if key is None else key, n, n_tr, jnp.dtype(dtype))
    return w_tr, w_te


def check_split(n: int, split: float | tuple[ArrayLike, ArrayLike]) -> tuple[int, int]:
    """Validate ``split`` for ``n`` rows as :func:`split_weights` does, without computing weights.

    Returns:
      ``(n_train, n_test)``.
    """
    n_tr, n_te, _ = _checked_split(n, split)
    return n_tr, n_te


def _describe_split(split) -> str:
    """A bad ``split`` in words: its repr, or an array's shape and dtype (with a boolean mask's fix)."""
    if np.ndim(split) == 0:
        return repr(split)
    a = np.asarray(split)
    hint = ("; for a boolean train mask m pass (np.flatnonzero(m), np.flatnonzero(~m))"
            if a.dtype == bool else "; an index array of train rows goes with one of test rows")
    return f"an array of shape {a.shape} and dtype {a.dtype}{hint}"


def _checked_split(n: int, split) -> tuple[int, int, tuple | None]:
    """``(n_train, n_test, (train_idx, test_idx) or None)``; raises for a bad split."""
    idx = None
    if isinstance(split, tuple):
        if len(split) != 2:
            raise ValueError("split must be a fraction or a pair (train_idx, test_idx).")
        idx = []
        for nm, ix in zip(("train_idx", "test_idx"), split):
            ix = np.asarray(ix) if not isinstance(ix, jax.Array) else ix
            if ix.ndim != 1 or not jnp.issubdtype(ix.dtype, jnp.integer):
                raise ValueError(f"split's {nm} must be a 1-D integer index array, got {ix.dtype} {ix.shape}.")
            if V.is_concrete(ix) and ix.size and (int(ix.min()) < 0 or int(ix.max()) >= n):
                raise ValueError(f"split's {nm} has indices outside [0, {n}).")
            idx.append(ix)
        tr, te = idx
        if V.is_concrete(tr, te) and np.intersect1d(np.asarray(tr), np.asarray(te)).size:
            raise ValueError("split's train_idx and test_idx overlap; held-out rows must be unseen.")
        idx = (tr, te)
        n_tr, n_te = int(tr.shape[0]), int(te.shape[0])
    else:
        if not isinstance(split, (float, int)) or isinstance(split, bool) or not 0 < split < 1:
            raise ValueError(f"split must be a train fraction in (0, 1) or (train_idx, test_idx), got "
                             f"{_describe_split(split)}.")
        n_tr = int(round(split * n))
        n_te = n - n_tr
    if n_tr < 2 or n_te < 2:
        raise ValueError(
            f"split gives {n_tr} train and {n_te} test rows out of n={n}; each side needs at "
            "least 2 rows (to centre and to have a variance). Use more samples or a fraction "
            "closer to 0.5."
        )
    return n_tr, n_te, idx


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _random_split(key, n: int, n_tr: int, dtype):
    """0/1 weights ``(n,)`` of ``n_tr`` random train rows and the rest (one program per shape)."""
    w_tr = jnp.zeros((n,), dtype).at[jax.random.permutation(key, n)[:n_tr]].set(1.0)
    return w_tr, 1.0 - w_tr


@functools.partial(jax.jit, static_argnums=(2, 3))
def _index_split(tr, te, n: int, dtype):
    """0/1 weights ``(n,)`` of the rows ``tr`` and ``te``."""
    return jnp.zeros((n,), dtype).at[tr].set(1.0), jnp.zeros((n,), dtype).at[te].set(1.0)
