"""`funsim similarity-study` and `funsim report usable-information` on the smoke zoo: end to end, the
mathematical claims per pair, and resumption after an interruption."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from funsim.experiments import cli, verdict
from funsim.experiments import similarity_study as S
from funsim.experiments import usable_information as ui
from funsim.experiments import zoo as zoo_lib
from funsim.experiments.io import read_json
from funsim.runtime.compile_count import CompileCounter

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ("claim1_asymmetry.png", "claim2_monotonicity.png", "claim3_r2.png", "claim3_architectures.png",
           "claim4_granularity.png", "claim5_sufficiency.png", "held_out_gap.png")


class Crash(Exception):
    """A simulated interruption (a killed process) in the middle of a study."""


def _run_cut_off(monkeypatch, cfg, **kw):
    """``S.run(cfg, **kw)`` interrupted (a simulated kill) as it starts its second stitching target: the grid's
    units and the first target's are written. ``S._stitch_target`` is itself again afterwards."""
    real, calls = S._stitch_target, []

    def crashing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Crash("the run was cut off")
        return real(*a, **k)

    monkeypatch.setattr(S, "_stitch_target", crashing)
    with pytest.raises(Crash):
        S.run(cfg, progress=False, log=lambda s: None, **kw)
    monkeypatch.setattr(S, "_stitch_target", real)


