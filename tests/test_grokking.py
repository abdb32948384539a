"""The grokking experiment: its data, its analysis helpers against references, and the driver end to end."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.data import modular_addition
from funsim.experiments import cli, grokking, verdict
from funsim.experiments import config as config_lib
from funsim.experiments.io import to_jsonable
from funsim.models import modular
from tests.test_modular import bilinear_checkpoints, write_authors_dir
from tests.test_phases import planted_run

# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("p,fraction", [(113, 0.3), (7, 0.3), (10, 0.5), (13, 0.9)])
def test_modular_addition_exact_counts_and_disjoint_split(p, fraction):
    ds = modular_addition(p=p, train_fraction=fraction, seed=3)
    n_train = int(round(fraction * p * p))
    assert ds.x_train.shape == (n_train, 2) and ds.x_test.shape == (p * p - n_train, 2)
    assert ds.x_train.dtype == np.int32 and ds.y_train.dtype == np.int32
    train = {tuple(r) for r in ds.x_train.tolist()}
    test = {tuple(r) for r in ds.x_test.tolist()}
    assert len(train) == n_train and len(test) == p * p - n_train  # no duplicates
    assert not train & test  # disjoint
    assert train | test == {(a, b) for a in range(p) for b in range(p)}  # every pair once
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        np.testing.assert_array_equal(y, (x[:, 0] + x[:, 1]) % p)
    oh = modular_addition(p=p, train_fraction=fraction, seed=3, onehot=True)
    assert oh.x_train.shape == (n_train, 2 * p) and oh.x_train.dtype == np.float32
    np.testing.assert_array_equal(oh.x_train[:, :p].argmax(1), ds.x_train[:, 0])
    np.testing.assert_array_equal(oh.x_train[:, p:].argmax(1), ds.x_train[:, 1])
    assert set(np.unique(oh.x_train).tolist()) <= {0.0, 1.0} and np.all(oh.x_train.sum(1) == 2)
    np.testing.assert_array_equal(oh.y_test, ds.y_test)
    # the split is a function of the seed
    again = modular_addition(p=p, train_fraction=fraction, seed=3)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    other = modular_addition(p=p, train_fraction=fraction, seed=4)
    assert {tuple(r) for r in other.x_train.tolist()} != train


# --------------------------------------------------------------------------- matrices, events


def test_checkpoint_matrices_equal_the_pairwise_library_functions():
    nets = bilinear_checkpoints()
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *nets)
    x = np.random.default_rng(1).normal(size=(40, 6))
    mats = grokking.checkpoint_matrices(stacked, x)
    assert list(mats) == list(grokking.MEASURES)
    ref = {
        "tensor (symmetric)": lambda a, b: similarity.tensor_similarity(a, b, metric="symmetric"),
        "tensor (gaussian)": lambda a, b: similarity.tensor_similarity(a, b, metric="gaussian"),
        "weight cosine": similarity.weight_cosine,
        "behavioural": lambda a, b: similarity.behavioural_similarity(a, b, x),
        "CKA (logits)": lambda a, b: similarity.cka(similarity.apply_network(a, x), similarity.apply_network(b, x)),
    }
    for name, f in ref.items():
        expected = np.array([[float(f(a, b)) for b in nets] for a in nets])
        np.testing.assert_allclose(mats[name], expected, rtol=1e-9, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(mats[name], mats[name].T, atol=1e-12)
        np.testing.assert_allclose(np.diag(mats[name]), 1.0, atol=1e-12)


# --------------------------------------------------------------------------- the driver


#: How far a resumed run may be from the uninterrupted one off the CPU (docs/gpu.md, "Reproducibility"):
#: a GPU's reductions (atomics, the GEMM's split of the sum) are not deterministic, so the retrained
#: checkpoints and the matrices computed from them differ by rounding (5.6e-16 seen on an H200).
#: On the CPU a resumed run is the same run, bit for bit.
RESUMED_TOL = 1e-6


def assert_same_run(resumed, uninterrupted):
    """Arrays or JSON-like trees of a resumed and an uninterrupted run: equal on the CPU, to
    :data:`RESUMED_TOL` (absolute, and relative for the JSON numbers) elsewhere."""
    exact = jax.default_backend() == "cpu"
    if isinstance(resumed, np.ndarray):
        if exact:
            np.testing.assert_array_equal(resumed, uninterrupted)
        else:
            np.testing.assert_allclose(resumed, uninterrupted, rtol=0, atol=RESUMED_TOL)
        return
    assert jax.tree_util.tree_structure(resumed) == jax.tree_util.tree_structure(uninterrupted)
    for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(uninterrupted)):
        if exact or not isinstance(a, float):
            assert a == b
        else:
            assert a == pytest.approx(b, rel=RESUMED_TOL, abs=RESUMED_TOL)


def _run_smoke(tmp_path, capsys, *extra):
    rc = cli.main(["grokking", "--config", "smoke", "--no-progress", "--root", str(tmp_path), *extra])
    assert rc == 0
    return capsys.readouterr().out


def test_grokking_smoke_end_to_end_and_resume(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(modular.AUTHORS_ENV, raising=False)
    # a planted run in the authors' format, on their 90 steps over 100k (the real files are not shipped)
    authors = write_authors_dir(tmp_path / "authors", planted_run([0, *modular.checkpoint_schedule(100_000, 100)]))
    printed = _run_smoke(tmp_path, capsys, "--authors-run", str(authors))
    out = tmp_path / "grokking" / "smoke"  # the run is named after the config
    cfg = grokking.CONFIGS["smoke"]
    assert json.loads((out / "config.json").read_text())["p"] == cfg.p
    m = json.loads((out / "metrics.json").read_text())
    steps = m["steps"]
    assert steps[0] == 0 and steps[-1] == cfg.steps and steps == sorted(set(steps))
    for split in ("train", "val"):
        acc = np.array(m["checkpoints"][split]["accuracy"])
        assert acc.shape == (len(steps),) and np.all((acc >= 0) & (acc <= 1))
    # the smoke run memorises its training pairs
    assert m["final"]["train_accuracy"] == 1.0
    mats = np.load(out / "matrices.npz")
    assert mats["steps"].tolist() == steps
    for name in grokking.MEASURES:
        a = mats[name.replace(" ", "_")]
        assert a.shape == (len(steps), len(steps))
        np.testing.assert_allclose(a, a.T, atol=1e-5)
        np.testing.assert_allclose(np.diag(a), 1.0, atol=1e-5)
        assert np.all(a <= 1 + 1e-5) and np.all(a >= -1 - 1e-5)
    seg = m["segmentation"]
    for cost in similarity.SEGMENT_COSTS:
        for name in grokking.MEASURES:
            st = seg["starts"][cost][name]
            assert len(st) == cfg.n_segments and st[0] == 0 and st == sorted(set(st)) and st[-1] < len(steps)
    assert len(seg["boundaries_vs_events"]["tensor (symmetric)"]) == cfg.n_segments - 1
    spectra = np.load(out / "spectra.npz")
    assert spectra["a"].shape == (len(steps), cfg.p // 2 + 1)
    for f in ("accuracy.png", "similarity_matrices.png", "similarity_to_final.png", "fourier.png"):
        data = (out / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    summary = (out / "summary.md").read_text()
    assert "paper's run" in summary and "| tensor (symmetric) |" in summary
    # the verdicts: every rule of the config, its number and the label the rule gives it
    stats = m["verdict_statistics"]
    assert [v["claim"] for v in m["verdicts"]] == [r.claim for r in cfg.verdict_rules]
    assert m["verdicts"] == [v.to_json() for v in verdict.judge_all(cfg.verdict_rules, stats)]
    for rule, v in zip(cfg.verdict_rules, m["verdicts"]):
        assert f"| {rule.claim} | `{rule.text()}` |" in summary and f"**{v['label']}**" in summary
    # the smoke run never reaches held-out accuracy 1: that claim cannot be judged
    assert m["verdicts"][1]["label"] == "inconclusive (held-out accuracy never reached 1)"
    # the authors' run beside ours, cut at our horizon
    assert m["authors"]["matched"]["horizon"] == cfg.steps
    assert all(s <= cfg.steps for s in m["authors"]["matched"]["steps"]["ours"])
    assert "## The authors' run, like with like" in summary and "| as released | 90 | 100,000 |" in summary
    assert "# grokking" in printed and str(out) in printed
    assert not list(out.glob("**/*.tmp*"))

    assert m["authors"]["source"]["directory"] == str(authors.resolve())
    assert "output_dir" not in m["authors"]["source"]["config"]

    # interrupted after the 5th of 8 checkpoints: the rerun resumes and reproduces the run (this time
    # without the authors' files: the summary says how to get them, that verdict is inconclusive)
    ckdir = out / "model" / "checkpoints"
    for s in steps[-3:]:
        shutil.rmtree(ckdir / str(s))
    printed = _run_smoke(tmp_path, capsys)
    assert f"resumed from step {steps[-4]}" in printed
    assert "Not compared: the authors' released run was not given; to compare, clone " \
           "https://github.com/tdooms/tensor-similarity" in printed and "--authors-run" in printed
    assert "inconclusive (the authors' run is not available)" in printed
    again = np.load(out / "matrices.npz")
    for name in grokking.MEASURES:
        assert_same_run(again[name.replace(" ", "_")], mats[name.replace(" ", "_")])
    m2 = json.loads((out / "metrics.json").read_text())
    assert_same_run(m2["checkpoints"], m["checkpoints"])
    assert m2["segmentation"] == m["segmentation"]


def _config_from(*argv):
    """``(run name, config)`` that ``funsim grokking ARGV`` would run, read through its own parser."""
    args = cli.build_parser("grokking").parse_args(["grokking", *argv])
    cfg, name = config_lib.from_args(args, grokking.GrokkingConfig, grokking.CONFIGS)
    return name, cfg


def test_grokking_config_file_and_bad_fields(tmp_path):
    good = tmp_path / "tiny.json"
    good.write_text(json.dumps({"p": 5, "steps": 3}))
    name, cfg = _config_from("--config", str(good))
    assert name == "tiny" and cfg.p == 5 and cfg.steps == 3 and cfg.d_hidden == 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"p": 5, "stepz": 3}))
    with pytest.raises(ValueError, match=r"unknown GrokkingConfig fields \['stepz'\] \(did you mean 'steps'\?\)"):
        _config_from("--config", str(bad))
    with pytest.raises(ValueError, match="neither one of smoke, default, paper nor a JSON file; did you mean 'default'"):
        _config_from("--config", "defualt")


def test_grokking_set_overrides_the_named_config(monkeypatch, capsys):
    """`funsim grokking --config default --set steps=2000` runs the default config with 2,000 steps (not run
    here: the call is recorded), into a run named after both; `--set stepz=2000` is one line naming `steps`."""
    calls = []
    monkeypatch.setattr(grokking, "run", lambda cfg, **kw: calls.append((cfg, kw)))
    assert cli.main(["grokking", "--config", "default", "--set", "steps=2000", "--no-progress"]) == 0
    [(cfg, kw)] = calls
    assert cfg == dataclasses.replace(grokking.CONFIGS["default"], steps=2000)
    assert kw["run_name"] == "default+steps=2000"
    capsys.readouterr()
    assert cli.main(["grokking", "--config", "default", "--set", "stepz=2000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["funsim grokking: error: --set stepz=2000: GrokkingConfig has no field 'stepz'; "
                   "did you mean 'steps'?"]
    assert len(calls) == 1  # nothing ran
    # the later of two overrides of one field wins, and the config's own checks apply
    assert _config_from("--set", "steps=5", "--set", "steps=7")[1].steps == 7
    with pytest.raises(ValueError, match=r"--set checkpoint_rule=square: GrokkingConfig.checkpoint_rule must be"):
        _config_from("--set", "checkpoint_rule=square")


def test_verdict_statistics_from_known_boundaries():
    cfg = grokking.CONFIGS["default"]
    bounds = {"tensor (symmetric)": [{"checkpoints_apart": a} for a in (0, -2, 3, None)]}
    starts = {"tensor (symmetric)": [0, 10, 20, 30, 40], "behavioural": [0, 11, 23, 30, 45]}
    after = {"val accuracy = 1": {"similarity_to_final": {"tensor (symmetric)": 0.8, "behavioural": 0.85}}}
    s = grokking.verdict_statistics(cfg, steps=list(range(50)), starts=starts, boundaries=bounds, after=after,
                                    comparison=None)
    assert s["boundaries_near_landmarks"] == 2  # |0| and |-2| <= 2
    assert s["tensor_only_boundaries"] == 2  # 20 (nearest 23: 3 apart) and 40 (nearest 45)
    assert s["to_final_tensor"] == 0.8 and s["to_final_behavioural"] == 0.85
    assert s["boundaries_matching_authors"]["value"] is None
    s = grokking.verdict_statistics(cfg, steps=list(range(50)), starts=starts, boundaries=bounds,
                                    after={"val accuracy = 1": None}, comparison=None)
    labels = {v.rule.statistic: v.label for v in verdict.judge_all(cfg.verdict_rules, s)}
    assert labels["to_final_tensor"] == "inconclusive (held-out accuracy never reached 1)"
    assert labels["boundaries_matching_authors"] == "inconclusive (the authors' run is not available)"
    assert labels["boundaries_near_landmarks"] == "not reproduced"
    assert labels["tensor_only_boundaries"] == "tensor-specific"


def test_verdict_rules_in_the_config(tmp_path):
    cfg = grokking.CONFIGS["default"]
    assert {r.statistic for r in cfg.verdict_rules} <= set(grokking.STATISTICS)
    # config.json round trip: the rules come back as Rule objects, the config equal
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(to_jsonable(cfg)))
    assert _config_from("--config", str(path))[1] == cfg
    # a rule on a statistic the driver does not compute is refused at load time
    d = to_jsonable(cfg)
    d["verdict_rules"][0]["statistic"] = "boundaries_near_landmark"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="names the statistic 'boundaries_near_landmark'"):
        _config_from("--config", str(path))
    with pytest.raises(ValueError, match="checkpoint_rule must be one of"):
        dataclasses.replace(cfg, checkpoint_rule="square")
    # the paper config draws its minibatches epoch by epoch, as the authors' shuffled data loader
    assert grokking.CONFIGS["paper"].sampling == "epochs" and grokking.CONFIGS["paper"].batch_size == 512
    with pytest.raises(ValueError, match="sampling must be 'independent' or 'epochs'"):
        dataclasses.replace(cfg, sampling="shuffled")


def test_the_arguments_module_names_the_library_constants():
    """configs.grokking imports no JAX, so it names two constants of models.modular itself: the same ones."""
    from funsim.experiments.configs import grokking as arguments

    assert arguments.CHECKPOINT_RULES == modular.CHECKPOINT_RULES
    assert arguments.AUTHORS_ENV == modular.AUTHORS_ENV
    assert grokking.make_model(grokking.CONFIGS["smoke"], 0).p == grokking.CONFIGS["smoke"].p
