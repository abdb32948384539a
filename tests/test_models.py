"""Models: shapes, layer access (features/tail), to_network equivalence, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from funsim import models
from funsim.data import modular_addition
from funsim.models import flatten, flatten_features, get_model
from funsim.similarity.multilinear import BilinearLayer, LinearLayer, apply_network

IMG = (8, 8, 1)


def _bn_mlp(seed=9, dropout=0.3):
    """The paper code's MLP (BatchNorm and dropout), its running averages and BatchNorm's scale and bias set
    away from their initial values (0, 1, 1, 0), so that evaluation-mode BatchNorm is not near the identity."""
    m = models.MLP(IMG, 10, widths=(16, 12), batch_norm=True, dropout=dropout, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for norm in m.norms:
        d = norm.mean.shape
        norm.mean[...] = jnp.asarray(rng.normal(size=d), jnp.float32)
        norm.var[...] = jnp.asarray(rng.uniform(0.3, 3.0, size=d), jnp.float32)
        norm.scale[...] = jnp.asarray(rng.uniform(0.5, 2.0, size=d), jnp.float32)
        norm.bias[...] = jnp.asarray(rng.normal(size=d), jnp.float32)
    return m


def _zoo():
    r = lambda s: nnx.Rngs(s)
    return {
        "linear": (models.Linear(IMG, 10, rngs=r(0)), IMG),
        "mlp": (models.MLP(IMG, 10, widths=(16, 12), activation="gelu", rngs=r(1)), IMG),
        "mlp_bn_dropout": (_bn_mlp(), IMG),
        "cnn": (models.CNN(IMG, 10, channels=(4, 6), rngs=r(2)), IMG),
        "resnet": (models.ResNet((8, 8, 3), 10, depth=8, width=4, rngs=r(3)), (8, 8, 3)),
        "mobilenet": (models.MobileNet(IMG, 10, channels=(4, 8), stem_channels=4, rngs=r(4)), IMG),
        "densenet": (models.DenseNet(IMG, 10, depth=7, growth=4, rngs=r(7)), IMG),
        "shufflenet": (
            models.ShuffleNet((8, 8, 3), 10, channels=(8, 12, 16), repeats=(2, 1, 2), stem_channels=6,
                              final_channels=20, rngs=r(8)),
            (8, 8, 3),
        ),
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


@pytest.fixture(autouse=True)
def _full_float32_precision():
    """These tests compare two programs of one float32 network (whole and split at a layer, eager and
    compiled, chunked) to about 1e-5. The models keep JAX's default precision, which is TF32 on a GPU
    (10 mantissa bits): there two such programs agree only to about 1e-3 (on an H200, DenseNet's
    pre-activation taps through ``models.compiled``), so the tests trace at full float32 precision
    (no change on a CPU, which computes float32 products in full anyway)."""
    with jax.default_matmul_precision("highest"):
        yield


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


@pytest.mark.parametrize("name", sorted(ZOO))
def test_tail_from_every_pre_activation_tap_reproduces_the_model(name):
    """tail(layer, ., point="pre_activation") after features(x, point="pre_activation") is the model,
    for every layer of every architecture (stages without a pre-activation tap give the same as before)."""
    model, shape = ZOO[name]
    x = _input(name, shape)
    logits = model(x)
    pre, post = model.features(x, point="pre_activation"), model.features(x)
    assert tuple(pre) == model.layer_names()
    for layer, z in pre.items():
        assert z.shape == post[layer].shape, layer
        np.testing.assert_allclose(model.tail(layer, z, point="pre_activation"), logits, rtol=1e-5, atol=1e-5,
                                   err_msg=layer)
    fast = models.compiled(model, chunk=2)
    for layer, z in fast.features(x, point="pre_activation", as_numpy=True).items():
        np.testing.assert_allclose(z, pre[layer], rtol=1e-5, atol=1e-5, err_msg=layer)
        np.testing.assert_allclose(fast.tail(layer, z, point="pre_activation", as_numpy=True), logits, rtol=1e-5,
                                   atol=1e-5, err_msg=layer)


def test_mlp_pre_activation_taps_against_numpy():
    """An MLP's pre-activation tap is the dense layer's raw output x W + b (NumPy), and differs from
    the post-activation one exactly by the activation; the logits are the same tap either way."""
    model = models.MLP(IMG, 10, widths=(16, 12), activation="relu", rngs=nnx.Rngs(3))
    x = np.random.default_rng(1).normal(size=(5, *IMG)).astype(np.float32)
    pre = model.features(x, point="pre_activation")
    h = x.reshape(5, -1).astype(np.float64)
    for i, layer in enumerate(("fc0", "fc1")):
        dense = model.hidden[i]
        ref = h @ np.asarray(dense.kernel[...], np.float64) + np.asarray(dense.bias[...], np.float64)
        np.testing.assert_allclose(pre[layer], ref, rtol=1e-4, atol=1e-5)
        assert np.any(ref < 0)  # so that the two taps differ
        h = np.maximum(ref, 0.0)
        np.testing.assert_allclose(model.features(x)[layer], h, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(pre["logits"], model.features(x)["logits"])
    with pytest.raises(ValueError, match="point must be one of 'post_activation', 'pre_activation'"):
        model.features(x, point="pre")


def test_default_mlp_is_the_plain_network():
    """Without batch_norm and dropout the MLP is what it was before those options: the same variables (the
    dense layers' kernels and biases only, drawn in the same order: compared with nnx.Linear layers built
    here from the same seed), the same forward pass (float64 NumPy), and a training step is that pass."""
    m = models.MLP(IMG, 10, widths=(16, 12), rngs=nnx.Rngs(4))
    paths = sorted((tuple(map(str, k)), type(v).__name__, tuple(v.shape)) for k, v in nnx.to_flat_state(nnx.state(m)))
    assert paths == [(("head", "bias"), "Param", (10,)), (("head", "kernel"), "Param", (12, 10)),
                     (("hidden", "0", "bias"), "Param", (16,)), (("hidden", "0", "kernel"), "Param", (64, 16)),
                     (("hidden", "1", "bias"), "Param", (12,)), (("hidden", "1", "kernel"), "Param", (16, 12))]
    assert m.norms is None and m.drop is None and not nnx.state(m, nnx.BatchStat)
    rngs = nnx.Rngs(4)
    ref = [nnx.Linear(a, b, rngs=rngs) for a, b in ((64, 16), (16, 12), (12, 10))]
    for got, want in zip([*m.hidden, m.head], ref, strict=True):
        np.testing.assert_array_equal(got.kernel[...], want.kernel[...])
        np.testing.assert_array_equal(got.bias[...], want.bias[...])
    x = np.random.default_rng(2).normal(size=(5, *IMG)).astype(np.float32)
    h = x.reshape(5, -1).astype(np.float64)
    for layer in [*m.hidden, m.head]:
        h = h @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...], np.float64)
        h = np.maximum(h, 0) if layer is not m.head else h
    np.testing.assert_allclose(m(x), h, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(m.training_logits(x, jax.random.key(0)), m(x))


def test_batch_norm_mlp_in_evaluation_against_numpy():
    """Evaluation-mode BatchNorm is (h - running mean) / sqrt(running var + 1e-5) * scale + bias (float64
    NumPy), then ReLU; the pre-activation tap is the dense layer's output before BatchNorm (the paper code's
    nn.Linear output); dropout draws nothing: every call gives the same numbers."""
    m = _bn_mlp()
    x = np.random.default_rng(1).normal(size=(6, *IMG)).astype(np.float32)
    post, pre = m.features(x), m.features(x, point="pre_activation")
    h = x.reshape(6, -1).astype(np.float64)
    f64 = lambda v: np.asarray(v[...], np.float64)  # noqa: E731
    for i, (dense, norm) in enumerate(zip(m.hidden, m.norms, strict=True)):
        h = h @ f64(dense.kernel) + f64(dense.bias)
        np.testing.assert_allclose(pre[f"fc{i}"], h, rtol=1e-4, atol=1e-5)
        h = np.maximum((h - f64(norm.mean)) / np.sqrt(f64(norm.var) + 1e-5) * f64(norm.scale) + f64(norm.bias), 0)
        np.testing.assert_allclose(post[f"fc{i}"], h, rtol=1e-4, atol=1e-5)
    logits = h @ f64(m.head.kernel) + f64(m.head.bias)
    np.testing.assert_allclose(m(x), logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(m(x), m(x))
    np.testing.assert_array_equal(m.features(x)["fc1"], post["fc1"])
    # the dense layers start as the plain MLP's of the same seed (BatchNorm's variables are drawn after them)
    plain = models.MLP(IMG, 10, widths=(16, 12), rngs=nnx.Rngs(9))
    for a, b in zip([*m.hidden, m.head], [*plain.hidden, plain.head], strict=True):
        np.testing.assert_array_equal(a.kernel[...], b.kernel[...])


def test_training_mode_uses_the_minibatch_and_draws_dropout():
    """A training step normalises with the minibatch's statistics and moves the running averages by
    momentum 0.9 (PyTorch's 0.1); its dropout depends on the key (the same key: the same logits)."""
    m = _bn_mlp(dropout=0.0)
    x = np.random.default_rng(3).normal(size=(8, *IMG)).astype(np.float32)
    h = x.reshape(8, -1).astype(np.float64) @ np.asarray(m.hidden[0].kernel[...], np.float64) \
        + np.asarray(m.hidden[0].bias[...], np.float64)
    mean0, var0 = np.asarray(m.norms[0].mean[...], np.float64), np.asarray(m.norms[0].var[...], np.float64)
    m.training_logits(x, jax.random.key(0))
    np.testing.assert_allclose(m.norms[0].mean[...], 0.9 * mean0 + 0.1 * h.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.norms[0].var[...], 0.9 * var0 + 0.1 * h.var(0), rtol=1e-4, atol=1e-5)
    d = _bn_mlp(dropout=0.5)
    a, b = d.training_logits(x, jax.random.key(1)), d.training_logits(x, jax.random.key(2))
    assert not np.allclose(a, b)
    d2 = _bn_mlp(dropout=0.5)
    np.testing.assert_array_equal(d2.training_logits(x, jax.random.key(1)), a)


def test_mlp_options_are_checked():
    for bad in (1, "yes", None, 0.0):
        with pytest.raises(ValueError, match=f"batch_norm must be True or False, got {bad!r}"):
            models.MLP(4, 2, batch_norm=bad, rngs=nnx.Rngs(0))
    for bad in (-0.1, 1.0, 1.5, float("nan"), True, "0.1", None):
        with pytest.raises(ValueError, match=r"dropout must be a rate in \[0, 1\), got "):
            models.MLP(4, 2, dropout=bad, rngs=nnx.Rngs(0))
    assert models.MLP(4, 2, batch_norm=np.bool_(True), dropout=np.float32(0.5), rngs=nnx.Rngs(0)).dropout == 0.5


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


@pytest.mark.parametrize("embed,head", [(False, False), (False, True), (True, False)])
def test_bilinear_mlp_without_embed_or_head(embed, head):
    """The grokking shape (no embedding, no head): one bilinear layer d_in -> h -> classes."""
    d_in, n_classes = 6, 4
    model = models.BilinearMLP(d_in, n_classes, d_model=5, d_hidden=3, n_layers=1, residual=False,
                               bias=True, embed=embed, head=head, rngs=nnx.Rngs(1))
    layer = model.layers[0]
    layer.left_bias[...] = jnp.linspace(-1, 1, 3, dtype=jnp.float32)
    layer.down_bias[...] = jnp.linspace(1, 2, layer.down.shape[0], dtype=jnp.float32)
    x = np.random.default_rng(0).normal(size=(4, d_in))
    # float64 NumPy reference
    f = lambda a: np.asarray(a[...], np.float64)
    z = x @ f(model.embed.weight).T + f(model.embed.bias) if embed else x
    z = ((z @ f(layer.left).T + f(layer.left_bias)) * (z @ f(layer.right).T + f(layer.right_bias))) @ f(layer.down).T + f(layer.down_bias)
    if head:
        z = z @ f(model.head.weight).T + f(model.head.bias)
    assert z.shape == (4, n_classes)
    np.testing.assert_allclose(model(jnp.asarray(x, jnp.float32)), z, rtol=1e-4, atol=1e-5)
    net = model.to_network()
    assert len(net) == 1 + embed + head and isinstance(net[0 if not embed else 1], BilinearLayer)
    np.testing.assert_allclose(apply_network(net, x), model(x), rtol=1e-10, atol=1e-10)
    names = model.layer_names()
    assert names == (*(("embed",) if embed else ()), *(("bilinear0",) if head else ()), "logits")
    feats = model.features(x)
    for name in names:
        np.testing.assert_allclose(model.tail(name, feats[name]), feats["logits"], rtol=1e-10, atol=1e-10)


def test_bilinear_mlp_grokking_shape_and_residual_error():
    m = models.BilinearMLP(226, 113, d_hidden=64, n_layers=1, residual=False, embed=False, head=False, rngs=nnx.Rngs(0))
    (layer,) = m.to_network()
    assert layer.left.shape == layer.right.shape == (64, 226) and layer.down.shape == (113, 64)
    with pytest.raises(ValueError, match=r"bilinear0 maps width 226 to 113.*Pass residual=False"):
        models.BilinearMLP(226, 113, n_layers=1, embed=False, head=False, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="head=False needs n_layers >= 1"):
        models.BilinearMLP(4, 3, n_layers=0, head=False, rngs=nnx.Rngs(0))


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
    from funsim.similarity import AttentionNetwork, apply_attention_network

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


def _n_params(model) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize(
    "channels,published",
    # torchvision's ShuffleNet_V2_X1_0_Weights / X0_5 "num_params" (ImageNet head, 3-channel input);
    # GroupNorm has the same two affine parameters per channel as BatchNorm.
    [((116, 232, 464), 2_278_604), ((48, 96, 192), 1_366_792)],
)
def test_shufflenet_matches_the_published_parameter_count(channels, published):
    m = nnx.eval_shape(lambda: models.ShuffleNet((32, 32, 3), 1000, channels=channels, repeats=(4, 8, 4),
                                                 stem_channels=24, final_channels=1024, rngs=nnx.Rngs(0)))
    assert _n_params(m) == published


def _densenet_reference(depth, growth, compression, stem, c_in=3, n_classes=10, hw=32):
    """Parameter count and stage shapes of a CIFAR DenseNet from Huang et al.'s recipe, by hand."""
    n = (depth - 4) // 3
    c, params, shapes = stem, 9 * c_in * stem, {"stem": (hw, hw, stem)}
    for b in range(3):
        for _ in range(n):
            params += 2 * c + 9 * c * growth  # norm (scale, bias) + 3x3 conv, no bias
            c += growth
        shapes[f"dense{b}"] = (hw, hw, c)
        if b < 2:
            out = int(c * compression)
            params += 2 * c + c * out
            c, hw = out, hw // 2
            shapes[f"trans{b}"] = (hw, hw, c)
    params += 2 * c + c * n_classes + n_classes
    shapes.update(pool=(c,), logits=(n_classes,))
    return params, shapes


@pytest.mark.parametrize("compression,stem", [(1.0, 16), (0.5, 24)])
def test_densenet40_structure_against_the_recipe(compression, stem):
    build = lambda: models.DenseNet((32, 32, 3), 10, depth=40, growth=12, compression=compression,
                                    stem_channels=stem, rngs=nnx.Rngs(0))
    params, shapes = _densenet_reference(40, 12, compression, stem)
    assert _n_params(nnx.eval_shape(build)) == params
    # abstractly (building DenseNet-40 eagerly takes a minute on the CPU)
    feats = jax.eval_shape(lambda x: build().features(x), jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32))
    assert {k: v.shape[1:] for k, v in feats.items()} == shapes
    if compression == 1.0:  # Huang et al. 2017, Table 2: DenseNet (L=40, k=12) has 1.0M parameters
        assert round(params / 1e6, 1) == 1.0


