"""Training loop: learning, determinism, resume after a kill, schedules, refusals."""

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from flax import nnx

from funsim import data, models
from funsim.experiments.io import read_json
from funsim.models.train import TrainConfig, list_checkpoints, load_checkpoint, power_schedule, train
from tests.conftest import NEEDS_SHAKESPEARE

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gauss():
    return data.gaussian_task(n_train=256, n_test=128, dim=6, n_classes=3, separation=3.0)


def test_training_learns_and_history_is_logged(tmp_path):
    ds = _gauss()
    m = models.MLP(6, 3, widths=(16,), rngs=nnx.Rngs(0))
    cfg = TrainConfig(steps=60, batch_size=32, learning_rate=3e-2, eval_every=20, checkpoint_steps=(7,))
    r = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    assert [h["step"] for h in r.history] == [0, 20, 40, 60]
    assert r.final["test_accuracy"] > 0.8 and r.final["train_loss"] < r.history[0]["train_loss"]
    # the logged accuracy is the model's accuracy on the test split (independent numpy check)
    acc = float((np.asarray(m(ds.x_test)).argmax(1) == ds.y_test).mean())
    assert abs(acc - r.final["test_accuracy"]) < 1e-6
    assert read_json(tmp_path / "metrics.json")["history"] == r.history
    assert list_checkpoints(tmp_path) == (7, 60)
    m2 = load_checkpoint(models.MLP(6, 3, widths=(16,), rngs=nnx.Rngs(9)), tmp_path)
    np.testing.assert_array_equal(m2(ds.x_test), m(ds.x_test))
    with pytest.raises(ValueError, match=r"No checkpoint at step 8.*\[7, 60\]"):
        load_checkpoint(m2, tmp_path, 8)


def test_seed_changes_the_minibatches():
    # (same seed -> identical runs is checked bit for bit by the resume test)
    ds = _gauss()
    run = lambda seed: train(
        models.Linear(6, 3, rngs=nnx.Rngs(0)), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
        config=TrainConfig(steps=3, batch_size=16, eval_every=3, seed=seed), progress=False,
    )
    assert run(0).final["train_loss"] != run(1).final["train_loss"]


def test_power_schedule_is_dense_early():
    s = power_schedule(10_000, 20, power=3.0)
    assert s[-1] == 10_000 and list(s) == sorted(set(s))
    gaps = np.diff((0,) + s)
    assert np.all(np.diff(gaps) >= 0) and gaps[0] < gaps[-1] / 20
    assert power_schedule(100, 4, power=1.0) == (25, 50, 75, 100)
    assert TrainConfig(steps=10, checkpoint_every=4, checkpoint_steps=(1, 11)).checkpoint_set() == (1, 4, 8, 10)
    with pytest.raises(ValueError, match="power_schedule needs"):
        power_schedule(0, 3)


def test_resume_with_changed_config_is_refused(tmp_path):
    ds = _gauss()
    mk = lambda: models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    train(mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=4, batch_size=8), workdir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"Refusing to resume(.|\n)*config.learning_rate: saved 0.001, now 0.1"):
        train(mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=4, batch_size=8, learning_rate=0.1), workdir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"Refusing to resume(.|\n)*model.init_params_sha1"):
        m = models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(1))
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=4, batch_size=8), workdir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"Refusing to resume(.|\n)*data.train_sha1"):
        train(mk(), ds.x_train[::-1], ds.y_train[::-1], ds.x_test, ds.y_test, config=TrainConfig(steps=4, batch_size=8), workdir=tmp_path, progress=False)


def test_bad_data_for_the_model():
    ds = _gauss()
    m = models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x_train of shape \(256, 5\) does not fit the model: MLP expects x of shape \(n, 6\)"):
        train(m, ds.x_train[:, :5], ds.y_train, ds.x_test, ds.y_test, progress=False)
    with pytest.raises(ValueError, match=r"y_test has labels in \[3, 5\], outside \[0, 3\)"):
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test + 3, progress=False)
    with pytest.raises(ValueError, match="x_train has 256 examples but y_train has 255"):
        train(m, ds.x_train, ds.y_train[1:], ds.x_test, ds.y_test, progress=False)
    with pytest.raises(ValueError, match=r"batch_size=999 must be in \[1, 256\]"):
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(batch_size=999), progress=False)
    with pytest.raises(ValueError, match="Unknown optimizer 'adma'"):
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(optimizer="adma"), progress=False)


