"""Bilinear-attention transformers as pure pytrees, and their Gaussian inner products.

docs/design.md §4, "Bilinear attention". One attention layer maps the residual stream
``x: (T, d)`` of a context of T positions to

    ``y_t = x_t + sum_h O_h sum_{s <= t} (q1_t . k1_s)(q2_t . k2_s) / e^2  v_s``,

with ``q1_t = Q1_h x_t`` etc. (``a`` heads of size ``e``; causal; no softmax). It
is a polynomial of degree 5 in the context: two legs at the query position, three
at the key position. An :class:`AttentionNetwork` is a token embedding (plus an
optional learned positional embedding), a stack of such layers and an unembedding.

**Input distribution.** A language model reads one-hot tokens. As the
tensor-similarity authors do (their ``CheckpointTransformer`` starts the
second-moment propagation from ``I ⊗ I`` on the *token* input of the
embedding), every position ``t < context`` gets an independent Gaussian vector in
token space, ``g_t ~ N(0, scale^2 I_V)``, in place of its one-hot row. The
embedding is linear, so the residual stream entering the first layer is exactly
Gaussian: ``x_t = E^T g_t + p_t`` with mean ``p_t`` (the positional embedding, or 0)
and covariance ``scale^2 E^T E``, independent across positions. The inner product is

    ``<A|B> = E sum_{t < context} sum_v f_a(g)[t, v] f_b(g)[t, v]``

(``v`` over the unembedding's outputs, or the slice ``outputs``), and the
similarity is ``<A|B> / sqrt(<A|A><B|B>)``. It depends only on the two functions
on ``R^{context x V}``: any reparametrisation (heads permuted, ``(q1, k1)`` swapped
with ``(q2, k2)``, a basis change inside a head, a basis change of the residual
stream) leaves it unchanged. ``scale=1`` is the authors' choice; it makes
``|g_t|^2 ~ V`` where a one-hot token has norm 1, which multiplies the amplitude
of the degree-5 attention term by about ``V^2`` relative to the degree-1 direct
path, compared with text. ``scale = 1/sqrt(V)`` matches the second moment of a
uniformly random one-hot token (``E[e e^T] = I/V``). We did not implement the
alternative, the exact average over the ``V^context`` token sequences: the
closure's moment propagation does not apply to it, and it is not what the paper
computed.

**Methods** (all for a stated ``context``):

* ``exact`` (depth 0 and 1): the expectation is a sum, over heads and positions
  ``(t, s, s')``, of expected products of five quadratic forms of the Gaussian
  input (``q1.k1``, ``q2.k2`` of each network, and the value read-out
  ``v_a^T O_a^T U_a^T U_b O_b v_b``). Each product is computed exactly from the
  forms' joint cumulants (``2^{m-1}`` times traces and chains of the form matrices,
  the formula of :mod:`similarity.tensor_similarity`'s depth-2 method), written
  on the forms' low-rank factors, so the cost is ``O(context^3 a_a a_b (2e)^3)``
  and ``d`` and ``V`` enter only through ``E^T E``. Means (the positional
  embedding) are included exactly. Independence across positions enters through
  the block-diagonal input covariance.
* ``closure`` (any depth >= 1): the tensor-similarity authors' algorithm. The
  exact mean and full second moment ``(T d x T d)`` of every layer's output are
  propagated (they are the gradient of the same scalar with respect to a
  read-out matrix), and each next layer's input is treated as the Gaussian with
  those moments. Exact at depth 1; at depth >= 2 it drops the higher cumulants
  of the hidden residual stream.
* Monte Carlo (any depth, with a standard error):
  :func:`similarity.validate_numerics.attention_monte_carlo_inner`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._validate import check_choice, check_finite, check_positive_result
from funsim.similarity.multilinear import resolve_outputs as _resolve_outputs
from funsim.similarity.tensor_similarity import _set_partitions

__all__ = [
    "AttentionLayer",
    "AttentionNetwork",
    "ATTENTION_METHODS",
    "bilinear_attention",
    "apply_attention_layer",
    "apply_attention_network",
    "validate_attention_network",
    "attention_inner",
    "attention_similarity",
    "attention_similarity_matrix",
    "attention_moments",
]

ATTENTION_METHODS = ("auto", "exact", "closure")

# Combinations evaluated per step of the inner loop; bounds memory to about
# _CHUNK_ELEMENTS numbers per (2e x 2e) core array.
_CHUNK_ELEMENTS = 2**17


# ---------------------------------------------------------------------------
# Pytrees and evaluation
# ---------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionLayer:
    """One bilinear-attention layer (see :func:`bilinear_attention`).

    Attributes:
      q1, k1, q2, k2, v: ``(a, e, d)`` per-head projections (a heads of size e).
      o: ``(d, a, e)`` output projection.
    """

    q1: jax.Array
    k1: jax.Array
    q2: jax.Array
    k2: jax.Array
    v: jax.Array
    o: jax.Array

    @property
    def n_heads(self) -> int:
        return self.q1.shape[-3]

    @property
    def d_head(self) -> int:
        return self.q1.shape[-2]

    @property
    def d_model(self) -> int:
        return self.q1.shape[-1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionNetwork:
    """An attention-only bilinear transformer: embed, attention layers, unembed.

    ``x_t = embed[token_t] (+ pos_embed[t])``, then each layer, then
    ``logits_t = unembed @ x_t``. On token-space vectors ``g: (T, V)`` (one-hot
    rows or Gaussian ones) the embedding is ``g @ embed``.

    Attributes:
      embed: ``(V, d)`` token embedding (one row per token).
      layers: tuple of :class:`AttentionLayer`, all with model width d.
      unembed: ``(o, d)`` unembedding (o outputs, usually V).
      pos_embed: ``(T_max, d)`` learned positional embedding, or None.
    """

    embed: jax.Array
    layers: tuple
    unembed: jax.Array
    pos_embed: Optional[jax.Array] = None

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[-2]

    @property
    def d_model(self) -> int:
        return self.embed.shape[-1]

    @property
    def n_outputs(self) -> int:
        return self.unembed.shape[-2]

    @property
    def depth(self) -> int:
        return len(self.layers)


def bilinear_attention(
    x: ArrayLike,
    q1: ArrayLike,
    k1: ArrayLike,
    q2: ArrayLike,
    k2: ArrayLike,
    v: ArrayLike,
    o: ArrayLike,
    /,
) -> jax.Array:
    """Causal bilinear attention without softmax, added to the residual stream.

    ``pattern[h, t, s] = (q1_t . k1_s)(q2_t . k2_s) / e^2`` for ``s <= t``
    (0 otherwise), ``out_t = x_t + sum_h O_h sum_s pattern[h, t, s] v_s``,
    where ``q1_t = Q1_h x_t`` etc.

    Args:
      x: ``(n, t, d)`` residual stream.
      q1, k1, q2, k2, v: ``(a, e, d)`` per-head projections (a heads of size e).
      o: ``(d, a, e)`` output projection.

    Returns:
      ``(n, t, d)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> w = jnp.ones((1, 2, 3))
      >>> bilinear_attention(jnp.zeros((1, 4, 3)), w, w, w, w, w, jnp.ones((3, 1, 2))).shape
      (1, 4, 3)
    """
    x = jnp.asarray(x)
    e = jnp.shape(q1)[1]
    proj = lambda w: jnp.einsum("aed,ntd->nate", w, x)
    s1 = jnp.einsum("nate,nase->nats", proj(q1), proj(k1))
    s2 = jnp.einsum("nate,nase->nats", proj(q2), proj(k2))
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    pattern = jnp.where(causal, s1 * s2 / e**2, 0.0)
    z = jnp.einsum("nats,nase->nate", pattern, proj(v))
    return x + jnp.einsum("dae,nate->ntd", o, z)


def apply_attention_layer(layer: AttentionLayer, x: ArrayLike, /) -> jax.Array:
    """Evaluate one :class:`AttentionLayer` on a residual stream ``x: (n, T, d)`` -> ``(n, T, d)``."""
    return bilinear_attention(x, layer.q1, layer.k1, layer.q2, layer.k2, layer.v, layer.o)


def apply_attention_network(net: AttentionNetwork, x: ArrayLike, /) -> jax.Array:
    """Logits of an :class:`AttentionNetwork`.

    Args:
      net: the network.
      x: integer tokens ``(n, T)`` in ``[0, V)``, or real token-space vectors
        ``(n, T, V)`` (one-hot rows give the same logits as the tokens).

    Returns:
      ``(n, T, o)`` logits at every position.

    Raises:
      ValueError: for a wrong rank or width, or more positions than ``pos_embed`` has.

    Examples:
      >>> import jax.numpy as jnp
      >>> lay = AttentionLayer(*(jnp.ones((1, 2, 3)),) * 5, jnp.ones((3, 1, 2)))
      >>> net = AttentionNetwork(jnp.eye(4, 3), (lay,), jnp.ones((4, 3)))
      >>> toks = jnp.array([[0, 2, 1]])
      >>> bool(jnp.allclose(apply_attention_network(net, toks),
      ...                   apply_attention_network(net, jax.nn.one_hot(toks, 4))))
      True
    """
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.integer):
        if x.ndim != 2:
            raise ValueError(f"Integer tokens must have shape (n, T), got {tuple(x.shape)}.")
        emb = jnp.take(jnp.asarray(net.embed), x, axis=0)
    else:
        if x.ndim != 3 or x.shape[-1] != net.vocab_size:
            raise ValueError(
                f"Token-space inputs must have shape (n, T, V={net.vocab_size}), got "
                f"{tuple(x.shape)}; pass integer tokens (n, T) or one-hot/Gaussian rows."
            )
        emb = jnp.einsum("ntv,vd->ntd", x, net.embed)
    t = x.shape[1]
    if net.pos_embed is not None:
        if t > net.pos_embed.shape[-2]:
            raise ValueError(
                f"x has T={t} positions but pos_embed has only {net.pos_embed.shape[-2]} rows."
            )
        emb = emb + jnp.asarray(net.pos_embed)[:t][None]
    for layer in net.layers:
        emb = apply_attention_layer(layer, emb)
    return jnp.einsum("od,ntd->nto", net.unembed, emb)


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def validate_attention_network(
    net, name: str = "net", *, context: int | None = None, batch_ndim: int = 0
) -> AttentionNetwork:
    """Check an :class:`AttentionNetwork`'s shapes, dtypes and values; return it.

    Args:
      net: the network.
      name: the argument name used in error messages.
      context: if given, the number of positions it will be evaluated on
        (must not exceed ``pos_embed``'s rows).
      batch_ndim: leading stacking axes on every leaf (1 for a stack of checkpoints).

    Returns:
      ``net``.

    Raises:
      TypeError: not an :class:`AttentionNetwork`, a layer that is not an
        :class:`AttentionLayer`, or a non-float leaf.
      ValueError: inconsistent shapes, a bad ``context`` or non-finite weights.
    """
    if not isinstance(net, AttentionNetwork):
        raise TypeError(
            f"{name} must be an AttentionNetwork (e.g. BilinearTransformer(..., mlp=False)"
            f".to_network()), got {type(net).__name__}."
        )
    bd = batch_ndim
    leaves = {"embed": net.embed, "unembed": net.unembed, "pos_embed": net.pos_embed}
    if not isinstance(net.layers, tuple):
        raise TypeError(f"{name}.layers must be a tuple of AttentionLayer, got {type(net.layers).__name__}.")
    for i, layer in enumerate(net.layers):
        if not isinstance(layer, AttentionLayer):
            raise TypeError(f"{name}.layers[{i}] must be an AttentionLayer, got {type(layer).__name__}.")
        for f in ("q1", "k1", "q2", "k2", "v", "o"):
            leaves[f"layers[{i}].{f}"] = getattr(layer, f)
    batch = None
    shapes = {}
    for field, value in leaves.items():
        if value is None:
            continue
        shp = _shape(value)
        rank = 3 if field.startswith("layers") else 2
        if len(shp) != rank + bd:
            raise ValueError(f"{name}.{field} must have rank {rank + bd}, got shape {shp}.")
        if batch is None:
            batch = shp[:bd]
        elif shp[:bd] != batch:
            raise ValueError(
                f"{name}.{field} has stacking shape {shp[:bd]} but other leaves have {batch}; "
                "stack every checkpoint the same way."
            )
        dt = jnp.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
        if not jnp.issubdtype(dt, jnp.floating):
            raise TypeError(f"{name}.{field} must be a float array, got dtype {dt}.")
        shapes[field] = shp[bd:]
    d = shapes["embed"][1]
    for field in ("unembed", "pos_embed"):
        if field in shapes and shapes[field][1] != d:
            raise ValueError(
                f"{name}.{field} has shape {shapes[field]} but embed {shapes['embed']} gives "
                f"model width d={d}; its last axis must be {d}."
            )
    for i in range(len(net.layers)):
        a, e, dq = shapes[f"layers[{i}].q1"]
        for f in ("k1", "q2", "k2", "v"):
            if shapes[f"layers[{i}].{f}"] != (a, e, dq):
                raise ValueError(
                    f"{name}.layers[{i}].{f} has shape {shapes[f'layers[{i}].{f}']}, expected "
                    f"{(a, e, dq)} like q1."
                )
        if dq != d or shapes[f"layers[{i}].o"] != (d, a, e):
            raise ValueError(
                f"{name}.layers[{i}] has q1 {(a, e, dq)} and o {shapes[f'layers[{i}].o']}; with "
                f"model width d={d} they must be (a, e, {d}) and ({d}, a, e)."
            )
    if context is not None:
        if not isinstance(context, (int, np.integer)) or isinstance(context, bool) or context < 1:
            raise ValueError(f"context must be a positive int (number of positions), got {context!r}.")
        if "pos_embed" in shapes and context > shapes["pos_embed"][0]:
            raise ValueError(
                f"context={context} exceeds {name}.pos_embed's {shapes['pos_embed'][0]} positions; "
                "use a context no longer than the model's sequence length."
            )
    for field, value in leaves.items():
        if value is not None:
            check_finite(jnp.asarray(value), f"{name}.{field}")
    return net


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
    for part in _set_partitions(list(range(n_forms))):
        masks = [sum(1 << i for i in block) for block in part]
        parts.append(masks + [0] * (n_forms - len(masks)))  # mask 0 has kappa = 1
    return traces, chains, np.asarray(parts, np.uint32)


def _product_moment(cores, etas, kappa1):
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
        tr = jnp.einsum("snij,snji->sn", p, cj[lev.last, lev.first])
        acc = acc + lev.to_mask.T.astype(dt) @ tr
        if len(lev.src):
            step = jnp.matmul(p[lev.src], cj[lev.last[lev.src], lev.nxt])
            p = jnp.einsum("ds,s...->d...", lev.dst.astype(dt), step)
    u = _swap_halves(etas, -1)  # (J eta_k)^T: paths of one form
    for depth, lev in enumerate(chains):
        if depth:  # chains of >= 2 forms: (J eta_first)^T J G ... J G eta_last
            acc = acc + lev.to_mask.T.astype(dt) @ jnp.einsum("sni,sni->sn", u, etas[lev.last])
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
class _Family:
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


def _forms_moment(tables, forms):
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
    return _product_moment(cores, jnp.concatenate([b, a], -1), kappa1)


# ---------------------------------------------------------------------------
# One attention layer under a Gaussian input
# ---------------------------------------------------------------------------


def _offsets(layer):
    ae = layer.n_heads * layer.d_head
    return {"q1": 0, "k1": ae, "q2": 2 * ae, "k2": 3 * ae, "v": 4 * ae, "id": 5 * ae}


def _projection_table(layer, d):
    a, e, _ = layer.q1.shape
    parts = [layer.q1, layer.k1 / e, layer.q2, layer.k2 / e, layer.v]
    rows = [p.reshape(a * e, d) for p in parts]
    return jnp.concatenate(rows + [jnp.eye(d, dtype=layer.q1.dtype)], 0)


def _tables(layers, mom):
    """Covariance and mean tables of every projection row, for both networks."""
    d = [mom["mu"][0].shape[1], mom["mu"][1].shape[1]]
    p = [_projection_table(layers[0], d[0]), _projection_table(layers[1], d[1])]
    pg = {  # flattened to (T R_m, T R_m')
        key: jnp.einsum("id,tdue,je->tiuj", p[key[0]], mom["c"][key], p[key[1]]).reshape(
            mom["c"][key].shape[0] * p[key[0]].shape[0], -1
        )
        for key in ((0, 0), (0, 1), (1, 1))
    }
    mu = [jnp.einsum("id,td->ti", p[m], mom["mu"][m]) for m in (0, 1)]
    return {"pg": pg, "mu": mu}


def _head_rows(layer, name, head):
    """``(n, e)`` table rows of projection ``name`` for the heads ``head: (n,)``."""
    e = layer.d_head
    return _offsets(layer)[name] + head[:, None] * e + jnp.arange(e)[None, :]


def _id_rows(layer, n):
    d = layer.d_model
    return jnp.broadcast_to(_offsets(layer)["id"] + jnp.arange(d)[None, :], (n, d))


def _qk_forms(layer, model, head, t, s):
    """The two score forms ``q1_t . k1_s / e`` and ``q2_t . k2_s / e`` of one network."""
    return [
        (_Family(model, _head_rows(layer, q, head), t), _Family(model, _head_rows(layer, k, head), s))
        for q, k in (("q1", "k1"), ("q2", "k2"))
    ]


def _combos(context, full, parts):
    """Position rows ``(t, s, t2, s2)`` (numpy) of a term.

    ``parts`` are ``"qk"`` (a query position and a key position ``s <= t``) or
    ``"res"`` (one position; its ``s`` is 0) for the two networks. With
    ``full=False`` only ``t == t2`` is kept.
    """
    axes = [
        [(t, s) for t in range(context) for s in range(t + 1)] if part == "qk"
        else [(t, 0) for t in range(context)]
        for part in parts
    ]
    rows = [(t, s, t2, s2) for t, s in axes[0] for t2, s2 in axes[1] if full or t == t2]
    return np.asarray(rows, dtype=np.int32).reshape(-1, 4)


def _expand_heads(index, a1, a2):
    """Every position row with every head pair: ``(n * a1 * a2, 6)`` rows ``(t, s, t2, s2, h, h2)``."""
    h1, h2 = np.meshgrid(np.arange(a1), np.arange(a2), indexing="ij")
    heads = np.stack([h1.ravel(), h2.ravel()], 1)
    return np.concatenate(
        [np.repeat(index, len(heads), 0), np.tile(heads, (index.shape[0], 1))], 1
    ).astype(np.int32)


def _sum_over(fn, index, chunk):
    """``sum_i fn(index[i])`` over the rows of the int array ``index (n, k)``, ``chunk`` rows per step."""
    n = index.shape[0]
    n_chunks = -(-n // chunk)
    chunk = -(-n // n_chunks)
    pad = n_chunks * chunk - n
    index = np.concatenate([index, np.repeat(index[:1], pad, 0)], 0).reshape(n_chunks, chunk, -1)
    valid = (np.arange(n_chunks * chunk) < n).reshape(n_chunks, chunk)
    dtype = jax.eval_shape(fn, jnp.asarray(index[0])).dtype

    # Rematerialised: under grad (the closure's second moments) each chunk is
    # recomputed in the backward pass, so memory stays that of one chunk.
    @jax.checkpoint
    def body(total, args):
        ix, ok = args
        return total + jnp.sum(jnp.where(ok, fn(ix), 0)), None

    total, _ = jax.lax.scan(body, jnp.zeros((), dtype), (jnp.asarray(index), jnp.asarray(valid)))
    return total


def _chunk_for(layers):
    r = max(max(2 * l.d_head, l.d_model) for l in layers)
    return max(1, _CHUNK_ELEMENTS // (r * r))


def _same_shapes(args_list):
    def sig(args):
        return (jax.tree_util.tree_structure(args),
                [(jnp.shape(x), jnp.result_type(x)) for x in jax.tree_util.tree_leaves(args)])

    first = sig(args_list[0])
    return all(sig(a) == first for a in args_list[1:])


def _map_same(fn, args_list):
    """``[fn(*args) for args in args_list]``, traced once (a ``lax.map``) when all shapes agree."""
    if len(args_list) > 1 and _same_shapes(args_list):
        stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *args_list)
        out = jax.lax.map(lambda args: fn(*args), stacked)
        return [jax.tree_util.tree_map(lambda x, i=i: x[i], out) for i in range(len(args_list))]
    return [fn(*args) for args in args_list]


def _swap_tables(tables):
    """The tables with the two networks' roles exchanged."""
    pg = tables["pg"]
    return {"pg": {(0, 0): pg[(1, 1)], (0, 1): pg[(0, 1)].T, (1, 1): pg[(0, 0)]},
            "mu": tables["mu"][::-1]}


def _res_term(layer_res, layer_act, tables, read, *, context, full):
    """``sum E[x^0_t^T G O_1 v_1(s2) (q1.k1)(q2.k2)_1(t2, s2)]``: network 0's residual x network 1's attention.

    ``read``: rows c of ``(G_{t t2} O_1[:, h2])^T`` acting on ``x^0_t``,
    ``(T, T, a_1, e_1, d_0)`` with ``full``, else ``(a_1, e_1, d_0)``.
    """

    def term(ix):
        t, _, t2, s2, _, h2 = (ix[:, i] for i in range(6))
        mix = read[t, t2, h2] if full else read[h2]
        forms = _qk_forms(layer_act, 1, h2, t2, s2)
        readout = _Family(0, _id_rows(layer_res, t.shape[0]), t, mix)
        forms.append((readout, _Family(1, _head_rows(layer_act, "v", h2), s2)))
        return _forms_moment(tables, forms)

    index = _expand_heads(_combos(context, full, ("res", "qk")), 1, layer_act.n_heads)
    return _sum_over(term, index, _chunk_for((layer_res, layer_act)))


def _act_term(layers, tables, mixes, *, context, full):
    """``sum E[(q1.k1)(q2.k2)_a (q1.k1)(q2.k2)_b v_a^T M v_b]`` over heads and positions."""
    la, lb = layers

    def term(ix):
        t, s, t2, s2, h, h2 = (ix[:, i] for i in range(6))
        mix = mixes[t, t2, h, h2] if full else mixes[h, h2]
        forms = _qk_forms(la, 0, h, t, s) + _qk_forms(lb, 1, h2, t2, s2)
        forms.append((_Family(0, _head_rows(la, "v", h), s), _Family(1, _head_rows(lb, "v", h2), s2, mix)))
        return _forms_moment(tables, forms)

    index = _expand_heads(_combos(context, full, ("qk", "qk")), la.n_heads, lb.n_heads)
    return _sum_over(term, index, _chunk_for(layers))


def _read_out_scalar(layers, mom, g, *, context, full):
    """``sum_{t, t2} E[y^a_t^T G_{t t2} y^b_{t2}]`` for one attention layer of each network.

    ``y^m`` is the layer's output on the Gaussian residual stream with moments
    ``mom``. ``g`` is ``(T, d_a, T, d_b)`` with ``full``, else one ``(d_a, d_b)``
    matrix for every ``t == t2`` (and no ``t != t2`` term).
    """
    la, lb = layers
    tables = _tables(layers, mom)
    ca = mom["c"][(0, 1)]
    mu_a, mu_b = mom["mu"]
    oa, ob = la.o, lb.o
    if full:
        res = jnp.sum(g * (ca + jnp.einsum("ti,uj->tiuj", mu_a, mu_b)))
        # read-out mixes per value unit c: O_a[:, h]^T G_{t t2} O_b[:, h2], and the
        # residual ones (G_{t t2} O_b[:, h2])^T, (G_{t t2}^T O_a[:, h])^T
        mixes = jnp.einsum("ihc,tiuj,jgf->tuhgcf", oa, g, ob)
        read_ab = jnp.einsum("tiuj,jgf->tugfi", g, ob)
        read_ba = jnp.transpose(jnp.einsum("ihc,tiuj->tuhcj", oa, g), (1, 0, 2, 3, 4))
    else:
        ts = jnp.arange(context)
        res = jnp.sum(g[None] * (ca[ts, :, ts, :] + jnp.einsum("ti,tj->tij", mu_a, mu_b)))
        mixes = jnp.einsum("ihc,ij,jgf->hgcf", oa, g, ob)
        read_ab = jnp.einsum("ij,jgf->gfi", g, ob)
        read_ba = jnp.einsum("ihc,ij->hcj", oa, g)
    act = _act_term(layers, tables, mixes, context=context, full=full)
    fn = functools.partial(_res_term, context=context, full=full)
    res_ab, res_ba = _map_same(fn, [(la, lb, tables, read_ab), (lb, la, _swap_tables(tables), read_ba)])
    return res + act + res_ab + res_ba


def _layer_mean(layer, mu, c, *, context):
    """``E[y_t]`` of one attention layer on a Gaussian ``(mu (T, d), c (T, d, T, d))``: ``(T, d)``."""
    mom = {"mu": [mu, mu], "c": {(0, 0): c, (0, 1): c, (1, 1): c}}
    tables = _tables((layer, layer), mom)
    e = layer.d_head
    pairs = np.asarray([(t, s) for t in range(context) for s in range(t + 1)], np.int32)
    hc = np.stack(np.meshgrid(np.arange(layer.n_heads), np.arange(e), indexing="ij"), -1).reshape(-1, 2)
    index = jnp.asarray(np.concatenate([np.repeat(pairs, len(hc), 0), np.tile(hc, (len(pairs), 1))], 1))
    t, s, h, cc = (index[:, i] for i in range(4))
    forms = _qk_forms(layer, 0, h, t, s)
    forms.append((_Family(0, (_offsets(layer)["v"] + h * e + cc)[:, None], s), None))
    vals = _forms_moment(tables, forms)  # E[(q1.k1)(q2.k2) v_c] per (t, s, h, c)
    per = jnp.einsum("dn,n->nd", layer.o[:, h, cc], vals)
    return mu + jax.ops.segment_sum(per, t, num_segments=context)


def _second_moment(layers, mom, *, context):
    """``E[y^a_t (y^b_t2)^T]``: ``(T, d_a, T, d_b)``, the gradient of the read-out in G."""
    shape = (context, layers[0].d_model, context, layers[1].d_model)
    zero = jnp.zeros(shape, mom["c"][(0, 1)].dtype)
    return jax.grad(lambda g: _read_out_scalar(layers, mom, g, context=context, full=True))(zero)


def _pair_moments(mu_a, mu_b, c_aa, c_ab, c_bb):
    return {"mu": [mu_a, mu_b], "c": {(0, 0): c_aa, (0, 1): c_ab, (1, 1): c_bb}}


def _input_moments(net_a, net_b, context, scale):
    def mean(net):
        if net.pos_embed is None:
            return jnp.zeros((context, net.d_model), net.embed.dtype)
        return net.pos_embed[:context]

    eye = jnp.eye(context, dtype=net_a.embed.dtype)
    cov = lambda x, y: scale**2 * jnp.einsum("tu,vi,vj->tiuj", eye, x.embed, y.embed)
    return _pair_moments(mean(net_a), mean(net_b), cov(net_a, net_a), cov(net_a, net_b), cov(net_b, net_b))


def _self_moments(net, scale, *, context, n_layers=None):
    """Mean and covariance after each of the first ``n_layers`` layers (default: all but the last).

    Layer 0's are exact; later ones are the closure's (each layer's input taken
    Gaussian with the previous moments). A list of ``(mu (T, d), c (T, d, T, d))``.
    """
    mom = _input_moments(net, net, context, scale)
    out = []
    for layer in net.layers[: net.depth - 1 if n_layers is None else n_layers]:
        mu = _layer_mean(layer, mom["mu"][0], mom["c"][(0, 0)], context=context)
        c = _second_moment((layer, layer), mom, context=context) - jnp.einsum("ti,uj->tiuj", mu, mu)
        c = (c + jnp.transpose(c, (2, 3, 0, 1))) / 2
        out.append((mu, c))
        mom = _pair_moments(mu, mu, c, c, c)
    return out


def _cross_inner(net_a, net_b, self_a, self_b, scale, *, context, outputs):
    """``<A|B>``: exact at depth <= 1, the closure beyond (``self_*`` from :func:`_self_moments`)."""
    mom = _input_moments(net_a, net_b, context, scale)
    ua, ub = net_a.unembed, net_b.unembed
    if outputs is not None:
        sel = np.asarray(outputs, dtype=np.int64)
        ua, ub = ua[sel], ub[sel]
    g = ua.T @ ub
    if net_a.depth == 0:
        ts = jnp.arange(context)
        diag_c = mom["c"][(0, 1)][ts, :, ts, :]
        return jnp.sum(g[None] * (diag_c + jnp.einsum("ti,tj->tij", *mom["mu"])))
    for i, layers in enumerate(zip(net_a.layers[:-1], net_b.layers[:-1])):
        second = _second_moment(layers, mom, context=context)
        (mu_a, c_aa), (mu_b, c_bb) = self_a[i], self_b[i]
        mom = _pair_moments(mu_a, mu_b, c_aa, second - jnp.einsum("ti,uj->tiuj", mu_a, mu_b), c_bb)
    return _read_out_scalar((net_a.layers[-1], net_b.layers[-1]), mom, g, context=context, full=False)


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def _resolve(depth, method):
    check_choice(method, "method", ATTENTION_METHODS)
    if depth >= 2 and method in ("auto", "exact"):
        raise ValueError(
            f"The networks have {depth} attention layers; the exact Gaussian inner product is "
            "offered for depth <= 1 (exactness is exponential in depth: the layer-2 output has "
            "degree 25). Options: method='closure' (the second-moment approximation, exact at "
            "depth 1) or similarity.attention_monte_carlo_inner (unbiased, with a standard error)."
        )
    if depth <= 1:
        return "exact"
    return "closure"


def _check_pair(net_a, net_b, context, names=("net_a", "net_b")):
    validate_attention_network(net_a, names[0], context=context)
    validate_attention_network(net_b, names[1], context=context)
    if net_a.vocab_size != net_b.vocab_size or net_a.n_outputs != net_b.n_outputs:
        raise ValueError(
            f"{names[0]} reads V={net_a.vocab_size} tokens and has {net_a.n_outputs} outputs, "
            f"{names[1]} reads V={net_b.vocab_size} and has {net_b.n_outputs}; networks compared "
            "on one input distribution must share the vocabulary and the outputs."
        )
    if net_a.depth != net_b.depth:
        raise ValueError(
            f"{names[0]} has {net_a.depth} attention layers but {names[1]} has {net_b.depth}; compare "
            "networks of equal depth (an AttentionLayer with o = 0 is the identity: append it to the "
            "shallower one) or use attention_monte_carlo_inner."
        )


def _promote(*trees):
    dt = jnp.result_type(*jax.tree_util.tree_leaves(trees))
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dt), trees)


