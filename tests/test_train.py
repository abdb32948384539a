"""Training loop: learning, determinism, resume after a kill, schedules, refusals."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from flax import nnx

from funsim import models
from funsim.experiments import data
from funsim.experiments.io import read_json
from funsim.models.train import TrainConfig, list_checkpoints, load_checkpoint, power_schedule, train

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
    from funsim.experiments import data
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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
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