@NEEDS_SHAKESPEARE
def test_sequence_model_trains():
    ds = data.load("shakespeare", seq_len=8, max_chars=4000)
    m = models.BilinearTransformer(97, 8, d_model=16, n_layers=1, n_heads=2, d_head=8, mlp=False, rngs=nnx.Rngs(0))
    r = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=10, batch_size=16, learning_rate=1e-2, eval_every=10), progress=False)
    assert r.final["train_loss"] < r.history[0]["train_loss"]


SCRIPT = textwrap.dedent(
    """
    import sys, time, numpy as np, jax
    from flax import nnx
    from funsim import models
    from funsim import data
    from funsim.models.train import TrainConfig, train
    slow = sys.argv[1] == "slow"
    ds = data.gaussian_task(n_train=256, n_test=64, dim=6, n_classes=3)
    cfg = TrainConfig(steps=40, batch_size=16, learning_rate=1e-2, eval_every=5, checkpoint_every=10)
    def cb(step, metrics):
        if slow and step >= 12:
            time.sleep(0.2)  # give the test time to kill us mid-run
    for workdir, out in zip(sys.argv[2::2], sys.argv[3::2]):  # runs in order, each from scratch or resumed
        m = models.BilinearMLP(6, 3, d_model=8, d_hidden=8, n_layers=1, rngs=nnx.Rngs(0))
        r = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=workdir, progress=False, callback=cb)
        _, params, _ = nnx.split(m, nnx.Param, ...)
        np.savez(out, *[np.asarray(p) for p in jax.tree.leaves(params)], resumed_from=r.resumed_from)
    """
)


def _run(args, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *map(str, args)], env=env, cwd=ROOT, **kw)


def test_killed_run_resumes_identically(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    victim = _run(["slow", cut, tmp_path / "never.npz"])
    deadline = time.time() + 120
    while not (cut / "checkpoints" / "20").is_dir():  # wait for a checkpoint past the first
        assert victim.poll() is None, "the run finished before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp_path / "never.npz").exists()
    # a fresh process: the uninterrupted reference run, then the resumption of the killed run
    rest = _run(["fast", full, tmp_path / "full.npz", cut, tmp_path / "cut.npz"])
    assert rest.wait(timeout=180) == 0
    a, b = np.load(tmp_path / "full.npz"), np.load(tmp_path / "cut.npz")
    assert int(a["resumed_from"]) == 0 and int(b["resumed_from"]) >= 20
    for k in a.files:
        if k != "resumed_from":
            np.testing.assert_array_equal(a[k], b[k])  # bit for bit
    ha, hb = read_json(full / "metrics.json")["history"], read_json(cut / "metrics.json")["history"]
    assert [h["step"] for h in ha] == list(range(0, 41, 5))
    assert ha == hb


def test_random_crop_flip_against_numpy():
    import jax
    import jax.numpy as jnp

    from funsim.models.train import random_crop_flip

    x = np.random.default_rng(0).normal(size=(16, 5, 6, 2)).astype(np.float32)
    out = np.asarray(random_crop_flip(jax.random.key(3), jnp.asarray(x), pad=2))
    padded = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))
    flips = 0
    for i in range(len(x)):
        # every output is one of the (2 pad + 1)^2 crops of the padded image, or its mirror image
        crops = [padded[i, dy : dy + 5, dx : dx + 6] for dy in range(5) for dx in range(5)]
        plain = any(np.array_equal(out[i], c) for c in crops)
        mirrored = any(np.array_equal(out[i], c[:, ::-1]) for c in crops)
        assert plain or mirrored
        flips += mirrored and not plain
    assert 0 < flips < len(x)  # both outcomes occur (16 draws at p = 1/2)
    same = np.asarray(random_crop_flip(jax.random.key(3), jnp.asarray(x), pad=0, flip=False))
    np.testing.assert_array_equal(same, x)
    with pytest.raises(ValueError, match=r"NHWC images \(n, H, W, C\), got shape \(16, 30\)"):
        random_crop_flip(jax.random.key(0), jnp.zeros((16, 30)))


