"""The ``language`` experiment: smoke run end to end, its matrices and n-gram statistics."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from funsim.experiments import config as config_lib
from funsim.experiments import language, verdict
from funsim.models import authors
from funsim.similarity import phases
from tests.conftest import NEEDS_SHAKESPEARE


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as mp:  # no clone of the authors' data: the recorded calibration
        mp.delenv(authors.AUTHORS_ENV, raising=False)
        metrics = language.run(language.CONFIGS["smoke"], root=root, run_name="smoke", progress=False,
                               log=lambda *a: None)
    return root / "language" / "smoke", metrics


@NEEDS_SHAKESPEARE
def test_smoke_run_writes_sane_outputs(smoke):
    out, metrics = smoke
    for name in ("config.json", "metrics.json", "summary.md", "training.png", "similarity_matrices.png",
                 "similarity_to_final.png", "ngrams.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "model" / "checkpoints").is_dir()
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["steps"] == metrics["steps"] and metrics["steps"][0] == 0
    n = len(metrics["steps"])
    assert list(metrics["matrices"]) == list(language.MATRICES) == list(metrics["blocks"])
    for name, mat in metrics["matrices"].items():
        m = np.asarray(mat)
        assert m.shape == (n, n), name
        np.testing.assert_allclose(m, m.T, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-6, err_msg=name)
        assert np.all(np.abs(m) <= 1 + 1e-6), name
    for h in metrics["history"]:
        assert 0 <= h["test_accuracy"] <= 1 and 0 <= h["train_accuracy"] <= 1
    for key, values in metrics["ngrams"].items():
        v = np.asarray(values)
        assert v.shape == (n,) and np.all(np.isfinite(v)), key
        if key.endswith("agreement") or key == "accuracy":
            assert np.all((v >= 0) & (v <= 1)), key
        if key.endswith("kl"):
            assert np.all(v >= -1e-12), key
    text = (out / "summary.md").read_text()
    assert "Paper's claim" in text
    # every label from the config's rules, printed with its rule; the overall label from the claim's rules
    cfg = language.CONFIGS["smoke"]
    stats = language.verdict_statistics(cfg, metrics)
    assert stats == metrics["verdict_statistics"]
    verdicts = verdict.calibrate(cfg.verdict_rules, metrics)[0]
    assert metrics["verdicts"] == [v.to_json() for v in verdicts]
    for rule, v in zip(cfg.verdict_rules, metrics["verdicts"]):
        assert f"| {rule.claim} | `{rule.text()}` |" in text and f"**{v['label']}**" in text
    # the two committed rules that fail on the authors' own matrices cannot label ours, nor the claim
    assert metrics["authors"]["statistics"] == authors.RECORDED["language"]
    by = {v.rule.statistic: v for v in verdicts}
    for s in ("explained_margin", "transition_ratio_margin"):
        assert by[s].label.startswith("uncalibrated (fails on the authors' data; ours: "), s
    assert "| -0.350 (not reproduced) |" in text and "| 0.208 (reproduced) |" in text
    assert language.claim_label(verdicts).startswith("uncalibrated (explained_margin, transition_ratio_margin")
    assert f"**{language.claim_label(verdicts)}**" in text
    assert f"**{language.claim_label(verdicts, language.arguments.CALIBRATED_CLAIM_RULES)}**" in text
    # the transition ratio recomputed from the primary matrix's adjacent entries
    prim = np.asarray(metrics["matrices"][language.PRIMARY])
    d = 1 - np.array([prim[i, i + 1] for i in range(n - 1)])
    assert stats["primary_transition_ratio"] == pytest.approx(d.max() / np.median(d))


@NEEDS_SHAKESPEARE
def test_smoke_matrices_equal_the_pairwise_library_functions(smoke):
    """Entries of the cached matrices against similarity's pairwise functions on the checkpoints."""
    from funsim import similarity

    out, metrics = smoke
    cfg = language.CONFIGS["smoke"]
    steps = metrics["steps"]
    nets = language._networks(cfg, metrics["vocab"], out / "model", steps)
    onehot = 1.0 / np.sqrt(metrics["vocab"])
    m = {k: np.asarray(v) for k, v in metrics["matrices"].items()}
    for i, j in ((0, len(steps) - 1), (1, 2)):
        a1, b1 = (language._truncate(nets[k], 1) for k in (i, j))
        for key, scale in (("tensor/gaussian/layers=1", onehot), ("tensor/gaussian/layers=1/scale=1", 1.0)):
            ref = float(similarity.attention_similarity(a1, b1, context=cfg.context, scale=scale))
            assert m[key][i, j] == pytest.approx(ref, abs=2e-6), key  # float32 networks
        wa, wb = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(nets[k])]).astype(np.float64) for k in (i, j))
        assert m["weight_cosine"][i, j] == pytest.approx(wa @ wb / np.linalg.norm(wa) / np.linalg.norm(wb), abs=1e-12)
        # behaviour: the mean per-position cosine of the two checkpoints' logits on the held-out windows
        from funsim import data as data_lib
        ds = data_lib.load("shakespeare", seq_len=cfg.seq_len, max_chars=cfg.max_chars)
        x = ds.x_test[: cfg.n_eval_windows]
        la, lb = (np.asarray(similarity.apply_attention_network(nets[k], x), np.float64) for k in (i, j))
        cos = (la * lb).sum(-1) / np.linalg.norm(la, axis=-1) / np.linalg.norm(lb, axis=-1)
        assert m["behavioral/held_out"][i, j] == pytest.approx(cos.mean(), abs=1e-5)


