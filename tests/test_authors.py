"""models.authors: the tensor-similarity authors' released matrices, and the drivers' rules calibrated on them.

The fixtures are small files written in the authors' format (tdooms/tensor-similarity ``artifacts/cache/``:
the same file names, long-format columns and dtypes as theirs, string columns as ``string_view``, the
forgetting values as float32), with planted numbers, so every statistic is known. The authors' data itself
is never shipped nor downloaded here: ``test_the_recorded_calibration_is_the_authors_data`` reads a clone
when ``FUNSIM_TENSOR_AUTHORS`` points at one (skipped otherwise), and

    FUNSIM_TENSOR_AUTHORS=<clone> python -m pytest -q tests/test_authors.py
    python tests/test_authors.py <clone>        # prints every rule's statistic on the authors' data

check and print the calibration recorded in ``models.authors.RECORDED`` (experiments/README.md).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from funsim.experiments import backdoor as bd
from funsim.experiments import cli, verdict
from funsim.experiments import forgetting as fg
from funsim.experiments import language as lg
from funsim.models import authors
from funsim.similarity.checkpoints import block_gap
from tests.conftest import NEEDS_MNIST5K

pa = pytest.importorskip("pyarrow", reason="reading the authors' .feather files needs pyarrow (the 'authors' extra)")
import pyarrow.feather as feather  # noqa: E402

STR = pa.string_view() if hasattr(pa, "string_view") else pa.string()  # polars writes string_view, as theirs


def _write(path, columns: dict):
    """A feather (Arrow IPC) file of ``{name: (values, arrow type)}``, as polars' ``write_ipc`` wrote theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(pa.table({k: pa.array(list(v), type=t) for k, (v, t) in columns.items()}), str(path))


def _long(steps, matrices: dict, *, key="metric", key_type=None, value="value", value_type=pa.float64()):
    """Long format ``(step_i, step_j, key, value)`` of ``{key: (n, n)}`` (no key column when ``key`` is None)."""
    n = len(steps)
    ii, jj = np.indices((n, n))
    cols = {"step_i": [], "step_j": [], value: []}
    if key is not None:
        cols[key] = []
    for k, m in matrices.items():
        cols["step_i"] += [int(steps[i]) for i in ii.ravel()]
        cols["step_j"] += [int(steps[j]) for j in jj.ravel()]
        cols[value] += [float(x) for x in np.asarray(m).ravel()]
        if key is not None:
            cols[key] += [k] * (n * n)
    types = {"step_i": pa.int64(), "step_j": pa.int64(), value: value_type, key: key_type or STR}
    order = ["step_i", "step_j", *([key] if key is not None else []), value]
    return {c: (cols[c], types[c]) for c in order}


def _blocks(in_b, a, b, ab):
    """A symmetric matrix: ``a`` within phase A, ``b`` within B, ``ab`` across, 1 on the diagonal."""
    in_b = np.asarray(in_b)
    m = np.where(in_b[:, None] & in_b[None, :], b, np.where(~in_b[:, None] & ~in_b[None, :], a, ab))
    np.fill_diagonal(m, 1.0)
    return m


def planted_backdoor():
    """Steps 0..1000 every 100, phase A to 700; class 9's slice moves most; attack success 0.02 -> 0.95."""
    steps = np.arange(0, 1001, 100)
    in_b = steps > 700
    mats = {"tn_sim": _blocks(in_b, 0.5, 0.9, 0.4), "act_clean_full": _blocks(in_b, 0.8, 0.85, 0.78),
            "act_poisoned_full": _blocks(in_b, 0.5, 0.9, 0.3), "act_clean_2s": _blocks(in_b, 0.8, 0.8, 0.8),
            "act_clean_9s": _blocks(in_b, 0.8, 0.8, 0.8), "act_clean_plus_poisoned": _blocks(in_b, 0.6, 0.9, 0.5),
            "matrix_cosine": _blocks(in_b, 0.9, 0.95, 0.88)}
    slices = np.stack([_blocks(in_b, 0.5, 0.9 if c == 9 else 0.7, 0.4) for c in range(10)])
    asr = np.where(in_b, 0.95, 0.02)
    return steps, in_b, mats, slices, asr


