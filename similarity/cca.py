"""Canonical correlation analysis and its descendants (DESIGN.md §2).

* :func:`cca`: canonical correlations ``rho_1 >= ... >= rho_k``,
  ``k = min(d1, d2)``: the singular values of ``Qx^T Qy`` with ``Qx``, ``Qy``
  from thin QR decompositions of the column-centred ``X``, ``Y``.
* :func:`cca_r2`: ``R^2_CCA = mean(rho^2)``; :func:`cca_mean`: ``mean(rho)``.
* :func:`svcca` (Raghu et al. 2017): keep each side's top singular directions
  explaining ``keep_variance`` of its variance, then the mean canonical
  correlation of the kept subspaces.
* :func:`pwcca` (Morcos et al. 2018): ``sum_i alpha_i rho_i`` with
  ``alpha_i ∝ sum_j |<h_i, x_j>|``, ``h_i`` the unit-norm canonical variates
  of ``x`` and ``x_j`` its centred columns. It is not symmetric: the weights
  come from the first argument.

Rank: CCA needs each centred representation to have full column rank, so
``d < n`` (centring removes one dimension). :func:`cca`, :func:`cca_r2`,
:func:`cca_mean` and :func:`pwcca` raise a ``ValueError`` when a side is
rank-deficient (``d >= n``, duplicated or collinear features), telling you to
reduce it first, e.g. with :func:`svcca`, which handles any rank (directions
with zero variance are never kept). Under a user's ``jit`` the rank check is
skipped and a rank-deficient side gives meaningless correlations near 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from similarity import _validate as V
from similarity._linalg import svd as _svd

__all__ = ["cca", "cca_r2", "cca_mean", "svcca", "pwcca"]


def _centre(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=0, keepdims=True)


def _rank_tol(dtype, n: int, d: int) -> float:
    return max(n, d) * float(jnp.finfo(dtype).eps) * 10.0


def _check_full_rank(x: jax.Array, name: str) -> None:
    n, d = x.shape
    if d >= n:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}: CCA needs more samples than features (d < n; "
            "centring uses one degree of freedom), otherwise every canonical correlation is 1. "
            f"Reduce {name} first (svcca does this), or pass more samples."
        )
    if not V.is_concrete(x):
        return
    a = np.asarray(x, dtype=np.float64)
    s = np.linalg.svd(a - a.mean(axis=0), compute_uv=False)
    if s[-1] <= _rank_tol(x.dtype, n, d) * s[0]:
        rank = int(np.sum(s > _rank_tol(x.dtype, n, d) * s[0]))
        raise ValueError(
            f"{name} of shape {tuple(x.shape)} has centred rank {rank} < {d} features "
            "(duplicated, collinear or constant features), so CCA is not defined. Remove "
            "the redundant features, or use svcca, which keeps only directions with variance."
        )


def _validate(x, y):
    x, y = V.check_pair(x, y, min_samples=3, why="CCA")
    _check_full_rank(x, "x")
    _check_full_rank(y, "y")
    return x, y


def _qr_basis(x: jax.Array) -> jax.Array:
    q, _ = jnp.linalg.qr(_centre(x), mode="reduced")
    return q


def _cca_core(x: jax.Array, y: jax.Array) -> jax.Array:
    m = jnp.einsum("ni,nj->ij", _qr_basis(x), _qr_basis(y))
    return jnp.clip(_svd(m, compute_uv=False), 0.0, 1.0)


_cca_jit = jax.jit(_cca_core)


def cca(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Canonical correlations of two representations, in decreasing order.

    Args:
      x: ``(n, d1)`` with ``d1 < n`` and full column rank after centring.
      y: ``(n, d2)`` likewise.

    Returns:
      ``(min(d1, d2),)`` in [0, 1], decreasing.

    Raises:
      ValueError: bad shapes, NaN/Inf, or a rank-deficient side (see module docstring).

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> np.round(np.asarray(cca(x, x @ np.array([[1.0, 2, 0], [0, 1, 0], [3, 0, 1]]))), 6).tolist()
      [1.0, 1.0, 1.0]
    """
    x, y = _validate(x, y)
    return _cca_jit(x, y)


