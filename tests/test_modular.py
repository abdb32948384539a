"""models.modular: the grokking network's checkpoint schedule and evaluation, and the reader of the authors' run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.experiments.configs.grokking import CONFIGS, PAPER
from funsim.models import modular
from funsim.models.train import power_schedule
from funsim.similarity import phases
from tests.test_phases import planted_run


def bilinear_checkpoints(n=4, d=6, h=3, o=5, seed=0):
    """``n`` one-layer bilinear networks ``d -> h -> o`` along a drifting trajectory, like training's checkpoints."""
    rng = np.random.default_rng(seed)
    base = [rng.normal(size=s) for s in ((h, d), (h, d), (o, h))]
    nets = []
    for i in range(n):  # a drifting trajectory, like training
        l, r, dn = (b + 0.7 * i * rng.normal(size=b.shape) for b in base)
        nets.append((similarity.BilinearLayer(jnp.asarray(l), jnp.asarray(r), jnp.asarray(dn)),))
    return nets


def test_evaluate_checkpoints_against_numpy():
    nets = bilinear_checkpoints(n=3, o=4)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *nets)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(30, 6)), rng.integers(0, 4, size=30)
    ev = modular.evaluate_checkpoints(stacked, x, y)
    for i, (layer,) in enumerate(nets):
        l, r, d = (np.asarray(a) for a in (layer.left, layer.right, layer.down))
        logits = ((x @ l.T) * (x @ r.T)) @ d.T
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        np.testing.assert_allclose(ev["loss"][i], -logp[np.arange(30), y].mean(), rtol=1e-9)
        assert ev["accuracy"][i] == np.mean(logits.argmax(1) == y)


def write_authors_dir(path, run, *, train_accuracy=None, config=None):
    """A directory in the format of the authors' released files, from a planted run (:func:`tests.test_phases.planted_run`)."""
    path.mkdir(parents=True, exist_ok=True)
    steps = np.asarray(run["steps"], np.int64)
    np.save(path / "checkpoint_steps.npy", steps)
    np.save(path / "tn_similarity.npy", run["matrices"]["tensor (symmetric)"])
    np.save(path / "act_similarity.npy", run["matrices"]["behavioural"])
    train = np.linspace(0.01, 1.0, len(steps)) if train_accuracy is None else train_accuracy
    val = np.asarray(run["val_accuracy"], np.float64)
    hist = {str(int(s)): {"train_loss": float(4.7 * (1 - t)), "train_acc": float(t), "val_loss": float(4.7 * (1 - v)),
                          "val_acc": float(v)} for s, t, v in zip(steps, train, val)}
    (path / "training_history.json").write_text(json.dumps(hist))
    (path / "config.json").write_text(json.dumps(config or {"P": 113, "seed": 1337, "output_dir": "/home/x"}))
    return path


