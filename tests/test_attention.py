"""Bilinear-attention tensor similarity (docs/design.md §4, "Bilinear attention").

References, all independent of the cumulant algebra under test: exact
Gauss–Hermite quadrature and Monte Carlo that only evaluate the networks
(``attention_quadrature_inner``, ``attention_monte_carlo_inner``, and a direct
quadrature over a correlated Gaussian below). Networks are tiny (V = 2 tokens)
so that the quadrature grids stay small; one shape per group of tests keeps
the number of compilations low.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim.similarity import (
    AttentionLayer,
    AttentionNetwork,
    apply_attention_layer,
    apply_attention_network,
    attention_inner,
    attention_moments,
    attention_monte_carlo_inner,
    attention_quadrature_inner,
    attention_similarity,
    attention_similarity_matrix,
)
from funsim.similarity import _attention_closure as closure

EXACT_RTOL = 1e-8
V, D, A, E, T = 2, 3, 2, 2, 3


def rel(x, y):
    return abs(float(x) - float(y)) / max(abs(float(y)), 1e-300)


def network(rng, *, vocab=V, d=D, heads=A, e=E, depth=1, pos=True, scale=0.7, n_out=None):
    def f(*shape, s=1.0):
        return s * rng.normal(size=shape)

    layers = tuple(
        AttentionLayer(*(f(heads, e, d, s=scale) for _ in range(5)), f(d, heads, e, s=0.5))
        for _ in range(depth)
    )
    return AttentionNetwork(f(vocab, d), layers, f(n_out or vocab, d), f(T, d) if pos else None)


RNG = np.random.default_rng(0)
NET_A = network(RNG)
NET_B = network(RNG)
OTHER = network(RNG, d=4, heads=1, e=3)  # another architecture, same vocabulary


def quadrature_similarity(a, b, **kw):
    ab, aa, bb = (float(attention_quadrature_inner(x, y, **kw)) for x, y in ((a, b), (a, a), (b, b)))
    return ab, ab / np.sqrt(aa * bb)


# ------------------------------ exactness --------------------------------


@pytest.mark.parametrize(
    "b,kw",
    [(NET_B, dict(context=T)), (OTHER, dict(context=T, scale=0.6)), (NET_B, dict(context=2, outputs=[1]))],
    ids=["same_arch", "other_arch_scale", "context2_slice"],
)
def test_one_layer_exact_equals_quadrature(b, kw):
    q_inner, q_sim = quadrature_similarity(NET_A, b, **kw)
    assert rel(attention_inner(NET_A, b, **kw), q_inner) < EXACT_RTOL
    assert rel(attention_similarity(NET_A, b, **kw), q_sim) < EXACT_RTOL


def test_no_positional_embedding_and_depth_zero_equal_quadrature():
    rng = np.random.default_rng(1)
    a, b = network(rng, pos=False), network(rng, pos=False)
    assert rel(attention_inner(a, b, context=2), attention_quadrature_inner(a, b, context=2)) < EXACT_RTOL
    a0 = dataclasses.replace(a, layers=())
    b0 = dataclasses.replace(NET_B, layers=())
    assert rel(attention_inner(a0, b0, context=T), attention_quadrature_inner(a0, b0, context=T)) < EXACT_RTOL


def test_exact_agrees_with_monte_carlo_on_a_larger_vocabulary():
    rng = np.random.default_rng(2)
    a, b = network(rng, vocab=6, d=4, e=3), network(rng, vocab=6, d=4, e=3)
    exact = float(attention_inner(a, b, context=3, scale=0.5))
    est, se = attention_monte_carlo_inner(a, b, context=3, scale=0.5, n_samples=200_000, key=jax.random.key(0))
    assert float(se) > 0
    assert abs(exact - float(est)) < 4 * float(se)  # a 4-sigma bound: fails by chance with p < 1e-4


def test_layer_moments_equal_quadrature():
    n = 6  # 5 + 1 nodes: exact for the degree-10 second moments
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    weights = weights / np.sqrt(2 * np.pi)
    grid = np.asarray(list(itertools.product(range(n), repeat=2 * V)))
    g = 0.8 * nodes[grid].reshape(-1, 2, V)
    w = np.prod(weights[grid], axis=1)
    emb = np.einsum("ntv,vd->ntd", g, NET_A.embed) + NET_A.pos_embed[:2]
    y = np.asarray(apply_attention_layer(NET_A.layers[0], emb))
    mean_ref = np.einsum("n,ntd->td", w, y)
    cov_ref = np.einsum("n,ntd,nue->tdue", w, y, y) - np.einsum("td,ue->tdue", mean_ref, mean_ref)
    mean, cov = attention_moments(NET_A, context=2, scale=0.8)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-9, atol=1e-9 * np.abs(mean_ref).max())
    np.testing.assert_allclose(cov, cov_ref, rtol=1e-9, atol=1e-9 * np.abs(cov_ref).max())


def _correlated_quadrature(layers, mu, lift, g_read, full, context):
    """``sum E[y^a_t G y^b_t2]`` for x^m = mu_m + lift_m z, z ~ N(0, I_k), by quadrature over z."""
    k = lift[0].shape[-1]
    nodes, weights = np.polynomial.hermite_e.hermegauss(6)
    weights = weights / np.sqrt(2 * np.pi)
    grid = np.asarray(list(itertools.product(range(6), repeat=k)))
    z = nodes[grid]
    w = np.prod(weights[grid], axis=1)
    ys = [np.asarray(apply_attention_layer(layers[m], mu[m][None] + np.einsum("tdk,nk->ntd", lift[m], z)))
          for m in (0, 1)]
    if full:
        return np.einsum("n,nti,tiuj,nuj->", w, ys[0], g_read, ys[1])
    return np.einsum("n,nti,ij,ntj->", w, ys[0], g_read, ys[1])


@pytest.mark.parametrize("full", [False, True], ids=["diagonal_readout", "full_readout"])
def test_layer_is_exact_on_any_gaussian_input(full):
    """The closure's building block: exact for a Gaussian input correlated across positions and networks."""
    rng = np.random.default_rng(3)
    context, k = 2, 4
    layers = (NET_A.layers[0], OTHER.layers[0])
    dims = (D, 4)
    lift = [0.6 * rng.normal(size=(context, d, k)) for d in dims]
    mu = [0.5 * rng.normal(size=(context, d)) for d in dims]
    cov = {key: np.einsum("tik,ujk->tiuj", lift[key[0]], lift[key[1]]) for key in ((0, 0), (0, 1), (1, 1))}
    mom = closure.pair_moments(mu[0], mu[1], cov[(0, 0)], cov[(0, 1)], cov[(1, 1)])
    shape = (context, dims[0], context, dims[1]) if full else dims
    g_read = rng.normal(size=shape)
    got = closure.read_out_scalar(layers, mom, g_read, context=context, full=full)
    ref = _correlated_quadrature(layers, mu, lift, g_read, full, context)
    assert rel(got, ref) < EXACT_RTOL