def write_backdoor(clone, planted=None):
    steps, in_b, mats, slices, asr = planted or planted_backdoor()
    d = clone / authors.AUTHORS_CACHE / "svhn_backdoor"
    _write(d / "similarity.feather", _long(steps, mats))
    _write(d / "slice_similarity.feather", _long(steps, dict(enumerate(slices)), key="class_idx",
                                                 key_type=pa.int64()))
    _write(d / "weight_cosine_matrix.feather", _long(steps, {None: mats["matrix_cosine"]}, key=None,
                                                     value="similarity"))
    hist = {"train_loss": 1 - asr / 2, "test_acc": np.full(len(steps), 0.8), "attack_success_rate": asr}
    _write(d / "history.feather", {"step": ([int(s) for _ in hist for s in steps], pa.int64()),
                                   "metric": ([k for k in hist for _ in steps], STR),
                                   "value": ([float(x) for v in hist.values() for x in v], pa.float64())})
    phase_a = int(steps[~in_b][-1])
    (d / "metadata.json").write_text(json.dumps({"steps": steps.tolist(), "config": {
        "d_hidden": 64, "phase_a_steps": phase_a, "phase_b_steps": int(steps[-1]) - phase_a, "poison_rate": 0.1},
        "phases": [{"name": "clean", "first_step": 100, "last_step": phase_a}]}))
    return clone


STAGES = (("base", 0, 100), ("add 5", 100, 200), ("add 6", 200, 300), ("add 7", 300, 400), ("add 8", 400, 500),
          ("add 9", 500, 600), ("repeat", 600, 700), ("remove 9", 700, 800), ("re-add 9", 800, 900))


def write_forgetting(clone, *, tensor_at_remove=0.8):
    """Values to the end of 'add 9' every 50 batches; each stage's last batch twice (its end, the next's start)."""
    batches = [b for k, (_, lo, hi) in enumerate(STAGES) for b in range(lo if k == 0 else lo, hi + 1, 50)]
    end_of = {hi: name for name, _, hi in STAGES}
    stage = []  # the stage each row belongs to
    for k, (name, lo, hi) in enumerate(STAGES):
        stage += [name] * len(range(lo, hi + 1, 50))
    at_end = {"remove 9": dict(tn=tensor_at_remove, cka=0.93, weight=0.92, slice=-0.9, s9=-0.05, acc9=0.0),
              "re-add 9": dict(tn=0.99, cka=0.999, weight=0.93, slice=0.4, s9=0.98, acc9=0.8),
              "add 9": dict(tn=1.0, cka=1.0, weight=1.0, slice=0.38, s9=1.0, acc9=0.8)}
    default = dict(tn=0.7, cka=0.8, weight=0.9, slice=-0.5, s9=0.3, acc9=0.0)
    val = lambda b, st, k: (at_end.get(st, default) if end_of.get(b) == st else default)[k]
    f32 = pa.float32()
    prog = {"batch": ([], pa.int64()), "metric": ([], STR), "value": ([], f32)}
    for m in ("tn", "cka", "weight"):
        prog["batch"][0].extend(batches), prog["metric"][0].extend([m] * len(batches))
        prog["value"][0].extend(val(b, st, m) for b, st in zip(batches, stage))
    d = clone / authors.AUTHORS_CACHE / "svhn_forgetting"
    _write(d / "progress.feather", prog)
    pc = {"batch": ([], pa.int64()), "class_idx": ([], pa.int64()), "kind": ([], STR), "value": ([], f32)}
    for kind, key, other in (("acc", "acc9", 0.9), ("tensor", "s9", 0.97), ("weight", "s9", 0.9)):
        for c in range(10):
            pc["batch"][0].extend(batches), pc["class_idx"][0].extend([c] * len(batches))
            pc["kind"][0].extend([kind] * len(batches))
            pc["value"][0].extend(val(b, st, key) if c == 9 else other for b, st in zip(batches, stage))
    _write(d / "per_class.feather", pc)
    diff = {"batch": (batches * 2, pa.int64()), "metric": (["slice"] * len(batches) + ["global"] * len(batches), STR),
            "value": ([val(b, st, "slice") for b, st in zip(batches, stage)] + [0.1] * len(batches), f32)}
    _write(clone / authors.AUTHORS_CACHE / "svhn_diffing" / "progress.feather", diff)
    (d / "metadata.json").write_text(json.dumps({"dataset": "svhn", "target_digit": 9,
                                                 "spans": [[lo, hi, name] for name, lo, hi in STAGES]}))
    return clone