# A smaller study than the smoke config, for the default suite (compilation dominates at this size):
# the smoke zoo's linear and MLP models, linear CKA beside the three families, and task-loss
# stitching of the layers at equal relative depth (the logits). The full smoke config runs in the
# slow test below.
TINY = {"base": "smoke", "name": "tiny", "zoo": "tiny", "measures": ["cka/linear"],
        "depth_tolerance": 0.0, "stitch_steps": 10}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-model zoo, the tiny study and its report."""
    root = tmp_path_factory.mktemp("study")
    zcfg = zoo_lib.config_from_dict({"base": "smoke", "name": "tiny",
                                     "models": [m for m in zoo_lib.CONFIGS["smoke"].models if m.name != "cnn"]})
    zoo_lib.run(zcfg, root=root, progress=False, log=lambda s: None)
    S.run(S.config_from_dict(TINY), root=root, progress=False, log=lambda s: None)
    run = root / "similarity_study" / "tiny"
    ui.report(run, options=ui.ReportOptions(n_resamples=50, n_permutations=50), log=lambda s: None)
    return root, run


@pytest.mark.slow
def test_smoke_config_end_to_end_through_the_cli(tmp_path):
    """`funsim zoo/similarity-study/report` on the smoke configs: every measure, both stitching layouts."""
    root = str(tmp_path)
    assert cli.main(["zoo", "--config", "smoke", "--root", root, "--no-progress"]) == 0
    assert cli.main(["similarity-study", "--config", "smoke", "--root", root, "--no-progress"]) == 0
    run = tmp_path / "similarity_study" / "smoke"
    assert cli.main(["report", "usable-information", "--run", str(run), "--n-resamples", "100",
                     "--n-permutations", "100"]) == 0
    t = S.read_table(run / "comparisons.csv")
    assert set(S.CONFIGS["smoke"].measures) <= set(t["measure"])
    # a cell is NaN only where the measure is undefined for the layers (the grid keeps it as NaN with its
    # reason, as the pairwise call refuses it); on the smoke zoo that happens for PWCCA only, and most of its
    # cells, and every other measure's, are finite
    bad = ~np.isfinite(t["value"])
    assert set(t["measure"][bad]) <= {"pwcca"}, sorted(set(t["measure"][bad]))
    assert np.isfinite(t["value"][t["measure"] == "pwcca"]).mean() > 0.5
    assert read_json(run / "metrics.json")["layer_pair_comparisons"] == 58
    for f in FIGURES:
        assert (run / "usable_information" / f).read_bytes()[:8] == PNG


def _where(t, **kw):
    mask = np.ones(len(t["value"]), bool)
    for k, v in kw.items():
        mask &= t[k] == v
    return mask


def _by_pair(t, mask):
    keys = zip(t["dataset"][mask], t["model_a"][mask], t["layer_a"][mask], t["model_b"][mask], t["layer_b"][mask],
               t["direction"][mask])
    return dict(zip(keys, t["value"][mask]))


def test_study_and_report_write_every_table_and_figure(tiny):
    root, run = tiny
    for f in ("config.json", "metrics.json", "summary.md", "comparisons.csv"):
        assert (run / f).stat().st_size > 0
    t = S.read_table(run / "comparisons.csv")
    assert set(t) == set(S.COLUMNS) and np.all(np.isfinite(t["value"]))
    cfg = S.config_from_dict(TINY)
    assert set(t["measure"]) >= set(cfg.measures) | {f"stitch/{f}" for f in cfg.families} | \
        {f"task/{f}/relative_accuracy" for f in cfg.stitch_families}
    metrics = read_json(run / "metrics.json")
    # every layer pair of two different models (linear: 1 layer, mlp: 2; two seeds each), each measure
    n_pairs = metrics["layer_pair_comparisons"]
    assert n_pairs == (6**2 - 2 * 1 - 2 * 4) // 2 == 13 and np.sum(_where(t, measure="cka/linear")) == n_pairs
    assert np.sum(_where(t, measure="stitch/affine", split="held_out")) == 2 * n_pairs
    rep = run / "usable_information"
    for f in FIGURES:
        assert (rep / f).read_bytes()[:8] == PNG and (rep / f).stat().st_size > 5000
    summary = (rep / "summary.md").read_text()
    for claim in range(1, 6):
        assert f"## Claim {claim}" in summary
    m = read_json(rep / "metrics.json")
    assert m["claim3"]["in_sample"]["scaled_orthogonal"]["cka/linear"]["n"] == 2 * n_pairs
    # the R^2 the report gives equals the squared Pearson correlation recomputed with NumPy from the table
    cka = _by_pair(t, _where(t, measure="cka/linear"))
    score = _by_pair(t, _where(t, measure="stitch/scaled_orthogonal", split="in_sample"))
    x = np.array([cka[k[:5] + ("sym",)] for k in sorted(score)])
    y = np.array([score[k] for k in sorted(score)])
    r2 = np.corrcoef(x, y)[0, 1] ** 2
    np.testing.assert_allclose(m["claim3"]["in_sample"]["scaled_orthogonal"]["cka/linear"]["r2"], r2, rtol=1e-6)
    np.testing.assert_allclose(m["verdict_statistics"]["r2_cka"]["value"], r2, rtol=1e-6)
    # claim 3 by architecture (linear, mlp): every pair of architectures, each leaving one out, RSA both ways
    arch = {k: k[1].split("/")[1].rsplit("_s", 1)[0] != k[3].split("/")[1].rsplit("_s", 1)[0] for k in sorted(score)}
    mixed = np.array(list(arch.values()))
    np.testing.assert_allclose(m["claim3_architectures"]["cka/linear"]["linear x mlp"]["value"],
                               np.corrcoef(x[mixed], y[mixed])[0, 1] ** 2, rtol=1e-6)
    assert set(m["claim3_architectures"]["cka/linear"]) == {"linear x linear", "linear x mlp", "mlp x mlp"}
    np.testing.assert_allclose(m["claim3_leave_one_out"]["cka/linear"]["all"]["value"], r2, rtol=1e-6)
    assert set(m["claim3_leave_one_out"]["cka/linear"]["without"]) == {"linear", "mlp"}
    assert set(m["claim3_families"]["cka/linear"]) == {"dense_only", "with_conv"}
    assert {k.split("@")[0] for k in m["claim3_rsa_skipped"]} == {"rsa/correlation/spearman"}
    assert "**By architecture**" in summary and "**RSA's cells skipped for width**" in summary
    # the verdict rows are the config's rules applied to the statistics, printed with their labels
    verdicts = verdict.judge_all(cfg.verdict_rules, m["verdict_statistics"])
    assert [v.to_json() for v in verdicts] == m["verdicts"]
    for v in verdicts:
        assert f"| {v.rule.claim} | `{v.rule.text()}` | {v.value_text()} | **{v.label}** |" in summary


def test_in_sample_scores_are_monotone_in_the_family_per_pair(tiny):
    """A theorem: the families are nested (orthogonal in scaled orthogonal in affine), and the in-sample
    score is one minus the least residual over the family on the rows it was fitted on. With the affine
    ridge r, affine >= scaled orthogonal - r min(d_src, d_tgt) (ui.ridge_slack). Held out, no theorem."""
    _, run = tiny
    t = S.read_table(run / "comparisons.csv")
    o, s, a = (_by_pair(t, _where(t, measure=f"stitch/{f}", split="in_sample")) for f in ui.FAMILIES)
    assert set(o) == set(s) == set(a) and len(o) == 26
    ridge = S.CONFIGS["smoke"].affine_ridge
    for k in o:
        assert o[k] <= s[k] + 1e-5, k
        assert s[k] <= a[k] + ridge * 16 + 1e-5, k  # 16: the widest representation here
    m = read_json(run / "usable_information" / "metrics.json")
    assert m["claim2"]["in_sample"]["orthogonal_gt_scaled"] == 0
    assert m["claim2"]["in_sample"]["scaled_gt_affine_beyond_ridge_bound"] == 0


def test_coarsened_predictions_are_at_least_as_accurate_per_pair(tiny):
    """A theorem: mapping a stitched model's fine prediction to its group is right whenever the fine
    prediction is, so its coarse accuracy is at least its fine accuracy (for the target's own layer too).
    The relative accuracy of a stitcher retrained on coarse labels is only empirically higher."""
    _, run = tiny
    t = S.read_table(run / "comparisons.csv")
    for q in ("accuracy", "own_accuracy"):
        fine = _by_pair(t, _where(t, measure=f"task/affine/{q}", task="fine"))
        coarse = _by_pair(t, _where(t, measure=f"task/affine/{q}", task="coarsened:parity"))
        # 4 logits layers, each into the 3 other models, and the two MLP seeds' fc0 both ways
        assert set(fine) == set(coarse) and len(fine) == 4 * 3 + 2
        assert all(coarse[k] >= fine[k] for k in fine)
    m = read_json(run / "usable_information" / "metrics.json")
    assert m["claim4"]["affine/parity"]["coarsened_accuracy_below_fine"] == 0


def test_interrupted_study_resumes_to_the_same_table(tiny, monkeypatch):
    root, run = tiny
    cfg = S.config_from_dict(TINY)
    _run_cut_off(monkeypatch, cfg, root=root, run_name="resumed")
    out = root / "similarity_study" / "resumed"
    assert len(list((out / "pairs" / "digits").glob("*.json"))) == 6  # the grid was written pair by pair
    # one stitching target, three tasks: fine, coarse (summed softmax), coarse (new head: an empty unit
    # here, since the linear model's logits have no penultimate stage after them)
    assert len(list((out / "stitch").rglob("*.json"))) == 3
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if p.parent.name != "resumed"}
    # the resumed run near the memory-mapping limit: it releases the compiled programs before its target
    from funsim.experiments import jit_memory as M
    released, clear = [], jax.clear_caches
    monkeypatch.setattr(M, "_limit", lambda: 1000)
    monkeypatch.setattr(M, "_mappings", lambda: 900)
    monkeypatch.setitem(M._state, "floor", 0)
    monkeypatch.setattr(M, "_MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(jax, "clear_caches", lambda: released.append(1) or clear())
    S.run(cfg, root=root, run_name="resumed", progress=False, log=lambda s: None)
    assert released
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished units are not redone
    assert (out / "comparisons.csv").read_bytes() == (run / "comparisons.csv").read_bytes()
    # a changed config is refused, not mixed in
    with pytest.raises(ValueError, match="another config:\n  n_rows: saved 96, now 64"):
        S.run(S.config_from_dict({**TINY, "n_rows": 64}), root=root, run_name="resumed", progress=False)


def test_damaged_result_files_are_named_refused_and_recomputed(tiny, capsys):
    """A cut table is refused (mid-line and at a line boundary), a damaged unit is recomputed, every reader
    names its file; the study's rerun repairs the table."""
    import shutil

    from funsim.experiments.io import DamagedFileError

    root, run = tiny
    out = root / "similarity_study" / "damaged"
    shutil.copytree(run, out)
    table = out / "comparisons.csv"
    good = table.read_bytes()
    n_rows = good.count(b"\n") - 1
    cut_mid_line = good[: good.index(b"\n", len(good) // 2) + 10]
    cut_at_line = good[: good.index(b"\n", len(good) // 2) + 1]
    for cut in (cut_mid_line, cut_at_line):
        table.write_bytes(cut)
        with pytest.raises(DamagedFileError, match=rf"{table} does not match its manifest.*\({n_rows} rows\).*"
                                                   r"Rerun the similarity study"):
            S.read_table(table)
        with pytest.raises(DamagedFileError, match=str(table)):
            ui.report(out, options=ui.ReportOptions(n_resamples=10, n_permutations=10), log=lambda s: None)
        assert cli.main(["report", "usable-information", "--run", str(out)]) == 1
        err = capsys.readouterr().err
        assert str(table) in err and "Traceback" not in err
    # read without the manifest, a row cut mid-line is still named (it used to be a TypeError in the report)
    table.write_bytes(cut_mid_line)
    last_line = cut_mid_line.count(b"\n") + 1
    with pytest.raises(DamagedFileError, match=rf"{table}, line {last_line}: \d+ fields where the header has 12"):
        S.read_table(table, verify=False)
    # a truncated unit file is recomputed by the rerun, which rewrites the table: identical to the original
    unit = sorted((out / "pairs" / "digits").glob("*.json"))[0]
    unit.write_bytes(unit.read_bytes()[:50])
    with pytest.raises(DamagedFileError, match=rf"{unit} is not valid JSON"):
        read_json(unit)
    with pytest.warns(RuntimeWarning, match=rf"{unit} is damaged.*recomputing it"):
        S.run(S.config_from_dict(TINY), root=root, run_name="damaged", progress=False, log=lambda s: None)
    assert table.read_bytes() == good
    assert S.read_table(table)["value"].shape == (n_rows,)
    # the report names a damaged metrics.json too
    (out / "metrics.json").write_text('{"zoo": ')
    with pytest.raises(DamagedFileError, match=rf"{out / 'metrics.json'} is not valid JSON"):
        ui.report(out, log=lambda s: None)


def test_bad_config_and_missing_zoo(tmp_path):
    for cfg in S.CONFIGS.values():  # every shipped config is valid (measures, families, options)
        S._check_config(cfg)
    with pytest.raises(ValueError, match="unknown StudyConfig fields \\['n_row'\\] \\(did you mean 'n_rows'\\?\\)"):
        S.config_from_dict({"base": "smoke", "n_row": 3})
    with pytest.raises(ValueError, match="reconstruction scores come from `families`"):
        S.run(S.config_from_dict({"base": "smoke", "measures": ["stitch/affine"]}), root=tmp_path, progress=False)
    with pytest.raises(ValueError, match="Unknown stitcher family 'rotation'"):
        S.run(S.config_from_dict({"base": "smoke", "families": ["rotation"]}), root=tmp_path, progress=False)
    assert cli.main(["similarity-study", "--config", "smoke", "--root", str(tmp_path), "--no-progress"]) == 1
    assert cli.main(["report", "usable-information", "--run", str(tmp_path / "nothing")]) == 1


def test_coarse_tail_marginalises_the_softmax():
    import jax
    import jax.numpy as jnp

    logits = jax.random.normal(jax.random.key(0), (5, 4))
    groups = (0, 1, 0, 1)
    tail = S.CoarseTail(lambda p, h: h * p, groups)
    assert hash(tail) == hash(S.CoarseTail(tail.tail, groups))
    p = np.asarray(jax.nn.softmax(logits, axis=-1))
    ref = np.stack([p[:, [0, 2]].sum(1), p[:, [1, 3]].sum(1)], axis=1)
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(tail(jnp.asarray(1.0), logits), axis=-1)), ref, rtol=1e-5)


def _synthetic_table(rng, *, n_models=6, layers=3, noise=0.02, fine_low=True):
    """A comparisons table with known answers: CKA = the in-sample scaled-orthogonal score + small noise,
    RSA likewise, SVCCA pure noise; fine task-loss relative accuracy either mostly below the ceiling or all
    above it, the coarse task 0.05 above the fine one."""
    cols = {c: [] for c in S.COLUMNS}

    def add(a, la, b, lb, measure, direction, split, task, value):
        for c, v in zip(S.COLUMNS, ("d", a, la, 0.5, b, lb, 0.5, measure, direction, split, task, value)):
            cols[c].append(v)

    for i in range(n_models):
        for j in range(i + 1, n_models):
            for la in range(layers):
                for lb in range(layers):
                    a, b, sa, sb = f"d/m{i}", f"d/m{j}", f"l{la}", f"l{lb}"
                    s = rng.uniform(0.2, 1.0)  # both directions: the symmetric measures track it
                    for d in ("a->b", "b->a"):
                        add(a, sa, b, sb, "stitch/scaled_orthogonal", d, "in_sample", "-", s)
                        for fam in ui.FAMILIES:
                            add(a, sa, b, sb, f"stitch/{fam}", d, "held_out", "-", s + 0.01 * ui.FAMILIES.index(fam))
                        fine = rng.uniform(0.6, 0.99) if fine_low else rng.uniform(0.96, 1.0)
                        add(a, sa, b, sb, "task/affine/relative_accuracy", d, "held_out", "fine", fine)
                        add(a, sa, b, sb, "task/affine/relative_accuracy", d, "held_out", "coarse:g", fine + 0.05)
                    add(a, sa, b, sb, "cka/linear", "sym", "all", "-", s + noise * rng.normal())
                    add(a, sa, b, sb, "rsa/correlation/spearman", "sym", "all", "-", s + noise * rng.normal())
                    add(a, sa, b, sb, "svcca", "sym", "all", "-", rng.uniform(0, 1))
    return ui._Table({c: np.array(v, dtype=float if c in ("depth_a", "depth_b", "value") else object)
                      for c, v in cols.items()})


def test_verdict_statistics_on_synthetic_tables_with_known_answers():
    """Claim 3 on a table where CKA and RSA track the score and SVCCA is noise: R^2 > 0.9 and the SVCCA
    margin positive, labelled 'reproduced'; claim 4 with coarse = fine + 0.05 below the ceiling: the mean
    difference is 0.05 and the label 'reproduced'; the same table at the ceiling: 'inconclusive (ceiling)'."""
    import jax

    rules = S.CONFIGS["default"].verdict_rules
    opts = ui.ReportOptions(n_resamples=200)
    stats = ui.verdict_statistics(_synthetic_table(np.random.default_rng(0)), opts, jax.random.key(0))
    assert stats["r2_cka"]["value"] > 0.9 and stats["r2_rsa"]["value"] > 0.9
    for name in ("r2_cka", "r2_min_cka_rsa_minus_svcca"):  # models resampled; model pairs beside
        iv, ip = stats[name]["interval"], stats[name]["interval_pairs"]
        assert iv[0] <= stats[name]["value"] <= iv[1] and ip[0] <= stats[name]["value"] <= ip[1] and iv != ip
    assert stats["r2_min_cka_rsa_minus_svcca"]["interval"][0] > 0.5
    np.testing.assert_allclose(stats["granularity_coarse_minus_fine_summed"]["value"], 0.05, atol=1e-12)
    assert stats["share_below_095"] > 0.8 and stats["order_violations_held_out"] == 0.0
    labels = {v.rule.claim: v.label for v in verdict.judge_all(rules, stats)}
    assert labels["3a CKA estimates the scaled-orthogonal score"] == "reproduced"
    assert labels["3c SVCCA estimates it less well than CKA and RSA"] == "reproduced"
    assert labels["4 coarse >= fine (summed-softmax readout)"] == "reproduced"
    assert labels["4 coarse >= fine (new coarse head)"].startswith("inconclusive (no coarse head")
    assert labels["2b family order holds on task loss"].startswith("inconclusive (task-loss families")
    ceiling = ui.verdict_statistics(_synthetic_table(np.random.default_rng(1), fine_low=False), opts,
                                    jax.random.key(0))
    assert ceiling["share_below_095"] == 0.0
    labels = {v.rule.claim: v.label for v in verdict.judge_all(rules, ceiling)}
    assert labels["4 coarse >= fine (summed-softmax readout)"] == "inconclusive (ceiling)"
    assert labels["1a asymmetry, task loss (affine)"] == "inconclusive (ceiling)"
    # noise instead of signal: R^2 near 0, labelled 'not reproduced'
    noisy = ui.verdict_statistics(_synthetic_table(np.random.default_rng(2), noise=5.0), opts, jax.random.key(0))
    labels = {v.rule.claim: v.label for v in verdict.judge_all(rules, noisy)}
    assert noisy["r2_cka"]["interval"][1] < 0.8
    assert labels["3a CKA estimates the scaled-orthogonal score"] == "not reproduced"


def test_rsa_above_the_feature_limit_is_nan_and_counted():
    """RSA of a layer wider than rsa_max_features is NaN (never 0.0); the other cells equal the plain grid."""
    rng = np.random.default_rng(0)
    reps = {"a": rng.normal(size=(20, 5)).astype(np.float32), "b": rng.normal(size=(20, 12)).astype(np.float32),
            "c": rng.normal(size=(20, 7)).astype(np.float32)}
    cfg = S.config_from_dict({"base": "smoke"})
    tables, skipped = S._limited_grid(reps, ["rsa/correlation/spearman"], cfg, 8)
    t = tables["rsa/correlation/spearman"]
    assert skipped == 1 and np.all(np.isnan(t[1])) and np.all(np.isnan(t[:, 1]))
    full = S._grid(reps, ["rsa/correlation/spearman"], cfg)["rsa/correlation/spearman"]
    keep = [0, 2]
    np.testing.assert_allclose(t[np.ix_(keep, keep)], full[np.ix_(keep, keep)], rtol=1e-6)


def test_feature_conventions_in_the_table(tiny):
    """The main grid reads MLP layers before the activation (the paper code's convention); the extra
    convention's rows (post-activation) carry `@post_activation/spatial_mean` and are linear CKA of the
    post-activation features, recomputed here with the library function."""
    import funsim.models as models_lib
    from funsim import similarity

    root, run = tiny
    t = S.read_table(run / "comparisons.csv")
    zoo = zoo_lib.load_zoo(root / "zoo" / "tiny", datasets=("digits",))
    mlps = [m for m in zoo.by_dataset("digits") if m.name == "mlp"]
    a, b = mlps[0], mlps[1]
    x = S._rows(zoo_lib.load_zoo_data(root / "zoo" / "tiny", "digits").dataset, S.config_from_dict(TINY).n_rows)
    for point, measure in (("pre_activation", "cka/linear"), ("post_activation",
                                                             "cka/linear@post_activation/spatial_mean")):
        fa = models_lib.compiled(a.model).features(x, point=point, as_numpy=True)["fc0"]
        fb = models_lib.compiled(b.model).features(x, point=point, as_numpy=True)["fc0"]
        row = _where(t, measure=measure, model_a=a.id, layer_a="fc0", model_b=b.id, layer_b="fc0")
        assert row.sum() == 1
        np.testing.assert_allclose(t["value"][row][0], float(similarity.cka(fa, fb)), rtol=1e-4)
    pre = t["value"][_where(t, measure="cka/linear", model_a=a.id, layer_a="fc0", model_b=b.id, layer_b="fc0")]
    post = t["value"][_where(t, measure="cka/linear@post_activation/spatial_mean", model_a=a.id, layer_a="fc0",
                             model_b=b.id, layer_b="fc0")]
    assert abs(pre[0] - post[0]) > 1e-4  # the two conventions differ


def test_unsaturated_design_smoke(tiny):
    """The unsaturated design's code path on the tiny zoo: three task-loss families, fewer stitching rows
    (12) than the MLP's source width (16: the orthogonal closed-form start on the rows' span), the coarse
    task through a new head on each target's penultimate features beside the summed softmax, and the report's
    granularity statistics for both readouts."""
    import jax

    root, _ = tiny
    cfg = S.config_from_dict({**TINY, "name": "unsat", "families": ["orthogonal", "scaled_orthogonal", "affine"],
                              "stitch_families": ["orthogonal", "scaled_orthogonal", "affine"], "depth_tolerance": 0.5,
                              "stitch_steps": 5, "stitch_train_rows_by_dataset": ["digits=12"], "conventions": []})
    with CompileCounter() as c:
        S.run(cfg, root=root, progress=False, log=lambda s: None)
    run = root / "similarity_study" / "unsat"
    t = S.read_table(run / "comparisons.csv")
    # at most one training loop per tail (a target's own, and its coarse head where it takes one), not
    # per task or family: the fine and coarse tasks of all three families train together
    units = run / "stitch" / "digits"
    n_tails = sum(1 for _ in (units / "fine" / "affine").glob("*.json")) + sum(
        1 for f in (units / "coarse_head_parity" / "affine").glob("*.json") if json.loads(f.read_text())["rows"])
    assert n_tails >= 3
    assert 0 < sum(n.endswith("fit_loop)") for n in c.names) <= n_tails, (n_tails, c.names)
    for fam in cfg.stitch_families:
        for task in ("fine", "coarse:parity", "coarse_head:parity"):
            sel = _where(t, measure=f"task/{fam}/relative_accuracy", task=task)
            assert sel.sum() > 0 and np.all(np.isfinite(t["value"][sel])), (fam, task)
    # the head reads the MLP's penultimate stage (fc0): only fc0 targets take it, the logits do not
    head = _where(t, measure="task/affine/own_accuracy", task="coarse_head:parity")
    targets = {(a if d == "b->a" else b, la if d == "b->a" else lb) for a, la, b, lb, d in
               zip(t["model_a"][head], t["layer_a"][head], t["model_b"][head], t["layer_b"][head], t["direction"][head])}
    assert {layer for _, layer in targets} == {"fc0"}
    assert np.all(t["value"][head] > 0.6)  # the new parity head on the frozen features works
    stats = ui.verdict_statistics(ui._Table(t), ui.ReportOptions(n_resamples=20), jax.random.key(0))
    assert stats["share_below_095"] is not None
    for name in ("granularity_coarse_minus_fine_summed", "granularity_coarse_minus_fine_head"):
        v = stats[name]
        assert isinstance(v, dict) and (v["value"] is not None or "reason" in v), name
    # claim 4's split: every task-loss row has its two halves of the test rows, and the report uses them
    for task in ("fine", "coarse:parity"):
        n = _where(t, measure="task/affine/relative_accuracy", task=task).sum()
        assert all(_where(t, measure=f"task/affine/relative_accuracy_half{h}", task=task).sum() == n for h in (0, 1))
    assert isinstance(stats["split_model_pairs"], int) and "predates" not in str(stats["granularity_split_summed"])


def test_orthogonal_families_trained_together_equal_one_alone(tiny):
    """The study trains a target's orthogonal and scaled-orthogonal stitchers in one compiled loop (the
    orthogonal ones with their scale held at 1): the orthogonal rows equal a run with that family alone
    (same keys: the family is first in both configs), and the scaled stitchers' scales are free."""
    root, _ = tiny
    base = {**TINY, "coarse_groupings": []}
    both = S.config_from_dict({**base, "stitch_families": ["orthogonal", "scaled_orthogonal"]})
    alone = S.config_from_dict({**base, "stitch_families": ["orthogonal"]})
    tables = {}
    for name, cfg in (("both", both), ("alone", alone)):
        S.run(cfg, root=root, run_name=f"fams_{name}", progress=False, log=lambda s: None)
        tables[name] = S.read_table(root / "similarity_study" / f"fams_{name}" / "comparisons.csv")
    for q in ("accuracy", "ce_gap"):
        a = _by_pair(tables["both"], _where(tables["both"], measure=f"task/orthogonal/{q}", task="fine"))
        b = _by_pair(tables["alone"], _where(tables["alone"], measure=f"task/orthogonal/{q}", task="fine"))
        assert a and set(a) == set(b)
        np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], rtol=0, atol=1e-6)
    scaled = _where(tables["both"], measure="task/scaled_orthogonal/accuracy", task="fine")
    assert scaled.sum() == len(a)


def test_units_from_another_machine_merge_and_the_run_resumes_to_the_same_table(tiny, tmp_path, monkeypatch):
    """The carry-and-resume path of a device run at smoke size: the zoo's data packed into its folder, a study
    interrupted "on the device" (where the data sources are absent), its units merged here, and the run
    finished here gives the table of an uninterrupted run; another config or code version is refused."""
    import shutil

    from funsim import data as data_lib
    from funsim.models import zoo as mzoo
    root, run = tiny
    device = tmp_path / "device"
    shutil.copytree(root / "zoo" / "tiny", device / "zoo" / "tiny")
    [pack] = mzoo.pack_zoo_data(device / "zoo" / "tiny")
    here = mzoo.load_zoo_data(root / "zoo" / "tiny", "digits")

    def absent(*a, **kw):
        raise data_lib.DataNotFoundError("no data sources on the device")

    monkeypatch.setattr(data_lib, "load", absent)
    monkeypatch.setattr(data_lib, "load_coarse", absent)
    packed = mzoo.load_zoo_data(device / "zoo" / "tiny", "digits")  # from the pack, fingerprint checked
    np.testing.assert_array_equal(packed.dataset.x_train, here.dataset.x_train)
    assert packed.coarse.keys() == here.coarse.keys()
    for g in here.coarse:
        np.testing.assert_array_equal(packed.coarse[g].y_test, here.coarse[g].y_test)
    cfg = S.config_from_dict(TINY)
    _run_cut_off(monkeypatch, cfg, root=device)  # the device run's time is up
    monkeypatch.undo()
    src = device / "similarity_study" / "tiny"
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    assert cli.main(["similarity-study", "--config", str(tmp_path / "tiny.json"), "--root", str(root), "--run",
                     "merged", "--merge-units", str(src)]) == 0
    out = root / "similarity_study" / "merged"
    assert sorted(p.relative_to(out) for p in out.rglob("*.json") if p.name != "config.json") == \
        sorted(p.relative_to(src) for p in src.rglob("*.json") if p.name != "config.json")
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if p.parent != out}
    S.run(cfg, root=root, run_name="merged", progress=False, log=lambda s: None)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # the merged units are not recomputed
    assert (out / "comparisons.csv").read_bytes() == (run / "comparisons.csv").read_bytes()
    # another config: refused before anything is copied
    with pytest.raises(ValueError, match=r"another config \(saved: .*other.*, now: .*device.*\):\n  n_rows: saved 64, now 96"):
        S.merge(src, S.config_from_dict({**TINY, "n_rows": 64}), root=tmp_path / "other")
    # a unit computed by other code: refused, naming it
    unit = sorted((src / "pairs").rglob("*.json"))[0]
    unit.write_text(json.dumps({**json.loads(unit.read_text()), "code": "0123456789abcdef"}))
    with pytest.raises(ValueError, match=f"1 units were computed by other code.*\n  {unit}: code '0123456789abcdef'"):
        S.merge(src, cfg, root=tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "similarity_study" / "tiny" / "pairs").exists()
    assert pack.name == "digits.npz"