def test_augmented_chunked_training_and_old_runs_resume(tmp_path):
    ds = data.load("digits").subset(200, 90)
    make = lambda: models.CNN(ds.input_shape, 10, channels=(4,), rngs=nnx.Rngs(0))
    base = dict(steps=4, batch_size=16, eval_every=2)
    plain = train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(**base), progress=False)
    chunked = train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                    config=TrainConfig(**base, eval_batch_size=32), progress=False)
    for a, b in zip(plain.history, chunked.history):  # chunked evaluation: same numbers
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)
    aug = train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                config=TrainConfig(**base, augment="crop_flip"), progress=False)
    assert aug.final["train_loss"] != plain.final["train_loss"]
    with pytest.raises(ValueError, match="Unknown augment 'flip'"):
        train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(**base, augment="flip"))
    with pytest.raises(ValueError, match=r"augment='crop' needs NHWC images"):
        flat = ds.x_train.reshape(200, -1)
        train(models.Linear(64, 10, rngs=nnx.Rngs(0)), flat, ds.y_train, flat[:5], ds.y_train[:5],
              config=TrainConfig(**base, augment="crop"))
    # a run saved before augment/eval_batch_size existed resumes when they are at their defaults
    train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(**base), workdir=tmp_path,
          progress=False)
    ident = read_json(tmp_path / "train_config.json")
    for k in ("augment", "eval_batch_size"):
        del ident["config"][k]
    from funsim.experiments.io import write_json_atomic

    write_json_atomic(tmp_path / "train_config.json", ident)
    again = train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(**base), workdir=tmp_path,
                  progress=False)
    assert again.resumed_from == 4
    with pytest.raises(ValueError, match="config.augment: saved 'none', now 'crop'"):
        train(make(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(**base, augment="crop"),
              workdir=tmp_path, progress=False)


def test_load_checkpoint_into_an_abstract_model(tmp_path):
    ds = _gauss()
    m = models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=5, batch_size=16, eval_every=5),
          workdir=tmp_path, progress=False)
    abstract = nnx.eval_shape(lambda: models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(1)))
    loaded = load_checkpoint(abstract, tmp_path)
    np.testing.assert_array_equal(loaded(ds.x_test), m(ds.x_test))


def _params(m):
    return [np.asarray(p) for p in jax.tree.leaves(nnx.state(m, nnx.Param))]


def test_chunk_boundaries_do_not_change_the_numbers_and_compile_once():
    # the compiled loop's trip count is traced: evaluating after every step (chunks of 1) and once at
    # the end (one chunk of 30) run the same program, so the parameters agree bit for bit
    from funsim.runtime.compile_count import CompileCounter

    ds = _gauss()
    mk = lambda: models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    runs = {}
    for every in (1, 7, 30):
        m = mk()
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test,
              config=TrainConfig(steps=30, batch_size=16, eval_every=every, learning_rate=1e-2), progress=False)
        runs[every] = _params(m)
    for every in (7, 30):
        for a, b in zip(runs[1], runs[every]):
            np.testing.assert_array_equal(a, b)
    # the same shapes with another seed, step count or evaluation spacing: nothing compiles
    # (the optimiser is a static argument, so only an equal optimiser config reuses it)
    with CompileCounter() as c:
        train(models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(3)), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
              config=TrainConfig(steps=11, batch_size=16, eval_every=4, learning_rate=1e-2, seed=5), progress=False)
    assert c.count == 0


def test_the_donated_state_leaves_the_callers_arrays_valid():
    ds = _gauss()
    m = models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    before = nnx.state(m, nnx.Param)
    first = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(steps=4, batch_size=16, eval_every=4),
                  progress=False)
    again = train(models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0)), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                  config=TrainConfig(steps=4, batch_size=16, eval_every=4), progress=False, init_opt_state=first.opt_state)
    # the model's initial arrays and the optimiser state passed in were copied, not donated
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(before))
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(first.opt_state))
    assert again.final["step"] == 4


def _digits_cnn():
    ds = data.load("digits").subset(200, 50)
    return ds, lambda: models.CNN(ds.input_shape, 10, channels=(4,), rngs=nnx.Rngs(0))