def planted_language(n=12):
    """Tensor: three sharp blocks; behavioural and matrix cosine: smooth bands; bigram score peaks at checkpoint 3."""
    steps = np.round(np.geomspace(1, 20_000, n - 1)).astype(int)
    steps = np.concatenate([[0], steps])
    idx = np.arange(n)
    labels = np.searchsorted([4, 8], idx, side="right")
    tensor = np.where(labels[:, None] == labels[None, :], 0.9, 0.2)
    np.fill_diagonal(tensor, 1.0)
    band = lambda r: np.exp(-np.abs(idx[:, None] - idx[None, :]) / r)
    score = np.where(idx == 3, 1.3, 1.1)
    return steps, {"tensor": tensor, "behavioural": band(6.0), "weight_cosine": 0.9 + 0.1 * band(3.0)}, score


def write_language(clone, planted=None):
    steps, mats, score = planted or planted_language()
    d = clone / authors.AUTHORS_CACHE / "language_similarity"
    for name, file in authors.LANGUAGE_MATRICES.items():
        _write(d / file, _long(steps, {None: mats[name]}, key=None, value="similarity"))
    metrics = {f"{n}gram_score": score for n in (2, 3, 4)} | {"val_loss": np.linspace(8, 4, len(steps))}
    _write(d / "behavior.feather", {"step": ([int(s) for _ in metrics for s in steps], pa.int64()),
                                    "metric": ([k for k in metrics for _ in steps], STR),
                                    "value": ([float(x) for v in metrics.values() for x in v], pa.float64())})
    (d / "metadata.json").write_text(json.dumps({"steps": steps.tolist(), "n_ctx": 4}))
    return clone


def write_all(clone):
    return write_language(write_forgetting(write_backdoor(clone)))


# --------------------------------------------------------------------------- readers


def test_no_clone_gives_none_and_the_recorded_calibration(monkeypatch):
    monkeypatch.delenv(authors.AUTHORS_ENV, raising=False)
    for read in (authors.read_backdoor, authors.read_forgetting, authors.read_language):
        assert read() is None and read("") is None
    c = authors.calibration("language", None, lambda d: pytest.fail("nothing to compute"))
    assert c["statistics"] == authors.RECORDED["language"] and authors.AUTHORS_COMMIT in c["source"]
    # every statistic each driver computes is recorded (a rule on any of them is calibrated)
    for name, mod in (("backdoor", bd), ("forgetting", fg), ("language", lg)):
        assert set(authors.RECORDED[name]) == set(mod.STATISTICS), name