def test_units_of_other_code_or_other_trained_models_are_refused_on_resume_and_merge(tiny, tmp_path, capsys):
    """Every unit records the code and the zoo's weights that computed it. A resumed run passes its own units and
    refuses, naming the unit and both versions, one computed by other code or from other weights (a zoo retrained
    to other bits, or a unit from before units recorded their zoo); so does a merge. The zoo's version is a
    function of every parameter: one ulp of one weight changes it."""
    import shutil

    from funsim.models.io import SetupMismatchError
    root, run = tiny
    cfg = S.config_from_dict(TINY)
    (tmp_path / "zoo").symlink_to(root / "zoo")
    mine = tmp_path / "similarity_study" / "tiny"
    shutil.copytree(run, mine)
    units = S._dataset_units(mine, "digits")
    models = zoo_lib.load_zoo(root / "zoo" / "tiny", datasets=("digits",)).by_dataset("digits")
    version = S._version(models)
    assert len(units) == 15 and all({k: json.loads(u.read_text())[k] for k in version} == version for u in units)
    table = (mine / "comparisons.csv").read_bytes()
    S.run(cfg, root=tmp_path, progress=False, log=lambda s: None)  # its own units: resumed, nothing recomputed
    assert (mine / "comparisons.csv").read_bytes() == table
    other = dict(version, zoo="0123456789abcdef")
    for unit, edit, why in [(units[0], {"code": "fedcba9876543210"}, f"code 'fedcba9876543210' \\(now '{version['code']}'\\)"),
                            (units[-1], {"zoo": other["zoo"]}, f"zoo '0123456789abcdef' \\(now '{version['zoo']}'\\)"),
                            (units[-1], {"zoo": None}, "zoo None")]:
        saved = unit.read_bytes()
        unit.write_text(json.dumps({**json.loads(saved), **edit}))
        with pytest.raises(SetupMismatchError, match=f"Refusing to resume {mine}: 1 of its digits units .*\n  {unit}: {why}"):
            S.run(cfg, root=tmp_path, progress=False, log=lambda s: None)
        if "code" in edit:  # the command line prints it as one error line, with no traceback, status 1
            (tmp_path / "tiny.json").write_text(json.dumps(TINY))
            capsys.readouterr()
            assert cli.main(["similarity-study", "--config", str(tmp_path / "tiny.json"), "--root", str(tmp_path),
                             "--no-progress"]) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"funsim similarity-study: error: Refusing to resume {mine}: 1 of its digits "
                                  "units") and str(unit) in err and "Traceback" not in err, err
        if "zoo" in edit:  # the merge reads this tree's zoo and refuses the unit too, copying nothing
            with pytest.raises(SetupMismatchError, match=f"1 units were computed from other inputs.*\n  {unit}: {why}"):
                S.merge(mine, cfg, root=tmp_path, run_name="merged")
            assert not (tmp_path / "similarity_study" / "merged" / "pairs").exists()
        unit.write_bytes(saved)
    assert S.merge(mine, cfg, root=tmp_path, run_name="merged") == {"copied": 15, "kept": 0}
    leaves, tree = jax.tree.flatten(nnx.state(models[-1].model, nnx.Param))
    w = np.array(leaves[0])
    w.flat[0] = np.nextafter(w.flat[0], np.inf)  # one ulp up in one entry of one weight
    nnx.update(models[-1].model, jax.tree.unflatten(tree, [w, *leaves[1:]]))
    assert S._version(models)["zoo"] != version["zoo"]