# a dense model runs in the compiled loop; a convolutional one, on the CPU, step by step (both checked)
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_non_finite_loss_stops_the_run_at_the_first_bad_step(tmp_path, kind):
    if kind == "mlp":
        ds, mk = _gauss(), lambda: models.MLP(6, 3, widths=(16,), rngs=nnx.Rngs(0))
    else:
        ds, mk = _digits_cnn()
    cfg = TrainConfig(steps=50, batch_size=32, learning_rate=1e20, optimizer="sgd", eval_every=50, checkpoint_every=1)
    m = mk()
    init = _params(m)
    with pytest.raises(models.train.NonFiniteLossError,
                       match=r"stopped at optimiser step (\d+) of 50: (the loss is nan|its update made parameters NaN)(.|\n)*learning_rate \(now 1e\+20\)") as e:
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    bad = int(__import__("re").search(r"optimiser step (\d+)", str(e.value)).group(1))
    assert 1 < bad < 50
    # nothing at or after the bad step was saved; the steps before it were
    assert list_checkpoints(tmp_path) == tuple(range(1, bad))
    assert f"up to step {bad - 1} are intact" in str(e.value)
    for a, b in zip(init, _params(m)):  # the model is left as it was passed in
        np.testing.assert_array_equal(a, b)
    # the reference: an eager step-by-step loop with optax finds the same first non-finite step
    assert _first_bad_step(mk(), ds, cfg) == bad
    # and the run stopped just before it ends with finite parameters
    ok = mk()
    train(ok, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=dataclasses.replace(cfg, steps=bad - 1), progress=False)
    assert all(np.isfinite(a).all() for a in _params(ok))


def _first_bad_step(model, ds, cfg):
    """The first (1-based) step whose minibatch loss or updated parameters are not finite, by an eager optax loop."""
    import jax.numpy as jnp
    import optax

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(cfg.learning_rate, momentum=0.9)
    opt = tx.init(params)
    key = jax.random.PRNGKey(cfg.seed)
    xs, ys = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
    for s in range(cfg.steps):
        idx = jax.random.choice(jax.random.fold_in(key, jnp.uint32(s)), len(xs), (cfg.batch_size,), replace=False)
        f = lambda p: optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p, rest)(xs[idx]), ys[idx]).mean()
        loss, g = jax.value_and_grad(f)(params)
        upd, opt = tx.update(g, opt, params)
        params = optax.apply_updates(params, upd)
        if not np.isfinite(float(loss)) or not all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params)):
            return s + 1
    return None


def test_non_finite_training_data_is_refused():
    ds = _gauss()
    x = ds.x_train.copy()
    x[3, 2] = np.nan
    x[7, 0] = np.inf
    with pytest.raises(ValueError, match=r"x_train holds 2 NaN or infinite values \(of 1536\)"):
        train(models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0)), x, ds.y_train, ds.x_test, ds.y_test, progress=False)