def _check_scale(scale):
    if not (isinstance(scale, (int, float, np.floating, np.integer)) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number (the token-space std), got {scale!r}.")


def _selves(nets, scale, context):
    fn = functools.partial(_self_moments, context=context)
    return _map_same(fn, [(net, scale) for net in nets])


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _inner_jit(net_a, net_b, scale, context, outputs):
    self_a, self_b = _selves((net_a, net_b), scale, context)
    return _cross_inner(net_a, net_b, self_a, self_b, scale, context=context, outputs=outputs)


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _similarity_jit(net_a, net_b, scale, context, outputs):
    self_a, self_b = _selves((net_a, net_b), scale, context)
    fn = functools.partial(_cross_inner, context=context, outputs=outputs)
    return _map_same(fn, [(net_a, net_b, self_a, self_b, scale), (net_a, net_a, self_a, self_a, scale),
                          (net_b, net_b, self_b, self_b, scale)])


def attention_inner(
    net_a: AttentionNetwork,
    net_b: AttentionNetwork,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
) -> jax.Array:
    """Gaussian inner product ``<A|B>`` of two attention networks over ``context`` positions.

    ``E sum_{t < context} sum_v f_a(g)[t, v] f_b(g)[t, v]`` with independent
    token-space Gaussians ``g_t ~ N(0, scale^2 I_V)`` (see the module docstring).
    Cost: depth 1, ``O(context^3 a_a a_b (2e)^3)``; the closure adds, per extra
    layer, three gradients of the full ``(context d)^2`` read-out, each
    ``O(context^4 a^2 (2e)^3)``.

    Args:
      net_a: an :class:`AttentionNetwork`.
      net_b: one with the same vocabulary, outputs and depth (widths and heads may differ).
      context: number of positions T (at most the positional embedding's length).
      method: ``"auto"`` (``exact``; depth >= 2 raises), ``"exact"`` (depth <= 1) or
        ``"closure"`` (any depth; exact at depth <= 1).
      scale: standard deviation of the token-space Gaussian.
      outputs: None, a slice, or a sequence of output (vocabulary) indices.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for invalid or mismatched networks, a bad context or scale, or
        ``exact`` at depth >= 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> net = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))   # logits = token vector
      >>> float(attention_inner(net, net, context=3))   # E |g|^2 summed over 3 positions
      6.0
    """
    _check_pair(net_a, net_b, context)
    _resolve(net_a.depth, method)
    _check_scale(scale)
    outputs = _resolve_outputs(outputs, net_a.n_outputs)
    net_a, net_b = _promote(net_a, net_b)
    return _inner_jit(net_a, net_b, jnp.asarray(scale, net_a.embed.dtype), int(context), outputs)


def attention_similarity(
    net_a: AttentionNetwork,
    net_b: AttentionNetwork,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
) -> jax.Array:
    """``<A|B> / sqrt(<A|A><B|B>)`` of two attention networks, a score in [-1, 1].

    A function of the two input-output maps only (heads permuted, ``(q1, k1)``
    swapped with ``(q2, k2)``, basis changes inside a head or of the residual
    stream all give 1 against the original).

    Args:
      net_a, net_b: :class:`AttentionNetwork` s (see :func:`attention_inner`).
      context: number of positions.
      method: see :func:`attention_inner`.
      scale: token-space standard deviation.
      outputs: output slice (the norms use the same slice).

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: as :func:`attention_inner`, and for a network that is zero on
        the selected outputs.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = AttentionNetwork(jnp.eye(2), (), jnp.eye(2))
      >>> b = AttentionNetwork(2 * jnp.eye(2), (), jnp.eye(2))
      >>> float(attention_similarity(a, b, context=2))
      1.0
    """
    _check_pair(net_a, net_b, context)
    _resolve(net_a.depth, method)
    _check_scale(scale)
    outputs = _resolve_outputs(outputs, net_a.n_outputs)
    net_a, net_b = _promote(net_a, net_b)
    ab, aa, bb = _similarity_jit(net_a, net_b, jnp.asarray(scale, net_a.embed.dtype), int(context), outputs)
    cause = "the network is zero on the selected outputs; its similarity is undefined (0/0)."
    check_positive_result(aa, "<net_a|net_a>", cause)
    check_positive_result(bb, "<net_b|net_b>", cause)
    return ab / jnp.sqrt(aa * bb)


def _stack(nets):
    if not nets:
        raise ValueError("nets is empty; pass at least one AttentionNetwork.")
    ref = jax.tree_util.tree_structure(nets[0])
    shapes = [_shape(x) for x in jax.tree_util.tree_leaves(nets[0])]
    for i, n in enumerate(nets[1:], 1):
        s = [_shape(x) for x in jax.tree_util.tree_leaves(n)]
        if jax.tree_util.tree_structure(n) != ref or s != shapes:
            raise ValueError(
                f"nets[{i}] does not have the structure and shapes of nets[0] ({s} vs {shapes}); "
                "checkpoints must share one architecture to be stacked."
            )
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *nets)