def test_verdict_statistics_on_planted_matrices():
    """A matrix with one sharp step and three blocks beside smooth baselines passes the claim's rules; swapped, it fails."""
    cfg = language.CONFIGS["default"]
    n = 12
    t = np.arange(n)
    smooth = np.exp(-np.abs(t[:, None] - t[None, :]) / 6.0)  # every adjacent change the same
    phase = np.searchsorted([4, 8], t, side="right")
    blocky = np.where(phase[:, None] == phase[None, :], 0.98, 0.3) + 0.02 * (t[:, None] == t[None, :])
    blocky = blocky - 0.004 * np.abs(t[:, None] - t[None, :]) * (phase[:, None] == phase[None, :])
    np.fill_diagonal(blocky, 1.0)
    steps = list(range(0, 120, 10))
    from funsim.similarity import checkpoints as cs

    def metrics(primary, baseline):
        mats = {k: baseline for k in language.MATRICES}
        mats[language.PRIMARY] = primary
        return {"matrices": mats, "blocks": {k: cs.block_summary(m, steps, (3,)) for k, m in mats.items()},
                "ngrams": {"2gram_agreement": list(np.minimum(t, 3) / 3)}}

    s = language.verdict_statistics(cfg, metrics(blocky, smooth))
    assert s["primary_transition_ratio"] > 3 and s["transition_ratio_margin"] > 0 and s["explained_margin"] > 0.02
    b = metrics(blocky, smooth)["blocks"]
    assert s["block_contrast_margin"] == pytest.approx(b[language.PRIMARY][3]["contrast"] - b["weight_cosine"][3]["contrast"])
    assert s["block_contrast_margin"] > 0.1
    v = verdict.judge_all(cfg.verdict_rules, s)
    assert language.claim_label(v) == language.claim_label(v, language.arguments.CALIBRATED_CLAIM_RULES) == "reproduced"
    s = language.verdict_statistics(cfg, metrics(smooth, blocky))
    assert s["primary_transition_ratio"] == pytest.approx(1.0) and s["explained_margin"] < 0
    assert s["block_contrast_margin"] < 0
    v = verdict.judge_all(cfg.verdict_rules, s)
    assert language.claim_label(v) == language.claim_label(v, language.arguments.CALIBRATED_CLAIM_RULES) == \
        "not reproduced at this scale"
    assert phases.transition_ratio(np.eye(2)) is None


@NEEDS_SHAKESPEARE
def test_smoke_monte_carlo_check_agrees_with_exact(smoke):
    _, metrics = smoke
    for row in metrics["mc_check"]:
        assert row["se"] > 0
        assert abs(row["mc"] - row["exact"]) < 5 * row["se"]  # seeded; a 5-sigma bound