# ------------------------------ closure ----------------------------------


def two_layer(net, second):
    return dataclasses.replace(net, layers=(net.layers[0], second))


def test_closure_with_identity_second_layer_equals_exact_one_layer():
    rng = np.random.default_rng(4)
    identity = AttentionLayer(*(rng.normal(size=(A, E, D)) for _ in range(5)), np.zeros((D, A, E)))
    a2, b2 = two_layer(NET_A, identity), two_layer(NET_B, identity)
    got = attention_inner(a2, b2, context=2, method="closure")
    assert rel(got, attention_inner(NET_A, NET_B, context=2)) < EXACT_RTOL


def test_closure_is_an_approximation_at_depth_two():
    """Declared non-exactness: the closure drops the hidden stream's higher cumulants.

    (All closure tests use one shape, so they share one compilation.)
    """
    rng = np.random.default_rng(5)
    a = network(rng, depth=2, scale=0.5)
    b = network(rng, depth=2, scale=0.5)
    closure = functools.partial(attention_inner, context=2, method="closure", scale=0.5)
    ab, aa, bb = float(closure(a, b)), float(closure(a, a)), float(closure(b, b))
    exact = float(attention_quadrature_inner(a, b, context=2, scale=0.5))
    assert rel(ab, exact) > 1e-3
    assert aa > 0 and bb > 0 and ab**2 <= aa * bb  # still a valid kernel


