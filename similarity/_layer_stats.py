"""Per-layer statistics for registered measures, so that a layer grid does per-layer work once.

A measure ``f(x, y)`` that factors as ``pair(layer(x), layer(y))`` can be
evaluated on a grid of ``La x Lb`` layers with ``La + Lb`` calls of ``layer``
(the expensive part: an RDM, a kernel matrix, a QR or SVD of the samples) and
``La * Lb`` calls of the cheap ``pair``. :class:`LayerStats` holds the two
functions; :mod:`similarity.registry` attaches one to each measure it can, and
:func:`similarity.compare_grid` uses it. ``pair(layer(x), layer(y))`` is the
same formula as ``f(x, y)`` (the tests check the agreement); like the other
pure kernels these functions do no validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from similarity._linalg import svd as _svd
from similarity.cca import _centre, _pwcca_pair, _qr_basis, _svcca_basis, _svcca_pair
from similarity.cka import _hsic_gram, _rbf_gram_and_median, linear_cka_from_stats, linear_stats
from similarity.regression import _layer as _reg_layer
from similarity.regression import _r2_from_layers
from similarity.rsa import _centre2, _rdm, compare_vectors, rank_average

__all__ = ["LayerStats", "cka_stats", "rsa_stats", "cca_stats", "svcca_stats", "pwcca_stats",
           "regression_stats"]


class LayerStats(NamedTuple):
    """``f(x, y) == pair(layer(x), layer(y))``.

    Attributes:
      layer: ``(n, d) -> pytree`` of per-layer statistics (pure, jit-able).
      pair: ``(stats_x, stats_y) -> ()`` (pure, jit-able).
    """

    layer: Callable
    pair: Callable


def _unit(v: jax.Array) -> jax.Array:
    return v / jnp.sqrt(jnp.sum(v * v))


# ----------------------------------------------------------------------------- CKA


def cka_stats(kernel: str, debiased: bool, rbf_scale: float = 0.5) -> LayerStats:
    """Linear CKA through :func:`similarity.cka.linear_stats`; RBF CKA through the kernel matrix."""
    if kernel == "linear":
        return LayerStats(
            lambda x: linear_stats(x, debiased=debiased),
            lambda sx, sy: linear_cka_from_stats(sx, sy, debiased=debiased),
        )

    def layer(x):
        k, _ = _rbf_gram_and_median(x, rbf_scale)
        return k, _hsic_gram(k, k, debiased)

    def pair(sx, sy):
        (k, hk), (l, hl) = sx, sy
        return _hsic_gram(k, l, debiased) / jnp.sqrt(hk * hl)

    return LayerStats(layer, pair)


# ----------------------------------------------------------------------------- RSA


def rsa_stats(rdm_metric: str, compare: str) -> LayerStats:
    """The RDM (its upper triangle, ranked or standardised as ``compare`` needs) per layer.

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


# ----------------------------------------------------------------------------- CCA family


def cca_stats(reduce: str) -> LayerStats:
    """An orthonormal basis of the centred columns per layer; canonical correlations per pair."""

    def pair(qx, qy):
        rho = jnp.clip(_svd(jnp.einsum("ni,nj->ij", qx, qy), compute_uv=False), 0.0, 1.0)
        return jnp.mean(rho**2) if reduce == "r2" else jnp.mean(rho)

    return LayerStats(_qr_basis, pair)


def svcca_stats(keep_variance: float = 0.99) -> LayerStats:
    """The kept top-SVD directions per layer (as :func:`similarity.svcca`)."""
    return LayerStats(lambda x: _svcca_basis(x, keep_variance), _svcca_pair)


def pwcca_stats() -> LayerStats:
    """``(basis, centred)`` per layer; the weights come from the first argument's side."""
    return LayerStats(lambda x: (_qr_basis(x), _centre(x)), lambda sx, sy: _pwcca_pair(*sx, sy[0]))


# ----------------------------------------------------------------------------- regression


def regression_stats(ridge: float) -> LayerStats:
    """The SVD of the centred predictor and the centred target, per layer (both roles)."""
    return LayerStats(_reg_layer, lambda sx, sy: _r2_from_layers(sx, sy, ridge))