def test_full_batch_sgd_matches_numpy_gradient_descent():
    # softmax regression, full batch, SGD with momentum 0.9: the compiled loop against float64 NumPy
    ds = _gauss()
    m = models.Linear(6, 3, rngs=nnx.Rngs(0))
    w0, b0 = np.asarray(m.head.kernel[...], np.float64), np.asarray(m.head.bias[...], np.float64)
    cfg = TrainConfig(steps=7, batch_size=len(ds.x_train), learning_rate=0.3, optimizer="sgd", eval_every=7)
    train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False)
    x, y = np.asarray(ds.x_train, np.float64), ds.y_train
    onehot = np.eye(3)[y]
    w, b, vw, vb = w0, b0, 0 * w0, 0 * b0
    for _ in range(cfg.steps):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / len(x)
        vw, vb = x.T @ g + 0.9 * vw, g.sum(0) + 0.9 * vb
        w, b = w - cfg.learning_rate * vw, b - cfg.learning_rate * vb
    np.testing.assert_allclose(m.head.kernel[...], w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m.head.bias[...], b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_epoch_sampling_visits_every_example_once_per_epoch_and_resumes(tmp_path, kind):
    # which rows each step trained on, reported by a batch transform
    if kind == "mlp":
        ds = _gauss()
        mk = lambda: models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0))
    else:
        ds, mk = _digits_cnn()
    n, b = len(ds.x_train), 32
    per_epoch = n // b
    cfg = TrainConfig(steps=3 * per_epoch + 2, batch_size=b, sampling="epochs", eval_every=5, checkpoint_every=per_epoch + 1)
    rows = _rows_seen(mk, ds, cfg)
    for e in range(3):  # every epoch: distinct rows, n - n mod b of them, in a new order
        seen = np.concatenate(rows[e * per_epoch:(e + 1) * per_epoch])
        assert len(set(seen.tolist())) == per_epoch * b
    assert not np.array_equal(rows[0], rows[per_epoch])
    # the same draws whatever the evaluation spacing (chunk ends) and after a resume from a checkpoint
    assert all(np.array_equal(a, c) for a, c in zip(rows, _rows_seen(mk, ds, dataclasses.replace(cfg, eval_every=3))))
    full = mk()
    train(full, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False)
    with pytest.raises(_Stop):
        train(mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False,
              callback=lambda s, _: _stop(s, per_epoch + 1))
    resumed = mk()
    assert train(resumed, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path,
                 progress=False).resumed_from == per_epoch + 1
    for a, c in zip(_params(full), _params(resumed)):
        np.testing.assert_array_equal(a, c)
    with pytest.raises(ValueError, match="Unknown sampling 'shuffle'"):
        train(mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=TrainConfig(sampling="shuffle"))


class _Stop(Exception):
    pass


def _stop(step, at):
    if step == at:
        raise _Stop


@dataclasses.dataclass(frozen=True)
class _RecordRows:
    """A batch transform that leaves the batch alone and reports its rows to the host."""

    def __call__(self, key, x, y):
        jax.debug.callback(_RecordRows.seen.append, x.reshape(len(x), -1), ordered=True)
        return x, y

    seen = []


def _rows_seen(mk, ds, cfg):
    flat = ds.x_train.reshape(len(ds.x_train), -1)
    lookup = {row.tobytes(): i for i, row in enumerate(np.asarray(flat, np.float32))}
    assert len(lookup) == len(flat)
    _RecordRows.seen.clear()
    train(mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False, batch_transform=_RecordRows())
    out = [np.array([lookup[np.asarray(r, np.float32).tobytes()] for r in batch]) for batch in _RecordRows.seen]
    assert len(out) == cfg.steps
    return out


def test_resume_rebuilds_a_damaged_or_deleted_metrics_file(tmp_path):
    """A finished run whose metrics.json is damaged resumed with a DamagedFileError; deleting it as the
    message said made the rerun stop with an IndexError (no history). Now the resume evaluates again
    what it can (step 0 from the initial parameters the run's identity pins, each checkpoint at an
    evaluation step, the newest checkpoint) and warns, naming the file, about what is lost."""
    ds = _gauss()
    cfg = TrainConfig(steps=40, batch_size=32, learning_rate=3e-2, eval_every=20, checkpoint_steps=(7,))
    run = lambda: train(models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(0)), ds.x_train, ds.y_train, ds.x_test,
                        ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    first = run().history
    assert [h["step"] for h in first] == [0, 20, 40] and list_checkpoints(tmp_path) == (7, 40)
    kept = [first[0], first[2]]  # step 20 has no checkpoint: it cannot be evaluated again
    metrics = tmp_path / "metrics.json"
    for damage in ("truncate", "delete"):
        if damage == "truncate":
            metrics.write_text(metrics.read_text()[:25])
        else:
            metrics.unlink()
        with pytest.warns(UserWarning) as rec:
            r = run()
        messages = " | ".join(str(w.message) for w in rec)
        assert "steps [20]" in messages and str(metrics) in messages, messages
        assert ("is damaged" in messages) == (damage == "truncate"), messages
        assert [h["step"] for h in r.history] == [0, 40] and r.final["step"] == 40
        for got, want in zip(r.history, kept):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
        assert read_json(metrics)["history"] == r.history
    # an intact file: nothing rebuilt, nothing warned
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")
        assert run().history == r.history