# ------------------------------ invariances ------------------------------


def map_layers(net, fn):
    return dataclasses.replace(net, layers=tuple(fn(l) for l in net.layers))


def permute_heads(layer, perm):
    return AttentionLayer(*(np.asarray(w)[perm] for w in (layer.q1, layer.k1, layer.q2, layer.k2, layer.v)),
                          np.asarray(layer.o)[:, perm])


def swap_pairs(layer):
    return dataclasses.replace(layer, q1=layer.q2, k1=layer.k2, q2=layer.q1, k2=layer.k1)


def head_basis_change(layer, rng):
    """q1 -> M q1, k1 -> M^-T k1, q2 -> c q2, k2 -> k2 / c, v -> B v, o -> o B^-1, per head."""
    a, e, _ = layer.q1.shape
    m = rng.normal(size=(a, e, e)) + 2 * np.eye(e)
    b = rng.normal(size=(a, e, e)) + 2 * np.eye(e)
    c = rng.uniform(0.5, 2.0, size=(a, 1, 1))
    inv_t = np.linalg.inv(m).transpose(0, 2, 1)
    return AttentionLayer(
        np.einsum("hij,hjd->hid", m, layer.q1), np.einsum("hij,hjd->hid", inv_t, layer.k1),
        c * layer.q2, layer.k2 / c, np.einsum("hij,hjd->hid", b, layer.v),
        np.einsum("dhj,hji->dhi", layer.o, np.linalg.inv(b)),
    )


def residual_basis_change(net, rng):
    """x -> R x: embed, pos_embed -> (.) R^T; projections -> W R^-1; o -> R o; unembed -> U R^-1."""
    r = rng.normal(size=(D, D)) + 2 * np.eye(D)
    ri = np.linalg.inv(r)

    def layer(l):
        proj = (np.einsum("hed,dk->hek", w, ri) for w in (l.q1, l.k1, l.q2, l.k2, l.v))
        return AttentionLayer(*proj, np.einsum("kd,dhe->khe", r, l.o))

    return AttentionNetwork(net.embed @ r.T, tuple(layer(l) for l in net.layers), net.unembed @ ri,
                            net.pos_embed @ r.T)


def reparametrisations():
    rng = np.random.default_rng(6)
    return {
        "head_permutation": map_layers(NET_A, lambda l: permute_heads(l, [1, 0])),
        "qk_pair_swap": map_layers(NET_A, swap_pairs),
        "head_basis_change": map_layers(NET_A, lambda l: head_basis_change(l, rng)),
        "residual_basis_change": residual_basis_change(NET_A, rng),
    }


REPARAM = reparametrisations()


@pytest.mark.parametrize("name", sorted(REPARAM))
def test_reparametrisations_leave_the_function_and_similarity_unchanged(name):
    net = REPARAM[name]
    tokens = jnp.asarray([[0, 1, 1], [1, 0, 1]])
    np.testing.assert_allclose(apply_attention_network(net, tokens), apply_attention_network(NET_A, tokens),
                               rtol=1e-9, atol=1e-9)
    assert rel(attention_similarity(net, NET_A, context=T), 1.0) < 1e-10
    assert rel(attention_inner(net, NET_B, context=T), attention_inner(NET_A, NET_B, context=T)) < 1e-10


def test_closure_is_invariant_to_reparametrisations():
    rng = np.random.default_rng(7)
    a = network(rng, depth=2)
    b = network(rng, depth=2)
    c = map_layers(residual_basis_change(a, rng), lambda l: head_basis_change(permute_heads(swap_pairs(l), [1, 0]), rng))
    ref = attention_inner(a, b, context=2, method="closure")
    assert rel(attention_inner(c, b, context=2, method="closure"), ref) < 1e-9


def test_weights_change_under_reparametrisation():
    """Declared non-invariance of the weight-space view the similarity replaces."""
    net = REPARAM["residual_basis_change"]
    va = np.concatenate([np.ravel(x) for x in jax.tree.leaves(NET_A)])
    vb = np.concatenate([np.ravel(x) for x in jax.tree.leaves(net)])
    assert va @ vb / np.linalg.norm(va) / np.linalg.norm(vb) < 0.99