@functools.partial(jax.jit, static_argnames=("context", "outputs"))
def _matrix_jit(stacked, scale, context, outputs):
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    selves = jax.lax.map(lambda net: _self_moments(net, scale, context=context), stacked)
    iu, ju = np.triu_indices(n)
    take = lambda tree, i: jax.tree_util.tree_map(lambda x: x[i], tree)

    def pair(ij):
        i, j = ij[0], ij[1]
        return _cross_inner(take(stacked, i), take(stacked, j), take(selves, i), take(selves, j), scale,
                            context=context, outputs=outputs)

    vals = jax.lax.map(pair, jnp.asarray(np.stack([iu, ju], 1)))
    gram = jnp.zeros((n, n), vals.dtype).at[iu, ju].set(vals)
    return gram + jnp.triu(gram, 1).T


def attention_similarity_matrix(
    nets,
    /,
    *,
    context: int,
    method: str = "auto",
    scale: float = 1.0,
    outputs=None,
    return_inner: bool = False,
) -> jax.Array:
    """Similarity matrix of many checkpoints of one architecture, in one compiled call.

    The ``n (n + 1) / 2`` inner products are evaluated in a ``lax.map`` inside one
    jit-compiled program (one compilation per architecture and context), then
    normalised by the diagonal.

    Args:
      nets: a list of :class:`AttentionNetwork` with identical shapes, or one whose
        every leaf has a leading stacking axis of length n.
      context: number of positions.
      method: see :func:`attention_inner`.
      scale: token-space standard deviation.
      outputs: output slice.
      return_inner: return the inner products instead of similarities.

    Returns:
      ``(n, n)`` symmetric matrix (unit diagonal unless ``return_inner``).

    Raises:
      ValueError: for differently shaped checkpoints, the errors of
        :func:`attention_inner`, and a checkpoint with zero norm.

    Examples:
      >>> import jax.numpy as jnp
      >>> nets = [AttentionNetwork(jnp.eye(2), (), w) for w in (jnp.eye(2), jnp.ones((2, 2)))]
      >>> np.asarray(attention_similarity_matrix(nets, context=1), float).round(4).tolist()
      [[1.0, 0.7071], [0.7071, 1.0]]
    """
    if isinstance(nets, (list, tuple)):
        for i, n in enumerate(nets):
            validate_attention_network(n, f"nets[{i}]", context=context)
        stacked = _stack(list(nets))
    else:
        stacked = validate_attention_network(nets, "nets", context=context, batch_ndim=1)
    one = jax.tree_util.tree_map(lambda x: x[0], stacked)
    _resolve(one.depth, method)
    _check_scale(scale)
    outputs = _resolve_outputs(outputs, one.n_outputs)
    (stacked,) = _promote(stacked)
    gram = _matrix_jit(stacked, jnp.asarray(scale, stacked.embed.dtype), int(context), outputs)
    if return_inner:
        return gram
    diag = jnp.diagonal(gram)
    check_positive_result(diag, "<net_i|net_i>", "a checkpoint is zero on the selected outputs; its similarity is undefined (0/0).")
    return gram / jnp.sqrt(diag[:, None] * diag[None, :])


