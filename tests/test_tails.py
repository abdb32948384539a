"""Tests for models.tails: a model's rest of network as a hashable pure function plus parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from funsim.models import CNN, MLP, split_tail, stack_tails


def test_split_tail_equals_model_tail_and_is_equal_across_seeds():
    x = jax.random.normal(jax.random.key(0), (5, 8, 8, 1))
    for make, layer in ((lambda s: MLP((8, 8, 1), 4, widths=(6, 5), rngs=nnx.Rngs(s)), "fc0"),
                        (lambda s: CNN((8, 8, 1), 4, channels=(3, 2), rngs=nnx.Rngs(s)), "conv0")):
        a, b = make(0), make(1)
        (fa, pa), (fb, pb) = split_tail(a, layer), split_tail(b, layer)
        assert fa == fb and hash(fa) == hash(fb)  # one architecture: one compiled program
        h = a.features(x)[layer]
        np.testing.assert_allclose(fa(pa, h), a.tail(layer, h), rtol=1e-6)
        np.testing.assert_allclose(jax.jit(fb)(pb, h), b.tail(layer, h), rtol=1e-6)
        assert not np.allclose(fa(pa, h), fa(pb, h))  # the parameters are data, not baked in
    other = split_tail(MLP((8, 8, 1), 4, widths=(6, 5), rngs=nnx.Rngs(0)), "fc1")[0]
    assert other != split_tail(MLP((8, 8, 1), 4, widths=(6, 5), rngs=nnx.Rngs(0)), "fc0")[0]
    assert split_tail(MLP((8, 8, 1), 4, widths=(6, 7), rngs=nnx.Rngs(0)), "fc1")[0] != other


def test_stack_tails_stacks_parameters_on_a_leading_axis():
    models = [MLP(6, 3, widths=(4,), rngs=nnx.Rngs(s)) for s in range(3)]
    f, stacked = stack_tails(models, "fc0")
    h = jax.random.normal(jax.random.key(1), (7, 4))
    out = jax.vmap(f, in_axes=(0, None))(stacked, h)
    assert out.shape == (3, 7, 3)
    for m, model in enumerate(models):
        np.testing.assert_allclose(out[m], model.tail("fc0", h), rtol=1e-6)
    with pytest.raises(ValueError, match="same architecture"):
        stack_tails([models[0], MLP(6, 3, widths=(5,), rngs=nnx.Rngs(0))], "fc0")


def test_stack_tails_of_batch_norm_mlps_use_each_models_running_averages():
    """BatchNorm MLPs stack with their running averages (different per model, from a training-mode call
    on different data); the stacked tail is each model's evaluation-mode tail, so it draws no dropout."""
    models = [MLP(6, 3, widths=(5, 4), batch_norm=True, dropout=0.5, rngs=nnx.Rngs(s)) for s in range(3)]
    for s, m in enumerate(models):
        m.training_logits(jax.random.normal(jax.random.key(10 + s), (16, 6), jnp.float32) * (s + 1), jax.random.key(s))
    f, stacked = stack_tails(models, "fc0")
    h = jax.random.normal(jax.random.key(1), (7, 5))
    with jax.default_matmul_precision("highest"):  # two programs of one float32 network (on a GPU: not TF32)
        out = jax.jit(jax.vmap(f, in_axes=(0, None)))(stacked, h)
        for m, model in enumerate(models):
            assert not np.allclose(model.norms[1].mean[...], 0)
            np.testing.assert_allclose(out[m], model.tail("fc0", h), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out, jax.jit(jax.vmap(f, in_axes=(0, None)))(stacked, h))


class _Duck:
    def layer_names(self):
        return ("h",)

    def tail(self, layer, z):
        return 2.0 * z


def test_split_tail_of_a_duck_typed_model_and_bad_input():
    d = _Duck()
    f, p = split_tail(d, "h")
    assert p == () and f == split_tail(d, "h")[0] and f != split_tail(_Duck(), "h")[0]
    np.testing.assert_allclose(f(p, jnp.ones((2, 3))), 2.0 * np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"layer='x' is not a layer of the model; its layers are: 'h'"):
        split_tail(d, "x")
    with pytest.raises(TypeError, match=r"must have \.tail"):
        split_tail(object(), "h")
    with pytest.raises(ValueError, match="Flax NNX models"):
        stack_tails([d, d], "h")