# ------------------------------ properties -------------------------------


@settings(max_examples=6)
@given(st.integers(0, 2**31 - 1))
def test_symmetric_bounded_and_cauchy_schwarz(seed):
    rng = np.random.default_rng(seed)
    a, b = network(rng), network(rng)
    ab, ba = attention_inner(a, b, context=T), attention_inner(b, a, context=T)
    aa, bb = attention_inner(a, a, context=T), attention_inner(b, b, context=T)
    assert rel(ab, ba) < 1e-10
    assert float(aa) > 0 and float(bb) > 0
    assert float(ab) ** 2 <= float(aa) * float(bb) * (1 + 1e-10)


def test_matrix_equals_pairwise_jit_and_vmap():
    nets = [NET_A, NET_B, REPARAM["head_permutation"]]
    mat = attention_similarity_matrix(nets, context=T)
    ref = np.array([[float(attention_similarity(x, y, context=T)) for y in nets] for x in nets])
    np.testing.assert_allclose(mat, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diag(mat), 1.0, rtol=1e-12)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *nets)
    np.testing.assert_allclose(attention_similarity_matrix(stacked, context=T), mat, rtol=1e-12)
    jitted = jax.jit(lambda a, b: attention_inner(a, b, context=T))(NET_A, NET_B)
    assert rel(jitted, attention_inner(NET_A, NET_B, context=T)) < 1e-12
    vmapped = jax.vmap(lambda net: attention_inner(net, NET_B, context=T))(stacked)
    looped = [float(attention_inner(net, NET_B, context=T)) for net in nets]
    np.testing.assert_allclose(vmapped, looped, rtol=1e-10)


def test_float32_agrees_with_float64():
    to32 = lambda net: jax.tree.map(lambda x: np.asarray(x, np.float32), net)
    s64 = float(attention_similarity(NET_A, NET_B, context=T))
    s32 = attention_similarity(to32(NET_A), to32(NET_B), context=T)
    assert s32.dtype == jnp.float32
    assert abs(float(s32) - s64) < 1e-4


# ------------------------------ bad input --------------------------------


def test_bad_input_raises_clear_errors():
    with pytest.raises(TypeError, match="AttentionNetwork"):
        attention_inner((NET_A.layers[0],), NET_B, context=T)
    with pytest.raises(ValueError, match="vocabulary"):
        attention_inner(NET_A, network(np.random.default_rng(8), vocab=3), context=T)
    with pytest.raises(ValueError, match="pos_embed"):
        attention_inner(NET_A, NET_B, context=T + 1)
    with pytest.raises(ValueError, match="context must be a positive int"):
        attention_inner(NET_A, NET_B, context=0)
    with pytest.raises(ValueError, match="scale"):
        attention_inner(NET_A, NET_B, context=T, scale=-1.0)
    with pytest.raises(ValueError, match="method"):
        attention_inner(NET_A, NET_B, context=T, method="gram")
    deep = dataclasses.replace(NET_A, layers=NET_A.layers * 2)
    with pytest.raises(ValueError, match="equal depth"):
        attention_inner(deep, NET_B, context=T)
    with pytest.raises(ValueError, match="closure"):
        attention_inner(deep, deep, context=T)
    bad = dataclasses.replace(NET_A, unembed=np.ones((V, D + 1)))
    with pytest.raises(ValueError, match="model width"):
        attention_inner(bad, NET_B, context=T)
    nan = dataclasses.replace(NET_A, embed=np.full((V, D), np.nan))
    with pytest.raises(ValueError, match="NaN"):
        attention_inner(nan, NET_B, context=T)
    zero = dataclasses.replace(NET_A, unembed=np.zeros((V, D)))
    with pytest.raises(ValueError, match="zero"):
        attention_similarity(zero, NET_B, context=T)
    with pytest.raises(ValueError, match="structure and shapes"):
        attention_similarity_matrix([NET_A, OTHER], context=T)
    with pytest.raises(ValueError, match="MAX_QUADRATURE_POINTS"):
        attention_quadrature_inner(deep, deep, context=T)
