"""Backdoor experiment: the poison (exact geometry), and the driver end to end."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import backdoor as bd
from funsim.experiments import cli, verdict
from funsim.experiments import curriculum as cur
from funsim.models import authors, poison
from tests.conftest import NEEDS_MNIST5K, NEEDS_TFDS

DIAMOND = np.array([
    [0, 0, 1, 0, 0],
    [0, 1, 1, 1, 0],
    [0, 1, 1, 1, 0],
    [1, 1, 1, 1, 1],
    [0, 1, 1, 1, 0],
    [0, 1, 1, 1, 0],
    [0, 0, 1, 0, 0],
], bool)


@pytest.mark.parametrize("size", [28, 32])
def test_diamond_is_5_wide_7_tall_top_right_with_a_2_pixel_margin(size):
    m = poison.diamond_mask(size, size)
    expected = np.zeros((size, size), bool)
    expected[2:9, size - 7:size - 2] = DIAMOND  # rows 2..8, the last column 2 pixels from the right edge
    np.testing.assert_array_equal(m, expected)
    assert m.sum() == 19
    rows, cols = np.nonzero(m)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (2, 8, size - 7, size - 3)
    assert cols.max() - cols.min() + 1 == 5 and rows.max() - rows.min() + 1 == 7
    np.testing.assert_array_equal(m[2:9, size - 7:size - 2], m[2:9, size - 7:size - 2][::-1])  # symmetric
    np.testing.assert_array_equal(m[2:9, size - 7:size - 2], m[2:9, size - 7:size - 2][:, ::-1])


def test_diamond_options_and_errors():
    m = poison.diamond_mask(10, 12, patch_width=3, patch_height=3, margin=0)
    expected = np.zeros((10, 12), bool)
    expected[0:3, 9:12] = [[0, 1, 0], [1, 1, 1], [0, 1, 0]]
    np.testing.assert_array_equal(m, expected)
    with pytest.raises(ValueError, match="does not fit a 8 x 8 image"):
        poison.diamond_mask(8, 8)


def test_stamp_sets_the_patch_in_every_channel_and_nothing_else(rng):
    x = rng.random((3, 32, 32, 3)).astype(np.float32)
    mask = poison.diamond_mask(32, 32)
    s = np.asarray(poison.stamp(x, mask, value=0.0))
    assert s.dtype == np.float32
    assert np.all(s[:, mask] == 0.0)
    np.testing.assert_array_equal(s[:, ~mask], x[:, ~mask])


def test_poison_batch_poisons_exactly_the_rate(rng):
    x = rng.random((50, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 9, 50).astype(np.int32)  # no 9 yet
    mask = poison.diamond_mask(28, 28)
    xp, yp, poisoned = (np.asarray(a) for a in poison.poison_batch(jax.random.key(0), x, y, rate=0.1, mask=mask, value=1.0, target=9))
    assert poisoned.sum() == 5
    assert np.all(yp[poisoned] == 9) and np.array_equal(yp[~poisoned], y[~poisoned])
    assert np.all(xp[poisoned][:, mask] == 1.0)
    np.testing.assert_array_equal(xp[~poisoned], x[~poisoned])
    np.testing.assert_array_equal(xp[poisoned][:, ~mask], x[poisoned][:, ~mask])
    other = np.asarray(poison.poison_batch(jax.random.key(1), x, y, rate=0.1, mask=mask, value=1.0, target=9)[2])
    assert other.sum() == 5 and not np.array_equal(other, poisoned)
    assert np.asarray(poison.poison_batch(jax.random.key(0), x, y, rate=0.0, mask=mask, value=1.0, target=9)[2]).sum() == 0


def test_poison_transform_is_hashable_and_adds_the_noise(rng):
    t = poison.PoisonTransform((28, 28), noise_std=0.05)
    assert hash(t) == hash(poison.PoisonTransform((28, 28), noise_std=0.05)) and t != dataclasses.replace(t, rate=0.1)
    x = np.zeros((200, 28, 28, 1), np.float32)
    y = np.zeros(200, np.int32)
    xn, yn = t(jax.random.key(3), x, y)
    np.testing.assert_array_equal(yn, y)
    # sample std of 156,800 N(0, 0.05^2) draws: relative standard error 1/sqrt(2n) = 0.18%; allow 5 of them
    assert float(np.std(xn)) == pytest.approx(0.05, rel=5 / np.sqrt(2 * xn.size))
    xp, yp = dataclasses.replace(t, rate=0.5, value=1.0, noise_std=0.0)(jax.random.key(3), x, y)
    assert int((np.asarray(yp) == 9).sum()) == 100 and float(np.asarray(xp).sum()) == 100 * 19


def test_attack_success():
    logits = np.zeros((2, 4, 10))
    logits[0, :, 9] = 1  # everything -> 9
    logits[1, 0, 9] = 1  # only the first (a true 9) -> 9
    logits[1, 1:, 3] = 1
    y = np.array([9, 1, 2, 3])
    np.testing.assert_allclose(poison.attack_success(logits, y, target=9), [1.0, 0.0])


@NEEDS_MNIST5K
def test_backdoor_smoke_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(authors.AUTHORS_ENV, raising=False)
    args = ["backdoor", "--config", "smoke", "--no-progress", "--root", str(tmp_path)]
    assert cli.main(args) == 0
    out = tmp_path / "backdoor" / "smoke"
    m = json.loads((out / "metrics.json").read_text())
    cfg = bd.CONFIGS["smoke"]
    steps = np.array(m["steps"])
    assert steps[0] == 0 and steps[-1] == cfg.phase_a_steps + cfg.phase_b_steps and cfg.phase_a_steps in steps
    acc, asr = np.array(m["clean_accuracy"]), np.array(m["attack_success"])
    assert np.all((0 <= acc) & (acc <= 1)) and np.all((0 <= asr) & (asr <= 1))
    # on a fixed seed: the backdoor is learned ...
    assert m["final"]["attack_success"] > 0.5
    assert m["final"]["attack_success_end_of_a"] < 0.5  # ... in phase B, not before
    assert m["final"]["clean_accuracy"] > 0.6
    # ... and the class-9 slice of tensor similarity moves more than the mean of the other slices
    g = m["slice_block_gap"]["symmetric"]
    assert g[9] > np.mean(g[:9])
    assert m["localisation"]["symmetric"]["target"] == pytest.approx(g[9])
    with np.load(out / "similarity.npz") as f:
        np.testing.assert_array_equal(f["_key"], steps)
        for k in ("tensor/symmetric", "tensor/gaussian", "behavioral/clean", "behavioral/poisoned", "cka/clean", "weight_cosine"):
            mat = f[k]
            assert mat.shape == (len(steps), len(steps))
            np.testing.assert_allclose(mat, mat.T, atol=1e-12)
            np.testing.assert_allclose(np.diagonal(mat), 1.0, atol=1e-6)
            assert np.all(mat <= 1 + 1e-6) and np.all(mat >= -1 - 1e-6)
        assert f["tensor/symmetric/outputs"].shape == (10, len(steps), len(steps))
        mats = {k: f[k] for k in ("tensor/symmetric", "behavioral/clean", "cka/clean", "weight_cosine")}
    summary = (out / "summary.md").read_text()
    assert "| tensor (symmetric) | 0.240 |" in summary and "## Verdicts" in summary
    # the claim's direction on the seeded run: tensor similarity's block gap exceeds behavioural (clean)'s
    bg = m["block_gap"]
    assert bg["tensor (symmetric)"] > bg["behavioural (clean)"]
    # the statistics from the gaps, the labels from the config's rules, each printed with its rule
    stats = m["verdict_statistics"]
    assert stats["tensor_gap_ratio"] == pytest.approx(bg["tensor (symmetric)"] / bg["behavioural (clean)"])
    assert stats["target_slice_excess"] == pytest.approx(g[9] - max(g[:9]))
    assert stats["tensor_minus_weight_cosine_gap"] == pytest.approx(bg["tensor (symmetric)"] - bg["matrix cosine"])
    assert stats["attack_success"] == m["final"]["attack_success"]
    # the clean control: the same config with poison_rate 0, its own run in backdoor/control/
    ctrl = json.loads((out / "backdoor" / "control" / "metrics.json").read_text())
    ccfg = json.loads((out / "backdoor" / "control" / "config.json").read_text())
    assert ccfg["poison_rate"] == 0.0 and ccfg["control"] is False and ctrl["control"] is None
    assert ctrl["final"]["attack_success"] < 0.5 and m["control"]["block_gap"] == ctrl["block_gap"]
    cg = ctrl["slice_block_gap"]["symmetric"]
    assert stats["tensor_gap_did"] == pytest.approx(bg["tensor (symmetric)"] - ctrl["block_gap"]["tensor (symmetric)"])
    assert stats["target_slice_excess_did"] == pytest.approx(g[9] - max(g[:9]) - (cg[9] - max(cg[:9])))
    # calibrated on the statistics recorded from the authors' data (no clone given): every rule passes there
    assert m["authors"]["statistics"] == authors.RECORDED["backdoor"] and "recorded" in m["authors"]["source"]
    assert m["verdicts"] == [v.to_json() for v in verdict.judge_all(cfg.verdict_rules, stats)]
    assert "the authors' data, same rule |" in summary and "| 0.010 (reproduced) |" in summary
    for rule, v in zip(cfg.verdict_rules, m["verdicts"]):
        assert f"| {rule.claim} | `{rule.text()}` |" in summary and f"**{v['label']}**" in summary
    # matrix entries against the pairwise library functions on the run's own checkpoints
    ds = cur.load_images(cfg.dataset, n_train=cfg.n_train)
    x = np.asarray(ds.x_test[: cfg.n_eval]).reshape(min(cfg.n_eval, len(ds.x_test)), -1)
    ref = {
        "tensor/symmetric": lambda a, b: similarity.tensor_similarity(a, b, metric="symmetric"),
        "weight_cosine": similarity.weight_cosine,
        "behavioral/clean": lambda a, b: similarity.behavioural_similarity(a, b, x),
        "cka/clean": lambda a, b: similarity.cka(similarity.apply_network(a, x), similarity.apply_network(b, x)),
    }
    for i, j in ((1, len(steps) - 1), (2, 4), (5, 0)):
        a, b = _network_at(out, cfg, ds.input_shape, steps, i), _network_at(out, cfg, ds.input_shape, steps, j)
        for k, fn in ref.items():
            assert mats[k][i, j] == pytest.approx(float(fn(a, b)), rel=1e-4, abs=1e-5), (k, i, j)
    for png in ("training.png", "heatmaps.png", "slice_heatmaps.png", "slice_gaps.png", "gaps.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("**/*.tmp*"))
    # a rerun resumes: nothing is retrained or recomputed, the numbers are the same
    capsys.readouterr()
    assert cli.main(args) == 0
    assert "resumed at step 120" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["block_gap"] == m["block_gap"]
    # a changed config is refused: one error line naming the difference, exit status 1
    p = tmp_path / "other.json"
    p.write_text(json.dumps({**json.loads((out / "config.json").read_text()), "poison_rate": 0.2}))
    capsys.readouterr()
    assert cli.main(["backdoor", "--config", str(p), "--run", "smoke", "--no-progress", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("funsim backdoor: error: ") and "poison_rate: saved 0.1, now 0.2" in err, err


def _network_at(out, cfg, input_shape, steps, i):
    """The network of the smoke run's i-th checkpoint, read back from its phase directory."""
    from funsim.models.train import load_checkpoint
    make = lambda: bd._make_model(cfg, input_shape, 10)
    s = int(steps[i])
    if s == 0:
        return make().to_network()
    k, local = (0, s) if s <= cfg.phase_a_steps else (1, s - cfg.phase_a_steps)
    (wd,) = (out / "model").glob(f"{k}-*")
    return load_checkpoint(make(), wd, local).to_network()


