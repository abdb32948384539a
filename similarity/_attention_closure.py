"""One attention layer under a Gaussian residual stream, and the closure over layers.

Private to :mod:`funsim.similarity.attention` (docs/design.md §4, "Bilinear attention").
:func:`read_out_scalar` is ``sum E[y_a^T G y_b]`` for one layer of each network on a
Gaussian input with given moments (exact, through :mod:`funsim.similarity._gaussian_forms`);
its gradient in ``G`` is the layer's second moment (:func:`second_moment`).
:func:`self_moments` propagates mean and covariance layer by layer (exact after the first
layer, the closure's Gaussian approximation after later ones) and :func:`cross_inner`
finishes the inner product of two networks with the last layer's read-out.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._gaussian_forms import Family, forms_moment

__all__ = ["read_out_scalar", "layer_mean", "second_moment", "pair_moments", "input_moments", "self_moments",
           "cross_inner", "map_same"]

# Combinations evaluated per step of the inner loop; bounds memory to about
# _CHUNK_ELEMENTS numbers per (2e x 2e) core array.
_CHUNK_ELEMENTS = 2**17


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
        (Family(model, _head_rows(layer, q, head), t), Family(model, _head_rows(layer, k, head), s))
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
        return (jax.tree.structure(args),
                [(jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(args)])

    first = sig(args_list[0])
    return all(sig(a) == first for a in args_list[1:])


def map_same(fn, args_list):
    """``[fn(*args) for args in args_list]``, traced once (a ``lax.map``) when all shapes agree."""
    if len(args_list) > 1 and _same_shapes(args_list):
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *args_list)
        out = jax.lax.map(lambda args: fn(*args), stacked)
        return [jax.tree.map(lambda x, i=i: x[i], out) for i in range(len(args_list))]
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
        readout = Family(0, _id_rows(layer_res, t.shape[0]), t, mix)
        forms.append((readout, Family(1, _head_rows(layer_act, "v", h2), s2)))
        return forms_moment(tables, forms)

    index = _expand_heads(_combos(context, full, ("res", "qk")), 1, layer_act.n_heads)
    return _sum_over(term, index, _chunk_for((layer_res, layer_act)))


def _act_term(layers, tables, mixes, *, context, full):
    """``sum E[(q1.k1)(q2.k2)_a (q1.k1)(q2.k2)_b v_a^T M v_b]`` over heads and positions."""
    la, lb = layers

    def term(ix):
        t, s, t2, s2, h, h2 = (ix[:, i] for i in range(6))
        mix = mixes[t, t2, h, h2] if full else mixes[h, h2]
        forms = _qk_forms(la, 0, h, t, s) + _qk_forms(lb, 1, h2, t2, s2)
        forms.append((Family(0, _head_rows(la, "v", h), s), Family(1, _head_rows(lb, "v", h2), s2, mix)))
        return forms_moment(tables, forms)

    index = _expand_heads(_combos(context, full, ("qk", "qk")), la.n_heads, lb.n_heads)
    return _sum_over(term, index, _chunk_for(layers))


def read_out_scalar(layers, mom, g, *, context, full):
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
    res_ab, res_ba = map_same(fn, [(la, lb, tables, read_ab), (lb, la, _swap_tables(tables), read_ba)])
    return res + act + res_ab + res_ba


def layer_mean(layer, mu, c, *, context):
    """``E[y_t]`` of one attention layer on a Gaussian ``(mu (T, d), c (T, d, T, d))``: ``(T, d)``."""
    mom = {"mu": [mu, mu], "c": {(0, 0): c, (0, 1): c, (1, 1): c}}
    tables = _tables((layer, layer), mom)
    e = layer.d_head
    pairs = np.asarray([(t, s) for t in range(context) for s in range(t + 1)], np.int32)
    hc = np.stack(np.meshgrid(np.arange(layer.n_heads), np.arange(e), indexing="ij"), -1).reshape(-1, 2)
    index = jnp.asarray(np.concatenate([np.repeat(pairs, len(hc), 0), np.tile(hc, (len(pairs), 1))], 1))
    t, s, h, cc = (index[:, i] for i in range(4))
    forms = _qk_forms(layer, 0, h, t, s)
    forms.append((Family(0, (_offsets(layer)["v"] + h * e + cc)[:, None], s), None))
    vals = forms_moment(tables, forms)  # E[(q1.k1)(q2.k2) v_c] per (t, s, h, c)
    per = jnp.einsum("dn,n->nd", layer.o[:, h, cc], vals)
    return mu + jax.ops.segment_sum(per, t, num_segments=context)


def second_moment(layers, mom, *, context):
    """``E[y^a_t (y^b_t2)^T]``: ``(T, d_a, T, d_b)``, the gradient of the read-out in G."""
    shape = (context, layers[0].d_model, context, layers[1].d_model)
    zero = jnp.zeros(shape, mom["c"][(0, 1)].dtype)
    return jax.grad(lambda g: read_out_scalar(layers, mom, g, context=context, full=True))(zero)


def pair_moments(mu_a, mu_b, c_aa, c_ab, c_bb):
    return {"mu": [mu_a, mu_b], "c": {(0, 0): c_aa, (0, 1): c_ab, (1, 1): c_bb}}


def input_moments(net_a, net_b, context, scale):
    def mean(net):
        if net.pos_embed is None:
            return jnp.zeros((context, net.d_model), net.embed.dtype)
        return net.pos_embed[:context]

    eye = jnp.eye(context, dtype=net_a.embed.dtype)
    cov = lambda x, y: scale**2 * jnp.einsum("tu,vi,vj->tiuj", eye, x.embed, y.embed)
    return pair_moments(mean(net_a), mean(net_b), cov(net_a, net_a), cov(net_a, net_b), cov(net_b, net_b))


def self_moments(net, scale, *, context, n_layers=None):
    """Mean and covariance after each of the first ``n_layers`` layers (default: all but the last).

    Layer 0's are exact; later ones are the closure's (each layer's input taken
    Gaussian with the previous moments). A list of ``(mu (T, d), c (T, d, T, d))``.
    """
    mom = input_moments(net, net, context, scale)
    out = []
    for layer in net.layers[: net.depth - 1 if n_layers is None else n_layers]:
        mu = layer_mean(layer, mom["mu"][0], mom["c"][(0, 0)], context=context)
        c = second_moment((layer, layer), mom, context=context) - jnp.einsum("ti,uj->tiuj", mu, mu)
        c = (c + jnp.transpose(c, (2, 3, 0, 1))) / 2
        out.append((mu, c))
        mom = pair_moments(mu, mu, c, c, c)
    return out


def cross_inner(net_a, net_b, self_a, self_b, scale, *, context, outputs):
    """``<A|B>``: exact at depth <= 1, the closure beyond (``self_*`` from :func:`self_moments`)."""
    mom = input_moments(net_a, net_b, context, scale)
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
        second = second_moment(layers, mom, context=context)
        (mu_a, c_aa), (mu_b, c_bb) = self_a[i], self_b[i]
        mom = pair_moments(mu_a, mu_b, c_aa, second - jnp.einsum("ti,uj->tiuj", mu_a, mu_b), c_bb)
    return read_out_scalar((net_a.layers[-1], net_b.layers[-1]), mom, g, context=context, full=False)