def test_a_ledger_keeps_a_study_across_machines(tiny, tmp_path, monkeypatch):
    """`funsim ledger`: a study cut off on one machine is recorded as a piece, restored on a fresh machine,
    finished there and recorded again (its new units only); both pieces restored into a third folder finish
    to the uninterrupted run's table without computing anything. The second machine reads the zoo the ledger
    keeps (a carried copy), not the one it was trained into. A new ledger without its commit, units of two code
    versions, a damaged piece or zoo and a run folder of another config are refused."""
    from funsim.experiments import ledger as L
    from funsim.models import zoo as mzoo
    root, run = tiny
    cfg = S.config_from_dict(TINY)
    book = tmp_path / "ledger"

    def machine(name, zoo=True):
        (tmp_path / name).mkdir()
        if zoo:
            (tmp_path / name / "zoo").symlink_to(root / "zoo")
        return tmp_path / name, tmp_path / name / "similarity_study" / "tiny"

    r1, m1 = machine("m1")
    _run_cut_off(monkeypatch, cfg, root=r1)  # this machine's time is up
    n1 = len(L._units(m1))
    assert 6 < n1 < 15  # the 6 model pairs' grids and the first target's units
    with pytest.raises(L.LedgerError, match="a new ledger needs --commit"):
        L.record(book, m1, device="this CPU")
    e1 = L.record(book, m1, device="this CPU", commit="c0ffee", seconds=1.5)
    assert (e1["file"], len(e1["units"])) == ("piece-001.tar.xz", n1)
    assert L.record(book, m1, device="this CPU") == {"units": []}
    mzoo.carry_zoo(root / "zoo" / "tiny", tmp_path / "carried" / "tiny")
    (tmp_path / "misnamed").symlink_to(tmp_path / "carried" / "tiny")
    with pytest.raises(L.LedgerError, match="restored by its folder's name, 'misnamed', but the run reads the zoo 'tiny'"):
        L.record_zoo(book, tmp_path / "misnamed")
    assert L.record_zoo(book, tmp_path / "carried" / "tiny")["file"] == "zoo.tar.xz"
    with pytest.raises(L.LedgerError, match="keeps its zoo already"):
        L.record_zoo(book, tmp_path / "carried" / "tiny")
    r2, m2 = machine("m2", zoo=False)
    assert L.restore(book, m2) == {"restored": n1, "kept": 0}
    assert L.restore_zoo(book, r2 / "zoo") == r2 / "zoo" / "tiny"
    S.run(cfg, root=r2, progress=False, log=lambda s: None)
    assert cli.main(["ledger", "record", str(book), "--run", str(m2), "--device", "another CPU"]) == 0
    book_json = json.loads((book / "ledger.json").read_text())
    assert [len(p["units"]) for p in book_json["pieces"]] == [n1, 15 - n1]
    assert book_json["zoo"] == {"digits": S._version(zoo_lib.load_zoo(root / "zoo" / "tiny").by_dataset("digits"))["zoo"]}
    r3, m3 = machine("m3")
    assert L.restore(book, m3) == {"restored": 15, "kept": 0}

    def nothing_left(*a, **kw):
        raise AssertionError("a restored unit was computed again")

    monkeypatch.setattr(S, "_stitch_target", nothing_left)
    monkeypatch.setattr(S, "_grid", nothing_left)
    S.run(cfg, root=r3, progress=False, log=lambda s: None)
    monkeypatch.undo()
    assert (m3 / "comparisons.csv").read_bytes() == (run / "comparisons.csv").read_bytes()
    assert L.restore(book, m3) == {"restored": 0, "kept": 15}
    assert "2 pieces" in L.status(book) and "commit c0ffee" in L.status(book)
    # refused: a unit of another code version; a damaged piece; a run of another config
    unit = sorted(L._units(m2).values())[-1]
    unit.write_text(json.dumps({**json.loads(unit.read_text()), "code": "0123456789abcdef"}))
    with pytest.raises(L.LedgerError, match=r"units of 2 code versions \['0123456789abcdef', '"):
        L.record(book, m2, device="x")
    unit.write_text(json.dumps({k: v for k, v in json.loads(unit.read_text()).items() if k != "zoo"}))
    with pytest.raises(L.LedgerError, match=f"1 units record no code or zoo version .*, e.g. {unit}"):
        L.record(book, m2, device="x")
    other = {**json.loads((m3 / "config.json").read_text()), "n_rows": 7}
    (tmp_path / "m4").mkdir()
    (tmp_path / "m4" / "config.json").write_text(json.dumps(other))
    with pytest.raises(L.LedgerError, match="the run folder holds another config"):
        L.restore(book, tmp_path / "m4")
    piece = book / "piece-002.tar.xz"
    piece.write_bytes(piece.read_bytes()[:-1] + bytes([piece.read_bytes()[-1] ^ 1]))
    with pytest.raises(L.LedgerError, match=f"The ledger's piece {piece} is damaged"):
        L.restore(book, tmp_path / "m5")
    assert not (tmp_path / "m5").exists()  # nothing written
    (book / "zoo.tar.xz").write_bytes((book / "zoo.tar.xz").read_bytes()[:-10])
    with pytest.raises(L.LedgerError, match="The ledger's zoo .*zoo.tar.xz is missing or damaged"):
        L.restore_zoo(book, tmp_path / "m5")