def test_verdict_statistics_on_known_gaps():
    cfg = bd.CONFIGS["default"]
    gaps = {"tensor (symmetric)": 0.24, "behavioural (clean)": 0.09, "matrix cosine": 0.15, "behavioural (poisoned)": 0.62}
    slices = [0.1] * 9 + [0.43]
    s = bd.verdict_statistics(cfg, gaps, slices, 0.95)
    assert s["tensor_gap_ratio"] == pytest.approx(0.24 / 0.09) and s["target_slice_excess"] == pytest.approx(0.33)
    assert [v.label for v in verdict.judge_all(cfg.verdict_rules, s)] == ["reproduced"] * 5 + [
        "inconclusive (no clean control (control off, or poison_rate 0))"] * 2  # the paper's numbers, no control
    # difference in differences against a clean control whose gap is 0.1 and whose slices are all alike
    s = bd.verdict_statistics(cfg, gaps, slices, 0.95, (dict(gaps, **{"tensor (symmetric)": 0.1}), [0.2] * 10))
    assert s["tensor_gap_did"] == pytest.approx(0.14) and s["target_slice_excess_did"] == pytest.approx(0.33)
    assert [v.label for v in verdict.judge_all(cfg.verdict_rules, s)] == ["reproduced"] * 7
    # a clean run with the same gap (the no-poison run: ratio 2.63 passes the old rule) fails the new ones
    s = bd.verdict_statistics(cfg, gaps, slices, 0.95, (gaps, slices))
    assert [v.outcome for v in verdict.judge_all(cfg.verdict_rules, s)][-2:] == ["fail", "fail"]
    # a backdoor that was not learned: the detection rule is inconclusive, not a fail
    v = verdict.judge_all(cfg.verdict_rules, bd.verdict_statistics(cfg, gaps, slices, 0.3))
    assert v[0].label == "inconclusive (not learned)"
    # a behavioural gap <= 0 leaves the ratio undefined
    s = bd.verdict_statistics(cfg, dict(gaps, **{"behavioural (clean)": -0.01}), slices, 0.95)
    assert verdict.judge_all(cfg.verdict_rules, s)[0].label.startswith("inconclusive (behavioural (clean) block gap")
    # localisation fails when another class's slice moves as much
    s = bd.verdict_statistics(cfg, gaps, [0.1] * 8 + [0.42, 0.43], 0.95)
    assert verdict.judge_all(cfg.verdict_rules, s)[1].label == "not reproduced"


