"""Tests for similarity.task_stitching: the pure task-loss stitching library.

The model-driving comparison (``models.functional``) is tested in
test_functional.py. Tails here are pure functions of a parameter pytree
(tests/_stitch_models.py) or Flax NNX models split with ``models.split_tail``.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg
from hypothesis import given
from hypothesis import strategies as hst
from jax.test_util import check_grads

from funsim.runtime.compile_count import CompileCounter
from funsim.similarity import (
    OPTIMIZERS,
    Stitcher,
    StitchTraining,
    TrainedStitcher,
    TrainHistory,
    fit_stitcher,
    resize_spatial,
    stitch_representation,
    stitching_loss,
    train_stitcher,
    train_stitchers,
)
from funsim.similarity._stitch_param import frame_cayley
from funsim.similarity._stitch_train import objective
from tests._stitch_models import (  # digits, models: shared module-scoped fixtures
    digits,  # noqa: F401  (a fixture)
    haar,
    models,  # noqa: F401  (a fixture)
    np_adaptive_pool,
    split,
    tail_h1,
    tail_h2,
)


def _head(w, h):
    """A linear tail: logits = h @ w."""
    return h @ w


class _Unhashable:
    __hash__ = None

    def __call__(self, w, h):
        return h @ w


# ---------------------------------------------------------------------------
# Training on trained models
# ---------------------------------------------------------------------------


def test_nested_families_monotone_seed_averaged(models, digits):
    """Train CE (the objective) averaged over 3 minibatch seeds: affine <= scaled <= orthogonal.

    Tolerance 0.02 nats: each fit is a finite number of stochastic steps, so
    monotonicity holds up to optimisation error; 0.02 nats is ~10x the seed
    spread seen here and far below the gaps between the families (> 0.1 nats).
    """
    a, b = models
    (x_tr, y_tr), _ = split(digits)
    x_tr, y_tr = x_tr[:600], y_tr[:600]
    za, zb = a.features(x_tr)["h1"], b.features(x_tr)["h1"]
    fams = ["orthogonal", "scaled_orthogonal", "affine"] * 3
    keys = jax.random.split(jax.random.key(11), 9)
    out = train_stitchers([za] * 9, y_tr, tail_h1, b.p, family=fams, z_tgt=zb, steps=100,
                          batch_size=128, key=keys)
    assert [s.family for s, _ in out] == fams
    loss = jax.jit(lambda s: stitching_loss(s, za, y_tr, tail_h1, b.p))
    ce = np.array([float(loss(s)) for s, _ in out]).reshape(3, 3).mean(0)
    assert ce[2] <= ce[1] + 0.02 and ce[1] <= ce[0] + 0.02, ce


def test_vmapped_batch_equals_one_by_one(models, digits):
    a, b = models
    (x_tr, y_tr), _ = split(digits)
    x_tr, y_tr = x_tr[:400], y_tr[:400]
    fa = a.features(x_tr)
    srcs = [fa["h1"], fa["h1"][:, :8]]  # widths 32 (tall) and 8 (wide) into 16
    fams = ["orthogonal", "scaled_orthogonal"]
    zt = b.features(x_tr)["h2"]
    keys = jax.random.split(jax.random.key(5), 2)
    kw = dict(z_tgt=zt, steps=60, batch_size=64, eval_every=25)
    for init in ("closed_form", "random"):
        out = train_stitchers(srcs, y_tr, tail_h2, b.p, family=fams, key=keys, init=init, **kw)
        for src, fam, k, (s, h) in zip(srcs, fams, keys, out):
            s1, h1 = train_stitcher(src, y_tr, tail_h2, b.p, family=fam, key=k, init=init, **kw)
            assert s.weight.shape == (src.shape[1], 16) and s.family == fam
            np.testing.assert_allclose(s.weight, s1.weight, atol=1e-9)
            np.testing.assert_allclose(s.bias, s1.bias, atol=1e-9)
            np.testing.assert_allclose(s.scale, s1.scale, atol=1e-9)
            np.testing.assert_allclose(h.train_loss, h1.train_loss, atol=1e-9)
            assert h.train_loss.shape == (60,) and int(h.steps_run) == 60


@pytest.mark.parametrize("width", [24, 48])
def test_orthogonality_exact_at_every_step_float32(width):
    """Far from the start (Adam, lr 0.2), tall (``width`` -> 16) and wide (8 -> 16) maps, in float32. Far from
    the start the generator's complement block is large, and its Gram matrix (in the r x r solve) rounds at
    eps |C|^2: without the map's Newton-Schulz step the 48-wide stitchers reached 2.5e-5 here."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(128, width)).astype(np.float32)
    srcs = [z, z, z[:, :8], z[:, :8]]
    fams = ["orthogonal", "scaled_orthogonal"] * 2
    y = jnp.asarray(rng.integers(0, 3, 128))
    head = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    out = train_stitchers(srcs, y, _head, head, family=fams, init="random", target_shape=(16,),
                          steps=120, learning_rate=0.2, key=jax.random.key(1))
    for (s, h), src in zip(out, srcs):
        assert s.weight.dtype == jnp.float32
        assert h.constraint_error.shape == (120,)
        assert np.max(h.constraint_error) <= 1e-5
        w = np.asarray(s.weight, np.float64)
        gram = w.T @ w if src.shape[1] >= 16 else w @ w.T
        np.testing.assert_allclose(gram, np.eye(min(src.shape[1], 16)), atol=1e-5)
        assert h.train_loss[-1] < 0.8 * h.train_loss[0]  # it moved far from the start
    assert float(out[1].stitcher.scale) > 0 and float(out[1].stitcher.scale) != 1.0


def _frame_consts(frame, m, r):
    """A frame's constants as ``init_params`` makes them: its completion and the generator mask."""
    from funsim.similarity._stitch_param import _completion

    m_k, r_k = frame.shape
    mask = np.zeros((m, r))
    mask[:r_k, :r_k], mask[r_k:m_k, :r_k] = 1.0, 2.0
    return {k: jnp.asarray(v) for k, v in dict(_completion(frame, m, r), mask=mask).items()}