def test_densenet_blocks_concatenate_and_shufflenet_passes_half_through():
    model, shape = ZOO["densenet"]
    feats = model.features(_input("densenet", shape))
    # a dense block keeps its input as the first channels of its output
    np.testing.assert_array_equal(feats["dense0"][..., : feats["stem"].shape[-1]], feats["stem"])
    np.testing.assert_array_equal(feats["dense1"][..., : feats["trans0"].shape[-1]], feats["trans0"])
    model, shape = ZOO["shufflenet"]
    feats = model.features(_input("shufflenet", shape))
    # a stride-1 unit leaves the first half of its channels alone; the shuffle puts them at even positions
    z_in, z_out = feats["unit0_0"], feats["unit0_1"]
    np.testing.assert_array_equal(z_out[..., 0::2], z_in[..., : z_in.shape[-1] // 2])


def test_channel_shuffle_against_numpy():
    z = np.random.default_rng(0).normal(size=(2, 3, 3, 12))
    for g in (2, 3, 4):
        # torch semantics on NCHW: view(n, g, C/g, h, w).transpose(1, 2).reshape(n, C, h, w)
        ref = np.moveaxis(np.moveaxis(z, -1, 1).reshape(2, g, 12 // g, 3, 3).swapaxes(1, 2).reshape(2, 12, 3, 3), 1, -1)
        np.testing.assert_array_equal(models.channel_shuffle(jnp.asarray(z), groups=g), ref)
    with pytest.raises(ValueError, match="12 channels are not divisible by groups=5"):
        models.channel_shuffle(jnp.asarray(z), groups=5)


def test_new_architectures_reject_bad_sizes():
    with pytest.raises(ValueError, match="DenseNet depth must be 3n \\+ 4"):
        models.DenseNet(IMG, 10, depth=41, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="compression must be in \\(0, 1\\]"):
        models.DenseNet(IMG, 10, compression=0.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="one even channel count.*channels=\\(8, 15\\)"):
        models.ShuffleNet(IMG, 10, channels=(8, 15), repeats=(1, 1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="strides must give 1 or 2 for each of the 2 blocks"):
        models.MobileNet(IMG, 10, channels=(4, 8), strides=(1,), rngs=nnx.Rngs(0))
    m = models.MobileNet(IMG, 10, channels=(4, 8, 8), stem_channels=4, strides=(1, 1, 2), rngs=nnx.Rngs(0))
    assert m.feature_shapes()["sep1"] == (8, 8, 8) and m.feature_shapes()["sep2"] == (4, 4, 8)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_compiled_model_equals_the_eager_one(name):
    # 5 rows in chunks of 2: two full chunks and a padded one
    model, shape = ZOO[name]
    x = np.asarray(_input(name, shape, n=5))
    fast = models.compiled(model, chunk=2)
    eager = model.features(x)
    got = fast.features(x)
    assert tuple(got) == tuple(eager)
    for k in eager:
        np.testing.assert_allclose(got[k], eager[k], rtol=1e-5, atol=1e-6, err_msg=k)
    as_np = fast.features(x, as_numpy=True)
    assert all(isinstance(v, np.ndarray) and v.shape == eager[k].shape for k, v in as_np.items())
    np.testing.assert_allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
    names = model.layer_names()
    for layer in {names[0], names[len(names) // 2]} - {"logits"}:
        np.testing.assert_allclose(fast.tail(layer, eager[layer]), model.tail(layer, eager[layer]),
                                   rtol=1e-5, atol=1e-6, err_msg=layer)


def test_compiled_model_float64_matches_and_compiles_once_per_architecture():
    from funsim.runtime.compile_count import CompileCounter

    mk = lambda s: models.CNN(IMG, 10, channels=(4, 6), rngs=nnx.Rngs(s))
    x = np.random.default_rng(1).normal(size=(7, *IMG))  # float64 (x64 is on in the tests)
    a = models.compiled(mk(0), chunk=3)
    got = a.features(x, as_numpy=True)
    ref = mk(0).features(x)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-12, atol=1e-13)
    a.tail("conv0", got["conv0"])
    a.features(x)
    with CompileCounter() as c:  # another seed of the same architecture: the same programs
        b = models.compiled(mk(1), chunk=3)
        out = b.features(x, as_numpy=True)
        b.tail("conv0", out["conv0"])
        b.features(x)
    assert c.count == 0
    with pytest.raises(ValueError, match=r"CNN expects x of shape \(n, 8, 8, 1\), got \(7, 8, 9, 1\)"):
        a.features(np.zeros((7, 8, 9, 1)))
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        models.compiled(mk(0), chunk=0)
    with pytest.raises(TypeError, match="needs a Flax NNX model"):
        models.compiled(object())


def test_tail_until_and_the_new_head_tail():
    """tail(layer, z, until=s) is the stage s's output; HeadTail is that, flattened, through a linear head;
    train_head fits a separable coarse task on frozen features."""
    model, shape = ZOO["cnn"]
    x = _input("cnn", shape, n=6)
    feats = model.features(x)
    np.testing.assert_allclose(model.tail("conv0", feats["conv0"], until="pool"), feats["pool"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="comes before"):
        model.tail("pool", feats["pool"], until="conv0")
    assert models.penultimate(model) == "pool" and models.penultimate(ZOO["linear"][0]) is None
    rng = np.random.default_rng(0)
    heads = [{"weight": rng.normal(size=(6, 2)).astype(np.float32), "bias": rng.normal(size=2).astype(np.float32)}
             for _ in range(2)]
    tail, params = models.stack_head_tails([model, model], "conv0", heads)
    out = tail(jax.tree.map(lambda a: a[1], params), feats["conv0"])
    np.testing.assert_allclose(out, np.asarray(feats["pool"]) @ heads[1]["weight"] + heads[1]["bias"], rtol=1e-5,
                               atol=1e-5)
    z = rng.normal(size=(200, 3))
    y = (z[:, 0] + 0.5 * z[:, 1] > 0).astype(int)
    h = models.train_head(z, y, 2, steps=300, learning_rate=0.05)
    assert np.mean(np.argmax(z @ h["weight"] + h["bias"], 1) == y) > 0.97


def test_token_pairs_equal_the_one_hot_model():
    p = 7
    m = models.BilinearMLP(2 * p, p, d_hidden=5, n_layers=1, residual=False, embed=False, head=False, bias=True,
                           rngs=nnx.Rngs(0))
    m.layers[0].left_bias[...] = jnp.linspace(-1, 1, 5, dtype=jnp.float32)
    m.layers[0].down_bias[...] = jnp.linspace(0, 1, p, dtype=jnp.float32)
    tok = modular_addition(p=p, train_fraction=0.5)
    oh = modular_addition(p=p, train_fraction=0.5, onehot=True)
    wrapped = models.TokenPairs(m, p)
    np.testing.assert_allclose(wrapped(tok.x_train), m(oh.x_train), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wrapped(tok.x_test), apply_network(m.to_network(), oh.x_test), rtol=1e-5, atol=1e-5)
    # the same gradients, so training on tokens is training the one-hot model
    loss = lambda model, x: jnp.sum(model(x) ** 2)
    g_tok = nnx.grad(lambda mod: loss(mod, tok.x_train))(wrapped)
    g_oh = nnx.grad(lambda mod: loss(mod, oh.x_train))(m)
    np.testing.assert_allclose(g_tok.model.layers[0].left[...], g_oh.layers[0].left[...], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="TokenPairs needs"):
        models.TokenPairs(models.BilinearMLP(2 * p, p, rngs=nnx.Rngs(0)), p)


def test_token_pairs_name_bad_tokens_and_widths():
    p = 7
    m = models.BilinearMLP(2 * p, p, d_hidden=5, n_layers=1, residual=False, embed=False, head=False, rngs=nnx.Rngs(0))
    wrapped = models.TokenPairs(m, p)
    with pytest.raises(ValueError, match=r"integer pairs \(n, 2\), got shape \(3, 14\)"):
        wrapped(np.zeros((3, 2 * p), np.float32))  # one-hot rows instead of tokens
    with pytest.raises(ValueError, match=r"\[0, p\) = \[0, 7\), got values from 0 to 7"):
        wrapped(np.asarray([[0, 7]]))
    with pytest.raises(ValueError, match="one-hot width 2p = 16"):
        models.TokenPairs(m, 8)