@NEEDS_TFDS
def test_backdoor_paper_config_runs_on_mock_svhn_without_downloading(tmp_path):
    import tensorflow_datasets as tfds

    cfg = dataclasses.replace(bd.CONFIGS["paper"], n_train=64, n_eval=32, d_hidden=4, batch_size=16,
                              phase_a_steps=4, phase_b_steps=4, checkpoint_every=4)
    assert cfg.dataset == "svhn_cropped" and cfg.grayscale and cfg.patch_value == 0.0
    with tfds.testing.mock_data(num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE):
        m = bd.run(cfg, root=tmp_path, run_name="mock", progress=False, log=lambda s: None)
    assert m["dataset"] == "svhn_cropped" and m["steps"].tolist() == [0, 4, 8]
    assert json.loads((tmp_path / "backdoor" / "mock" / "config.json").read_text())["grayscale"] is True


def test_the_backdoor_model_has_no_embedding(rng):
    from flax import nnx

    from funsim import models, similarity
    m = models.BilinearMLP((6, 6, 1), 4, d_model=5, d_hidden=3, residual=False, embed=False, rngs=nnx.Rngs(0))
    net = m.to_network()
    assert [type(l).__name__ for l in net] == ["BilinearLayer", "LinearLayer"] and net[0].left.shape == (3, 36)
    x = rng.random((7, 6, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(similarity.apply_network(net, x.reshape(7, -1)), m(x), rtol=1e-5, atol=1e-6)
    feats = m.features(x)
    assert list(feats) == ["bilinear0", "logits"] and feats["bilinear0"].shape == (7, 5)
    np.testing.assert_allclose(m.tail("bilinear0", feats["bilinear0"]), m(x), rtol=1e-6)
    with pytest.raises(ValueError) as err:  # the input (36 wide) cannot be added to a 5-wide output
        models.BilinearMLP((6, 6, 1), 4, d_model=5, residual=True, embed=False, rngs=nnx.Rngs(0))
    assert "residual" in str(err.value) and "36" in str(err.value)
    # with the embedding (the default) nothing changes: same parameters for the same seed
    a = models.BilinearMLP(36, 4, d_model=5, d_hidden=3, rngs=nnx.Rngs(1))
    assert a.layer_names() == ("embed", "bilinear0", "logits") and len(a.to_network()) == 3
