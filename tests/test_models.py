"""Models: shapes, layer access (features/tail), to_network equivalence, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from models import flatten, flatten_features, get_model
from similarity.multilinear import BilinearLayer, LinearLayer, apply_network

IMG = (8, 8, 1)


def _zoo():
    r = lambda s: nnx.Rngs(s)
    return {
        "linear": (models.Linear(IMG, 10, rngs=r(0)), IMG),
        "mlp": (models.MLP(IMG, 10, widths=(16, 12), activation="gelu", rngs=r(1)), IMG),
        "cnn": (models.CNN(IMG, 10, channels=(4, 6), rngs=r(2)), IMG),
        "resnet": (models.ResNet((8, 8, 3), 10, depth=8, width=4, rngs=r(3)), (8, 8, 3)),
        "mobilenet": (models.MobileNet(IMG, 10, channels=(4, 8), stem_channels=4, rngs=r(4)), IMG),
        "bilinear_mlp": (
            models.BilinearMLP(IMG, 10, d_model=12, d_hidden=10, n_layers=2, bias=True, rngs=r(5)),
            IMG,
        ),
        "bilinear_transformer": (
            models.BilinearTransformer(7, 5, d_model=8, n_layers=2, n_heads=2, d_head=4, d_hidden=6, rngs=r(6)),
            None,
        ),
    }


ZOO = _zoo()


def _input(name, shape, n=3):
    rng = np.random.default_rng(0)
    if shape is None:
        return jnp.asarray(rng.integers(0, 7, size=(n, 5)), dtype=jnp.int32)
    return jnp.asarray(rng.normal(size=(n, *shape)), dtype=jnp.float32)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_forward_shapes_and_features_in_order(name):
    model, shape = ZOO[name]
    x = _input(name, shape)
    logits = model(x)
    expected = (3, 5, 7) if name == "bilinear_transformer" else (3, 10)
    assert logits.shape == expected
    assert bool(jnp.all(jnp.isfinite(logits)))
    feats = model.features(x)
    assert tuple(feats) == model.layer_names()
    assert model.layer_names()[-1] == "logits"
    np.testing.assert_array_equal(feats["logits"], logits)
    assert {k: v.shape[1:] for k, v in feats.items()} == model.feature_shapes()
    for z in feats.values():
        assert z.shape[0] == 3


@pytest.mark.parametrize("name", sorted(ZOO))
def test_tail_from_every_layer_reproduces_the_model(name):
    model, shape = ZOO[name]
    x = _input(name, shape)
    logits = model(x)
    feats = model.features(x)
    for layer, z in feats.items():
        np.testing.assert_allclose(model.tail(layer, z), logits, rtol=1e-5, atol=1e-5, err_msg=layer)
        # the "flatten"-policy form is accepted too
        np.testing.assert_allclose(
            model.tail(layer, flatten(z, policy="flatten")), logits, rtol=1e-5, atol=1e-5, err_msg=layer
        )


@pytest.mark.parametrize("name", ["cnn", "bilinear_mlp"])
def test_tail_under_jit(name):
    model, shape = ZOO[name]
    x = _input(name, shape)
    feats = model.features(x)
    layer = model.layer_names()[0]
    jitted = jax.jit(lambda z: model.tail(layer, z))
    np.testing.assert_allclose(jitted(feats[layer]), model(x), rtol=1e-5, atol=1e-5)


def test_flatten_policies_against_numpy():
    z = np.random.default_rng(1).normal(size=(2, 3, 4, 5))
    np.testing.assert_allclose(flatten(z, policy="flatten"), z.reshape(2, 60))
    np.testing.assert_allclose(flatten(z, policy="spatial_mean"), z.mean(axis=(1, 2)))
    seq = np.random.default_rng(2).normal(size=(2, 6, 3))
    np.testing.assert_allclose(flatten(seq, policy="spatial_mean"), seq.mean(axis=1))
    out = flatten_features({"a": z, "b": z[:, 0, 0]}, policy="spatial_mean")
    assert list(out) == ["a", "b"] and out["b"].shape == (2, 5)
    with pytest.raises(ValueError, match="Unknown flattening policy 'mean'.*'spatial_mean'"):
        flatten(z, policy="mean")


@pytest.mark.parametrize("bias,residual", [(False, True), (True, True), (True, False), (False, False)])
def test_bilinear_mlp_to_network_equals_model(bias, residual):
    model = models.BilinearMLP(6, 4, d_model=6, d_hidden=5, n_layers=2, bias=bias, residual=residual, rngs=nnx.Rngs(3))
    # non-zero biases so that the bias paths are exercised
    if bias:
        for layer in model.layers:
            layer.left_bias[...] = jnp.linspace(-1, 1, 5, dtype=jnp.float32)
            layer.down_bias[...] = jnp.linspace(1, 2, 6, dtype=jnp.float32)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 6)), jnp.float32)
    net = model.to_network()
    assert isinstance(net[0], LinearLayer) and isinstance(net[-1], LinearLayer)
    assert all(isinstance(l, BilinearLayer) and l.residual == residual for l in net[1:-1])
    np.testing.assert_allclose(apply_network(net, x), model(x), rtol=1e-5, atol=1e-5)


def test_bilinear_mlp_against_numpy_reference():
    model = models.BilinearMLP(3, 2, d_model=4, d_hidden=5, n_layers=1, residual=True, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(3, 3))
    E = np.asarray(model.embed.weight[...], np.float64)
    L, R, D = (np.asarray(p[...], np.float64) for p in (model.layers[0].left, model.layers[0].right, model.layers[0].down))
    U = np.asarray(model.head.weight[...], np.float64)
    z = x @ E.T
    z = ((z @ L.T) * (z @ R.T)) @ D.T + z
    np.testing.assert_allclose(model(jnp.asarray(x, jnp.float32)), z @ U.T, rtol=1e-4, atol=1e-5)


def test_bilinear_attention_against_numpy_loops():
    rng = np.random.default_rng(0)
    n, t, d, a, e = 2, 4, 3, 2, 2
    x = rng.normal(size=(n, t, d))
    q1, k1, q2, k2, v = (rng.normal(size=(a, e, d)) for _ in range(5))
    o = rng.normal(size=(d, a, e))
    ref = x.copy()
    for i in range(n):
        for tt in range(t):
            for h in range(a):
                acc = np.zeros(e)
                for s in range(tt + 1):
                    score = (q1[h] @ x[i, tt]) @ (k1[h] @ x[i, s]) * ((q2[h] @ x[i, tt]) @ (k2[h] @ x[i, s])) / e**2
                    acc += score * (v[h] @ x[i, s])
                ref[i, tt] += o[:, h, :] @ acc
    np.testing.assert_allclose(models.bilinear_attention(x, q1, k1, q2, k2, v, o), ref, rtol=1e-10)


def test_transformer_is_causal():
    model, _ = ZOO["bilinear_transformer"]
    x = _input("bilinear_transformer", None)
    y = x.at[:, -1].set((x[:, -1] + 1) % 7)
    np.testing.assert_allclose(model(x)[:, :-1], model(y)[:, :-1], rtol=1e-6)
    assert not np.allclose(model(x)[:, -1], model(y)[:, -1])


def test_transformer_mlp_network_and_no_to_network_with_mlp():
    model, _ = ZOO["bilinear_transformer"]
    (layer,) = model.mlp_network(0)
    assert isinstance(layer, BilinearLayer) and layer.residual
    with pytest.raises(NotImplementedError, match="attention-only"):
        model.to_network()


def test_attention_only_transformer_to_network_equals_model():
    from similarity import AttentionNetwork, apply_attention_network

    model = models.BilinearTransformer(7, 5, d_model=8, n_layers=2, n_heads=2, d_head=4, mlp=False,
                                       rngs=nnx.Rngs(7))
    net = model.to_network()
    assert isinstance(net, AttentionNetwork) and net.depth == 2
    x = _input("bilinear_transformer", None)
    np.testing.assert_allclose(apply_attention_network(net, x), model(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(apply_attention_network(net, jax.nn.one_hot(x, 7)), model(x), rtol=1e-5, atol=1e-6)


def test_resnet_depths_and_mobilenet_depthwise():
    for depth, blocks in [(8, 3), (14, 6), (20, 9)]:
        m = models.ResNet((8, 8, 3), 10, depth=depth, width=4, rngs=nnx.Rngs(0))
        assert len([n for n in m.layer_names() if n.startswith("block")]) == blocks
    with pytest.raises(ValueError, match="6k \\+ 2"):
        models.ResNet((8, 8, 3), 10, depth=10, rngs=nnx.Rngs(0))
    m = models.MobileNet(IMG, 10, channels=(4,), stem_channels=4, rngs=nnx.Rngs(0))
    # depthwise kernel: (3, 3, in/groups = 1, out)
    assert m.blocks[0].depthwise.kernel.shape == (3, 3, 1, 4)


def test_get_model_and_unknown_names():
    m = get_model("cnn", IMG, 10, channels=(4,), seed=1)
    assert isinstance(m, models.CNN)
    with pytest.raises(ValueError, match="Unknown model name 'resent'. Did you mean 'resnet'.*'bilinear_mlp'"):
        get_model("resent", IMG, 10)
    model, shape = ZOO["mlp"]
    with pytest.raises(ValueError, match="Unknown layer name 'fc9'.*Valid layer names: 'fc0', 'fc1', 'logits'"):
        model.tail("fc9", jnp.ones((2, 16)))
    with pytest.raises(ValueError, match="Unknown activation 'rellu'. Did you mean 'relu'"):
        models.MLP(4, 2, activation="rellu", rngs=nnx.Rngs(0))


def test_wrong_input_shapes_are_rejected():
    model, _ = ZOO["cnn"]
    with pytest.raises(ValueError, match=r"CNN expects x of shape \(n, 8, 8, 1\), got \(2, 28, 28, 1\)"):
        model(jnp.ones((2, 28, 28, 1)))
    model(jnp.ones((2, 8, 8)))  # a missing single channel axis is added
    mlp, _ = ZOO["mlp"]
    with pytest.raises(ValueError, match=r"MLP expects x of shape \(n, 8, 8, 1\), got \(2, 64\)"):
        mlp(jnp.ones((2, 64)))
    with pytest.raises(ValueError, match=r"tail\('conv0', z\) expects z of shape \(n, 4, 4, 4\) or flattened \(n, 64\)"):
        model.tail("conv0", jnp.ones((2, 5)))
    tr, _ = ZOO["bilinear_transformer"]
    with pytest.raises(ValueError, match=r"integer tokens of shape \(n, 5\)"):
        tr(jnp.ones((2, 5)))