def test_device_study_script_packs_units_that_merge_here(tiny, tmp_path):
    """experiments/device_study.sh as the device runs it (here on the CPU, at the tiny size), on the zoo as
    carried there (`models.zoo.carry_zoo`: the last checkpoints and the packed data): its units come back as one
    archive, merge into a run here (same weights, so the same zoo version), and that run's table is the
    uninterrupted run's."""
    import os
    import pathlib
    import subprocess
    import sys
    import tarfile

    from funsim.models import zoo as mzoo
    root, run = tiny
    results, out = tmp_path / "carried", tmp_path / "out"
    zoo = root / "zoo" / "tiny"
    size = mzoo.carry_zoo(zoo, results / "zoo" / "tiny")
    # the carried zoo: each model's last checkpoint (not the earlier ones), its data packed in
    for e in mzoo.read_manifest(zoo)["models"].values():
        assert len(list((zoo / e["workdir"] / "checkpoints").iterdir())) > 1
        assert [p.name for p in (results / "zoo" / "tiny" / e["workdir"] / "checkpoints").iterdir()] == \
            [str(max(int(p.name) for p in (zoo / e["workdir"] / "checkpoints").iterdir() if p.name.isdigit()))]
    assert (results / "zoo" / "tiny" / "data" / "digits.npz").is_file()
    assert size["models"] == 4 and size["bytes"] < sum(f.stat().st_size for f in zoo.rglob("*") if f.is_file()) / 2
    with pytest.raises(FileExistsError, match="carried/zoo/tiny exists"):
        mzoo.carry_zoo(zoo, results / "zoo" / "tiny")
    with pytest.raises(ValueError, match=r"data sets \['cifar10'\] are not trained in the zoo .*; it has \['digits'\]"):
        mzoo.carry_zoo(zoo, tmp_path / "other", datasets=("cifar10",))
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    script = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "device_study.sh"
    proc = subprocess.run(["bash", str(script), str(tmp_path / "tiny.json"), "dev", "600"], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "OUT": str(out), "PYTHON": sys.executable,
                                                       "STUDY_RESULTS": str(results),
                                                       "JAX_ENABLE_X64": str(int(jax.config.jax_enable_x64))})
    assert proc.returncode == 0, proc.stdout + proc.stderr + (out / "study.log").read_text()
    assert "exited with status 0" in (out / "study.log").read_text()
    with tarfile.open(out / "units.tar.gz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    cfg = S.config_from_dict(TINY)
    # the 6 model pairs' grids and the 9 stitching units (3 targets x fine, coarse, coarse with a new head)
    assert S.merge(tmp_path / "back" / "dev", cfg, root=root, run_name="from-device") == {"copied": 15, "kept": 0}
    S.run(cfg, root=root, run_name="from-device", progress=False, log=lambda s: None)
    got = root / "similarity_study" / "from-device" / "comparisons.csv"
    assert got.read_bytes() == (run / "comparisons.csv").read_bytes()


def test_authors_protocol_every_depth_pair_and_task_loss_asymmetry(tiny):
    """The tiny zoo at the authors' protocol (depth tolerance 1.0: every source layer into every target layer,
    as `authors_protocol`): depth-mismatched pairs (fc0 <-> logits) are stitched both ways, and the report states
    claim 1 on task-loss relative accuracy itself (forward - reverse per directed pair, recomputed here with NumPy)
    beside the closed form, with model-resampled intervals and the pair-resampled ones beside."""
    root, _ = tiny
    S.run(S.config_from_dict({**TINY, "name": "authors", "depth_tolerance": 1.0, "conventions": [],
                              "coarse_groupings": []}), root=root, progress=False, log=lambda s: None)
    run = root / "similarity_study" / "authors"
    m = ui.report(run, options=ui.ReportOptions(n_resamples=50, n_permutations=20), log=lambda s: None)
    t = S.read_table(run / "comparisons.csv")
    rel = _by_pair(t, _where(t, measure="task/affine/relative_accuracy", task="fine"))
    assert {(k[2], k[4]) for k in rel} >= {("fc0", "logits"), ("logits", "fc0")}
    d = np.array([v - rel[(*k[:5], "b->a")] for k, v in sorted(rel.items()) if k[5] == "a->b"])
    r = m["claim1"]["task-loss stitching (affine): relative accuracy"]
    assert r["n"] == d.size > 4
    np.testing.assert_allclose(r["mean_abs"], np.abs(d).mean(), rtol=1e-9)
    np.testing.assert_allclose(r["sd"], d.std(), rtol=1e-9)
    assert "closed-form affine score, held out" in m["claim1"]
    for q in ("excess_kurtosis", "mean_abs"):
        assert (r[f"{q}_ci95"] is None) == (r[f"{q}_ci95_pairs"] is None) or q in r.get("undefined", {})
    v = m["verdict_statistics"]["r2_cka"]
    assert set(v) == {"value", "interval", "interval_pairs"}
    summary = (run / "usable_information" / "summary.md").read_text()
    assert "task-loss stitching (affine): relative accuracy" in summary and "resampling model pairs |" in summary


def test_spatial_scores_on_conv_pairs_equal_the_library_function(tmp_path):
    """`spatial_scores`: every directed conv -> conv layer pair of every model pair gets an in-sample
    `stitch/spatial/<family>` row, equal to `similarity.spatial_reconstruction_score` on the unreduced maps
    (here conv1 (2x2) into conv0 (4x4): a source smaller than the target); dense layers get none; the report
    gives R^2 against it beside R^2 against our pooled score, on the same pairs."""
    import funsim.models as models_lib
    from funsim import similarity
    from funsim.experiments.configs.zoo import ModelSpec

    zcfg = zoo_lib.config_from_dict({"base": "smoke", "name": "conv", "models": [
        ModelSpec("cnn", "cnn", {"channels": (4, 8)}), ModelSpec("mlp", "mlp", {"widths": (16,)})]})
    zoo_lib.run(zcfg, root=tmp_path, progress=False, log=lambda s: None)
    fams = ("orthogonal", "scaled_orthogonal", "affine")
    cfg = S.config_from_dict({**TINY, "name": "conv", "zoo": "conv", "stitch_families": [], "conventions": [],
                              "spatial_scores": list(fams)})
    S.run(cfg, root=tmp_path, progress=False, log=lambda s: None)
    run = tmp_path / "similarity_study" / "conv"
    t = S.read_table(run / "comparisons.csv")
    cnns = [m for m in zoo_lib.load_zoo(tmp_path / "zoo" / "conv", datasets=("digits",)).by_dataset("digits")
            if m.name == "cnn"]
    for fam in fams:
        sel = _where(t, measure=f"stitch/spatial/{fam}")
        # only the two CNNs' conv layers (conv0, conv1), both directions: 2 x 2 layer pairs x 2
        assert sel.sum() == 8 and set(t["split"][sel]) == {"in_sample"}
        assert set(t["layer_a"][sel]) | set(t["layer_b"][sel]) == {"conv0", "conv1"}
    a, b = cnns
    x = S._rows(zoo_lib.load_zoo_data(tmp_path / "zoo" / "conv", "digits").dataset, cfg.n_rows)
    fa, fb = (models_lib.compiled(m.model).features(x, point=cfg.activation_point, as_numpy=True) for m in (a, b))
    assert fa["conv1"].shape[1:3] == (2, 2) and fb["conv0"].shape[1:3] == (4, 4)
    for fam in fams:
        row = _where(t, measure=f"stitch/spatial/{fam}", model_a=a.id, layer_a="conv1", model_b=b.id,
                     layer_b="conv0", direction="a->b")
        want = float(similarity.spatial_reconstruction_score(fa["conv1"], fb["conv0"], family=fam))
        np.testing.assert_allclose(t["value"][row], [want], rtol=1e-5, atol=1e-6)
    m = ui.report(run, options=ui.ReportOptions(n_resamples=20, n_permutations=20), log=lambda s: None)
    spatial = m["claim3_spatial"]
    assert spatial["cka/linear"]["n"] == 8 and set(spatial["cka/linear"]) == {"n", "spatial", "ours"}
    cka = _by_pair(t, _where(t, measure="cka/linear"))
    sp = _by_pair(t, _where(t, measure="stitch/spatial/scaled_orthogonal"))
    r = np.corrcoef([cka[k[:5] + ("sym",)] for k in sorted(sp)], [sp[k] for k in sorted(sp)])[0, 1]
    np.testing.assert_allclose(spatial["cka/linear"]["spatial"]["value"], r**2, rtol=1e-6)
    assert "Against the paper code's conv score" in (run / "usable_information" / "summary.md").read_text()
