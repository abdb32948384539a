"""Tests for similarity.task_stitching: task-loss stitching and functional similarity.

The models are tiny duck-typed pure-JAX MLPs (features / tail / layer_names)
trained for a few hundred full-batch Adam steps on scikit-learn's digits.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.special
from jax.test_util import check_grads
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

from similarity import (
    Stitcher,
    fit_stitcher,
    functional_similarity,
    resize_spatial,
    stitch_representation,
    stitching_loss,
    train_stitcher,
    train_stitchers,
)
from similarity.task_stitching import _complete_orthogonal, _objective


# ---------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------


def _dense(x, w, b):
    return x @ w + b[None, :]


class MLP:
    """64 -> 32 (tanh) -> 16 (tanh) -> 10, as a duck-typed funsim model."""

    def __init__(self, params):
        self.p = params

    def layer_names(self):
        return ("h1", "h2")

    def features(self, x):
        h1 = jnp.tanh(_dense(jnp.asarray(x), *self.p[0]))
        h2 = jnp.tanh(_dense(h1, *self.p[1]))
        return {"h1": h1, "h2": h2}

    def tail(self, layer, z):
        if layer == "h1":
            z = jnp.tanh(_dense(z, *self.p[1]))
        return _dense(z, *self.p[2])


class Rotated(MLP):
    """The same function with layer h1 rotated: h1' = h1 @ q, tail(h1') = tail(h1' @ q^T)."""

    def __init__(self, base, q):
        super().__init__(base.p)
        self.base, self.q = base, q

    def features(self, x):
        f = self.base.features(x)
        return {"h1": f["h1"] @ self.q, "h2": f["h2"]}

    def tail(self, layer, z):
        return self.base.tail(layer, z @ self.q.T if layer == "h1" else z)


class Bottleneck:
    """Model B whose only layer is a lossy projection of A's h1: p = h1 @ P, P (32, 2)."""

    def __init__(self, base, proj):
        self.base, self.proj = base, proj

    def layer_names(self):
        return ("p",)

    def features(self, x):
        return {"p": self.base.features(x)["h1"] @ self.proj}

    def tail(self, layer, z):
        return self.base.tail("h1", z @ self.proj.T)


def _train_mlp(x, y, seed):
    """64 -> 32 -> 16 -> 10 tanh MLP trained by scikit-learn (NumPy: nothing to compile)."""
    clf = MLPClassifier((32, 16), activation="tanh", max_iter=200, random_state=seed, tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: we want a fixed budget
        clf.fit(x, y)
    return MLP([(jnp.asarray(w), jnp.asarray(b)) for w, b in zip(clf.coefs_, clf.intercepts_)])


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float64)
    y = d.target.astype(np.int32)
    return x, y


@pytest.fixture(scope="module")
def models(digits):
    x, y = digits
    return _train_mlp(x[:1200], y[:1200], 0), _train_mlp(x[:1200], y[:1200], 1)


def _split(digits):
    x, y = digits
    return (x[:1200], y[:1200]), (x[1200:], y[1200:])


def _haar(n, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def _np_ce_acc(logits, y):
    logits = np.asarray(logits, np.float64)
    logp = logits - scipy.special.logsumexp(logits, axis=1, keepdims=True)
    return -logp[np.arange(len(y)), y].mean(), (logits.argmax(1) == y).mean()


# ---------------------------------------------------------------------------
# Functional similarity on trained models
# ---------------------------------------------------------------------------


def test_self_stitch_identity_gives_relative_accuracy_one(models, digits):
    a, _ = models
    res = functional_similarity(a, "h1", a, "h1", _split(digits), family="orthogonal",
                                init="identity", steps=50, both_directions=False, progress=False)
    r = res.a_to_b
    assert abs(r.relative_accuracy - 1.0) <= 0.01
    assert abs(r.ce_gap) <= 0.05
    assert r.own_accuracy > 0.85  # the model is actually trained
    assert np.max(r.history.constraint_error) <= 1e-10  # float64: exact to rounding


def test_rotated_copy_is_recovered_by_orthogonal(models, digits):
    a, _ = models
    q = jnp.asarray(_haar(32, 3))
    res = functional_similarity(a, "h1", Rotated(a, q), "h1", _split(digits),
                                family="orthogonal", steps=50, progress=False)
    for r in (res.a_to_b, res.b_to_a):
        assert r.relative_accuracy >= 0.99
        assert abs(r.ce_gap) <= 0.03  # training nudges the exact start towards the train set
        assert np.max(r.history.constraint_error) <= 1e-10
    # the closed-form start is Q itself (training then moves it only slightly)
    h1 = np.asarray(a.features(_split(digits)[0][0])["h1"])
    w0 = fit_stitcher(h1, h1 @ np.asarray(q), family="orthogonal", normalize=False).weight
    np.testing.assert_allclose(w0, q, atol=1e-8)


@pytest.mark.slow
def test_rotated_copy_recovered_by_training_from_identity(models, digits):
    """No closed-form help: gradient steps on the Cayley parametrisation find the rotation."""
    a, _ = models
    q = _haar(32, 4)
    q[:, 0] *= np.sign(np.linalg.det(q))  # det +1: reachable from the identity
    res = functional_similarity(a, "h1", Rotated(a, jnp.asarray(q)), "h1", _split(digits),
                                family="orthogonal", init="identity", steps=300,
                                both_directions=False, optimizer=optax.adam(5e-2), progress=False)
    assert res.a_to_b.relative_accuracy >= 0.97
    assert res.b_to_a is None


def test_asymmetric_pair_lossy_projection(models, digits):
    a, _ = models
    proj = jnp.asarray(_haar(32, 5)[:, :2])
    b = Bottleneck(a, proj)
    res = functional_similarity(a, "h1", b, "p", _split(digits), family="affine", steps=100,
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
    (x_tr, y_tr), (x_te, y_te) = _split(digits)
    res = functional_similarity(a, "h2", b, "h2", ((x_tr, y_tr), (x_te, y_te)),
                                family="affine", steps=100, both_directions=False, progress=False)
    with pytest.raises(ValueError, match="both_directions=True"):
        res.accuracy_asymmetry
    r = res.a_to_b
    st = r.stitcher
    logits_te = b.tail("h2", a.features(x_te)["h2"] @ st.weight * st.scale + st.bias[None, :])
    ce_te, acc_te = _np_ce_acc(logits_te, y_te)
    own_ce, own_acc = _np_ce_acc(b.tail("h2", b.features(x_te)["h2"]), y_te)
    np.testing.assert_allclose([r.stitched_ce, r.stitched_accuracy], [ce_te, acc_te], rtol=1e-10)
    np.testing.assert_allclose([r.own_ce, r.own_accuracy], [own_ce, own_acc], rtol=1e-10)
    np.testing.assert_allclose(r.ce_gap, ce_te - own_ce, rtol=1e-10)
    np.testing.assert_allclose(r.relative_accuracy, acc_te / own_acc, rtol=1e-10)
    # In-sample differs (it is optimistic) and is not what is reported.
    logits_tr = b.tail("h2", a.features(x_tr)["h2"] @ st.weight * st.scale + st.bias[None, :])
    ce_tr, _ = _np_ce_acc(logits_tr, y_tr)
    np.testing.assert_allclose(r.train_stitched_ce, ce_tr, rtol=1e-10)
    assert r.train_stitched_ce < r.stitched_ce - 1e-3
    assert r.n_train == 1200 and r.n_eval == len(y_te)


def test_nested_families_monotone_seed_averaged(models, digits):
    """Train CE (the objective) averaged over 3 minibatch seeds: affine <= scaled <= orthogonal.

    Tolerance 0.02 nats: each fit is a finite number of stochastic steps, so
    monotonicity holds up to optimisation error; 0.02 nats is ~10x the seed
    spread seen here and far below the gaps between the families (> 0.1 nats).
    """
    a, b = models
    (x_tr, y_tr), _ = _split(digits)
    x_tr, y_tr = x_tr[:600], y_tr[:600]
    za, zb = a.features(x_tr)["h1"], b.features(x_tr)["h1"]
    tail = functools.partial(b.tail, "h1")
    fams = ["orthogonal", "scaled_orthogonal", "affine"] * 3
    keys = jax.random.split(jax.random.key(11), 9)
    sts, _ = train_stitchers([za] * 9, y_tr, tail, families=fams, z_tgt=zb, steps=100,
                             batch_size=128, keys=keys, progress=False)
    loss = jax.jit(lambda s: stitching_loss(s, za, y_tr, tail))
    ce = np.array([float(loss(s)) for s in sts]).reshape(3, 3).mean(0)
    assert ce[2] <= ce[1] + 0.02 and ce[1] <= ce[0] + 0.02, ce


# ---------------------------------------------------------------------------
# Training machinery
# ---------------------------------------------------------------------------


def test_vmapped_batch_equals_one_by_one(models, digits):
    a, b = models
    (x_tr, y_tr), (x_te, y_te) = _split(digits)
    x_tr, y_tr = x_tr[:400], y_tr[:400]
    fa = a.features(x_tr)
    srcs = [fa["h1"], fa["h1"][:, :8]]  # widths 32 (tall) and 8 (wide) into 16
    fams = ["orthogonal", "scaled_orthogonal"]
    zt = b.features(x_tr)["h2"]
    tail = functools.partial(b.tail, "h2")
    keys = jax.random.split(jax.random.key(5), 2)
    kw = dict(z_tgt=zt, steps=60, batch_size=64, eval_every=25, progress=False)
    for init in ("closed_form", "random"):
        sts, hists = train_stitchers(srcs, y_tr, tail, families=fams, keys=keys, init=init, **kw)
        for src, fam, k, s, h in zip(srcs, fams, keys, sts, hists):
            s1, h1 = train_stitcher(src, y_tr, tail, family=fam, key=k, init=init, **kw)
            assert s.weight.shape == (src.shape[1], 16) and s.family == fam
            np.testing.assert_allclose(s.weight, s1.weight, atol=1e-9)
            np.testing.assert_allclose(s.bias, s1.bias, atol=1e-9)
            np.testing.assert_allclose(s.scale, s1.scale, atol=1e-9)
            np.testing.assert_allclose(h.train_loss, h1.train_loss, atol=1e-9)
            assert h.train_loss.shape == (60,)


def test_orthogonality_exact_at_every_step_float32():
    """Far from the start (Adam, lr 0.2), tall (24 -> 16) and wide (8 -> 16) maps, in float32."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(128, 24)).astype(np.float32)
    srcs = [z, z, z[:, :8], z[:, :8]]
    fams = ["orthogonal", "scaled_orthogonal"] * 2
    y = jnp.asarray(rng.integers(0, 3, 128))
    head = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    tail = lambda h: h @ head  # noqa: E731
    sts, hists = train_stitchers(srcs, y, tail, families=fams, init="random", target_shape=(16,),
                                 steps=120, optimizer=optax.adam(0.2), key=jax.random.key(1),
                                 progress=False)
    for s, h, src in zip(sts, hists, srcs):
        assert s.weight.dtype == jnp.float32
        assert h.constraint_error.shape == (120,)
        assert np.max(h.constraint_error) <= 1e-5
        w = np.asarray(s.weight, np.float64)
        gram = w.T @ w if src.shape[1] >= 16 else w @ w.T
        np.testing.assert_allclose(gram, np.eye(min(src.shape[1], 16)), atol=1e-5)
        assert h.train_loss[-1] < 0.8 * h.train_loss[0]  # it moved far from the start
    assert float(sts[1].scale) > 0 and float(sts[1].scale) != 1.0


def test_gradients_of_stitching_loss():
    rng = np.random.default_rng(1)
    z = jnp.asarray(rng.normal(size=(12, 4)))
    y = jnp.asarray(rng.integers(0, 3, 12))
    head = jnp.asarray(rng.normal(size=(5, 3)))
    tail = lambda h: jnp.tanh(h) @ head  # noqa: E731
    w, bias, scale = jnp.asarray(rng.normal(size=(4, 5))), jnp.asarray(rng.normal(size=5)), jnp.asarray(0.7)
    f = jax.jit(lambda w, b, s: stitching_loss(Stitcher(w, b, s, "affine"), z, y, tail))
    check_grads(f, (w, bias, scale), order=1, modes=("fwd", "rev"))
    teacher = jnp.asarray(rng.normal(size=(12, 3)))
    g = jax.jit(lambda w, b, s: stitching_loss(Stitcher(w, b, s, "affine"), z, y, tail,
                                               loss="kl", teacher_logits=teacher))
    check_grads(g, (w, bias, scale), order=1, modes=("fwd", "rev"))
    # Through the exact-orthogonality (Cayley) parametrisation.
    m = 5
    consts = dict(base=jnp.asarray(_haar(m, 2)), mask=jnp.ones((m, m)), code=jnp.asarray(1))
    p0 = dict(gen=jnp.asarray(0.3 * rng.normal(size=(m, m))), log_scale=jnp.asarray(0.2),
              weight=jnp.zeros((4, 5)), bias=jnp.asarray(rng.normal(size=5)))
    obj = jax.jit(lambda p: _objective(p, consts, z, y, None, tail_fn=tail,  # noqa: E731
                                       family="scaled_orthogonal", loss="ce", d_tgt=5)[0])
    check_grads(obj, (p0,), order=1, modes=("fwd", "rev"))


def test_kl_loss_self_stitch_stays_at_identity(models, digits):
    a, _ = models
    x = jnp.asarray(digits[0][:300])
    z = a.features(x)["h2"]
    tail = functools.partial(a.tail, "h2")
    s, hist = train_stitcher(z, digits[1][:300], tail, family="affine", init="identity",
                             target_shape=(16,), loss="kl", teacher_logits=tail(z), steps=30,
                             optimizer=optax.sgd(0.5), progress=False)
    # KL of a model to itself is 0 and the identity is a stationary point (plain SGD keeps it;
    # Adam would normalise the rounding-level gradient into lr-sized steps).
    assert abs(hist.train_loss[0]) < 1e-12
    np.testing.assert_allclose(s.weight, np.eye(16), atol=1e-5)
    np.testing.assert_allclose(s.bias, 0, atol=1e-5)


def test_early_stopping_returns_best_held_out_params():
    rng = np.random.default_rng(2)
    z_tr, z_ev = jnp.asarray(rng.normal(size=(20, 30))), jnp.asarray(rng.normal(size=(50, 30)))
    y_tr, y_ev = jnp.asarray(rng.integers(0, 4, 20)), jnp.asarray(rng.integers(0, 4, 50))
    head = jnp.asarray(rng.normal(size=(30, 4)))
    tail = lambda h: h @ head  # noqa: E731
    s, hist = train_stitcher(z_tr, y_tr, tail, family="affine", init="random",
                             target_shape=(30,), steps=1000, eval_every=10,
                             eval_data=(z_ev, y_ev), early_stopping=3,
                             optimizer=optax.adam(0.05), key=jax.random.key(0), progress=False)
    assert hist.stopped_early and len(hist.train_loss) < 1000
    best = int(np.argmin(hist.eval_loss))
    assert hist.best_step == hist.eval_steps[best]
    np.testing.assert_allclose(stitching_loss(s, z_ev, y_ev, tail), hist.eval_loss[best], rtol=1e-10)


def test_float32_and_jit_vmap_of_public_functions():
    rng = np.random.default_rng(3)
    z = jnp.asarray(rng.normal(size=(10, 3)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 2, 10))
    tail = lambda h: h[:, :2]  # noqa: E731
    s = Stitcher(jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), jnp.ones(4, jnp.float32),
                 jnp.asarray(1.5, jnp.float32), "affine")
    out = stitch_representation(s, z)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, 1.5 * np.asarray(z) @ np.asarray(s.weight) + 1, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(stitch_representation)(s, z), out, rtol=1e-6)
    f = lambda st: stitching_loss(st, z, y, tail)  # noqa: E731
    np.testing.assert_allclose(jax.jit(f)(s), f(s), rtol=1e-6)
    batch = jax.tree.map(lambda *a: jnp.stack(a), s, s)
    np.testing.assert_allclose(jax.vmap(lambda st: stitch_representation(st, z))(batch),
                               np.stack([out, out]), rtol=1e-6)


def test_complete_orthogonal_blocks():
    q = _haar(6, 1)
    for blk in (q[:, :4], q[:4, :]):  # orthonormal columns, orthonormal rows
        full = _complete_orthogonal(blk)
        np.testing.assert_allclose(full @ full.T, np.eye(6), atol=1e-12)
        np.testing.assert_allclose(full[: blk.shape[0], : blk.shape[1]], blk, atol=1e-12)


def test_closed_form_init_is_fit_stitcher(models, digits):
    """With steps=1 and a zero learning rate the trained stitcher is the closed-form start."""
    a, b = models
    x = jnp.asarray(digits[0][:300])
    za, zb = a.features(x)["h1"], b.features(x)["h2"]
    sts, _ = train_stitchers([za] * 3, digits[1][:300], functools.partial(b.tail, "h2"),
                             families=["orthogonal", "scaled_orthogonal", "affine"], z_tgt=zb,
                             steps=1, optimizer=optax.sgd(0.0), progress=False)
    for s in sts:
        affine = s.family == "affine"
        ref = fit_stitcher(za, zb, family=s.family, ridge=1e-6 if affine else 0.0, normalize=affine)
        np.testing.assert_allclose(s.weight, ref.weight, atol=1e-10)
        np.testing.assert_allclose(s.bias, ref.bias, atol=1e-10)
        np.testing.assert_allclose(s.scale, ref.scale, atol=1e-10)
    assert float(sts[0].scale) == 1.0


# ---------------------------------------------------------------------------
# Convolutional maps
# ---------------------------------------------------------------------------


def _np_adaptive_pool(z, size):
    n, h, w, c = z.shape
    out = np.zeros((n, size[0], size[1], c))
    for i in range(size[0]):
        h0, h1 = (i * h) // size[0], int(np.ceil((i + 1) * h / size[0]))
        for j in range(size[1]):
            w0, w1 = (j * w) // size[1], int(np.ceil((j + 1) * w / size[1]))
            out[:, i, j] = z[:, h0:h1, w0:w1].mean(axis=(1, 2))
    return out


@pytest.mark.parametrize("shape,size", [((2, 8, 6, 3), (4, 3)), ((2, 7, 5, 2), (3, 2)),
                                        ((1, 2, 3, 2), (4, 5)), ((1, 4, 4, 1), (4, 4))])
def test_resize_spatial_matches_adaptive_pool_reference(shape, size):
    z = np.random.default_rng(0).normal(size=shape)
    np.testing.assert_allclose(resize_spatial(z, size=size), _np_adaptive_pool(z, size), atol=1e-12)


def test_resize_spatial_integer_ratio_is_block_mean():
    z = np.random.default_rng(1).normal(size=(2, 8, 6, 3))
    ref = z.reshape(2, 4, 2, 3, 2, 3).mean(axis=(2, 4))
    np.testing.assert_allclose(resize_spatial(z, size=(4, 3)), ref, atol=1e-12)


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
    mix = jnp.asarray(_haar(5, 6)[:3] * 1.5)  # (3, 5): B's layer is pooled input mixed to 5 ch.
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
    ref = (np.einsum("nhwc,cd->nhwd", _np_adaptive_pool(x[:5], (4, 4)), np.asarray(st.weight))
           * float(st.scale) + np.asarray(st.bias))
    np.testing.assert_allclose(stitch_representation(st, x[:5], spatial=(4, 4)), ref, atol=1e-10)


# ---------------------------------------------------------------------------
# Bad input
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


def test_bad_input_train_stitcher():
    z = jnp.ones((10, 3))
    y = jnp.zeros(10, jnp.int32)
    tail = lambda h: h  # noqa: E731
    with pytest.raises(ValueError, match=r"init='closed_form' needs z_tgt"):
        train_stitcher(z, y, tail, progress=False)
    with pytest.raises(ValueError, match=r"Pass z_tgt .* or target_shape"):
        train_stitcher(z, y, tail, init="identity", progress=False)
    with pytest.raises(ValueError, match=r'loss="kl" needs teacher_logits'):
        train_stitcher(z, y, tail, init="identity", target_shape=(3,), loss="kl", progress=False)
    with pytest.raises(ValueError, match=r"z_srcs_train\[0\] has 9 samples .* labels have 10"):
        train_stitcher(z[:9], y, tail, init="identity", target_shape=(3,), progress=False)
    with pytest.raises(ValueError, match=r"conv target needs an NHWC source"):
        train_stitcher(z, y, tail, init="identity", target_shape=(2, 2, 3), progress=False)
    with pytest.raises(ValueError, match=r"y_train has labels in \[0, 5\], outside \[0, 3\)"):
        train_stitcher(z, jnp.arange(10) % 6, tail, init="identity", target_shape=(3,),
                       progress=False)
    with pytest.raises(ValueError, match=r"tail_fn must map target activations"):
        train_stitcher(z, y, lambda h: h[:, 0], init="identity", target_shape=(3,), progress=False)
    with pytest.raises(ValueError, match=r"early_stopping needs eval_data"):
        train_stitcher(z, y, tail, init="identity", target_shape=(3,), early_stopping=2,
                       progress=False)
    with pytest.raises(ValueError, match=r"Unknown init 'eye'"):
        train_stitcher(z, y, tail, init="eye", target_shape=(3,), progress=False)
    with pytest.raises(ValueError, match=r"families has 1 entries but there are 2 sources"):
        train_stitchers([z, z], y, tail, families=["affine"], init="identity", target_shape=(3,),
                        progress=False)
    with pytest.raises(ValueError, match=r"z must be \(n, 3\) or NHWC"):
        stitch_representation(Stitcher(jnp.eye(3), jnp.zeros(3), jnp.ones(()), "affine"), jnp.ones((2, 4)))


def test_with_a_flax_models_mlp(digits):
    """The duck-typed adapter works with a real `models` network (Flax NNX), traced inside jit."""
    from flax import nnx

    from models import MLP as NnxMLP

    a = NnxMLP(64, 10, widths=(16,), rngs=nnx.Rngs(0))
    b = NnxMLP(64, 10, widths=(16,), rngs=nnx.Rngs(1))
    x, y = digits[0][:400].astype(np.float32), digits[1][:400]
    data = ((x[:300], y[:300]), (x[300:], y[300:]))
    # zero learning rate: the returned stitcher is its closed-form start, checked independently
    res = functional_similarity(a, "fc0", b, "fc0", data, family="scaled_orthogonal", steps=2,
                                optimizer=optax.sgd(0.0), both_directions=False, progress=False)
    r = res.a_to_b
    assert r.n_eval == 100 and np.isfinite([r.stitched_ce, r.own_ce]).all()
    za, zb = a.features(jnp.asarray(x[:300]))["fc0"], b.features(jnp.asarray(x[:300]))["fc0"]
    ref = fit_stitcher(za, zb, family="scaled_orthogonal", normalize=False)
    np.testing.assert_allclose(r.stitcher.weight, ref.weight, atol=1e-5)
    np.testing.assert_allclose(r.stitcher.scale, ref.scale, rtol=1e-5)
    logits = b.tail("fc0", stitch_representation(r.stitcher, a.features(jnp.asarray(x[300:]))["fc0"]))
    np.testing.assert_allclose(r.stitched_ce, _np_ce_acc(logits, y[300:])[0], rtol=1e-5)
