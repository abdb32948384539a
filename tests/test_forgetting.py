"""Forgetting experiment end to end on a tiny config, its SVHN path on mock data, and its helpers."""

import dataclasses
import json

import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import cli
from funsim.experiments import forgetting as fg
from funsim.similarity import BilinearLayer, LinearLayer


def test_one_layer_network_folds_into_one_bilinear_layer_exactly(rng):
    r = lambda *s: rng.normal(size=s)
    net = (LinearLayer(r(4, 6), r(4)), BilinearLayer(r(5, 4), r(5, 4), r(4, 5), r(5), r(5), r(4)), LinearLayer(r(3, 4), r(3)))
    one = fg._as_one_layer(net)
    x = r(7, 6)
    np.testing.assert_allclose(similarity.apply_layer(one, x), similarity.apply_network(net, x), rtol=1e-10, atol=1e-10)
    assert float(similarity.tensor_similarity((one,), net)) == pytest.approx(1.0, abs=1e-12)


def test_forgetting_smoke_end_to_end(tmp_path):
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
    assert "| tensor similarity at 'remove 9' | 0.814 |" in text and "Claims:" in text
    for png in ("heatmaps.png", "slice_heatmaps.png", "to_reference.png", "slices_to_reference.png",
                "class_accuracy.png", "difference.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