def _cayley_reference(gen, frame):
    """``base @ (I - B)^{-1} (I + B) E`` by SciPy in float64: ``base`` the frame's completion from
    NumPy's complete QR, ``B = [[X11 - X11^T, -C^T], [C, 0]]`` with ``X11 = gen[:r]``, ``C = 2 gen[r:]``
    (a generator over ``B``'s first columns and rows, each entry moved by two coordinates)."""
    m, r = frame.shape
    full, rr = np.linalg.qr(frame, mode="complete")
    full[:, :r] *= np.sign(np.diag(rr))
    b = np.zeros((m, m))
    b[:r, :r] = gen[:r] - gen[:r].T
    b[r:, :r] = 2 * gen[r:]
    b[:r, r:] = -2 * gen[r:].T
    return full @ scipy.linalg.solve(np.eye(m) - b, (np.eye(m) + b)[:, :r])


@pytest.mark.parametrize("m, r", [(9, 2), (5, 3), (6, 6), (7, 1), (40, 4), (8, 3)])
def test_frame_cayley_matches_scipy(m, r):
    """Both computations (where 2r < m the r x r solve and the completion as Householder reflectors, else
    the m x m solve and a dense completion) against SciPy's dense m x m Cayley map with NumPy's dense
    completion; orthonormal columns; the start at zero; a rotation for square frames; and padding: the
    frame zero-padded in rows and columns (always the other computation) gives the
    same columns and exact zeros in the padding, whatever the padded generator holds."""
    rng = np.random.default_rng(m * 10 + r)
    frame = haar(m, m * 10 + r)[:, :r]
    gen = rng.normal(size=(m, r))
    ref = _cayley_reference(gen, frame)
    u = np.asarray(frame_cayley(jnp.asarray(gen), _frame_consts(frame, m, r)))
    np.testing.assert_allclose(u, ref, atol=1e-12)
    np.testing.assert_allclose(u.T @ u, np.eye(r), atol=1e-12)
    np.testing.assert_allclose(frame_cayley(jnp.zeros((m, r)), _frame_consts(frame, m, r)), frame, atol=1e-14)
    if m == r:
        assert np.linalg.det(u @ frame.T) > 0  # the Cayley map stays in SO(m)
    big_m, big_r = (m + 1, r + (m + 2) // 2) if 2 * r < m else (2 * m + 4, r + 1)
    assert (2 * r < m) != (2 * big_r < big_m)  # padding switches the computation
    junk = np.pad(gen, ((0, big_m - m), (0, big_r - r))) + 5.0 * np.pad(np.zeros((m, r)), ((0, big_m - m), (0, big_r - r)),
                                                                        constant_values=1.0)
    up = np.asarray(frame_cayley(jnp.asarray(junk), _frame_consts(frame, big_m, big_r)))
    np.testing.assert_allclose(up[:m, :r], ref, atol=1e-12)
    assert not up[m:].any() and not up[:, r:].any()


def test_frame_cayley_float32_far_from_the_start():
    """In float32 with a large, nearly low-rank complement block (entries near 100: far beyond a training
    run's, whose Adam steps move an entry by the learning rate), the Gram matrix in the r x r solve rounds at
    eps |C|^2, and the frame is orthonormal only through the map's two Newton-Schulz steps (on one x86 CPU:
    2.9e-3 without them, 1.9e-5 after one, 2.6e-7 after two; another CPU gave 9e-4 without them)."""
    rng = np.random.default_rng(0)
    m, r = 48, 16
    consts = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), _frame_consts(haar(m, 0)[:, :r], m, r))
    gen = 100.0 * rng.normal(size=(m, 2)) @ rng.normal(size=(2, r)) + rng.normal(size=(m, r))
    with jax.default_matmul_precision("highest"):  # as the public functions trace it (a GPU defaults to TF32)
        u = np.asarray(frame_cayley(jnp.asarray(gen, jnp.float32), consts), np.float64)
    assert np.abs(u.T @ u - np.eye(r)).max() <= 1e-6