def cca_r2(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """``R^2_CCA``: the mean squared canonical correlation, a symmetric score in [0, 1].

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.

    Returns:
      ``()``.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(cca_r2(x, 2 * x + 1)), 6)
      1.0
    """
    x, y = _validate(x, y)
    return _cca_r2_jit(x, y)


_cca_r2_jit = jax.jit(lambda x, y: jnp.mean(_cca_core(x, y) ** 2))
_cca_mean_jit = jax.jit(lambda x, y: jnp.mean(_cca_core(x, y)))


def cca_mean(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Mean canonical correlation ``mean(rho)``, a symmetric score in [0, 1].

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(20, 3))
      >>> round(float(cca_mean(x, -x)), 6)
      1.0
    """
    x, y = _validate(x, y)
    return _cca_mean_jit(x, y)


@jax.jit
def _pwcca_core(x: jax.Array, y: jax.Array) -> jax.Array:
    return _pwcca_pair(_qr_basis(x), _centre(x), _qr_basis(y))


def _pwcca_pair(qx: jax.Array, xc: jax.Array, qy: jax.Array) -> jax.Array:
    """PWCCA from ``x``'s basis ``(n, d1)`` and centred columns ``(n, d1)`` and ``y``'s basis."""
    u, rho, _ = _svd(jnp.einsum("ni,nj->ij", qx, qy))
    k = rho.shape[0]
    h = jnp.einsum("ni,ik->nk", qx, u[:, :k])  # unit-norm canonical variates of x
    w = jnp.sum(jnp.abs(jnp.einsum("nk,nj->kj", h, xc)), axis=1)
    return jnp.sum(w * jnp.clip(rho, 0.0, 1.0)) / jnp.sum(w)


def pwcca(x: ArrayLike, y: ArrayLike, /) -> jax.Array:
    """Projection-weighted CCA (Morcos et al. 2018), a score in [0, 1]; not symmetric.

    ``alpha_i ∝ sum_j |<h_i, x_j>|``: how much of ``x``'s centred columns
    ``x_j`` the i-th canonical variate ``h_i`` (of ``x``, unit norm) accounts
    for. There are ``min(d1, d2)`` canonical pairs, whichever argument is wider.

    Args:
      x: ``(n, d1)``: the representation whose canonical variates weight the sum.
      y: ``(n, d2)``.

    Returns:
      ``()``.

    Raises:
      ValueError: as :func:`cca`.

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(30, 4))
      >>> y = x[:, :2] + np.random.default_rng(1).normal(size=(30, 2))
      >>> 0.0 < float(pwcca(x, y)) < 1.0
      True
    """
    x, y = _validate(x, y)
    return _pwcca_core(x, y)


def _svcca_basis(a: jax.Array, keep_variance: float) -> tuple[jax.Array, jax.Array]:
    """The top-SVD directions of ``a: (n, d)`` that SVCCA keeps: ``(u masked (n, r), count)``."""
    u, s, _ = _svd(_centre(a))
    var = s * s
    frac = jnp.cumsum(var) / jnp.sum(var)
    # keep direction i iff the directions before it explain < keep_variance
    before = jnp.concatenate([jnp.zeros((1,), frac.dtype), frac[:-1]])
    tol = _rank_tol(a.dtype, *a.shape) * s[0]
    keep = (before < keep_variance) & (s > tol)
    return u * keep[None, :].astype(u.dtype), jnp.sum(keep)


@functools.partial(jax.jit, static_argnames=("keep_variance",))
def _svcca_core(x: jax.Array, y: jax.Array, keep_variance: float) -> jax.Array:
    return _svcca_pair(_svcca_basis(x, keep_variance), _svcca_basis(y, keep_variance))


def _svcca_pair(bx, by) -> jax.Array:
    (ux, kx), (uy, ky) = bx, by
    rho = _svd(jnp.einsum("ni,nj->ij", ux, uy), compute_uv=False)
    # the masked matrix has the kept block's min(kx, ky) correlations, then zeros
    return jnp.sum(jnp.clip(rho, 0.0, 1.0)) / jnp.minimum(kx, ky)


def svcca(x: ArrayLike, y: ArrayLike, /, *, keep_variance: float = 0.99) -> jax.Array:
    """SVCCA (Raghu et al. 2017): mean canonical correlation of the top SVD subspaces.

    Each side keeps its fewest top singular directions (of the centred data)
    that explain at least ``keep_variance`` of its variance; directions with
    zero variance are never kept, so any rank and ``d >= n`` are fine. The
    score is the mean of the ``min(k1, k2)`` canonical correlations. Shapes are
    static under ``jit``: kept directions are selected by a mask.

    Args:
      x: ``(n, d1)``.
      y: ``(n, d2)``.
      keep_variance: fraction in (0, 1].

    Returns:
      ``()`` in [0, 1]; symmetric.

    Raises:
      ValueError: bad shapes, NaN/Inf, a constant side, keep_variance outside (0, 1].

    Examples:
      >>> import numpy as np
      >>> x = np.random.default_rng(0).normal(size=(30, 40))
      >>> round(float(svcca(x, 2 * x + 1)), 4)
      1.0
    """
    if not 0.0 < float(keep_variance) <= 1.0:
        raise ValueError(f"keep_variance must be in (0, 1], got {keep_variance!r}.")
    x, y = V.check_pair(x, y, min_samples=3, why="SVCCA")
    V.check_not_constant(x, "x", what="SVCCA")
    V.check_not_constant(y, "y", what="SVCCA")
    return _svcca_core(x, y, float(keep_variance))
