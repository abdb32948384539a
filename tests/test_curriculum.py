"""Stage-wise training (batch transforms, a carried optimiser, resume) and the drivers' shared helpers."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from funsim import data, models
from funsim.experiments import curriculum as cur
from funsim.experiments.config import load_config
from funsim.experiments.io import open_run, release_run_lock
from funsim.models.curriculum import Stage, load_stage_networks, train_stages
from funsim.models.train import TrainConfig, train


def _gauss():
    return data.gaussian_task(n_train=240, n_test=90, dim=6, n_classes=3, separation=3.0)


def _mk(seed=0):
    return models.MLP(6, 3, widths=(8,), rngs=nnx.Rngs(seed))


@dataclasses.dataclass(frozen=True)
class ShiftLabels:
    """A hashable batch transform: every label becomes (y + 1) mod 3."""

    def __call__(self, key, x, y):
        return x, (y + 1) % 3


@dataclasses.dataclass(frozen=True)
class CountCalls:
    scale: float = 1.0

    def __call__(self, key, x, y):
        return self.scale * x, y


def test_batch_transform_changes_what_is_learned_but_not_the_evaluation(tmp_path):
    ds = _gauss()
    cfg = TrainConfig(steps=150, batch_size=32, learning_rate=3e-2, eval_every=150)
    m = _mk()
    r = train(m, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False, batch_transform=ShiftLabels())
    pred = np.asarray(m(ds.x_train)).argmax(1)
    assert (pred == (ds.y_train + 1) % 3).mean() > 0.9  # it learned the shifted labels
    assert r.final["train_accuracy"] < 0.1  # evaluation uses the true labels


def test_batch_transform_runs_resume_bit_for_bit_and_refuse_another_transform(tmp_path):
    ds = _gauss()
    cfg = TrainConfig(steps=10, batch_size=16, eval_every=5, checkpoint_steps=(4,))
    full = _mk()
    train(full, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False, batch_transform=CountCalls(0.5))
    # interrupted after the step-4 checkpoint, then resumed
    with pytest.raises(_Stop):
        train(_mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path,
              progress=False, batch_transform=CountCalls(0.5), callback=lambda s, _: _stop_at(s, 4))
    resumed = _mk()
    r = train(resumed, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False,
              batch_transform=CountCalls(0.5))
    assert r.resumed_from == 4
    np.testing.assert_array_equal(resumed(ds.x_test), full(ds.x_test))
    with pytest.raises(ValueError, match=r"Refusing to resume(.|\n)*batch_transform: saved 'CountCalls\(scale=0.5\)', now 'CountCalls\(scale=2.0\)'"):
        train(_mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False,
              batch_transform=CountCalls(2.0))


class _Stop(Exception):
    pass


def _stop_at(step, at):
    if step == at:
        raise _Stop


def test_carried_optimizer_state_continues_adam(tmp_path):
    ds = _gauss()
    cfg = TrainConfig(steps=6, batch_size=16, eval_every=6)
    a = _mk()
    r1 = train(a, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False)
    count = lambda s: [int(x) for x in jax.tree.leaves(s) if np.ndim(x) == 0]
    assert count(r1.opt_state) == [6]
    after1 = nnx.state(a, nnx.Param)
    # carry: Adam's step count and moments continue; reset: they restart
    b, c = _mk(), _mk()
    nnx.update(b, after1)
    nnx.update(c, after1)
    r_carry = train(b, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False, init_opt_state=r1.opt_state)
    r_reset = train(c, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, progress=False)
    assert count(r_carry.opt_state) == [12] and count(r_reset.opt_state) == [6]
    assert not np.allclose(b(ds.x_test), c(ds.x_test))
    # with a workdir the carried state is part of the identity
    train(_mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False,
          init_opt_state=r1.opt_state)
    with pytest.raises(ValueError, match="init_opt_state_sha1"):
        train(_mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False,
              init_opt_state=r_reset.opt_state)
    with pytest.raises(ValueError, match="init_opt_state does not match"):
        train(_mk(), ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=dataclasses.replace(cfg, optimizer="sgd"),
              progress=False, init_opt_state=r1.opt_state)


def _bil(seed=0):
    return models.BilinearMLP(6, 3, d_model=4, d_hidden=4, residual=False, rngs=nnx.Rngs(seed))


def test_train_stages_counts_steps_globally_and_resumes(tmp_path):
    from funsim import similarity
    ds = _gauss()
    x01, y01 = cur.select_classes(ds.x_train, ds.y_train, [0, 1])
    stages = [Stage("first two", 6, x01, y01), Stage("all", 4, ds.x_train, ds.y_train)]
    cfg = TrainConfig(steps=1, batch_size=16, eval_every=2, checkpoint_every=3)
    logs = []
    m = _bil()
    r = train_stages(m, stages, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False, log=logs.append)
    assert r.steps.tolist() == [0, 3, 6, 9, 10]
    assert r.stage_index.tolist() == [0, 0, 0, 1, 1]
    assert r.local == [(0, 0), (0, 3), (0, 6), (1, 3), (1, 4)]
    assert r.spans == [(0, 6, "first two"), (6, 10, "all")]
    assert [h["step"] for h in r.history] == [0, 2, 4, 6, 8, 10] and [h["stage"] for h in r.history] == [0, 0, 0, 0, 1, 1]
    assert [p.name for p in r.workdirs] == ["0-first-two", "1-all"] and len(logs) == 2
    nets = load_stage_networks(_bil, r)
    x = ds.x_test
    np.testing.assert_allclose(similarity.apply_network(nets[-1], x), m(x), atol=1e-6)
    np.testing.assert_allclose(similarity.apply_network(nets[0], x), _bil()(x), atol=1e-6)
    assert not np.allclose(similarity.apply_network(nets[2], x), m(x))
    # a rerun resumes every stage at its end and gives the same model
    m2 = _bil()
    r2 = train_stages(m2, stages, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path, progress=False, log=logs.append)
    assert r2.steps.tolist() == r.steps.tolist() and "resumed at step 6" in logs[2]
    np.testing.assert_array_equal(m2(x), m(x))
    with pytest.raises(ValueError, match="stages is empty"):
        train_stages(m, [], x, ds.y_test, config=cfg, workdir=tmp_path)
    with pytest.raises(ValueError, match="steps < 1"):
        train_stages(m, [Stage("none", 0, x01, y01)], x, ds.y_test, config=cfg, workdir=tmp_path)
    with pytest.raises(ValueError, match="carry_optimizer=True with a learning-rate schedule"):
        train_stages(m, stages, x, ds.y_test, config=dataclasses.replace(cfg, warmup_steps=1), workdir=tmp_path,
                         carry_optimizer=True)


def test_train_stages_same_seed(tmp_path, monkeypatch):
    """``same_seed``: every stage trains from ``config.seed`` (the authors' fit); else stage k from seed + k."""
    from funsim.models import curriculum as mc
    ds = _gauss()
    x01, y01 = cur.select_classes(ds.x_train, ds.y_train, [0, 1])
    stages = [Stage("a", 2, x01, y01), Stage("b", 2, ds.x_train, ds.y_train), Stage("c", 2, x01, y01)]
    cfg = TrainConfig(steps=1, batch_size=16, eval_every=2, checkpoint_every=2, seed=7)
    seen, real = [], mc.train

    def spy(*args, config, **kw):
        seen.append(config.seed)
        return real(*args, config=config, **kw)

    monkeypatch.setattr(mc, "train", spy)  # the name train_stages calls
    for same, expected in ((True, [7, 7, 7]), (False, [7, 8, 9])):
        seen.clear()
        train_stages(_bil(), stages, ds.x_test, ds.y_test, config=cfg, workdir=tmp_path / str(same),
                     same_seed=same, progress=False, log=lambda s: None)
        assert seen == expected


def test_grayscale_and_class_selection():
    rng = np.random.default_rng(0)
    x = rng.random((4, 3, 3, 3)).astype(np.float32)
    g = cur.to_grayscale(x)
    assert g.shape == (4, 3, 3, 1) and g.dtype == np.float32
    np.testing.assert_allclose(g[..., 0], 0.2989 * x[..., 0] + 0.5870 * x[..., 1] + 0.1140 * x[..., 2], rtol=1e-6)
    assert cur.to_grayscale(g) is g
    with pytest.raises(ValueError, match=r"\(n, H, W, 1 or 3\)"):
        cur.to_grayscale(np.ones((2, 3, 3, 2)))
    xs, ys = cur.select_classes(np.arange(8), np.array([3, 1, 2, 3, 0, 1, 3, 2]), (3, 2))
    assert xs.tolist() == [0, 2, 3, 6, 7] and ys.tolist() == [3, 2, 3, 3, 2]


def test_configs_runs_and_cached_arrays(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        a: int = 1
        b: tuple = ((1, (2, 3)),)

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"a": 5, "b": [[1, [2, 3]]]}))
    assert load_config(Cfg, {"x": Cfg()}, str(p)) == Cfg(a=5)
    assert load_config(Cfg, {"x": Cfg(a=2)}, "x") == Cfg(a=2)
    with pytest.raises(ValueError, match="neither one of x nor a JSON file"):
        load_config(Cfg, {"x": Cfg()}, "nope")
    p.write_text(json.dumps({"c": 1}))
    with pytest.raises(ValueError, match=r"unknown Cfg fields \['c'\]"):
        load_config(Cfg, {}, str(p))

    out = open_run("exp", "r", root=tmp_path, config=Cfg())
    assert json.loads((out / "config.json").read_text()) == {"a": 1, "b": [[1, [2, 3]]]}
    assert open_run("exp", "r", root=tmp_path, config=Cfg()) == out
    with pytest.raises(ValueError, match="a: saved 1, now 2"):
        open_run("exp", "r", root=tmp_path, config=Cfg(a=2))
    release_run_lock(out)  # the two opens above nest
    release_run_lock(out)

    calls = []
    compute = lambda: calls.append(1) or {"m": np.eye(2)}
    f = tmp_path / "m.npz"
    a1 = cur.cached_arrays(f, np.arange(3), compute)
    a2 = cur.cached_arrays(f, np.arange(3), compute)
    a3 = cur.cached_arrays(f, np.arange(4), compute)
    assert len(calls) == 2 and set(a2) == {"m"}
    np.testing.assert_array_equal(a1["m"], a2["m"])
    np.testing.assert_array_equal(a3["m"], np.eye(2))
    assert not list(tmp_path.glob(".*tmp*"))
