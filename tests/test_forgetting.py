"""Forgetting experiment end to end on a tiny config, its SVHN path on mock data, and its helpers."""

import dataclasses
import json

import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import cli, verdict
from funsim.experiments import curriculum as cur
from funsim.experiments import forgetting as fg
from funsim.models import authors
from funsim.similarity import BilinearLayer, LinearLayer
from tests.conftest import NEEDS_MNIST5K, NEEDS_TFDS


def test_one_layer_network_folds_into_one_bilinear_layer_exactly(rng):
    r = lambda *s: rng.normal(size=s)
    net = (LinearLayer(r(4, 6), r(4)), BilinearLayer(r(5, 4), r(5, 4), r(4, 5), r(5), r(5), r(4)), LinearLayer(r(3, 4), r(3)))
    one = fg._as_one_layer(net)
    x = r(7, 6)
    np.testing.assert_allclose(similarity.apply_layer(one, x), similarity.apply_network(net, x), rtol=1e-10, atol=1e-10)
    assert float(similarity.tensor_similarity((one,), net)) == pytest.approx(1.0, abs=1e-12)


@NEEDS_MNIST5K
def test_forgetting_smoke_end_to_end(tmp_path, monkeypatch):
    monkeypatch.delenv(authors.AUTHORS_ENV, raising=False)
    assert cli.main(["forgetting", "--config", "smoke", "--no-progress", "--root", str(tmp_path)]) == 0
    out = tmp_path / "forgetting" / "smoke"
    cfg = fg.CONFIGS["smoke"]
    m = json.loads((out / "metrics.json").read_text())
    steps = np.array(m["steps"])
    n_stages = len(cfg.curriculum)
    assert steps[0] == 0 and steps[-1] == n_stages * cfg.stage_steps
    assert len(steps) == 1 + n_stages * cfg.stage_steps // cfg.checkpoint_every
    assert [s[2] for s in m["stage_spans"]] == [name for name, _ in cfg.curriculum]
    ref = m["reference"]
    assert ref == {"stage": "add 9", "step": 6 * cfg.stage_steps}
    with np.load(out / "similarity.npz") as f:
        np.testing.assert_array_equal(f["_key"], steps)
        for k in ("tensor/gaussian", "tensor/symmetric", "cka", "behavioral", "weight_cosine"):
            mat = f[k]
            assert mat.shape == (len(steps), len(steps))
            np.testing.assert_allclose(mat, mat.T, atol=1e-12)
            np.testing.assert_allclose(np.diagonal(mat), 1.0, atol=1e-6)
            assert np.all(np.abs(mat) <= 1 + 1e-6)
        mats = {k: f[k] for k in ("tensor/gaussian", "tensor/symmetric", "cka", "behavioral", "weight_cosine")}
        sl = f["tensor/gaussian/outputs"]
        assert sl.shape == (10, len(steps), len(steps))
        np.testing.assert_allclose(np.diagonal(sl, axis1=1, axis2=2), 1.0, atol=1e-6)
        acc = f["class_accuracy"]
        assert acc.shape == (len(steps), 10) and np.all((0 <= acc) & (acc <= 1))
    st = m["at_stage_end"]
    assert list(st) == [name for name, _ in cfg.curriculum]
    assert st["add 9"]["tensor (gaussian)"] == pytest.approx(1.0) and st["add 9"]["slice_target"] == pytest.approx(1.0)
    # digit 9 is never seen in the first five stages, and forgotten by the end of 'remove 9'
    assert st["base"]["class_accuracy"][9] == 0.0 and st["remove 9"]["class_accuracy"][9] < 0.2
    assert st["re-add 9"]["class_accuracy"][9] > 0.5
    assert set(st["remove 9"]["difference"]) == set(m["difference"])
    for h in m["history"]:
        assert 0 <= h["test_accuracy"] <= 1 and 0 <= h["train_accuracy"] <= 1
    text = (out / "summary.md").read_text()
    assert "| tensor similarity at 'remove 9' | 0.814 |" in text and "## Verdicts" in text
    # the seeded smoke run forgets 9 and its slice drops below the other classes' (the claim's direction)
    rm = st["remove 9"]
    assert rm["class_accuracy"][9] <= 0.05 and rm["slice_target"] < rm["slice_others_mean"]
    # every statistic from the end-of-stage values, every label from the config's rules, printed
    stats = m["verdict_statistics"]
    assert stats["cka_minus_tensor_at_remove"] == pytest.approx(rm["CKA (logits)"] - rm["tensor (gaussian)"])
    assert stats["target_slice_margin"] == pytest.approx(rm["slice_others_min"] - rm["slice_target"])
    assert stats["target_accuracy_at_remove"] == rm["class_accuracy"][9]
    assert stats["tensor_at_readd"] == st["re-add 9"]["tensor (gaussian)"]
    assert stats["difference_slice_at_remove"] == rm["difference"]["class-9 slice (gaussian)"]
    # every rule passes on the authors' own curriculum (the recorded calibration): the labels are ours
    assert m["authors"]["statistics"] == authors.RECORDED["forgetting"]
    assert m["verdicts"] == [v.to_json() for v in verdict.judge_all(cfg.verdict_rules, stats)]
    assert "the authors' data, same rule |" in text and "| 0.116 (reproduced) |" in text
    for rule, v in zip(cfg.verdict_rules, m["verdicts"]):
        assert f"| {rule.claim} | `{rule.text()}` |" in text and f"**{v['label']}**" in text
    # matrix entries against the pairwise library functions on the run's own checkpoints
    ds = cur.load_images(cfg.dataset, n_train=cfg.n_train)
    x = np.asarray(ds.x_test[: cfg.n_eval]).reshape(min(cfg.n_eval, len(ds.x_test)), -1)
    ref = {
        "tensor/gaussian": lambda a, b: similarity.tensor_similarity(a, b, metric="gaussian"),
        "tensor/symmetric": lambda a, b: similarity.tensor_similarity(a, b, metric="symmetric"),
        "weight_cosine": similarity.weight_cosine,
        "behavioral": lambda a, b: similarity.behavioural_similarity(a, b, x),
        "cka": lambda a, b: similarity.cka(similarity.apply_network(a, x), similarity.apply_network(b, x)),
    }
    for i, j in ((1, len(steps) - 1), (7, 15), (12, 3)):
        a, b = _network_at(out, cfg, m, i), _network_at(out, cfg, m, j)
        for k, f in ref.items():
            assert mats[k][i, j] == pytest.approx(float(f(a, b)), rel=1e-4, abs=1e-5), (k, i, j)
    for png in ("heatmaps.png", "slice_heatmaps.png", "to_reference.png", "slices_to_reference.png",
                "class_accuracy.png", "difference.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _network_at(out, cfg, m, i):
    """The network of the smoke run's i-th checkpoint, read back from its stage directory."""
    from funsim.models.train import load_checkpoint
    s = m["steps"][i]
    make = lambda: fg._make_model(cfg, (28, 28, 1), 10, cfg.seed)
    if s == 0:
        return make().to_network()
    for k, (a, b, _) in enumerate(m["stage_spans"]):
        if a < s <= b:
            (wd,) = (out / "model_a").glob(f"{k}-*")
            return load_checkpoint(make(), wd, s - a).to_network()
    raise AssertionError(f"step {s} in no stage")


def test_default_protocol():
    """The authors' protocol at mnist5k's size: >= 1,500 steps per stage, one seed for every stage."""
    cfg = fg.CONFIGS["default"]
    assert cfg.stage_epochs is None and cfg.stage_steps >= 1500 and cfg.same_seed
    assert fg.CONFIGS["paper"].stage_epochs == 20 and fg.CONFIGS["paper"].same_seed
    assert {r.statistic for r in cfg.verdict_rules} <= set(fg.STATISTICS)


def test_verdict_statistics_on_known_stage_values():
    cfg = fg.CONFIGS["default"]
    acc = [1.0] * 9 + [0.0]
    stage = lambda t, c, sl, diff: {"tensor (gaussian)": t, "CKA (logits)": c, "slice_target": sl,
                                    "slice_others_min": 0.9, "class_accuracy": acc,
                                    "difference": {"class-9 slice (gaussian)": diff}}
    at = {"add 9": stage(1.0, 1.0, 1.0, 0.4), "repeat": stage(0.99, 0.99, 0.99, 0.3),
          "remove 9": stage(0.8, 0.93, -0.07, -0.86), "re-add 9": stage(0.995, 0.99, 0.98, 0.39)}
    s = fg.verdict_statistics(cfg, at)
    assert s["cka_minus_tensor_at_remove"] == pytest.approx(0.13) and s["target_slice_margin"] == pytest.approx(0.97)
    labels = [v.label for v in verdict.judge_all(cfg.verdict_rules, s)]
    assert labels == ["reproduced"] * 6  # the paper's numbers pass every rule
    # class 9 not forgotten: the slice rule is inconclusive whatever the slice says
    at["remove 9"] = dict(at["remove 9"], class_accuracy=[1.0] * 9 + [0.2])
    v = verdict.judge_all(cfg.verdict_rules, fg.verdict_statistics(cfg, at))
    assert v[2].label == "inconclusive (not forgotten)" and v[0].label == "reproduced"
    # no such stage / no difference model: undefined, never a pass or a fail
    del at["re-add 9"]
    for k in at.values():
        del k["difference"]
    v = {x.rule.statistic: x.label for x in verdict.judge_all(cfg.verdict_rules, fg.verdict_statistics(cfg, at))}
    assert v["tensor_at_readd"] == "inconclusive (no stage 're-add 9')"
    assert v["difference_slice_at_add9"] == "inconclusive (no difference model (difference=False))"


@NEEDS_TFDS
def test_forgetting_svhn_path_on_mock_data_without_downloading(tmp_path):
    import tensorflow_datasets as tfds

    cfg = dataclasses.replace(
        fg.CONFIGS["paper"], n_eval=40, d_model=4, d_hidden=4, batch_size=8, stage_epochs=None, stage_steps=3,
        checkpoint_every=3, curriculum=(("add 9", tuple(range(10))), ("remove 9", tuple(range(9)))), difference=False)
    assert cfg.dataset == "svhn_cropped" and cfg.grayscale
    with tfds.testing.mock_data(num_examples=120, policy=tfds.testing.MockPolicy.USE_CODE):
        m = fg.run(cfg, root=tmp_path, run_name="mock", progress=False, log=lambda s: None)
    assert m["dataset"] == "svhn_cropped" and m["steps"].tolist() == [0, 3, 6]
    assert m["difference"] is None


def test_stage_epochs_and_bad_configs(tmp_path):
    cfg = dataclasses.replace(fg.CONFIGS["default"], stage_epochs=20, batch_size=248)
    assert fg._stage_steps(cfg, 1011) == 80  # floor(1011 / 248) = 4 batches per epoch
    with pytest.raises(ValueError, match="reference_stage 'add 10' is not a stage"):
        fg.run(dataclasses.replace(fg.CONFIGS["smoke"], reference_stage="add 10"), root=tmp_path, progress=False)
    with pytest.raises(ValueError, match="lr_schedule must be"):
        fg._train_config(dataclasses.replace(fg.CONFIGS["smoke"], lr_schedule="linear"))
