"""Tests for models.functional: functional similarity of two models' layers.

The models are tiny duck-typed pure-JAX MLPs (tests/_stitch_models.py) trained
by scikit-learn on digits, and one pair of Flax NNX ``models.MLP``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from funsim.models.functional import functional_similarity
from funsim.similarity import fit_stitcher, resize_spatial, stitch_representation
from tests._stitch_models import (  # digits, models: shared module-scoped fixtures
    MLP,
    Bottleneck,
    Rotated,
    digits,  # noqa: F401  (a fixture)
    haar,
    models,  # noqa: F401  (a fixture)
    np_adaptive_pool,
    np_ce_acc,
    split,
)


def test_self_stitch_identity_gives_relative_accuracy_one(models, digits):
    a, _ = models
    res = functional_similarity(a, "h1", a, "h1", split(digits), family="orthogonal",
                                init="identity", steps=50, both_directions=False, progress=False)
    r = res.a_to_b
    assert abs(r.relative_accuracy - 1.0) <= 0.01
    assert abs(r.ce_gap) <= 0.05
    assert r.own_accuracy > 0.85  # the model is actually trained
    assert np.max(r.history.constraint_error) <= 1e-10  # float64: exact to rounding


def test_rotated_copy_is_recovered_by_orthogonal(models, digits):
    a, _ = models
    q = jnp.asarray(haar(32, 3))
    res = functional_similarity(a, "h1", Rotated(a, q), "h1", split(digits),
                                family="orthogonal", steps=50, progress=False)
    for r in (res.a_to_b, res.b_to_a):
        assert r.relative_accuracy >= 0.99
        assert abs(r.ce_gap) <= 0.03  # training nudges the exact start towards the train set
        assert np.max(r.history.constraint_error) <= 1e-10
    # the closed-form start is Q itself (training then moves it only slightly)
    h1 = np.asarray(a.features(split(digits)[0][0])["h1"])
    w0 = fit_stitcher(h1, h1 @ np.asarray(q), family="orthogonal", normalise=False).weight
    np.testing.assert_allclose(w0, q, atol=1e-8)


@pytest.mark.slow
def test_rotated_copy_recovered_by_training_from_identity(models, digits):
    """No closed-form help: gradient steps on the Cayley parametrisation find the rotation."""
    a, _ = models
    q = haar(32, 4)
    q[:, 0] *= np.sign(np.linalg.det(q))  # det +1: reachable from the identity
    res = functional_similarity(a, "h1", Rotated(a, jnp.asarray(q)), "h1", split(digits),
                                family="orthogonal", init="identity", steps=300,
                                both_directions=False, learning_rate=5e-2, progress=False)
    assert res.a_to_b.relative_accuracy >= 0.97
    assert res.b_to_a is None


def test_asymmetric_pair_lossy_projection(models, digits):
    a, _ = models
    proj = jnp.asarray(haar(32, 5)[:, :2])
    b = Bottleneck(a, proj)
    res = functional_similarity(a, "h1", b, "p", split(digits), family="affine", steps=100,
                                progress=False)
    # A -> B: B's layer is a linear function of A's, so the affine stitcher does B's task
    # at least as well as B's own layer (trained on the task, it can even beat B's fixed P).
    assert res.a_to_b.relative_accuracy >= 0.98
    assert res.a_to_b.ce_gap <= 0.05
    # B -> A: two dimensions cannot carry what A's 32-dim layer gives A's tail.
    assert res.b_to_a.relative_accuracy <= 0.8
    assert res.b_to_a.ce_gap >= 0.3
    assert res.accuracy_asymmetry >= 0.2 and res.ce_asymmetry >= 0.3
    text = str(res)
    assert "A:h1 -> B:p" in text and "B:p -> A:h1" in text and "asymmetry" in text


def test_reported_numbers_are_held_out(models, digits):
    a, b = models
    (x_tr, y_tr), (x_te, y_te) = split(digits)
    res = functional_similarity(a, "h2", b, "h2", ((x_tr, y_tr), (x_te, y_te)),
                                family="affine", steps=100, both_directions=False, progress=False)
    with pytest.raises(ValueError, match="both_directions=True"):
        res.accuracy_asymmetry
    r = res.a_to_b
    st = r.stitcher
    logits_te = b.tail("h2", a.features(x_te)["h2"] @ st.weight * st.scale + st.bias[None, :])
    ce_te, acc_te = np_ce_acc(logits_te, y_te)
    own_ce, own_acc = np_ce_acc(b.tail("h2", b.features(x_te)["h2"]), y_te)
    np.testing.assert_allclose([r.stitched_ce, r.stitched_accuracy], [ce_te, acc_te], rtol=1e-10)
    np.testing.assert_allclose([r.own_ce, r.own_accuracy], [own_ce, own_acc], rtol=1e-10)
    np.testing.assert_allclose(r.ce_gap, ce_te - own_ce, rtol=1e-10)
    np.testing.assert_allclose(r.relative_accuracy, acc_te / own_acc, rtol=1e-10)
    # In-sample differs (it is optimistic) and is not what is reported.
    logits_tr = b.tail("h2", a.features(x_tr)["h2"] @ st.weight * st.scale + st.bias[None, :])
    ce_tr, _ = np_ce_acc(logits_tr, y_tr)
    np.testing.assert_allclose(r.train_stitched_ce, ce_tr, rtol=1e-10)
    assert r.train_stitched_ce < r.stitched_ce - 1e-3
    assert r.n_train == 1200 and r.n_eval == len(y_te)


def test_early_stopping_never_touches_the_test_split(models, digits):
    """Early stopping selects on a validation split carved from train; test rows stay unseen."""
    a, b = models
    (x_tr, y_tr), (x_te, y_te) = split(digits)
    data = ((x_tr[:400], y_tr[:400]), (x_te, y_te))
    res = functional_similarity(a, "h2", b, "h2", data, family="affine", steps=200,
                                early_stopping=2, eval_every=20, val_fraction=0.25,
                                both_directions=False, progress=False)
    r = res.a_to_b
    assert r.n_train == 300 and r.n_eval == len(y_te)  # 100 of the 400 train rows validate
    assert len(r.history.eval_steps) == 11 and int(r.history.best_step) % 20 == 0


# ---------------------------------------------------------------------------
# Convolutional maps
# ---------------------------------------------------------------------------


class ConvToy:
    """A "conv model": layer c is the NHWC input itself (A) or pooled and mixed (B)."""

    def __init__(self, mix=None, head=None):
        self.mix, self.head = mix, head

    def layer_names(self):
        return ("c",)

    def features(self, x):
        x = jnp.asarray(x)
        if self.mix is None:
            return {"c": x}
        return {"c": jnp.einsum("nhwc,cd->nhwd", resize_spatial(x, size=(4, 4)), self.mix)}

    def tail(self, layer, z):
        return jnp.tanh(z).mean(axis=(1, 2)) @ self.head


def test_conv_stitching_with_spatial_mismatch():
    rng = np.random.default_rng(6)
    k = rng.integers(0, 3, 300)
    x = 2.0 * np.eye(3)[k][:, None, None, :] + 0.5 * rng.normal(size=(300, 8, 8, 3))
    mix = jnp.asarray(haar(5, 6)[:3] * 1.5)  # (3, 5): B's layer is pooled input mixed to 5 ch.
    b = ConvToy(mix, 4.0 * mix.T)
    y = np.asarray(jnp.argmax(b.tail("c", b.features(x)["c"]), axis=1))
    a = ConvToy(head=4.0 * jnp.eye(3))
    # B's 5 channels have rank 3: the default small ridge keeps the B -> A affine init finite.
    res = functional_similarity(a, "c", b, "c", (x, y), family="affine", steps=30, progress=False)
    assert res.a_to_b.own_accuracy == 1.0 and res.b_to_a.own_accuracy > 0.95
    assert res.a_to_b.relative_accuracy >= 0.99
    # 8x8 -> 4x4 pooling then a 1x1 conv recovers B's layer: the closed-form start is `mix`
    s0 = fit_stitcher(resize_spatial(x, size=(4, 4)).reshape(-1, 3),
                      b.features(x)["c"].reshape(-1, 5), family="affine")
    np.testing.assert_allclose(s0.weight, mix, atol=1e-8)
    np.testing.assert_allclose(s0.bias, 0, atol=1e-8)
    assert res.b_to_a.stitcher.weight.shape == (5, 3)  # upsampled 4x4 -> 8x8, 5 -> 3 channels
    assert res.b_to_a.relative_accuracy >= 0.95
    # the 1x1 conv equals a per-pixel dense map after pooling
    st = res.a_to_b.stitcher
    ref = (np.einsum("nhwc,cd->nhwd", np_adaptive_pool(x[:5], (4, 4)), np.asarray(st.weight))
           * float(st.scale) + np.asarray(st.bias))
    np.testing.assert_allclose(stitch_representation(st, x[:5], spatial=(4, 4)), ref, atol=1e-10)


# ---------------------------------------------------------------------------
# Bad input; a real Flax model
# ---------------------------------------------------------------------------


def test_bad_input_functional_similarity(models, digits):
    a, b = models
    x, y = digits
    msg = r"layer_a='h3' is not a layer of model_a; its layers are: 'h1', 'h2'"
    with pytest.raises(ValueError, match=msg):
        functional_similarity(a, "h3", b, "h1", (x, y), progress=False)
    with pytest.raises(ValueError, match=r"layer_b='out'.*'h1', 'h2'"):
        functional_similarity(a, "h1", b, "out", (x, y), progress=False)
    with pytest.raises(ValueError, match=r"labels must be 1-D"):
        functional_similarity(a, "h1", b, "h1", (x, y[:, None]), progress=False)
    with pytest.raises(ValueError, match=r"same n as the labels"):
        functional_similarity(a, "h1", b, "h1", (x[:-3], y), progress=False)
    with pytest.raises(ValueError, match=r"Only 9 held-out samples, fewer than min_eval_samples=20"):
        functional_similarity(a, "h1", b, "h1", (x[:90], y[:90]), test_fraction=0.1, progress=False)
    five = MLP([a.p[0], a.p[1], (a.p[2][0][:, :5], a.p[2][1][:5])])
    with pytest.raises(ValueError, match=r"same label set.*\(\d+, 10\) and \(\d+, 5\)"):
        functional_similarity(a, "h1", five, "h1", (x, y), progress=False)
    with pytest.raises(TypeError, match=r"no callable \.features"):
        functional_similarity(a, "h1", object(), "h1", (x, y), progress=False)
    with pytest.raises(ValueError, match=r"Unknown family 'orthogonl'.*'orthogonal'"):
        functional_similarity(a, "h1", b, "h1", (x, y), family="orthogonl", progress=False)
    with pytest.raises(TypeError, match=r"data must be \(x, y\)"):
        functional_similarity(a, "h1", b, "h1", x, progress=False)


def test_with_a_flax_models_mlp(digits):
    """A real `models` network (Flax NNX): its tail is split into graphdef + state and traced."""
    from flax import nnx

    from funsim.models import MLP as NnxMLP

    a = NnxMLP(64, 10, widths=(16,), rngs=nnx.Rngs(0))
    b = NnxMLP(64, 10, widths=(16,), rngs=nnx.Rngs(1))
    x, y = digits[0][:400].astype(np.float32), digits[1][:400]
    data = ((x[:300], y[:300]), (x[300:], y[300:]))
    # zero learning rate: the returned stitcher is its closed-form start, checked independently
    res = functional_similarity(a, "fc0", b, "fc0", data, family="scaled_orthogonal", steps=2,
                                optimizer="sgd", learning_rate=0.0, both_directions=False,
                                progress=False)
    r = res.a_to_b
    assert r.n_eval == 100 and np.isfinite([r.stitched_ce, r.own_ce]).all()
    za, zb = a.features(jnp.asarray(x[:300]))["fc0"], b.features(jnp.asarray(x[:300]))["fc0"]
    ref = fit_stitcher(za, zb, family="scaled_orthogonal", normalise=False)
    np.testing.assert_allclose(r.stitcher.weight, ref.weight, atol=1e-5)
    np.testing.assert_allclose(r.stitcher.scale, ref.scale, rtol=1e-5)
    logits = b.tail("fc0", stitch_representation(r.stitcher, a.features(jnp.asarray(x[300:]))["fc0"]))
    np.testing.assert_allclose(r.stitched_ce, np_ce_acc(logits, y[300:])[0], rtol=1e-5)