def test_checkpoint_schedule_is_the_authors_rule():
    # floor(T (i / (n - 1))^5) in exact integer arithmetic (T = 100k, n = 100: the authors' run),
    # duplicates merged: 89 steps after 0 (their released steps are compared in the test below)
    exact = sorted({100_000 * i ** 5 // 99 ** 5 for i in range(100)} - {0})
    assert list(modular.checkpoint_schedule(100_000, 100, power=5.0)) == exact
    assert len(exact) == 89 and exact[:6] == [1, 2, 3, 5, 7, 11] and exact[-2:] == [95_050, 100_000]
    assert modular.checkpoint_schedule(1000, 7, power=3.0, rule="power") == power_schedule(1000, 7, power=3.0)
    t = modular.checkpoint_schedule(50_000, 100)
    assert t[-1] == 50_000 and list(t) == sorted(set(t)) and t[0] >= 1
    # the default and paper configs use the authors' rule at the 5th power
    for name in ("default", "paper"):
        cfg = CONFIGS[name]
        assert (cfg.checkpoint_rule, cfg.checkpoint_power) == ("authors", 5.0)
    with pytest.raises(ValueError, match="checkpoint rule must be one of"):
        modular.checkpoint_schedule(100, 5, rule="square")


_AUTHORS = __import__("os").environ.get(modular.AUTHORS_ENV)
needs_authors = pytest.mark.skipif(
    not _AUTHORS, reason=f"the authors' released grokking files are not shipped: set {modular.AUTHORS_ENV} to a clone's "
                         f"{modular.AUTHORS_BUNDLE}/ to recompute every PAPER number from them")


@needs_authors
def test_authors_files_reproduce_the_paper_constants():
    """Every number of PAPER recomputed from the authors' released files (independent of the constants)."""
    ref = modular.authors_run()
    assert ref["source"]["repository"] == "https://github.com/tdooms/tensor-similarity"
    assert ref["source"]["config"]["seed"] == 1337 and "output_dir" not in ref["source"]["config"]
    steps = ref["steps"].tolist()
    assert len(steps) == 90 and steps[-1] == PAPER["steps"]
    # their released steps are the authors' rule: T = 100k, n = 100, 5th power
    assert [0, *modular.checkpoint_schedule(100_000, 100, power=5.0)] == steps
    ev = phases.accuracy_events(steps, ref["train_accuracy"], ref["val_accuracy"], ref["val_loss"])
    assert ev == PAPER["events"]
    st = phases.phase_starts(ref["matrices"]["tensor (symmetric)"], n_segments=5)
    assert [steps[i] for i in st] == PAPER["phase_starts"]
    # their published segmentation (metadata.json phases: 0, 124, 1545, 7517, 24953) is this DP
    # optimum with the 4th start moved one checkpoint earlier by hand
    assert steps[st[3] - 1] == 7517
    k = steps.index(PAPER["events"]["val accuracy = 1"])
    for name, key in (("tensor (symmetric)", "tensor (symmetric)"), ("behavioural", "behavioural")):
        assert round(ref["matrices"][key][k, -1], 3) == PAPER["to_final"][name]
    m = ref["matrices"]["tensor (symmetric)"]
    assert np.all(np.abs(np.diag(m) - 1) < 1e-6) and np.all(m <= 1 + 1e-6)


def test_authors_run_reads_the_authors_format(tmp_path, monkeypatch):
    monkeypatch.delenv(modular.AUTHORS_ENV, raising=False)
    assert modular.authors_run() is None  # nothing given: not available
    run = planted_run([0, *modular.checkpoint_schedule(20_000, 40)])
    train = np.linspace(0.0, 1.0, len(run["steps"]))
    d = write_authors_dir(tmp_path / "a", run, train_accuracy=train)
    for ref in (modular.authors_run(d), modular.authors_run(str(d))):
        assert ref["steps"].dtype == np.int64 and ref["steps"].tolist() == run["steps"].tolist()
        for k in ("tensor (symmetric)", "behavioural"):
            np.testing.assert_array_equal(ref["matrices"][k], run["matrices"][k])
        np.testing.assert_allclose(ref["train_accuracy"], train)
        np.testing.assert_allclose(ref["val_accuracy"], run["val_accuracy"])
        np.testing.assert_allclose(ref["val_loss"], 4.7 * (1 - run["val_accuracy"]))
        assert ref["source"]["config"] == {"P": 113, "seed": 1337}  # their output_dir dropped
    monkeypatch.setenv(modular.AUTHORS_ENV, str(d))  # the environment variable, when no directory is given
    assert modular.authors_run()["steps"].tolist() == run["steps"].tolist()
    monkeypatch.setenv(modular.AUTHORS_ENV, str(tmp_path / "nowhere"))  # set but wrong: an error, not None
    with pytest.raises(ValueError, match="nowhere is not a directory; to compare, clone"):
        modular.authors_run()


def test_authors_run_refuses_damaged_files(tmp_path):
    run = planted_run([0, *modular.checkpoint_schedule(20_000, 40)])
    n = len(run["steps"])

    def fresh(name):
        return write_authors_dir(tmp_path / name, run)

    d = fresh("missing")
    (d / "act_similarity.npy").unlink()
    with pytest.raises(ValueError, match=r"missing/act_similarity.npy is missing .*--authors-run"):
        modular.authors_run(d)
    d = fresh("cut")
    b = (d / "tn_similarity.npy").read_bytes()
    (d / "tn_similarity.npy").write_bytes(b[: len(b) // 2])
    with pytest.raises(ValueError, match="cut/tn_similarity.npy: not a readable .npy file"):
        modular.authors_run(d)
    d = fresh("shape")
    np.save(d / "tn_similarity.npy", run["matrices"]["tensor (symmetric)"][:-1])
    with pytest.raises(ValueError, match=f"shape/tn_similarity.npy: expected a {n} x {n} matrix"):
        modular.authors_run(d)
    d = fresh("nan")
    m = run["matrices"]["behavioural"].copy()
    m[3, 4] = m[4, 3] = np.nan
    np.save(d / "act_similarity.npy", m)
    with pytest.raises(ValueError, match="nan/act_similarity.npy: 2 non-finite entries"):
        modular.authors_run(d)
    d = fresh("asym")
    m = run["matrices"]["behavioural"].copy()
    m[3, 4] += 0.1
    np.save(d / "act_similarity.npy", m)
    with pytest.raises(ValueError, match="asym/act_similarity.npy: not symmetric"):
        modular.authors_run(d)
    d = fresh("steps")
    np.save(d / "checkpoint_steps.npy", run["steps"][::-1])
    with pytest.raises(ValueError, match="steps/checkpoint_steps.npy: steps must increase strictly from 0"):
        modular.authors_run(d)
    d = fresh("history")
    h = json.loads((d / "training_history.json").read_text())
    del h[str(int(run["steps"][7]))]["val_acc"]
    (d / "training_history.json").write_text(json.dumps(h))
    with pytest.raises(ValueError, match=f"history/training_history.json: no 'val_acc' at checkpoint step {run['steps'][7]}"):
        modular.authors_run(d)
    d = fresh("json")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="json/config.json: not a readable JSON file"):
        modular.authors_run(d)