def test_read_backdoor_returns_the_planted_arrays(tmp_path, monkeypatch):
    steps, in_b, mats, slices, asr = planted_backdoor()
    clone = write_backdoor(tmp_path / "clone")
    monkeypatch.setenv(authors.AUTHORS_ENV, str(clone))  # the environment variable names the clone
    d = authors.read_backdoor()
    np.testing.assert_array_equal(d["steps"], steps)
    assert d["phase_a_steps"] == 700 and d["in_b"].tolist() == in_b.tolist()
    for ours, theirs in authors.BACKDOOR_METRICS.items():
        np.testing.assert_array_equal(d["matrices"][ours], mats[theirs])
    np.testing.assert_array_equal(d["slices"], slices)
    np.testing.assert_array_equal(d["attack_success"], asr)
    # the block gaps as funsim backdoor computes them, and the placebo: the clean phase, its last 3 checkpoints as B
    gaps, sl, final = authors.block_gaps(d, 9)
    assert gaps["tensor (symmetric)"] == pytest.approx(block_gap(mats["tn_sim"], in_b))
    assert sl[9] == pytest.approx(block_gap(slices[9], in_b)) and final == 0.95
    pg, ps, pfinal = authors.block_gaps(d, 9, placebo=True)
    a = ~in_b
    placebo_b = np.arange(a.sum()) >= a.sum() - in_b.sum()
    assert pg["tensor (symmetric)"] == pytest.approx(block_gap(mats["tn_sim"][np.ix_(a, a)], placebo_b))
    # phase A is one block: the placebo's gap is its diagonal's share only, (3 + 6 * 0.5) / 9 - 0.5
    assert pg["tensor (symmetric)"] == pytest.approx(1 / 6) and pfinal == 0.02


def test_read_forgetting_reads_each_stage_end(tmp_path):
    d = authors.read_forgetting(write_forgetting(tmp_path, tensor_at_remove=0.81))
    assert d["stages"] == tuple(s[0] for s in STAGES) and d["target"] == 9
    k = d["stages"].index("remove 9")
    assert d["tensor"][k] == pytest.approx(0.81) and d["cka"][k] == pytest.approx(0.93)
    assert d["slices"][k, 9] == pytest.approx(-0.05) and d["slices"][k, 0] == pytest.approx(0.97)
    assert d["class_accuracy"][k, 9] == 0 and d["difference_slice"][k] == pytest.approx(-0.9)
    # the batch 800 ends 'remove 9' and starts 're-add 9': its first row (the end of 'remove 9') is read
    assert d["difference_slice"][d["stages"].index("add 9")] == pytest.approx(0.38)


def test_read_language_returns_the_three_matrices_and_the_ngram_scores(tmp_path):
    steps, mats, score = planted_language()
    d = authors.read_language(write_language(tmp_path))
    np.testing.assert_array_equal(d["steps"], steps)
    assert d["n_ctx"] == 4 and set(d["matrices"]) == set(authors.LANGUAGE_MATRICES)
    for k in mats:
        np.testing.assert_allclose(d["matrices"][k], mats[k])
    np.testing.assert_array_equal(d["ngram_score"][2], score)


@pytest.mark.parametrize("experiment, read, file", [
    ("backdoor", authors.read_backdoor, "svhn_backdoor/slice_similarity.feather"),
    ("forgetting", authors.read_forgetting, "svhn_diffing/progress.feather"),
    ("language", authors.read_language, "language_similarity/empirical_pile_matrix.feather"),
])
def test_a_missing_or_damaged_file_is_named(tmp_path, experiment, read, file):
    clone = write_all(tmp_path)
    path = clone / authors.AUTHORS_CACHE / file
    good = path.read_bytes()
    path.unlink()
    with pytest.raises(ValueError, match=f"{path.name} is missing"):
        read(clone)
    path.write_bytes(b"")  # an LFS-less checkout leaves empty files
    with pytest.raises(ValueError, match=f"{path.name}: the file is empty"):
        read(clone)
    path.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(ValueError, match=f"{path.name}: not a readable feather"):
        read(clone)
    path.write_bytes(good)
    assert read(clone) is not None