def attention_moments(net: AttentionNetwork, /, *, context: int, scale: float = 1.0, layer: int = 0):
    """Exact mean and covariance of the residual stream after attention layer ``layer``.

    With the Gaussian token-space input (see the module docstring). For
    ``layer == 0`` these are exact; for ``layer >= 1`` they are the closure's
    (exact moments of the layer's output *given* a Gaussian input with the
    previous layer's moments).

    Args:
      net: an :class:`AttentionNetwork`.
      context: number of positions.
      scale: token-space standard deviation.
      layer: which layer's output, ``0 <= layer < depth``.

    Returns:
      ``(mean (T, d), cov (T, d, T, d))``.

    Raises:
      ValueError: for an invalid network, context or layer.
    """
    validate_attention_network(net, "net", context=context)
    _check_scale(scale)
    if not (isinstance(layer, (int, np.integer)) and 0 <= layer < net.depth):
        raise ValueError(f"layer must be an int in [0, {net.depth}) (the network's depth), got {layer!r}.")
    (net,) = _promote(net)
    return _moments_jit(net, jnp.asarray(scale, net.embed.dtype), int(context), int(layer))


@functools.partial(jax.jit, static_argnames=("context", "layer"))
def _moments_jit(net, scale, context, layer):
    return _self_moments(net, scale, context=context, n_layers=layer + 1)[-1]