@NEEDS_SHAKESPEARE
def test_smoke_two_layer_monte_carlo_against_an_independent_estimate(smoke):
    """Both two-layer Monte Carlo matrices (1/sqrt(V) and the paper's scale 1) against
    ``similarity.attention_monte_carlo_inner`` on other draws: within 5 combined standard errors (seeded)."""
    from funsim import similarity

    out, metrics = smoke
    cfg = language.CONFIGS["smoke"]
    nets = language._networks(cfg, metrics["vocab"], out / "model", metrics["steps"])
    nets64 = [jax.tree.map(lambda x: np.asarray(x, np.float64), net) for net in nets]  # scale 1 passes float32's range
    n = len(nets)
    for stage, key, scale, ns in (("tensor2_mc", "tensor/gaussian/monte_carlo", 1 / np.sqrt(metrics["vocab"]), nets),
                                  ("tensor2_mc_unit", "tensor/gaussian/monte_carlo/scale=1", 1.0, nets64)):
        cached = np.load(out / "analysis" / f"{stage}.npz")
        np.testing.assert_allclose(metrics["matrices"][key], language.cs.normalise_gram(cached["inner"]), atol=1e-12)
        for i, j in ((0, n - 1), (n - 2, n - 1)):
            with jax.enable_x64(True):
                est, se = similarity.attention_monte_carlo_inner(ns[i], ns[j], context=cfg.context, scale=scale,
                                                                 n_samples=4096, key=jax.random.key(7))
            both = np.hypot(float(se), cached["inner_se"][i, j])
            assert abs(float(est) - cached["inner"][i, j]) < 5 * both, (key, i, j)


@NEEDS_SHAKESPEARE
def test_paper_scale_config_judges_the_scale_one_matrix(smoke, tmp_path):
    """``paper_scale`` is ``default`` with the scale-1 two-layer matrix as the primary one; at smoke size its
    statistics, verdicts and summary read that matrix, and the 1/sqrt(V) one is reported beside it."""
    key = "tensor/gaussian/monte_carlo/scale=1"
    assert language.CONFIGS["paper_scale"] == dataclasses.replace(language.CONFIGS["default"], primary=key)
    with pytest.raises(ValueError, match="primary must be a tensor matrix"):
        dataclasses.replace(language.CONFIGS["smoke"], primary="weight_cosine")
    cfg = dataclasses.replace(language.CONFIGS["smoke"], primary=key)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(authors.AUTHORS_ENV, raising=False)
        metrics = language.run(cfg, root=tmp_path, run_name="paper_scale", progress=False, log=lambda *a: None)
    _, base = smoke
    assert metrics["matrices"] == base["matrices"]  # the same training run and draws; only the primary differs
    by = metrics["verdict_statistics_by_primary"]
    assert list(by) == ["tensor/gaussian/monte_carlo", key] and by == base["verdict_statistics_by_primary"]
    assert metrics["verdict_statistics"] == by[key] and base["verdict_statistics"] == by[language.PRIMARY]
    prim = np.asarray(metrics["matrices"][key])
    d = 1 - np.diagonal(prim, 1)
    assert metrics["verdict_statistics"]["primary_transition_ratio"] == pytest.approx(d.max() / np.median(d))
    assert metrics["verdicts"] == [v.to_json() for v in verdict.calibrate(cfg.verdict_rules, metrics)[0]]
    text = (tmp_path / "language" / "paper_scale" / "summary.md").read_text()
    assert f"Primary tensor matrix: {language.MATRICES[key]};" in text
    assert f"Statistics with {language.MATRICES[language.PRIMARY]} as the primary matrix: " in text


@NEEDS_SHAKESPEARE
def test_resume_reuses_every_stage_and_refuses_another_config(smoke):
    out, metrics = smoke
    again = language.run(language.CONFIGS["smoke"], root=out.parent.parent, run_name="smoke", progress=False,
                         log=lambda *a: None)
    assert again["matrices"] == metrics["matrices"]
    assert again["stage_seconds"] == metrics["stage_seconds"]  # read back from the cached stages
    other = dataclasses.replace(language.CONFIGS["smoke"], context=1)
    with pytest.raises(ValueError, match="different config"):
        language.run(other, root=out.parent.parent, run_name="smoke", progress=False, log=lambda *a: None)


def test_cli_config_parsing(tmp_path):
    def load(spec):
        return config_lib.load_config(language.LanguageConfig, language.CONFIGS, spec)

    assert load("smoke") == language.CONFIGS["smoke"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"steps": 7, "segments": [2, 3]}))
    cfg = load(str(path))
    assert cfg.steps == 7 and cfg.segments == (2, 3)
    path.write_text(json.dumps({"stepz": 7}))
    with pytest.raises(ValueError, match="unknown LanguageConfig fields"):
        load(str(path))
    with pytest.raises(ValueError, match="neither"):
        load("nope")