def test_malformed_files_are_named(tmp_path):
    clone = write_all(tmp_path)
    cache = clone / authors.AUTHORS_CACHE
    with pytest.raises(ValueError, match="is not a directory"):
        authors.read_language(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="artifacts/cache is missing"):
        authors.read_language(cache)
    # a column of the wrong kind, a missing column, a pair given twice, a step not in metadata.json
    p = cache / "language_similarity" / "matrix.feather"
    steps, mats, _ = planted_language()
    cols = _long(steps, {None: mats["tensor"]}, key=None, value="similarity")
    _write(p, {**cols, "similarity": ([str(x) for x in cols["similarity"][0]], STR)})
    with pytest.raises(ValueError, match="matrix.feather: column 'similarity' must hold floating-point"):
        authors.read_language(clone)
    _write(p, {k: v for k, v in cols.items() if k != "step_j"})
    with pytest.raises(ValueError, match="matrix.feather: no column 'step_j'"):
        authors.read_language(clone)
    dup = {k: (v[0] + v[0][:1], v[1]) for k, v in cols.items()}
    _write(p, dup)
    with pytest.raises(ValueError, match=r"matrix.feather: expected each pair .* occurs 2 times"):
        authors.read_language(clone)
    _write(p, {**cols, "step_i": ([99_999 if s == 0 else s for s in cols["step_i"][0]], pa.int64())})
    with pytest.raises(ValueError, match="matrix.feather: step 99999 is not a checkpoint step"):
        authors.read_language(clone)
    # a metric the backdoor needs is absent; metadata.json that is not JSON
    p = cache / "svhn_backdoor" / "similarity.feather"
    steps_b, in_b, m, *_ = planted_backdoor()
    _write(p, _long(steps_b, {k: v for k, v in m.items() if k != "act_poisoned_full"}))
    with pytest.raises(ValueError, match="similarity.feather: no rows of metric 'act_poisoned_full'"):
        authors.read_backdoor(clone)
    (cache / "svhn_forgetting" / "metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match="metadata.json: not a readable JSON file"):
        authors.read_forgetting(clone)


# --------------------------------------------------------------------------- calibration


def test_the_drivers_statistics_on_planted_authors_data(tmp_path):
    clone = write_all(tmp_path)
    cfg = bd.CONFIGS["default"]
    d = authors.read_backdoor(clone)
    s = bd.verdict_statistics(cfg, *authors.block_gaps(d, 9), authors.block_gaps(d, 9, placebo=True))
    steps, in_b, mats, slices, _ = planted_backdoor()
    tensor = block_gap(mats["tn_sim"], in_b)  # (3 + 6 * 0.9) / 9 - 0.4
    assert s["tensor_gap_ratio"] == pytest.approx(tensor / block_gap(mats["act_clean_full"], in_b))
    assert s["target_slice_excess"] == pytest.approx(block_gap(slices[9], in_b) - block_gap(slices[0], in_b))
    assert tensor == pytest.approx(8.4 / 9 - 0.4) and s["tensor_gap_did"] == pytest.approx(tensor - 1 / 6)
    assert [v.outcome for v in verdict.judge_all(cfg.verdict_rules, s)] == ["pass"] * len(cfg.verdict_rules)
    f = fg.verdict_statistics(fg.CONFIGS["default"], authors.stage_ends(authors.read_forgetting(clone), 9))
    assert f["cka_minus_tensor_at_remove"] == pytest.approx(0.93 - 0.8) and f["target_slice_at_remove"] == pytest.approx(-0.05)
    assert f["target_slice_margin"] == pytest.approx(0.97 + 0.05) and f["tensor_at_readd"] == pytest.approx(0.99)
    assert f["difference_slice_at_add9"] == pytest.approx(0.38) and f["difference_slice_at_remove"] == pytest.approx(-0.9)
    lcfg = lg.CONFIGS["default"]
    m = authors.language_metrics(authors.read_language(clone), lcfg.segments,
                                 keys=(lg.PRIMARY, "behavioral/held_out", "weight_cosine"), ngram_key="2gram_agreement")
    ls = lg.verdict_statistics(lcfg, m)
    # three planted blocks: the tensor matrix's K = 3 contrast is 0.9 - 0.2 (minus the baselines' own)
    b = m["blocks"]
    assert b[lg.PRIMARY][3]["boundaries_steps"] == [int(steps) for steps in planted_language()[0][[4, 8]]]
    assert b[lg.PRIMARY][3]["contrast"] == pytest.approx(0.7)
    assert ls["block_contrast_margin"] == pytest.approx(0.7 - max(b[k][3]["contrast"] for k in ("behavioral/held_out",
                                                                                                   "weight_cosine")))


def test_a_rule_that_fails_on_the_authors_data_cannot_label_ours():
    rules = (verdict.Rule("blocks", "x", ">", 0.02), verdict.Rule("contrast", "y", ">", 0.1),
             verdict.Rule("drift", "z", "<", 1.0))
    m = {"verdict_statistics": {"x": -0.01, "y": 0.05, "z": 0.5},
         "authors": {"statistics": {"x": -0.35, "y": 0.21, "z": {"value": None, "reason": "no data"}}, "source": "S"}}
    ours, table = verdict.calibrate(rules, m)
    assert [v.label for v in ours] == [
        "uncalibrated (fails on the authors' data; ours: not reproduced)", "not reproduced",
        "uncalibrated (undefined on the authors' data; ours: reproduced)"]
    assert [v.outcome for v in ours] == ["undefined", "fail", "undefined"]
    assert table[0] == "Calibrated on S." and "the authors' data, same rule" in table[2]
    assert "| -0.350 (not reproduced) |" in table[4] and "| 0.210 (reproduced) |" in table[5]
    # the language claim: "uncalibrated" when a claim rule fails on their data, not "not reproduced"
    lcfg = lg.CONFIGS["default"]
    stats = {"explained_margin": -0.01, "block_contrast_margin": 0.2, "primary_transition_ratio": 8.0,
             "transition_ratio_margin": -40.0, "late_range_margin": 0.36, "primary_max_similarity_se": 6e-4}
    v, _ = verdict.calibrate(lcfg.verdict_rules, {"verdict_statistics": stats,
                                                  "authors": {"statistics": authors.RECORDED["language"], "source": ""}})
    assert lg.claim_label(v) == ("uncalibrated (explained_margin, transition_ratio_margin fail on the authors' "
                                 "data)")
    assert lg.claim_label(v, lg.arguments.CALIBRATED_CLAIM_RULES) == "reproduced"
    v, _ = verdict.calibrate(lcfg.verdict_rules, {"verdict_statistics": stats | {"block_contrast_margin": -0.08},
                                                  "authors": {"statistics": authors.RECORDED["language"], "source": ""}})
    assert lg.claim_label(v, lg.arguments.CALIBRATED_CLAIM_RULES) == "not reproduced at this scale"
    # a primary matrix whose Monte Carlo error swamps the statistics (paper_scale's 0.32) labels nothing
    v, _ = verdict.calibrate(lcfg.verdict_rules, {"verdict_statistics": stats | {"primary_max_similarity_se": 0.32},
                                                  "authors": {"statistics": authors.RECORDED["language"], "source": ""}})
    label = lg.claim_label(v, lg.arguments.CALIBRATED_CLAIM_RULES)
    assert label.startswith("inconclusive (") and "Monte Carlo error too large: primary_max_similarity_se = 0.320" in label
    assert all(x.outcome == "undefined" and "Monte Carlo error too large" in x.label for x in v
               if x.rule.statistic not in ("explained_margin", "transition_ratio_margin"))  # those: uncalibrated


def test_a_bad_clone_is_refused_before_training(tmp_path):
    for name in ("backdoor", "forgetting", "language"):
        with pytest.raises(ValueError, match="is not a directory"):
            cli.main([name, "--config", "smoke", "--no-progress", "--root", str(tmp_path / "r"),
                      "--authors-data", str(tmp_path / "nowhere")])
    assert not (tmp_path / "r").exists()


@NEEDS_MNIST5K
def test_the_backdoor_driver_labels_by_the_authors_data(tmp_path, monkeypatch):
    """With ``--authors-data`` the driver judges each rule on the clone's files first: a rule that fails there
    (here behavioural similarity on clean data sees as much as tensor similarity) cannot label ours."""
    steps, in_b, mats, slices, asr = planted_backdoor()
    mats["act_clean_full"] = _blocks(in_b, 0.5, 0.9, 0.4)  # behavioural gap 0.53 >= 0.15: that rule fails there
    clone = write_backdoor(tmp_path / "clone", (steps, in_b, mats, slices, asr))
    monkeypatch.delenv(authors.AUTHORS_ENV, raising=False)
    cfg = tmp_path / "smoke.json"
    cfg.write_text(json.dumps({"base": "smoke", "control": False}))
    assert cli.main(["backdoor", "--config", str(cfg), "--no-progress", "--root", str(tmp_path / "r"),
                     "--authors-data", str(clone)]) == 0
    out = tmp_path / "r" / "backdoor" / "smoke"
    m = json.loads((out / "metrics.json").read_text())
    assert str(clone.resolve()) in m["authors"]["source"]
    assert m["authors"]["statistics"]["behavioural_gap_clean"] == pytest.approx(block_gap(mats["act_clean_full"], in_b))
    labels = {v["statistic"]: v["label"] for v in m["verdicts"]}
    assert labels["behavioural_gap_clean"].startswith("uncalibrated (fails on the authors' data; ours: ")
    assert labels["tensor_gap_did"] == "inconclusive (no clean control (control off, or poison_rate 0))"
    assert labels["target_slice_excess"] in ("reproduced", "not reproduced")  # passes on theirs: ours decides
    assert f"**{labels['behavioural_gap_clean']}**" in (out / "summary.md").read_text()


def calibration_table(clone) -> list[tuple]:
    """``(experiment, statistic, rule, authors' value, recorded value, outcome)`` for every rule, from a clone."""
    rows = []
    for name, mod in (("backdoor", bd), ("forgetting", fg), ("language", lg)):
        cfg = mod.CONFIGS["default"]
        read = getattr(authors, f"read_{name}")(clone)
        stats = {"backdoor": lambda d: bd.verdict_statistics(cfg, *authors.block_gaps(d, cfg.target),
                                                             authors.block_gaps(d, cfg.target, placebo=True)),
                 "forgetting": lambda d: fg.verdict_statistics(cfg, authors.stage_ends(d, cfg.target)),
                 "language": lambda d: lg.verdict_statistics(cfg, authors.language_metrics(
                     d, cfg.segments, keys=(lg.PRIMARY, "behavioral/held_out", "weight_cosine"),
                     ngram_key=f"{min(cfg.ngram_orders)}gram_agreement"))}[name](read)
        for v in verdict.judge_all(cfg.verdict_rules, stats):
            rows.append((name, v.rule.statistic, v.rule.text(), v.value, authors.RECORDED[name][v.rule.statistic],
                         v.outcome))
    return rows


@pytest.mark.skipif(not os.environ.get(authors.AUTHORS_ENV), reason=f"set {authors.AUTHORS_ENV} to a clone of "
                    f"{authors.AUTHORS_REPOSITORY} to check the recorded calibration against their files")
def test_the_recorded_calibration_is_the_authors_data():
    rows = calibration_table(os.environ[authors.AUTHORS_ENV])
    for name, stat, _, value, recorded, _ in rows:
        assert value == pytest.approx(recorded, abs=6e-4), (name, stat)
    failing = {(n, s) for n, s, *_, outcome in rows if outcome != "pass"}
    assert failing == {("language", "explained_margin"), ("language", "transition_ratio_margin")}


if __name__ == "__main__":  # python tests/test_authors.py <clone>: the calibration table of experiments/README.md
    for row in calibration_table(sys.argv[1] if len(sys.argv) > 1 else os.environ[authors.AUTHORS_ENV]):
        print("{:10s} {:32s} authors {:9.4f} (recorded {:8.3f}) {:5s} {}".format(row[0], row[1], row[3], row[4],
                                                                            row[5], row[2]))