def _bn(dropout=0.0, seed=0):
    return models.MLP(6, 3, widths=(8,), batch_norm=True, dropout=dropout, rngs=nnx.Rngs(seed))


@pytest.fixture
def _highest_precision():
    """Float32 products in full (on a GPU, not TF32): these tests compare the loop with NumPy and with eager calls."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.mark.usefixtures("_highest_precision")
def test_training_updates_batch_norm_statistics_and_evaluates_with_them():
    """One full-batch step moves the running averages to 0.9 * (0, 1) + 0.1 * the batch's mean and biased
    variance of the first dense layer (float64 NumPy); they are carried across compiled chunks (the same
    numbers evaluated after every step or once), and the logged evaluation uses them."""
    ds = _gauss()
    m = _bn()
    h = ds.x_train.astype(np.float64) @ np.asarray(m.hidden[0].kernel[...], np.float64) \
        + np.asarray(m.hidden[0].bias[...], np.float64)
    full = TrainConfig(steps=1, batch_size=len(ds.x_train), learning_rate=1e-2, eval_every=1)
    train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=full, progress=False)
    np.testing.assert_allclose(m.norms[0].mean[...], 0.1 * h.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m.norms[0].var[...], 0.9 + 0.1 * h.var(0), rtol=1e-4, atol=1e-6)
    runs = []
    for every in (1, 6):
        m = _bn(dropout=0.2)
        cfg = TrainConfig(steps=6, batch_size=32, learning_rate=1e-2, eval_every=every)
        r = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False)
        runs.append([np.asarray(v) for v in jax.tree.leaves(nnx.state(m))])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
    loss = float(optax_ce(m(ds.x_test), ds.y_test))
    assert abs(loss - r.final["test_loss"]) < 1e-5 and not np.allclose(m.norms[0].mean[...], 0)


def optax_ce(logits, y):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def test_dropout_is_drawn_per_run_seed_only_in_training():
    """On the full batch the minibatch does not depend on the seed, so two seeds train the same network,
    unless dropout draws different units from them."""
    ds = _gauss()
    cfg = TrainConfig(steps=1, batch_size=len(ds.x_train), learning_rate=1e-2, eval_every=1)

    def after_one_step(dropout, seed):
        m = _bn(dropout)
        train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=dataclasses.replace(cfg, seed=seed),
              progress=False)
        return _params(m)

    for a, b in zip(after_one_step(0.0, 0), after_one_step(0.0, 1), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(after_one_step(0.5, 0), after_one_step(0.5, 1), strict=True))


def test_batch_statistics_round_trip_through_checkpoints_and_resume(tmp_path):
    """The running averages are saved with the parameters: loaded into an abstract model they give back
    the trained network; a resume from an earlier checkpoint reproduces the run bit for bit; a changed
    dropout rate is refused; a damaged checkpoint is named."""
    from funsim.models.io import DamagedFileError

    ds = _gauss()
    cfg = TrainConfig(steps=8, batch_size=32, learning_rate=1e-2, eval_every=4, checkpoint_steps=(4,))
    m = _bn(0.1)
    train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    loaded = load_checkpoint(nnx.eval_shape(lambda: _bn(0.1, seed=5)), tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(loaded)), jax.tree.leaves(nnx.state(m)), strict=True):
        np.testing.assert_array_equal(a, b)
    first = load_checkpoint(_bn(0.1), tmp_path, 4)
    assert not np.array_equal(first.norms[0].mean[...], m.norms[0].mean[...])
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "8")  # as if killed after step 4
    again = _bn(0.1)
    r = train(again, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    assert r.resumed_from == 4
    for a, b in zip(jax.tree.leaves(nnx.state(again)), jax.tree.leaves(nnx.state(m)), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="model.dropout: saved 0.1, now 0.2"):
        train(_bn(0.2), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False)
    victim = max((p for p in (tmp_path / "checkpoints" / "8").rglob("*") if p.is_file()
                  and p.name != "funsim_checksums.json"), key=lambda p: p.stat().st_size)
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(DamagedFileError, match=f"Checkpoint {tmp_path / 'checkpoints' / '8'} is damaged"):
        load_checkpoint(_bn(0.1), tmp_path)