@pytest.mark.parametrize("m, r", [(9, 2), (5, 3)])
def test_frame_cayley_derivatives(m, r):
    """The tangent at the start, 2 base (X - E X^T E) with X = gen * mask (every tangent direction of the
    manifold: the frame's own rotations and its complement), and first and second derivatives against finite
    differences."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(1)
    frame = haar(m, 3)[:, :r]
    consts = _frame_consts(frame, m, r)
    g = rng.normal(size=(m, r))
    _, tangent = jax.jvp(lambda x: frame_cayley(x, consts), (jnp.zeros((m, r)),), (jnp.asarray(g),))
    full, rr = np.linalg.qr(frame, mode="complete")
    full[:, :r] *= np.sign(np.diag(rr))
    x = g * np.asarray(consts["mask"])
    np.testing.assert_allclose(tangent, 2 * full @ (x - np.eye(m, r) @ x[:r].T), atol=1e-12)
    c = jnp.asarray(rng.normal(size=(m, r)))
    check_grads(lambda x: jnp.sum(frame_cayley(x, consts) * c), (jnp.asarray(0.3 * g),), order=2, modes=("rev",))


def test_gradients_of_stitching_loss():
    rng = np.random.default_rng(1)
    z = jnp.asarray(rng.normal(size=(12, 4)))
    y = jnp.asarray(rng.integers(0, 3, 12))
    head = jnp.asarray(rng.normal(size=(5, 3)))

    def tail(w, h):
        return jnp.tanh(h) @ w

    w, bias, scale = jnp.asarray(rng.normal(size=(4, 5))), jnp.asarray(rng.normal(size=5)), jnp.asarray(0.7)
    f = jax.jit(lambda w, b, s: stitching_loss(Stitcher(w, b, s, "affine"), z, y, tail, head))
    check_grads(f, (w, bias, scale), order=1, modes=("fwd", "rev"))
    teacher = jnp.asarray(rng.normal(size=(12, 3)))
    g = jax.jit(lambda w, b, s: stitching_loss(Stitcher(w, b, s, "affine"), z, y, tail, head,
                                               loss="kl", teacher_logits=teacher))
    check_grads(g, (w, bias, scale), order=1, modes=("fwd", "rev"))
    # Through the exact-orthogonality (Cayley) parametrisation, and in the tail's parameters.
    m = 5  # a wide stitcher 4 -> 5: its weight's transpose is a frame of St(5, 4), padded to 5 columns
    consts = dict(_frame_consts(haar(m, 2)[:, :4], m, m), tall=jnp.asarray(0.0))
    p0 = dict(gen=jnp.asarray(0.3 * rng.normal(size=(m, m))), log_scale=jnp.asarray(0.2),
              bias=jnp.asarray(rng.normal(size=5)))
    obj = jax.jit(lambda p, hd: objective(p, consts, z, y, None, hd, tail_apply=tail,  # noqa: E731
                                          family="scaled_orthogonal", loss="ce")[0])
    check_grads(obj, (p0, head), order=1, modes=("fwd", "rev"))


def test_kl_loss_self_stitch_stays_at_identity(models, digits):
    a, _ = models
    x = jnp.asarray(digits[0][:300])
    z = a.features(x)["h2"]
    s, hist = train_stitcher(z, digits[1][:300], tail_h2, a.p, family="affine", init="identity",
                             target_shape=(16,), loss="kl", teacher_logits=tail_h2(a.p, z),
                             steps=30, optimizer="sgd", learning_rate=0.5)
    # KL of a model to itself is 0 and the identity is a stationary point (plain SGD keeps it;
    # Adam would normalise the rounding-level gradient into lr-sized steps).
    assert abs(hist.train_loss[0]) < 1e-12
    np.testing.assert_allclose(s.weight, np.eye(16), atol=1e-5)
    np.testing.assert_allclose(s.bias, 0, atol=1e-5)


def test_loop_equals_a_plain_optax_loop():
    """Independent reference: the same steps written as a plain optax loop on stitching_loss."""
    rng = np.random.default_rng(7)
    z = jnp.asarray(rng.normal(size=(40, 5)))
    y = jnp.asarray(rng.integers(0, 3, 40))
    head = jnp.asarray(rng.normal(size=(4, 3)))
    s, hist = train_stitcher(z, y, _head, head, family="affine", init="identity",
                             target_shape=(4,), steps=25, eval_every=10, optimizer="sgd",
                             learning_rate=0.3, optimizer_options={"momentum": 0.8})
    opt = optax.sgd(0.3, momentum=0.8)
    p = dict(weight=jnp.eye(5, 4), bias=jnp.zeros(4))
    state = opt.init(p)
    f = lambda p: stitching_loss(Stitcher(p["weight"], p["bias"], jnp.ones(()), "affine"),  # noqa: E731
                                 z, y, _head, head)
    losses = []
    for _ in range(25):
        value, g = jax.value_and_grad(f)(p)
        losses.append(float(value))
        updates, state = opt.update(g, state, p)
        p = optax.apply_updates(p, updates)
    np.testing.assert_allclose(hist.train_loss, losses, rtol=1e-10)
    np.testing.assert_allclose(s.weight, p["weight"], atol=1e-10)
    np.testing.assert_allclose(s.bias, p["bias"], atol=1e-10)


def test_early_stopping_returns_best_held_out_params():
    rng = np.random.default_rng(2)
    z_tr, z_ev = jnp.asarray(rng.normal(size=(20, 30))), jnp.asarray(rng.normal(size=(50, 30)))
    y_tr, y_ev = jnp.asarray(rng.integers(0, 4, 20)), jnp.asarray(rng.integers(0, 4, 50))
    head = jnp.asarray(rng.normal(size=(30, 4)))
    s, hist = train_stitcher(z_tr, y_tr, _head, head, family="affine", init="random",
                             target_shape=(30,), steps=1000, eval_every=10,
                             eval_data=(z_ev, y_ev), early_stopping=3, learning_rate=0.05,
                             key=jax.random.key(0))
    ran = int(hist.steps_run)
    assert hist.stopped_early and ran < 1000 and ran % 10 == 0
    assert np.all(np.isfinite(hist.train_loss[:ran])) and np.all(np.isnan(hist.train_loss[ran:]))
    n_ev = ran // 10 + 1
    assert np.all(np.isfinite(hist.eval_loss[:n_ev])) and np.all(np.isnan(hist.eval_loss[n_ev:]))
    best = int(np.nanargmin(hist.eval_loss))
    assert int(hist.best_step) == hist.eval_steps[best]
    # stopped after exactly `patience` evaluations without improvement
    assert n_ev - 1 - best == 3
    np.testing.assert_allclose(stitching_loss(s, z_ev, y_ev, _head, head), hist.eval_loss[best],
                               rtol=1e-10)


def test_float32_and_jit_vmap_of_public_functions():
    rng = np.random.default_rng(3)
    z = jnp.asarray(rng.normal(size=(10, 3)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 2, 10))
    s = Stitcher(jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), jnp.ones(4, jnp.float32),
                 jnp.asarray(1.5, jnp.float32), "affine")
    out = stitch_representation(s, z)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, 1.5 * np.asarray(z) @ np.asarray(s.weight) + 1, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(stitch_representation)(s, z), out, rtol=1e-6)
    head = jnp.eye(4, 2, dtype=jnp.float32)
    f = lambda st: stitching_loss(st, z, y, _head, head)  # noqa: E731
    np.testing.assert_allclose(jax.jit(f)(s), f(s), rtol=1e-6)
    batch = jax.tree.map(lambda *a: jnp.stack(a), s, s)
    np.testing.assert_allclose(jax.vmap(lambda st: stitch_representation(st, z))(batch),
                               np.stack([out, out]), rtol=1e-6)


def test_closed_form_init_is_fit_stitcher(models, digits):
    """With steps=1 and a zero learning rate the trained stitcher is the closed-form start."""
    a, b = models
    x = jnp.asarray(digits[0][:300])
    za, zb = a.features(x)["h1"], b.features(x)["h2"]
    out = train_stitchers([za] * 3, digits[1][:300], tail_h2, b.p,
                          family=["orthogonal", "scaled_orthogonal", "affine"], z_tgt=zb,
                          steps=1, optimizer="sgd", learning_rate=0.0)
    for s, _ in out:
        affine = s.family == "affine"
        ref = fit_stitcher(za, zb, family=s.family, ridge=1e-6 if affine else 0.0, normalise=affine)
        np.testing.assert_allclose(s.weight, ref.weight, atol=1e-10)
        np.testing.assert_allclose(s.bias, ref.bias, atol=1e-10)
        np.testing.assert_allclose(s.scale, ref.scale, atol=1e-10)
    assert float(out[0].stitcher.scale) == 1.0


# ---------------------------------------------------------------------------
# Compiled once; stacked tails; result types
# ---------------------------------------------------------------------------


def _nnx_pair(seed_a, seed_b, widths=(16, 8)):
    from flax import nnx

    from funsim.models import MLP as NnxMLP

    return (NnxMLP(64, 10, widths=widths, rngs=nnx.Rngs(seed_a)),
            NnxMLP(64, 10, widths=widths, rngs=nnx.Rngs(seed_b)))


def test_second_call_with_equal_tail_and_new_optimizer_compiles_nothing(digits):
    """Fresh-but-equal tails (another NNX model of the architecture, or the same one re-split,
    or a module-level function with new parameters) and new hyperparameters: no compilation."""
    from funsim.models import split_tail

    x, y = jnp.asarray(digits[0][:200], jnp.float32), digits[1][:200]
    a, b = _nnx_pair(0, 1)
    c, d = _nnx_pair(2, 3)
    kw = dict(family="scaled_orthogonal", steps=20, eval_every=10, batch_size=64)

    def sweep(src, tgt, lr, momentum):
        f, p = split_tail(tgt, "fc1")
        za, zb = src.features(x), tgt.features(x)
        return train_stitchers([za["fc0"], za["fc1"]], y, f, p, z_tgt=zb["fc1"], learning_rate=lr,
                               optimizer="sgd", optimizer_options={"momentum": momentum},
                               eval_data=([za["fc0"], za["fc1"]], y), early_stopping=2, **kw)

    first = sweep(a, b, 0.1, 0.9)
    with CompileCounter() as counter:
        again = sweep(c, d, 0.05, 0.5)  # other models, same architecture; new hyperparameters
        sweep(b, a, 0.02, 0.7)  # the first models re-split, the other way round
    assert counter.count == 0, counter.names  # the training loop (jit_fit_loop) above all
    # the second call really used its own tail, data and hyperparameters
    assert not np.allclose(first[0].stitcher.weight, again[0].stitcher.weight)
    # a pure module-level tail with new parameter values: also no compilation
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.normal(size=(50, 4)))
    yy = jnp.asarray(rng.integers(0, 3, 50))
    run = lambda head, lr: train_stitcher(z, yy, _head, head, family="scaled_orthogonal",  # noqa: E731
                                          init="random", target_shape=(5,), steps=10,
                                          learning_rate=lr)
    run(jnp.asarray(rng.normal(size=(5, 3))), 0.1)
    with CompileCounter() as counter:
        run(jnp.asarray(rng.normal(size=(5, 3))), 0.3)
    assert counter.count == 0


def test_stacked_tails_equal_separate_calls(digits):
    from funsim.models import split_tail, stack_tails

    x, y = jnp.asarray(digits[0][:200], jnp.float32), digits[1][:200]
    a, b = _nnx_pair(0, 1)
    src = _nnx_pair(5, 6)[0].features(x)
    srcs = [src["fc0"], src["fc1"]]
    f, stacked = stack_tails([a, b], "fc0")
    z_tgt = jnp.stack([a.features(x)["fc0"], b.features(x)["fc0"]])
    kw = dict(family="scaled_orthogonal", steps=15, batch_size=50,
              key=jax.random.split(jax.random.key(3), 2))
    out = train_stitchers(srcs, y, f, stacked, z_tgt=z_tgt, stacked_tails=True, **kw)
    for m, model in enumerate((a, b)):
        fm, pm = split_tail(model, "fc0")
        assert fm == f
        ref = train_stitchers(srcs, y, fm, pm, z_tgt=z_tgt[m], **kw)
        for (s, h), (s1, h1), d in zip(out, ref, (16, 8)):
            assert s.weight.shape == (2, d, 16) and h.train_loss.shape == (2, 15)
            np.testing.assert_allclose(s.weight[m], s1.weight, atol=1e-5)
            np.testing.assert_allclose(s.bias[m], s1.bias, atol=1e-5)
            np.testing.assert_allclose(s.scale[m], s1.scale, rtol=1e-5)
            np.testing.assert_allclose(h.train_loss[m], h1.train_loss, rtol=1e-5)
    with pytest.raises(ValueError, match="leading shape \\(2, 200\\)"):
        train_stitchers(srcs, y, f, stacked, z_tgt=z_tgt[0], stacked_tails=True, **kw)


def test_result_types_are_pytrees():
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.normal(size=(30, 3)))
    y = jnp.asarray(rng.integers(0, 2, 30))
    res = train_stitcher(z, y, _head, jnp.eye(3, 2), family="orthogonal", init="identity",
                         target_shape=(3,), steps=4)
    assert isinstance(res, TrainedStitcher) and isinstance(res.history, TrainHistory)
    assert isinstance(res.stitcher, Stitcher)
    leaves, tree = jax.tree.flatten(res)
    assert len(leaves) == 3 + len(TrainHistory._fields)  # weight, bias, scale + history fields
    back = jax.tree.unflatten(tree, leaves)
    assert back.stitcher.family == "orthogonal" and not bool(back.history.stopped_early)


# ---------------------------------------------------------------------------
# Convolutional maps
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape,size", [((2, 8, 6, 3), (4, 3)), ((2, 7, 5, 2), (3, 2)),
                                        ((1, 2, 3, 2), (4, 5)), ((1, 4, 4, 1), (4, 4))])
def test_resize_spatial_matches_adaptive_pool_reference(shape, size):
    z = np.random.default_rng(0).normal(size=shape)
    np.testing.assert_allclose(resize_spatial(z, size=size), np_adaptive_pool(z, size), atol=1e-12)


def test_resize_spatial_integer_ratio_is_block_mean():
    z = np.random.default_rng(1).normal(size=(2, 8, 6, 3))
    ref = z.reshape(2, 4, 2, 3, 2, 3).mean(axis=(2, 4))
    np.testing.assert_allclose(resize_spatial(z, size=(4, 3)), ref, atol=1e-12)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_bad_input_train_stitcher():
    z = jnp.ones((10, 3))
    y = jnp.zeros(10, jnp.int32)
    eye = jnp.eye(3)
    with pytest.raises(ValueError, match=r"init='closed_form' needs z_tgt"):
        train_stitcher(z, y, _head, eye)
    with pytest.raises(ValueError, match=r"Pass z_tgt .* or target_shape"):
        train_stitcher(z, y, _head, eye, init="identity")
    kw = dict(init="identity", target_shape=(3,))
    with pytest.raises(ValueError, match=r'loss="kl" needs teacher_logits'):
        train_stitcher(z, y, _head, eye, loss="kl", **kw)
    with pytest.raises(ValueError, match=r"zs_src\[0\] has 9 samples .* labels have 10"):
        train_stitcher(z[:9], y, _head, eye, **kw)
    with pytest.raises(ValueError, match=r"conv target needs an NHWC source"):
        train_stitcher(z, y, _head, eye, init="identity", target_shape=(2, 2, 3))
    with pytest.raises(ValueError, match=r"y has labels in \[0, 5\], outside \[0, 3\)"):
        train_stitcher(z, jnp.arange(10) % 6, _head, eye, **kw)
    with pytest.raises(ValueError, match=r"tail_apply\(tail_params, h\) must map"):
        train_stitcher(z, y, lambda p, h: h[:, 0], eye, **kw)
    with pytest.raises(TypeError, match=r"tail_apply must be hashable"):
        train_stitcher(z, y, _Unhashable(), eye, **kw)
    with pytest.raises(ValueError, match=r"early_stopping needs eval_data"):
        train_stitcher(z, y, _head, eye, early_stopping=2, **kw)
    with pytest.raises(ValueError, match=r"Unknown init 'eye'"):
        train_stitcher(z, y, _head, eye, init="eye", target_shape=(3,))
    with pytest.raises(ValueError, match=r"Unknown optimizer 'adamm'"):
        train_stitcher(z, y, _head, eye, optimizer="adamm", **kw)
    with pytest.raises(ValueError, match=r"learning_rate as its own argument"):
        train_stitcher(z, y, _head, eye, optimizer_options={"learning_rate": 0.1}, **kw)
    with pytest.raises(ValueError, match=r"learning_rate must be a non-negative number"):
        train_stitcher(z, y, _head, eye, learning_rate=-1.0, **kw)
    with pytest.raises(ValueError, match=r"steps must be a positive int"):
        train_stitcher(z, y, _head, eye, steps=0, **kw)
    with pytest.raises(TypeError, match=r"family must be one family name"):
        train_stitcher(z, y, _head, eye, family=["affine"], **kw)
    with pytest.raises(ValueError, match=r"family has 1 entries but there are 2 sources"):
        train_stitchers([z, z], y, _head, eye, family=["affine"], **kw)
    with pytest.raises(ValueError, match=r"key holds 3 keys but there are 2 sources"):
        train_stitchers([z, z], y, _head, eye, key=jax.random.split(jax.random.key(0), 3), **kw)
    with pytest.raises(ValueError, match=r"same leading axis"):
        train_stitchers([z], y, _head, (eye, jnp.ones(4)), stacked_tails=True, **kw)
    with pytest.raises(TypeError, match=r"non-empty list or tuple"):
        train_stitchers(z, y, _head, eye, **kw)
    with pytest.raises(ValueError, match=r"z must be \(n, 3\) or NHWC"):
        stitch_representation(Stitcher(jnp.eye(3), jnp.zeros(3), jnp.ones(()), "affine"), jnp.ones((2, 4)))


@pytest.mark.parametrize("field,value,message", [
    ("init", "identty", r"Unknown init 'identty'\. Did you mean 'identity'"),
    ("steps", 0, r"steps must be a positive int, got 0"),
    ("steps", 2.0, r"steps must be a positive int, got 2\.0"),
    ("steps", True, r"steps must be a positive int, got True"),
    ("optimizer", "adamm", r"Unknown optimizer 'adamm'"),
    ("learning_rate", -1.0, r"learning_rate must be a non-negative number, got -1\.0"),
    ("learning_rate", float("nan"), r"learning_rate must be a non-negative number, got nan"),
    ("learning_rate", float("inf"), r"learning_rate must be a non-negative number, got inf"),
    ("learning_rate", "0.1", r"learning_rate must be a non-negative number, got '0\.1'"),
    ("optimizer_options", {"learning_rate": 0.1}, r"learning_rate as its own argument"),
    ("loss", "mse", r"Unknown loss 'mse'"),
    ("batch_size", 0, r"batch_size must be a positive int or None, got 0"),
    ("early_stopping", -2, r"early_stopping must be a positive int or None, got -2"),
    ("eval_every", None, r"eval_every must be a positive int, got None"),
    ("ridge", -1e-3, r"ridge must be a non-negative number, got -0\.001"),
])
def test_stitch_training_checks_each_field_once(field, value, message):
    with pytest.raises(ValueError, match=message):
        StitchTraining(**{field: value})
    # the same check, the same message, when the field comes as a keyword of either function
    z, y = jnp.ones((10, 3)), jnp.zeros(10, jnp.int32)
    with pytest.raises(ValueError, match=message):
        train_stitcher(z, y, _head, jnp.eye(3), target_shape=(3,), **{"init": "identity", field: value})


def test_stitch_training_options_and_keywords():
    o = StitchTraining(steps=20, optimizer="sgd", optimizer_options={"nesterov": True, "momentum": 0.5})
    assert o.optimizer_options == (("momentum", 0.5), ("nesterov", True))  # sorted pairs: hashable
    assert hash(o) == hash(StitchTraining(steps=20, optimizer="sgd",
                                          optimizer_options=[("momentum", 0.5), ("nesterov", True)]))
    with pytest.raises(TypeError, match=r"optimizer_options values must be numbers or hashable, got a=\[1\]"):
        StitchTraining(optimizer_options={"a": [1]})
    with pytest.raises(TypeError, match=r"optimizer_options must be a mapping"):
        StitchTraining(optimizer_options=3)
    rng = np.random.default_rng(2)
    z, y = rng.normal(size=(40, 3)), rng.integers(0, 3, 40)
    common = dict(family="scaled_orthogonal", init="random", target_shape=(3,), key=jax.random.key(4))
    by_options = train_stitcher(z, y, _head, jnp.eye(3), options=o, **common)
    by_keywords = train_stitcher(z, y, _head, jnp.eye(3), steps=20, optimizer="sgd",
                                 optimizer_options={"momentum": 0.5, "nesterov": True}, **common)
    # a keyword replaces the field of options
    overridden = train_stitcher(z, y, _head, jnp.eye(3), options=dataclasses.replace(o, steps=5), steps=20, **common)
    for other in (by_keywords, overridden):
        np.testing.assert_array_equal(other.stitcher.weight, by_options.stitcher.weight)
        np.testing.assert_array_equal(other.history.train_loss, by_options.history.train_loss)
    assert by_options.history.train_loss.shape == (20,)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['stepz'\] \(did you mean 'steps'\?\)"):
        train_stitchers([z], y, _head, jnp.eye(3), stepz=3, **common)
    with pytest.raises(TypeError, match=r"options must be a StitchTraining, got dict"):
        train_stitchers([z], y, _head, jnp.eye(3), options={"steps": 3}, **common)


def test_train_stitcher_is_train_stitchers_of_one_source(monkeypatch):
    """``train_stitcher(z, ...)`` returns ``train_stitchers([z], ...)[0]``: one call, the key used as given."""
    from funsim.similarity import task_stitching

    rng = np.random.default_rng(3)
    z, y = rng.normal(size=(48, 3)), rng.integers(0, 3, 48)
    z_ev, y_ev = rng.normal(size=(16, 3)), rng.integers(0, 3, 16)
    k = jax.random.key(9)
    kw = dict(family="affine", init="random", target_shape=(3,), steps=30, batch_size=16, eval_every=10,
              early_stopping=2)
    many = train_stitchers([z], y, _head, jnp.eye(3), key=jnp.stack([k]), eval_data=([z_ev], y_ev), **kw)[0]
    calls = []
    real = task_stitching.train_stitchers
    monkeypatch.setattr(task_stitching, "train_stitchers", lambda *a, **k: calls.append(a) or real(*a, **k))
    one = train_stitcher(z, y, _head, jnp.eye(3), key=k, eval_data=(z_ev, y_ev), **kw)
    assert len(calls) == 1 and len(calls[0][0]) == 1 and calls[0][0][0] is z
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_every_listed_optimizer_runs():
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.normal(size=(30, 3)))
    y = jnp.asarray(rng.integers(0, 2, 30))
    for name in OPTIMIZERS:
        _, h = train_stitcher(z, y, _head, jnp.eye(3, 2), family="affine", init="identity",
                              target_shape=(3,), steps=30, optimizer=name, learning_rate=0.05)
        assert h.train_loss[-1] < h.train_loss[0], name


def test_orthogonal_closed_form_start_with_fewer_rows_than_source_features():
    """The orthogonal families' closed-form start where the source is wider than the fitting rows: the
    Procrustes solution on the rows' span (any completion), orthonormal, with the family's least residual on
    those rows (||Yc||^2 - 2 s tr(S) + s^2 ||Xc||^2, the nuclear-norm formula); equal to ``fit_stitchers``
    where that is well posed; and the padded start of ``init_params`` carries it exactly."""
    import funsim.similarity as sim
    from funsim.similarity._stitch_param import init_params, materialise, procrustes_start

    rng = np.random.default_rng(0)
    for scaled in (False, True):
        fam = "scaled_orthogonal" if scaled else "orthogonal"
        # well posed: the fallback equals the library fit
        x, y = rng.normal(size=(40, 6)), rng.normal(size=(40, 3))
        w, b, s = procrustes_start(x, y, scaled=scaled)
        ref = sim.fit_stitchers([x], [y], family=fam, ridge=0.0, normalise=False)[0]
        np.testing.assert_allclose(w, np.asarray(ref.weight), atol=1e-8)
        np.testing.assert_allclose(b, np.asarray(ref.bias), atol=1e-8)
        np.testing.assert_allclose(s, float(ref.scale), rtol=1e-8)
        # fewer rows than features: refused by fit_stitchers, solved here
        x, y = rng.normal(size=(10, 16)), rng.normal(size=(10, 4))
        with pytest.raises(ValueError, match="more fitting rows than source features"):
            sim.fit_stitchers([x], [y], family=fam, ridge=0.0, normalise=False)
        w, b, s = procrustes_start(x, y, scaled=scaled)
        np.testing.assert_allclose(w.T @ w, np.eye(4), atol=1e-10)
        xc, yc = x - x.mean(0), y - y.mean(0)
        nuc = np.linalg.svd(xc.T @ yc, compute_uv=False).sum()
        best = np.sum(yc**2) - 2 * s * nuc + s**2 * np.sum(xc**2)
        # the family's residual: the target zero-padded to the source width, a square orthogonal Q
        full = np.concatenate([w, scipy.linalg.null_space(w.T)], axis=1)  # a square orthogonal completion
        ypad = np.concatenate([yc, np.zeros((10, 12))], axis=1)
        np.testing.assert_allclose(np.sum((ypad - s * xc @ full) ** 2), best, rtol=1e-9)
        np.testing.assert_allclose(b, y.mean(0) - s * x.mean(0) @ w, atol=1e-12)
        if scaled:
            np.testing.assert_allclose(s, nuc / np.sum(xc**2), rtol=1e-12)
        for _ in range(20):  # no orthogonal map does better on these rows
            q, _r = np.linalg.qr(rng.normal(size=(16, 16)))
            assert np.sum((ypad - s * xc @ q) ** 2) >= best - 1e-9
        params, consts = init_params(fam, "closed_form", [jnp.asarray(x)], [jnp.asarray(y)], d_tgt=4, n_tails=1,
                                     ridge=0.0, keys=jax.random.split(jax.random.key(0), 1), dtype=jnp.float64)
        one = jax.tree.map(lambda a: a[0, 0], params)
        weight, scale, bias, q = materialise(one, jax.tree.map(lambda a: a[0, 0], consts), family=fam)
        np.testing.assert_allclose(np.asarray(weight)[:16], w, atol=1e-8)
        np.testing.assert_allclose(np.asarray(bias), b, atol=1e-8)
        np.testing.assert_allclose(float(scale), s, rtol=1e-8)


def test_every_family_shares_one_compiled_loop():
    """Affine, orthogonal and scaled-orthogonal stitchers in one call, interleaved, train in one program
    (the orthogonal ones in one loop with their scale held at exactly 1, the affine ones in their own
    loop beside it) and equal three one-family calls with the same keys, to rounding, in the call's
    source order; sources of different widths pad to one width."""
    from funsim.runtime.compile_count import CompileCounter

    rng = np.random.default_rng(0)
    x, x2 = rng.normal(size=(200, 6)), rng.normal(size=(200, 4))
    y = (x[:, 0] > 0).astype(np.int32)
    w_tail = jnp.asarray(rng.normal(size=(5, 2)))

    def tail(w, h):
        return h @ w

    kw = dict(z_tgt=x @ rng.normal(size=(6, 5)), steps=30, batch_size=64, eval_every=10)
    keys = jax.random.split(jax.random.key(3), 6)
    fams = ("orthogonal", "scaled_orthogonal", "affine")
    alone = {f: train_stitchers([x, x2], y, tail, w_tail, family=f, key=keys[2 * k:2 * k + 2], **kw)
             for k, f in enumerate(fams)}
    # interleaved: (family, source) in an order that is neither family by family nor source by source
    plan = [("affine", 1), ("orthogonal", 0), ("scaled_orthogonal", 1), ("orthogonal", 1), ("affine", 0),
            ("scaled_orthogonal", 0)]
    with CompileCounter() as c:
        mixed = train_stitchers([(x, x2)[s] for _, s in plan], y, tail, w_tail, family=[f for f, _ in plan],
                                key=jnp.stack([keys[2 * fams.index(f) + s] for f, s in plan]), **kw)
    assert sum("fit_loop" in n for n in c.names) == 1, c.names
    assert sum("fit_padded" in n for n in c.names) == 1, c.names  # the three families' closed-form starts
    for (f, s), b in zip(plan, mixed):
        a = alone[f][s]
        assert a.stitcher.family == b.stitcher.family == f
        assert b.stitcher.weight.shape == a.stitcher.weight.shape
        np.testing.assert_allclose(b.stitcher.weight, a.stitcher.weight, rtol=0, atol=1e-12, err_msg=f)
        np.testing.assert_allclose(b.stitcher.bias, a.stitcher.bias, rtol=0, atol=1e-12, err_msg=f)
        np.testing.assert_allclose(b.stitcher.scale, a.stitcher.scale, rtol=0, atol=1e-12, err_msg=f)
        np.testing.assert_allclose(b.history.train_loss, a.history.train_loss, rtol=0, atol=1e-12, err_msg=f)
        np.testing.assert_allclose(b.history.constraint_error, a.history.constraint_error, rtol=0, atol=1e-12)
        assert (float(b.stitcher.scale) == 1.0) == (f != "scaled_orthogonal"), f
    # the affine stitchers really trained
    assert all(float(np.abs(np.diff(b.history.train_loss)).max()) > 0 for (f, _), b in zip(plan, mixed) if f == "affine")
    # a start that cannot be fitted is named: source, tail and family
    dead = np.ones_like(x2)
    with pytest.raises(ValueError, match=re.escape(
            "init='closed_form' could not fit a start (the source of zs_src[1] -> tail 0 (orthogonal start) "
            "is constant across samples")):
        train_stitchers([x, dead], y, tail, w_tail, family=["affine", "orthogonal"], key=keys[:2], **kw)


def test_label_groups_train_coarser_tasks_in_the_same_loop():
    """A stitcher with ``label_groups`` trains on the coarse task through the fine tail: it equals a
    stitcher trained on the coarse labels through a tail that sums the softmax within each group
    (float64, to rounding); a ``None`` entry equals the plain call to the bit; fine and coarse
    stitchers share one compiled loop."""
    from funsim.runtime.compile_count import CompileCounter

    rng = np.random.default_rng(4)
    x, x2 = rng.normal(size=(160, 5)), rng.normal(size=(160, 3))
    y = rng.integers(0, 4, size=160).astype(np.int32)
    w_tail = jnp.asarray(rng.normal(size=(6, 4)))
    groups = (0, 1, 1, 0)  # 4 classes into 2
    y_coarse = np.asarray(groups)[y]

    def tail(w, h):
        return h @ w

    def coarse_tail(w, h):
        logits = h @ w
        return jnp.stack([jax.nn.logsumexp(logits[:, [c for c in range(4) if groups[c] == g]], axis=-1)
                          for g in (0, 1)], axis=-1)

    kw = dict(z_tgt=x @ rng.normal(size=(5, 6)), steps=25, batch_size=48, eval_every=10)
    keys = jax.random.split(jax.random.key(7), 3)
    ev = ([x[:40], x2[:40], x[:40]], y[:40])
    with CompileCounter() as c:
        both = train_stitchers([x, x2, x], y, tail, w_tail, family=["affine", "scaled_orthogonal", "orthogonal"],
                               key=keys, label_groups=[groups, None, groups], eval_data=ev, **kw)
    assert sum("fit_loop" in n for n in c.names) == 1, c.names
    fine = train_stitchers([x2], y, tail, w_tail, family="scaled_orthogonal", key=keys[1:2],
                           eval_data=([x2[:40]], y[:40]), **kw)[0]
    for f in ("weight", "bias", "scale"):
        np.testing.assert_allclose(getattr(both[1].stitcher, f), getattr(fine.stitcher, f), rtol=0, atol=1e-12)
    np.testing.assert_allclose(both[1].history.eval_loss, fine.history.eval_loss, rtol=0, atol=1e-12)
    for k, fam in ((0, "affine"), (2, "orthogonal")):
        ref = train_stitchers([x], y_coarse, coarse_tail, w_tail, family=fam, key=keys[k:k + 1],
                              eval_data=([x[:40]], y_coarse[:40]), **kw)[0]
        for f in ("weight", "bias", "scale"):
            np.testing.assert_allclose(getattr(both[k].stitcher, f), getattr(ref.stitcher, f), rtol=1e-9,
                                       atol=1e-10, err_msg=(fam, f))
        np.testing.assert_allclose(both[k].history.train_loss, ref.history.train_loss, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(both[k].history.eval_loss, ref.history.eval_loss, rtol=1e-9, atol=1e-10)
    # the groups are checked
    with pytest.raises(ValueError, match="label_groups must be None or a list of 3"):
        train_stitchers([x, x2, x], y, tail, w_tail, label_groups=[groups], **kw)
    with pytest.raises(ValueError, match=r"label_groups\[1\] must be 4 non-negative integers"):
        train_stitchers([x, x2], y, tail, w_tail, label_groups=[None, (0, 1)], **kw)
    with pytest.raises(ValueError, match='needs loss="ce"'):
        train_stitchers([x], y, tail, w_tail, label_groups=[groups], loss="kl",
                        teacher_logits=np.zeros((160, 4)), **kw)


def test_a_source_given_twice_is_prepared_and_fitted_once(monkeypatch):
    """The same array object for several stitchers (several families or tasks) gets one closed-form fit
    per family, and every stitcher equals its call with the source given once."""
    from funsim.similarity import _stitch_param

    rng = np.random.default_rng(8)
    x, x2 = rng.normal(size=(120, 5)), rng.normal(size=(120, 3))
    y = (x[:, 0] > 0).astype(np.int32)
    w_tail = jnp.asarray(rng.normal(size=(4, 2)))

    def tail(w, h):
        return h @ w

    kw = dict(z_tgt=x @ rng.normal(size=(5, 4)), steps=5, family="affine")
    problems = []
    real = _stitch_param.fit_stitchers
    monkeypatch.setattr(_stitch_param, "fit_stitchers", lambda a, b, **k: problems.append(len(a)) or real(a, b, **k))
    keys = jax.random.split(jax.random.key(1), 3)
    twice = train_stitchers([x, x2, x], y, tail, w_tail, key=keys, **kw)
    assert problems == [2]  # x and x2, one tail
    once = train_stitchers([x, x2], y, tail, w_tail, key=keys[:2], **kw)
    for a, b in ((twice[0], once[0]), (twice[1], once[1])):
        np.testing.assert_allclose(a.stitcher.weight, b.stitcher.weight, rtol=0, atol=1e-12)
    third = train_stitchers([x], y, tail, w_tail, key=keys[2:], **kw)[0]
    np.testing.assert_allclose(twice[2].stitcher.weight, third.stitcher.weight, rtol=0, atol=1e-12)


@given(widths=hst.lists(hst.integers(1, 5000), min_size=1, max_size=12), ratio=hst.sampled_from([2, 3, 4]))
def test_width_buckets_hold_each_width_within_one_rung(widths, ratio):
    """Each source's bucket holds it, is a rung of the ladder (the widest width divided by ``ratio`` again
    and again, rounded up, down to 8), and the next rung down would not hold it: a source is padded by
    less than the ratio (beyond the floor of 8)."""
    from funsim.similarity.task_stitching import _width_buckets

    top = max(widths)
    ladder = [top]
    while ladder[-1] > 8:
        ladder.append(max(math.ceil(ladder[-1] / ratio), 8))
    out = _width_buckets(widths, ratio)
    for w, b in zip(widths, out):
        assert b >= w and b in ladder
        lower = [r for r in ladder if r < b]
        assert not lower or max(lower) < w
        assert b <= max(ratio * w, 8, w)


def test_width_buckets_halve_on_the_cpu_and_refuse_a_ratio_below_two():
    """On the CPU the ladder halves (a training step's arithmetic costs more than a larger program's
    compile), on an accelerator it quarters; a ratio below 2 would never end the ladder."""
    from funsim.similarity.task_stitching import _bucket_ratio, _width_buckets

    widths = [10, 64, 200, 256, 2048]
    if jax.default_backend() == "cpu":
        assert _bucket_ratio() == 2 and _width_buckets(widths, _bucket_ratio()) == [16, 64, 256, 256, 2048]
    else:
        assert _bucket_ratio() == 4 and _width_buckets(widths, _bucket_ratio()) == [32, 128, 512, 512, 2048]
    with pytest.raises(ValueError, match="ratio must be an int >= 2"):
        _width_buckets([10, 20], 1)


def test_sources_of_far_apart_widths_train_in_width_buckets_of_one_program():
    """Sources of 3, 20 and 90 features (three width buckets: 90, 23 and 8) of every family in one call:
    one compiled program, each stitcher equal to its call alone (no padding beyond its own width), to
    rounding."""
    from funsim.runtime.compile_count import CompileCounter
    from funsim.similarity.task_stitching import _width_buckets

    assert _width_buckets([3, 20, 90]) == [8, 23, 90] and _width_buckets([5]) == [5]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(150, 90))
    srcs = [x[:, :3], x[:, :20], x]
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    w_tail = jnp.asarray(rng.normal(size=(6, 2)))
    tail = lambda w, h: h @ w  # noqa: E731
    kw = dict(z_tgt=x[:, :6] + 0.1 * rng.normal(size=(150, 6)), steps=20, batch_size=50)
    fams = ["affine", "orthogonal", "scaled_orthogonal"]
    plan = [(f, s) for f in fams for s in range(3)]
    keys = jax.random.split(jax.random.key(4), len(plan))
    with CompileCounter() as c:
        out = train_stitchers([srcs[s] for _, s in plan], y, tail, w_tail, family=[f for f, _ in plan], key=keys, **kw)
    assert sum("fit_loop" in n for n in c.names) == 1, c.names
    with CompileCounter() as c:  # the same families and widths assigned to other positions: nothing new
        train_stitchers([srcs[s] for _, s in plan[::-1]], y, tail, w_tail, family=[f for f, _ in plan[::-1]], key=keys,
                        **kw)
    assert c.count == 0, c.names
    for (f, s), k, (st, h) in zip(plan, keys, out):
        st1, h1 = train_stitcher(srcs[s], y, tail, w_tail, family=f, key=k, **kw)
        assert st.weight.shape == (srcs[s].shape[1], 6) and st.family == f
        np.testing.assert_allclose(st.weight, st1.weight, rtol=0, atol=1e-10, err_msg=f"{f} {s}")
        np.testing.assert_allclose(h.train_loss, h1.train_loss, rtol=0, atol=1e-10)
