"""The cumulant engine: expected products of low-rank quadratic forms of a Gaussian vector.

Private to :mod:`funsim.similarity.attention` (docs/design.md §4, "Bilinear attention").
:func:`product_moment` computes ``E[prod_k q_k]`` of K quadratic forms of a standard
Gaussian from the forms' cores, through their joint cumulants (sums over cyclic orders
and chains by dynamic programming over subsets, then over set partitions);
:func:`forms_moment` builds the cores of forms whose factor vectors are rows of the
projection tables of one attention layer under a Gaussian residual stream (a
:class:`Family` names such a block of rows).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._precision import sum_of_products

__all__ = ["Family", "product_moment", "forms_moment", "set_partitions"]


def set_partitions(items):
    """All set partitions of a list (15 for four items), each a list of blocks.

    >>> len(list(set_partitions([0, 1, 2, 3])))
    15
    """
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


# ---------------------------------------------------------------------------
# Expected product of low-rank quadratic forms of a standard Gaussian
# ---------------------------------------------------------------------------
#
# A form is q(z) = sum_{i<r} (alpha_i . z + a_i)(beta_i . z + b_i), z ~ N(0, I).
# With F = [alpha_1..alpha_r, beta_1..beta_r] it is c + 2 b^T z + z^T A z with
# A = F J F^T / 2 (J swaps the two halves), b = F eta / 2, eta = (b_1..b_r, a_1..a_r),
# c = sum a_i b_i. Only the cores Gamma_kl = F_k^T F_l (2r_k x 2r_l) enter:
#   kappa_1 = c + tr A = sum a_i b_i + sum alpha_i . beta_i,
#   kappa(S) = 1/2 [ sum over cyclic orders tr(J G_12 J G_23 ... J G_m1)
#                    + sum over orders eta_1^T G_12 J G_23 ... J G_(m-1)m eta_m ]  (|S| >= 2),
# which is 2^{m-1}(traces + chains) of the A's and b's (the cumulant generating
# function of Gaussian quadratic forms). Orders are summed by dynamic programming
# over subsets, and the moment is the sum over set partitions of cumulant products.


def _swap_halves(x, axis):
    r = x.shape[axis] // 2
    return jnp.concatenate(
        [jax.lax.slice_in_dim(x, r, 2 * r, axis=axis), jax.lax.slice_in_dim(x, 0, r, axis=axis)],
        axis=axis,
    )


@dataclasses.dataclass(frozen=True)
class _Level:
    """One level of the subset dynamic programme (all states with the same number of forms)."""

    masks: np.ndarray  # (S,) subset of each state
    last: np.ndarray  # (S,) the form the paths end on
    first: np.ndarray  # (S,) smallest member (trace DP) ; unused for chains
    src: np.ndarray  # (X,) transitions: source state
    nxt: np.ndarray  # (X,) form appended
    dst: np.ndarray  # (S', X) one-hot: transition -> next-level state
    to_mask: np.ndarray  # (S, 2^K) one-hot: state -> subset


def _levels(n_forms, states, cyclic):
    out = []
    while states:
        index: dict = {}
        src, nxt, dst = [], [], []
        for i, (mask, last) in enumerate(states):
            k0 = (mask & -mask).bit_length() - 1
            for l2 in range(k0 + 1 if cyclic else 0, n_forms):
                if mask >> l2 & 1:
                    continue
                key = (mask | 1 << l2, l2)
                index.setdefault(key, len(index))
                src.append(i), nxt.append(l2), dst.append(index[key])
        to_mask = np.zeros((len(states), 1 << n_forms))
        to_mask[np.arange(len(states)), [m for m, _ in states]] = 1
        onehot = np.zeros((len(index), len(src)))
        onehot[dst, np.arange(len(src))] = 1
        masks = np.asarray([m for m, _ in states], np.uint32)
        out.append(_Level(
            masks, np.asarray([l for _, l in states], np.uint32),
            np.asarray([(int(m) & -int(m)).bit_length() - 1 for m in masks], np.uint32),
            np.asarray(src, np.uint32), np.asarray(nxt, np.uint32), onehot, to_mask,
        ))
        states = list(index)
    return out


@functools.lru_cache(maxsize=None)
def _dp_plan(n_forms):
    """Static index arrays: trace levels, chain levels and the set partitions."""
    traces = _levels(n_forms, [(1 << k | 1 << l, l) for k in range(n_forms) for l in range(k + 1, n_forms)], True)
    chains = _levels(n_forms, [(1 << k, k) for k in range(n_forms)], False)
    parts = []
    for part in set_partitions(list(range(n_forms))):
        masks = [sum(1 << i for i in block) for block in part]
        parts.append(masks + [0] * (n_forms - len(masks)))  # mask 0 has kappa = 1
    return traces, chains, np.asarray(parts, np.uint32)


def product_moment(cores, etas, kappa1):
    """``E[prod_k q_k]`` of K forms from their cores.

    Static axes lead (K, K, then the batch n) so that every pick of the dynamic
    programme is a gather along leading axes and every product one flat batched
    matmul.

    Args:
      cores: ``(K, K, n, 2r, 2r)`` with ``cores[k, l] = Gamma_kl = F_k^T F_l``.
      etas: ``(K, n, 2r)``.
      kappa1: ``(K, n)`` first cumulants (the forms' means).

    Returns:
      ``(n,)``.
    """
    n_forms, n = etas.shape[:2]
    traces, chains, parts = _dp_plan(n_forms)
    dt = cores.dtype
    cj = _swap_halves(cores, -2)  # J Gamma_kl
    acc = jnp.zeros((1 << n_forms, n), cores.dtype)
    first = traces[0]
    p = cj[first.first, first.last]  # (S, n, 2r, 2r): paths of two forms, J Gamma_{k0 l}
    for lev in traces:  # cyclic orders from the smallest member: tr(P J Gamma_{last k0})
        tr = sum_of_products(p, jnp.swapaxes(cj[lev.last, lev.first], -1, -2), axis=(-2, -1))
        acc = acc + lev.to_mask.T.astype(dt) @ tr
        if len(lev.src):
            step = jnp.matmul(p[lev.src], cj[lev.last[lev.src], lev.nxt])
            p = jnp.einsum("ds,s...->d...", lev.dst.astype(dt), step)
    u = _swap_halves(etas, -1)  # (J eta_k)^T: paths of one form
    for depth, lev in enumerate(chains):
        if depth:  # chains of >= 2 forms: (J eta_first)^T J G ... J G eta_last
            acc = acc + lev.to_mask.T.astype(dt) @ sum_of_products(u, etas[lev.last], axis=-1)
        if len(lev.src):
            step = jnp.einsum("sni,snij->snj", u[lev.src], cj[lev.last[lev.src], lev.nxt])
            u = jnp.einsum("ds,s...->d...", lev.dst.astype(dt), step)
    single = np.asarray([1 << k for k in range(n_forms)], np.uint32)
    kappa = (acc / 2).at[0].set(1).at[single].set(kappa1)
    return jnp.sum(jnp.prod(kappa[parts], 1), 0)


# ---------------------------------------------------------------------------
# Families of factor vectors, forms and their cores
# ---------------------------------------------------------------------------
#
# The residual stream of network m (0 = a, 1 = b) at position t is Gaussian with
# mean mu[m][t] and cross-covariances c[(m, m')][t, :, t', :]. Every factor vector
# of every form is a row of a projection table P_m (R_m, d_m) applied to x^m_t:
# rows [Q1 | K1/e | Q2 | K2/e | V] (a e rows each, head-major) and the identity
# (d rows), optionally mixed. pg[(m, m')] = P_m C P_m'^T holds all their
# covariances, flattened to (T R, T R'); flat index = position * R + row.


@dataclasses.dataclass(frozen=True)
class Family:
    """``r`` factor vectors: ``mix @`` rows ``rows`` of ``P_model`` at position ``pos``.

    rows: ``(n, r0)`` int; pos: ``(n,)`` int; mix: ``(n, r, r0)`` or None (identity).
    """

    model: int
    rows: jax.Array
    pos: jax.Array
    mix: Optional[jax.Array] = None

    @property
    def rank(self):
        return self.rows.shape[1] if self.mix is None else self.mix.shape[1]


def _mix_rows(x, fams, r):
    """Apply each family's mix to its block of rows (axis 1) and zero-pad it to ``r`` rows."""
    parts, off = [], 0
    for f in fams:
        r0 = f.rows.shape[1]
        piece = x[:, off:off + r0]
        off += r0
        if f.mix is not None:
            piece = jnp.einsum("nij,nj...->ni...", f.mix, piece)
        if piece.shape[1] < r:
            piece = jnp.concatenate([piece, jnp.zeros((piece.shape[0], r - piece.shape[1], *piece.shape[2:]), piece.dtype)], 1)
        parts.append(piece)
    return jnp.concatenate(parts, 1)


def forms_moment(tables, forms):
    """``E[prod_k q_k]`` for forms ``(alpha, beta)``; ``beta=None`` is the linear form ``alpha . x``.

    All covariances come from one gather per pair of networks; forms are padded
    to a common rank r with zero factors.
    """
    fams = [f for form in forms for f in form]  # alpha_0, beta_0, alpha_1, ...
    r = max(f.rank for f in fams if f is not None)
    by_model = {m: [i for i, f in enumerate(fams) if f is not None and f.model == m] for m in (0, 1)}
    flat = {}  # per network: (n, R0_m) flat indices pos * R_m + row into its tables
    for m, idx in by_model.items():
        if idx:
            width = tables["mu"][m].shape[1]
            flat[m] = jnp.concatenate(
                [(fams[i].pos[:, None] * width + fams[i].rows).astype(jnp.uint32) for i in idx], 1
            )
    models = sorted(flat)
    n = fams[0].rows.shape[0]
    dtype = tables["mu"][0].dtype
    blocks = {}
    for m in models:
        for m2 in models:
            key = (m, m2)
            blocks[key] = (tables["pg"][key][flat[m][:, :, None], flat[m2][:, None, :]] if key in tables["pg"]
                           else jnp.swapaxes(blocks[(m2, m)], 1, 2))

    def mixed(key):  # each family's mix applied to its rows, then to its columns
        g = _mix_rows(blocks[key], [fams[i] for i in by_model[key[0]]], r)
        return jnp.swapaxes(_mix_rows(jnp.swapaxes(g, 1, 2), [fams[i] for i in by_model[key[1]]], r), 1, 2)

    big = jnp.concatenate([jnp.concatenate([mixed((m, m2)) for m2 in models], 2) for m in models], 1)
    big = jnp.pad(big, ((0, 0), (0, r), (0, r)))  # a zero block for the beta of linear forms
    slot, start = {}, 0
    for m in models:
        for i in by_model[m]:
            slot[i] = start
            start += r
    order = np.concatenate([np.arange(slot.get(i, start), slot.get(i, start) + r) for i in range(len(fams))])
    full = big[:, order][:, :, order]  # (n, 2 K r, 2 K r) in form order
    n_forms = len(forms)
    cores = jnp.transpose(full.reshape(n, n_forms, 2 * r, n_forms, 2 * r), (1, 3, 0, 2, 4))
    means = {}
    for m in models:
        mu = tables["mu"][m].reshape(-1)[flat[m]]
        mixed_mu = _mix_rows(mu, [fams[i] for i in by_model[m]], r)
        for j, i in enumerate(by_model[m]):
            means[i] = mixed_mu[:, j * r:(j + 1) * r]
    a = jnp.stack([means[2 * k] for k in range(n_forms)])  # (K, n, r)
    b = jnp.stack([means.get(2 * k + 1, jnp.ones((n, r), dtype)) for k in range(n_forms)])
    diag = jnp.einsum("kknii->kn", cores[:, :, :, :r, r:])  # alpha_k . beta_k
    kappa1 = jnp.sum(a * b, -1) + diag
    return product_moment(cores, jnp.concatenate([b, a], -1), kappa1)

