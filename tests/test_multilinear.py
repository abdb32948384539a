"""Lifting, folding, interaction tensors, differences and network validation (docs/design.md §4).

References: ``apply_layer`` / ``apply_network`` (direct evaluation) and the
tensors built in NumPy from the layer definitions in tests/_tensor_nets.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim.similarity import (
    BilinearLayer,
    LinearLayer,
    apply_layer,
    apply_network,
    difference,
    fold_network,
    interaction_tensor,
    lift,
    lift_linear,
    network_depth,
    validate_network,
)
from tests._tensor_nets import bilinear, deep, linear, np_lifted_layer


def lifted(x):
    return np.concatenate([np.ones((x.shape[0], 1)), x], axis=1)


@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True), (True, True)])
def test_lift_reproduces_the_layer(bias, residual):
    rng = np.random.default_rng(0)
    layer = bilinear(rng, 3, 4, 3, bias=bias, residual=residual)
    left, right, down = (np.asarray(t) for t in lift(layer))
    assert left.shape == right.shape == (4 + 1 + 3 * residual, 4)
    assert down.shape == (4, left.shape[0])
    x = rng.normal(size=(6, 3))
    xt = lifted(x)
    y = np.einsum("ou,nu->no", down, (xt @ left.T) * (xt @ right.T))
    np.testing.assert_allclose(y[:, 0], 1.0, rtol=1e-12)  # the constant coordinate
    np.testing.assert_allclose(y[:, 1:], apply_layer(layer, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("symmetric", [True, False])
def test_interaction_tensor_matches_numpy_definition(symmetric):
    rng = np.random.default_rng(1)
    layer = bilinear(rng, 3, 2, 3, bias=True, residual=True)
    ref = np_lifted_layer(layer)
    if symmetric:
        ref = (ref + np.swapaxes(ref, 1, 2)) / 2
    got = np.asarray(interaction_tensor(layer, symmetric=symmetric))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    x = rng.normal(size=(4, 3))
    xt = lifted(x)
    np.testing.assert_allclose(np.einsum("oij,ni,nj->no", got, xt, xt)[:, 1:],
                               apply_layer(layer, x), rtol=1e-10)


def test_lift_linear():
    rng = np.random.default_rng(2)
    layer = linear(rng, 3, 2)
    np.testing.assert_allclose(lift_linear(layer), np_lifted_layer(layer), rtol=1e-14)
    with pytest.raises(TypeError, match="lift_linear"):
        lift(layer)
    with pytest.raises(TypeError, match="expects a LinearLayer"):
        lift_linear(bilinear(rng, 2, 2, 2))


@pytest.mark.parametrize("widths,embed,head", [([3], True, True), ([2, 3], False, True),
                                               ([2, 2, 3], True, False), ([], True, True)])
def test_fold_network_evaluates_like_apply_network(widths, embed, head):
    rng = np.random.default_rng(3)
    net = deep(rng, 2, widths, embed=embed, head=head)
    if not net:
        net = (linear(rng, 2, 3),)
    nodes = fold_network(validate_network(net))
    assert len(nodes) == max(network_depth(net), 1)
    x = rng.normal(size=(5, 2))
    y = lifted(x)
    if network_depth(net) == 0:
        y = y @ np.asarray(nodes[0]).T
    else:
        for left, right, down in nodes:
            y = ((y @ np.asarray(left).T) * (y @ np.asarray(right).T)) @ np.asarray(down).T
    np.testing.assert_allclose(y[:, 0], 1.0, rtol=1e-10)
    np.testing.assert_allclose(y[:, 1:], apply_network(net, x), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("res_new,res_old", [(False, False), (True, True), (True, False), (False, True)])
def test_difference_is_pointwise_difference(res_new, res_old):
    rng = np.random.default_rng(4)
    new = bilinear(rng, 3, 3, 3, bias=True, residual=res_new)
    old = bilinear(rng, 3, 2, 3, bias=False, residual=res_old)
    diff = difference(new, old)
    assert not diff.residual
    x = rng.normal(size=(7, 3))
    np.testing.assert_allclose(apply_layer(diff, x), apply_layer(new, x) - apply_layer(old, x),
                               rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="same input and output widths"):
        difference(new, bilinear(rng, 3, 2, 2))


def test_pytrees_are_jit_and_vmap_friendly():
    rng = np.random.default_rng(5)
    layer = bilinear(rng, 3, 2, 3, bias=True, residual=True)
    x = rng.normal(size=(4, 3))
    np.testing.assert_allclose(jax.jit(apply_layer)(layer, x), apply_layer(layer, x), rtol=1e-12)
    stacked = jax.tree.map(lambda *xs: np.stack(xs), layer, layer)
    out = jax.vmap(lambda lay: lift(lay)[2])(stacked)
    np.testing.assert_allclose(out[1], lift(layer)[2], rtol=1e-14)


def test_validate_network_errors():
    rng = np.random.default_rng(6)
    good = bilinear(rng, 3, 2, 3)
    _assert_same_network(validate_network(good), (good,))
    with pytest.raises(ValueError, match="empty network"):
        validate_network((), "net")
    with pytest.raises(TypeError, match=r"net\[1\] must be a BilinearLayer or LinearLayer"):
        validate_network((good, "relu"), "net")
    with pytest.raises(ValueError, match=r"net\[0\] outputs 3 features but net\[1\] expects d=4"):
        validate_network((good, bilinear(rng, 4, 2, 2)), "net")
    with pytest.raises(ValueError, match="residual but maps d=3 inputs to o=2 outputs"):
        validate_network((bilinear(rng, 3, 2, 2, residual=True),), "net")
    with pytest.raises(ValueError, match=r"net\[0\].down has shape \(3, 5\), expected \(3, 2\)"):
        validate_network((dataclasses.replace(good, down=np.ones((3, 5))),), "net")
    with pytest.raises(ValueError, match=r"net\[0\].left_bias has shape \(3,\), expected \(2,\)"):
        validate_network((dataclasses.replace(good, left_bias=np.ones(3)),), "net")
    with pytest.raises(ValueError, match=r"must have rank 2"):
        validate_network((dataclasses.replace(good, left=np.ones((1, 2, 3))),), "net")
    with pytest.raises(ValueError, match=r"net\[0\].right .* contains 1 NaN and 1 Inf"):
        bad = np.asarray(good.right).copy()
        bad[0, 0], bad[1, 1] = np.nan, np.inf
        validate_network((dataclasses.replace(good, right=bad),), "net")
    with pytest.raises(ValueError, match=r"bias has shape \(3,\), expected \(2,\)"):
        validate_network((LinearLayer(np.ones((2, 3)), np.ones(3)),), "net")
    with pytest.raises(TypeError, match=r"net\[0\].weight has complex dtype complex128"):
        validate_network((LinearLayer(np.ones((2, 3), dtype=complex)),), "net")
    with pytest.raises(TypeError, match=r"net\[0\].residual must be True or False, got 'yes'"):
        validate_network((dataclasses.replace(good, residual="yes"),), "net")
    stacked = jax.tree.map(lambda *xs: np.stack(xs), good, good)
    _assert_same_network(validate_network(stacked, batch_ndim=1), (stacked,))
    with pytest.raises(ValueError, match="must have rank 3"):
        validate_network(good, "nets", batch_ndim=1)


def _assert_same_network(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(g, jax.Array)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(
    "dtype, want",
    [(np.int32, np.float64), (np.bool_, np.float64), (np.float16, np.float32),
     (jnp.bfloat16, np.float32), (np.float32, np.float32)],
)
def test_validate_network_casts_to_the_compute_dtype(dtype, want):
    """One dtype policy (similarity._validate): ints/bools -> default float, half -> float32."""
    layer = BilinearLayer(np.ones((2, 3), dtype), np.ones((2, 3), dtype), np.ones((1, 2), dtype),
                          left_bias=np.ones(2, np.float32))
    (out,) = validate_network(layer)
    leaves = jax.tree.leaves(out)
    assert {x.dtype for x in leaves} == {np.dtype(np.promote_types(want, np.float32))}
    np.testing.assert_array_equal(np.asarray(out.left), np.ones((2, 3)))


def test_depth_counts_bilinear_layers_only():
    rng = np.random.default_rng(7)
    assert network_depth(deep(rng, 2, [2, 2])) == 2
    assert network_depth(linear(rng, 2, 2)) == 0
    assert network_depth(BilinearLayer(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)))) == 1
