"""The noise-aware controls for the similarity study: the model bootstrap, the paired family test, the split-half
selection, the ceiling-gated lift and Holm's correction, each against a float64 NumPy reference
(similarity/statistics.py and similarity/study_rules.py), and their wiring into the report's verdicts."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hst

from funsim.experiments import similarity_study as S
from funsim.experiments import usable_information as ui
from funsim.experiments import verdict
from funsim.experiments.configs import similarity_study as C
from funsim.experiments.io import write_table_atomic
from funsim.similarity import statistics as st
from funsim.similarity import study_architectures as sa
from funsim.similarity import study_rules as sr


def _design(m):
    """Every pair of ``m`` models once (a complete two-way design)."""
    ia, ib = np.triu_indices(m, 1)
    ids = np.array([f"m{i}" for i in range(m)])
    return ia, ib, ids[ia], ids[ib]


# ----------------------------------------------------------------------------- the model bootstrap


@given(hst.integers(2, 7), hst.integers(1, 12), hst.integers(0, 2**16))
def test_model_weights_are_products_of_model_multiplicities(m, n, seed):
    """The weight of pair (a, b) is (copies of a drawn) x (copies of b drawn), from the same draws, in NumPy."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, m, n), rng.integers(0, m, n)
    ids = np.array([f"m{i:02d}" for i in range(m)])
    key = jax.random.key(seed)
    w = np.asarray(st.model_resample_weights(key, ids[a], ids[b], n_resamples=5), np.float64)
    present = np.unique(np.concatenate([a, b]))  # the models in the data, in sorted-id order
    draws = np.asarray(jax.random.randint(key, (5, present.size), 0, present.size))
    counts = np.stack([np.bincount(d, minlength=present.size) for d in draws]).astype(np.float64)
    pos = {mm: i for i, mm in enumerate(present)}
    ref = counts[:, [pos[x] for x in a]] * counts[:, [pos[x] for x in b]]
    np.testing.assert_array_equal(w, ref)
    assert np.all(counts.sum(1) == present.size)


def test_model_weights_mean_and_refusals():
    # E[m_a m_b] = 1 - 1/M for two different models of M (multinomial covariance -1/M)
    _, _, a, b = _design(8)
    w = np.asarray(st.model_resample_weights(jax.random.key(0), a, b, n_resamples=4000), np.float64)
    np.testing.assert_allclose(w.mean(), 1 - 1 / 8, atol=0.02)
    with pytest.raises(ValueError, match="1-D of one length"):
        st.model_resample_weights(jax.random.key(0), a, b[:-1], n_resamples=2)
    with pytest.raises(ValueError, match="not both"):
        st.bootstrap(st.weighted_mean, (np.ones(len(a)),), key=jax.random.key(0), clusters=a, models=(a, b))


def test_model_bootstrap_equals_a_numpy_loop_and_is_wider_with_shared_models():
    """Pairs y_ab = u_a + u_b + noise (a shared-model effect, true mean 0): the model bootstrap's interval
    equals a float64 NumPy loop over the same weights, covers 0, and is wider than resampling pairs or
    model pairs. Without the model effect it is still wider (never narrower): the product of two models'
    multiplicities has variance about 3 where a pair's has 1, so pure pair noise counts about sqrt(3) times
    (Owen 2007: the pigeonhole bootstrap is conservative); we require a ratio in (1.2, 2.6)."""
    ia, ib, a, b = _design(12)
    rng = np.random.default_rng(0)
    u = rng.normal(size=12)
    y = u[ia] + u[ib] + 0.3 * rng.normal(size=ia.size)
    key = jax.random.key(1)
    ci = st.bootstrap(st.weighted_mean, (y,), key=key, n_resamples=2000, models=(a, b))
    w = np.asarray(st.model_resample_weights(key, a, b, n_resamples=2000), np.float64)
    ref = np.quantile(w @ y / w.sum(1), [0.025, 0.975])
    np.testing.assert_allclose([ci.low, ci.high], ref, rtol=1e-5, atol=1e-6)
    pairs = st.bootstrap(st.weighted_mean, (y,), key=key, n_resamples=2000)
    assert ci.low < 0 < ci.high and ci.high - ci.low > 2 * (pairs.high - pairs.low)
    # each model pair's layer pairs: clusters of model pairs are as narrow as pairs here
    y4 = np.repeat(y, 4) + 0.01 * rng.normal(size=4 * y.size)
    by_pair = st.bootstrap(st.weighted_mean, (y4,), key=key, clusters=np.repeat(np.arange(y.size), 4))
    by_model = st.bootstrap(st.weighted_mean, (y4,), key=key, models=(np.repeat(a, 4), np.repeat(b, 4)))
    assert by_model.high - by_model.low > 2 * (by_pair.high - by_pair.low)
    flat = 0.3 * rng.normal(size=ia.size)  # no shared-model effect
    wm = st.bootstrap(st.weighted_mean, (flat,), key=key, models=(a, b))
    wp = st.bootstrap(st.weighted_mean, (flat,), key=key)
    assert 1.2 < (wm.high - wm.low) / (wp.high - wp.low) < 2.6


def test_model_bootstrap_coverage_by_simulation():
    """200 data sets of 10 models (45 pairs), y_ab = u_a + u_b + e, true mean 0, 90% intervals. The model
    bootstrap covers about 0.82 (a percentile bootstrap over 10 units undercovers); we require >= 0.74
    (Monte Carlo SE about 0.03 at 200 data sets). Resampling pairs covers about 0.41; we require <= 0.6."""
    m, sims, reps = 10, 200, 400
    ia, ib, a, b = _design(m)
    rng = np.random.default_rng(0)
    u = rng.normal(size=(sims, m))
    ys = u[:, ia] + u[:, ib] + 0.5 * rng.normal(size=(sims, ia.size))
    covered = {"models": 0, "pairs": 0}
    for s, k in enumerate(jax.random.split(jax.random.key(0), sims)):
        for name, w in (("models", st.model_resample_weights(k, a, b, n_resamples=reps)),
                        ("pairs", st.resample_weights(k, ia.size, n_resamples=reps))):
            w = np.asarray(w, np.float64)
            lo, hi = np.quantile(w @ ys[s] / w.sum(1), [0.05, 0.95])
            covered[name] += lo <= 0 <= hi
    assert covered["models"] / sims >= 0.74, covered
    assert covered["pairs"] / sims <= 0.6, covered


# ----------------------------------------------------------------------------- p-values and Holm


def _holm_reference(p):
    """The textbook step-down: the k-th smallest p times (m - k), a running maximum, capped at 1."""
    p = np.asarray(p, np.float64)
    order = np.argsort(p, kind="stable")
    out = np.empty_like(p)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (p.size - k) * p[i]))
        out[i] = running
    return out


@given(hst.lists(hst.floats(0.0, 1.0), min_size=1, max_size=12))
def test_holm_matches_the_textbook_step_down(p):
    adj = np.asarray(st.holm(np.array(p, np.float64)), np.float64)
    np.testing.assert_allclose(adj, _holm_reference(p), rtol=1e-6, atol=1e-7)
    assert np.all(adj >= np.array(p) - 1e-7) and np.all(adj <= 1.0)


def test_holm_known_values_and_bootstrap_p_value():
    np.testing.assert_allclose(np.asarray(st.holm(np.array([0.01, 0.04, 0.03, 0.5]))), [0.04, 0.09, 0.09, 0.5],
                               rtol=1e-6)
    s = np.array([0.3, -0.1, 0.2, 0.0, np.nan, 0.5])
    assert st.bootstrap_p_value(s, 0.0, ">") == (1 + 2) / (1 + 5)  # -0.1 and 0.0 fail "> 0"
    assert st.bootstrap_p_value(s, 0.0, ">=") == (1 + 1) / (1 + 5)
    assert st.bootstrap_p_value(s, 0.25, "<") == (1 + 2) / (1 + 5)
    with pytest.raises(ValueError, match="direction"):
        st.bootstrap_p_value(s, 0.0, "=")


# ----------------------------------------------------------------------------- the claims' statistics


def test_accuracy_difference_se_is_the_binomial_se():
    """The example behind the rule: two accuracies near 0.97 on 297 test rows differ by noise of about 0.014 (a
    constant tolerance of 0.01 is less than one standard error)."""
    p1, p2, n = np.array([0.97, 0.5, 0.9]), np.array([0.97, 0.6, 0.99]), np.array([297, 100, 1000])
    ref = np.sqrt(p1 * (1 - p1) / n + p2 * (1 - p2) / n)
    np.testing.assert_allclose(np.asarray(st.accuracy_difference_se(p1, p2, n)), ref, rtol=1e-6)
    assert 0.0135 < float(st.accuracy_difference_se(0.97, 0.97, 297)) < 0.0145


@given(hst.integers(0, 2**16), hst.integers(1, 3))
def test_order_margin_and_lift_match_numpy_with_weights(seed, links):
    rng = np.random.default_rng(seed)
    n = 9
    d = rng.normal(size=(links, n))
    tol = rng.uniform(0, 0.1, size=(links, n))
    w = rng.integers(0, 4, n).astype(np.float64)
    w[0] = 1.0
    ref = min(np.average(d[k], weights=w) + np.average(tol[k], weights=w) for k in range(links))
    got = float(sr.order_margin(*d, *tol, weights=w))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    top, hit = rng.integers(0, 2, n), rng.integers(0, 2, n)
    top[0] = 1
    rt, rh = np.repeat(top, w.astype(int)), np.repeat(hit, w.astype(int))
    np.testing.assert_allclose(float(sr.sufficiency_lift(top, hit, weights=w)), rh[rt == 1].mean() - rh.mean(),
                               rtol=1e-5, atol=1e-6)


def test_order_margin_refuses_an_odd_number_of_arrays():
    with pytest.raises(ValueError, match="K differences then K tolerances"):
        sr.order_margin(np.ones(3), np.ones(3), np.ones(3))


def test_split_halves_remove_the_regression_to_the_mean():
    """Coarse = fine in truth (no effect), each half's score with independent noise. Selecting on the fine
    score and scoring on the same rows gives coarse - fine > 0 (regression to the mean); selecting on one
    half and scoring on the other gives about 0. The split itself against a NumPy loop."""
    rng = np.random.default_rng(0)
    n = 4000
    true = rng.uniform(0.85, 1.0, n)
    f0, f1, c0, c1 = (true + 0.03 * rng.normal(size=n) for _ in range(4))
    sel, d = (np.asarray(v) for v in sr.split_half_differences(f0, c0, f1, c1, below=0.95))
    ref_sel, ref_d = [], []
    for fa, ca, fb, cb in ((f0, c0, f1, c1), (f1, c1, f0, c0)):
        for i in range(n):
            ref_sel.append(fa[i] < 0.95)
            ref_d.append(cb[i] - fb[i])
    np.testing.assert_array_equal(sel, ref_sel)
    np.testing.assert_allclose(d, ref_d, rtol=1e-6, atol=1e-7)
    fine, coarse = (f0 + f1) / 2, (c0 + c1) / 2
    same_rows = np.mean((coarse - fine)[fine < 0.95])
    split = np.mean(d[sel])
    se = np.std(d[sel]) / np.sqrt(sel.sum())
    assert same_rows > 5 * se and abs(split) < 3 * se, (same_rows, split, se)


# ----------------------------------------------------------------------------- wiring into the report


def _table(rng, *, n_models=6, layers=2, gap=(0.0, 0.0), n_test=300, halves=True, fine_high=False):
    """A comparisons table: three task-loss families (relative accuracy = base + the family's offset
    gap[k] per link), accuracy = relative accuracy x own accuracy 0.9, per-half scores with coarse = fine
    + 0.05, and linear CKA that predicts a high relative accuracy."""
    cols = {c: [] for c in S.COLUMNS}

    def add(a, la, b, lb, measure, d, split, task, value):
        for c, v in zip(S.COLUMNS, ("d", a, la, 0.5, b, lb, 0.5, measure, d, split, task, value)):
            cols[c].append(v)

    offsets = np.concatenate([[0.0], np.cumsum(gap)])
    u = rng.normal(scale=0.02, size=n_models)
    for i in range(n_models):
        for j in range(i + 1, n_models):
            for la in range(layers):
                for lb in range(layers):
                    a, b, sa, sb = f"d/m{i}", f"d/m{j}", f"l{la}", f"l{lb}"
                    cka = rng.uniform(0, 1)
                    add(a, sa, b, sb, "cka/linear", "sym", "all", "-", cka)
                    for d in ("a->b", "b->a"):
                        base = (1.05 if fine_high else 0.75 + 0.25 * cka) + u[i] + u[j]
                        for k, fam in enumerate(ui.FAMILIES):
                            rel = base + offsets[k] + 0.005 * rng.normal()
                            m = f"task/{fam}/"
                            add(a, sa, b, sb, m + "relative_accuracy", d, "held_out", "fine", rel)
                            add(a, sa, b, sb, m + "accuracy", d, "held_out", "fine", 0.9 * rel)
                            add(a, sa, b, sb, m + "own_accuracy", d, "held_out", "fine", 0.9)
                            add(a, sa, b, sb, m + "relative_accuracy", d, "held_out", "coarse:g", rel + 0.05)
                            for h in range(2) if halves else ():
                                f_h = rel + 0.02 * rng.normal()
                                add(a, sa, b, sb, m + f"relative_accuracy_half{h}", d, "held_out", "fine", f_h)
                                add(a, sa, b, sb, m + f"relative_accuracy_half{h}", d, "held_out", "coarse:g",
                                    f_h + 0.05)
    table = ui._Table({c: np.array(v, dtype=float if c in ("depth_a", "depth_b", "value") else object)
                       for c, v in cols.items()})
    return table, {"d": n_test}


def _labels(table, n_test, n_resamples=300):
    stats = ui.verdict_statistics(table, ui.ReportOptions(n_resamples=n_resamples), jax.random.key(0), n_test)
    verdicts = verdict.judge_all(C.RULES, stats)
    return stats, {v.rule.claim: v.label for v in verdicts}, verdicts


def test_new_rules_on_synthetic_tables_with_known_answers():
    """Ordered families within the noise: 2b' holds; one family 0.12 worse than the one before it (2 binomial
    SEs of the accuracy difference on 300 rows are about 0.07 here): broken; coarse = fine + 0.05 on the halves: 4' reproduced; the lift
    of CKA >= 0.9 is positive below the ceiling, and 'inconclusive (ceiling)' above it."""
    rng = np.random.default_rng(0)
    stats, labels, verdicts = _labels(*_table(rng))
    assert labels["2b' task-loss order, paired, noise tolerance"] == "holds"
    np.testing.assert_allclose(stats["granularity_split_summed"]["value"], 0.05, atol=1e-9)
    assert stats["split_model_pairs"] == 15
    assert labels["4' coarse >= fine, split halves (summed softmax)"] == "fewer than 30 model pairs".join(
        ("inconclusive (", ")"))
    assert labels["4' coarse >= fine, split halves (new head)"].startswith("inconclusive (")
    assert stats["p_high_overall"] < 0.8 and stats["sufficiency_lift_cka_090"]["interval"][0] > 0
    assert labels["5a' high CKA lifts P(high)"] == "reproduced"
    rows = sr.primary_holm(verdicts, stats["bootstrap_p"], C.PRIMARY)
    assert [r["claim"] for r in rows] == list(C.PRIMARY)
    assert [r["stands"] for r in rows] == [True, False, False, True]
    # with enough model pairs (9 models: 36) the split rule decides
    stats, labels, _ = _labels(*_table(np.random.default_rng(1), n_models=9, layers=1))
    assert 30 <= stats["split_model_pairs"] <= 36
    assert labels["4' coarse >= fine, split halves (summed softmax)"] == "reproduced"
    # a family 0.12 worse than the one before it: broken beyond the noise
    stats, labels, _ = _labels(*_table(np.random.default_rng(2), gap=(-0.12, 0.0)))
    assert stats["order_margin_task"]["interval"][1] < 0
    assert labels["2b' task-loss order, paired, noise tolerance"] == "broken"
    # the ceiling: P(high) above 0.8 makes the lift inconclusive, whatever it is
    stats, labels, _ = _labels(*_table(np.random.default_rng(3), fine_high=True))
    assert stats["p_high_overall"] > 0.8 and labels["5a' high CKA lifts P(high)"] == "inconclusive (ceiling)"


def test_old_runs_are_labelled_not_computed():
    """A table without the per-half rows, and no zoo manifest (no test-set size): not computed, not a failure."""
    stats, labels, verdicts = _labels(*_table(np.random.default_rng(0), halves=False)[:1], None, n_resamples=50)
    assert labels["2b' task-loss order, paired, noise tolerance"] == \
        "inconclusive (not computed: no zoo manifest, so the test-set size is unknown)"
    assert labels["4' coarse >= fine, split halves (summed softmax)"] == \
        "inconclusive (not computed: the run predates the per-half recording of task-loss stitching)"
    assert labels["5a' high CKA lifts P(high)"] == "reproduced"  # needs nothing new
    rows = sr.primary_holm(verdicts, stats["bootstrap_p"], C.PRIMARY)
    assert [r["p"] for r in rows][:3] == [None] * 3 and [r["stands"] for r in rows] == [False, False, False, True]
    # alone in the family, 5a' is not multiplied
    assert rows[3]["p_holm"] == rows[3]["p"] == stats["bootstrap_p"]["sufficiency_lift_cka_090"][">"]


def test_report_adds_the_new_rules_to_an_old_run(tmp_path):
    """An old run (its config.json holds the first rules only): the report keeps their labels and adds the
    committed rules in their own table, with the multiplicity table of the primary rules."""
    table, _ = _table(np.random.default_rng(0), halves=False)
    run = tmp_path / "run"
    run.mkdir()
    old_rules = [r for r in C.RULES if r.claim not in C.PRIMARY]
    cfg = {"name": "old", "zoo": "none", "flatten": "spatial_mean", "affine_ridge": 1e-4,
           "verdict_rules": [dataclasses.asdict(r) for r in old_rules]}
    (run / "config.json").write_text(json.dumps(cfg))
    lines = [",".join(S.COLUMNS)] + [",".join(str(table.cols[c][i]) for c in S.COLUMNS)
                                     for i in range(len(table.cols["value"]))]
    write_table_atomic(run / "comparisons.csv", ("\n".join(lines) + "\n").encode(), len(lines) - 1)
    m = ui.report(run, options=ui.ReportOptions(n_resamples=50, n_permutations=20), log=lambda s: None)
    assert [v["claim"] for v in m["verdicts"]] == [r.claim for r in old_rules]
    assert [v["claim"] for v in m["verdicts_added"]] == list(C.PRIMARY)
    assert [r["claim"] for r in m["primary"]] == list(C.PRIMARY)
    summary = (run / "usable_information" / "summary.md").read_text()
    assert "Rules committed after this run's config was written" in summary
    assert "the run predates the per-half recording" in summary and "| primary rule |" in summary


# ----------------------------------------------------------------------------- the older rules' intervals, claim 1


def _np_kurtosis(x, w):
    mu = w @ x / w.sum()
    m2, m4 = w @ (x - mu) ** 2 / w.sum(), w @ (x - mu) ** 4 / w.sum()
    return m4 / m2**2 - 3.0


def _layer_keys(m, layers=2):
    """Every layer pair of every model pair of ``m`` models: keys ``(dataset, a, la, b, lb)`` and model indices."""
    ia, ib, a, b = _design(m)
    keys = [("d", a[i], f"l{x}", b[i], f"l{y}") for i in range(ia.size) for x in range(layers) for y in range(layers)]
    return keys, np.repeat(ia, layers * layers), np.repeat(ib, layers * layers)


def test_model_interval_and_mean_abs_match_numpy():
    """`model_interval`: the estimate, the model-resampled interval (the same weights in float64 NumPy) and the
    pair-resampled one (clusters of model pairs, as the report's intervals were before); `mean_abs` with weights."""
    keys, _, _ = _layer_keys(7)
    rng = np.random.default_rng(3)
    d = rng.standard_t(3, size=len(keys))
    key = jax.random.key(5)
    r = sr.model_interval(st.excess_kurtosis, (d,), keys, key=key, n_resamples=400)
    np.testing.assert_allclose(r["value"], _np_kurtosis(d, np.ones_like(d)), rtol=1e-5)
    k_models, k_pairs = jax.random.split(key)
    w = np.asarray(st.model_resample_weights(k_models, [k[1] for k in keys], [k[3] for k in keys],
                                             n_resamples=400), np.float64)
    ref = np.nanquantile([_np_kurtosis(d, wi) if wi.sum() else np.nan for wi in w], [0.025, 0.975])
    np.testing.assert_allclose(r["interval"], ref, rtol=1e-4, atol=1e-5)
    pairs = st.bootstrap(st.excess_kurtosis, (d,), key=k_pairs, n_resamples=400,
                         clusters=[f"{k[0]}|{k[1]}|{k[3]}" for k in keys])
    assert r["interval_pairs"] == [pairs.low, pairs.high]
    np.testing.assert_allclose(float(sr.mean_abs(d, weights=w[0])), w[0] @ np.abs(d) / w[0].sum(), rtol=1e-6)
    assert sr.model_interval(st.excess_kurtosis, (d[:3],), keys[:3], key=key)["value"] is None
    assert "constant" in sr.model_interval(st.excess_kurtosis, (np.zeros(8),), keys[:8], key=key)["reason"]


def test_one_model_pair_has_no_interval_and_its_rule_is_inconclusive():
    """Fewer than 3 models: every model resample holds the same pairs, so there is no interval (None with the
    reason), not a point interval of width 0; an interval rule reads that as inconclusive, and the report's
    tables print "-"."""
    from funsim.experiments.usable_information import _ci
    from funsim.experiments.verdict import Rule

    keys, _, _ = _layer_keys(7)
    one = [k for k in keys if (k[1], k[3]) == (keys[0][1], keys[0][3])]
    assert len(one) >= 4 and len({k[1] for k in one} | {k[3] for k in one}) == 2
    rng = np.random.default_rng(0)
    x = rng.normal(size=len(one))
    y = x + rng.normal(size=len(one))
    r = sr.model_interval(st.r2, (x, y), one, key=jax.random.key(0), n_resamples=200)
    np.testing.assert_allclose(r["value"], np.corrcoef(x, y)[0, 1] ** 2, rtol=1e-6)
    assert r["interval"] is None and r["interval_pairs"] is None and r["reason"] == st.ONE_MODEL_PAIR
    v = Rule("3a", "r2_cka", ">", 0.8, interval=True).judge(r["value"], interval=r["interval"], reason=r["reason"])
    assert v.outcome == "undefined" and st.ONE_MODEL_PAIR in v.label
    assert _ci(r["interval"]) == "-" and _ci([float("nan")] * 2) == "-" and _ci([0.1, 0.2]) == "[0.100, 0.200]"
    assert "constant" in sr.model_interval(st.excess_kurtosis, (np.zeros(len(one)),), one, key=jax.random.key(0))["reason"]
    # three models: an interval again
    three = one + [k for k in keys if k[1] not in {one[0][1], one[0][3]} or k[3] not in {one[0][1], one[0][3]}][:20]
    assert len({k[1] for k in three} | {k[3] for k in three}) >= 3
    x3 = rng.normal(size=len(three))
    r3 = sr.model_interval(st.r2, (x3, x3 + rng.normal(size=len(three))), three, key=jax.random.key(0), n_resamples=200)
    assert r3["interval"] is not None and r3["interval"][0] < r3["interval"][1]


def test_model_interval_is_wider_than_pairs_with_shared_models():
    """y = u_a + u_b + noise per layer pair: the models' effects are shared across model pairs, so the
    model-resampled interval of the mean is much wider than the pair-resampled one; it covers 0, the pairs' not
    always."""
    keys, ia, ib = _layer_keys(10)
    rng = np.random.default_rng(0)
    u = rng.normal(size=10)
    y = u[ia] + u[ib] + 0.3 * rng.normal(size=len(keys))
    r = sr.model_interval(st.weighted_mean, (y - np.mean(u) * 2,), keys, key=jax.random.key(0), n_resamples=1000)
    lo, hi = r["interval"]
    plo, phi = r["interval_pairs"]
    assert hi - lo > 2 * (phi - plo)


def _asym_table(rng, *, planted, m=10, layers=2):
    """Task-loss relative accuracy both ways per layer pair: forward = reverse + noise, and with ``planted``
    the depth-mismatched pairs (l0 -> l1) apart by a heavy-tailed amount (0.05 x Student t, 2 degrees)."""
    keys, _, _ = _layer_keys(m, layers)
    vals = {}
    for k in keys:
        base = rng.uniform(0.6, 0.9)
        gap = 0.05 * rng.standard_t(2) if planted and k[2] != k[4] else 0.0
        vals[(*k, "a->b")] = base + gap + 0.01 * rng.normal()
        vals[(*k, "b->a")] = base + 0.01 * rng.normal()
    return vals


def test_asymmetry_statistics_match_numpy_and_find_a_planted_asymmetry():
    """Claim 1 on task loss: the forward - reverse differences equal NumPy's; the tail statistics equal
    `tail_statistics`; a planted heavy tail (the depth-mismatched pairs apart by 0.05 x t(2)) gives a model-resampled
    kurtosis interval above 0 and a mean |asymmetry| interval above that of none; with none (forward = reverse +
    noise), the kurtosis interval straddles 0 and the mean |asymmetry| stays at the noise's (0.01 * 2 / sqrt(pi)
    = 0.011)."""
    key = jax.random.key(2)
    res = {}
    for planted in (True, False):
        vals = _asym_table(np.random.default_rng(1), planted=planted)
        keys, d = sr.directed_asymmetry(vals)
        ref = np.array([vals[(*k, "a->b")] - vals[(*k, "b->a")] for k in keys])
        np.testing.assert_array_equal(d, ref)
        assert len(keys) == len(vals) // 2
        r = res[planted] = sr.asymmetry_statistics(keys, d, key=key, n_resamples=500)
        for name, v in st.tail_statistics(ref).items():
            np.testing.assert_allclose(r[name], v, rtol=1e-6)
        np.testing.assert_allclose(r["mean_abs"], np.abs(ref).mean(), rtol=1e-12)
        assert r["excess_kurtosis_ci95"] is not None and r["excess_kurtosis_ci95_pairs"] is not None
    assert res[True]["excess_kurtosis_ci95"][0] > 0 and res[True]["mean_abs_ci95"][0] > res[False]["mean_abs_ci95"][1]
    lo, hi = res[False]["excess_kurtosis_ci95"]
    assert lo < 0 < hi and res[False]["mean_abs_ci95"][1] < 0.02
    # a pair missing one direction, or NaN in one, is left out
    vals = _asym_table(np.random.default_rng(1), planted=False)
    k0, k1 = sorted(vals)[:2], sorted(vals)[2:4]
    del vals[k0[0]]
    vals[k1[1]] = np.nan
    assert len(sr.directed_asymmetry(vals)[0]) == len(_asym_table(np.random.default_rng(1), planted=False)) // 2 - 2
    with pytest.raises(ValueError, match="fewer than 4"):
        sr.asymmetry_statistics(keys[:3], d[:3], key=key)


def test_authors_protocol_config_stitches_every_depth_pair():
    """`authors_protocol` is `unsaturated` with a depth tolerance covering every pair of relative depths (in
    (0, 1]), the paper code's conv score for every family, and the committed rules."""
    a, u = C.CONFIGS["authors_protocol"], C.CONFIGS["unsaturated"]
    assert a.depth_tolerance >= 1.0 > u.depth_tolerance
    assert set(a.spatial_scores) == set(a.stitch_families) and not u.spatial_scores
    assert dataclasses.replace(a, name=u.name, depth_tolerance=u.depth_tolerance, spatial_scores=()) == u
    assert a.verdict_rules == C.RULES


def test_authors_mlp_config_fits_every_layer_of_the_paper_code_mlps():
    """`authors_mlp` reads the `authors_mlp` zoo with more train rows of the held-out split than its widest
    layer (2,048: the paper code's widest preset), so no fit is refused for too few rows; the grid only, the
    committed rules, and the conv score of every family."""
    from funsim.experiments.configs import zoo as Z

    a = C.CONFIGS["authors_mlp"]
    zoo = Z.CONFIGS[a.zoo]
    widest = max(max(m.kwargs.get("widths", (0,))) for m in zoo.models)
    assert widest == 2048 and a.n_rows * a.split > widest
    assert a.datasets == ("mnist5k",) and a.stitch_families == () and a.verdict_rules == C.RULES
    assert set(a.spatial_scores) == set(a.families)


def test_old_rules_read_model_intervals_with_pairs_beside():
    """The first rules' interval statistics resample models now, with the pair-resampled interval beside."""
    table, _ = _table(np.random.default_rng(0), n_models=7)
    stats = ui.verdict_statistics(table, ui.ReportOptions(n_resamples=200), jax.random.key(0))
    for name in ("asymmetry_kurtosis_task_orthogonal", "asymmetry_kurtosis_task_affine"):
        v = stats[name]
        assert v["value"] is not None and len(v["interval"]) == 2 and len(v["interval_pairs"]) == 2, name
        assert v["interval"] != v["interval_pairs"]


def test_the_statistics_refuse_arrays_of_different_lengths_naming_them():
    """A table joined wrongly must not broadcast into a number: each error names the arguments and shapes."""
    with pytest.raises(ValueError, match=r"got shapes \{'top': \(3,\), 'hit': \(4,\)\}"):
        sr.sufficiency_lift(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match=r"'x': \(3,\), 'weights': \(2,\)"):
        sr.mean_abs(np.ones(3), weights=np.ones(2))
    with pytest.raises(ValueError, match=r"'d_1': \(2,\), 'tol_1': \(3,\)"):
        sr.order_margin(np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match=r"'fine_b': \(2, 1\)"):
        sr.split_half_differences(np.ones(2), np.ones(2), np.ones((2, 1)), np.ones(2))


# ----------------------------------------------------------------------------- claim 3 by architecture


def _arch_rows(seed=0, archs=("cnn", "mlp", "res", "wide"), seeds=3, layers=2):
    """Directed layer pairs of every pair of models (``<arch>_s<seed>``), a measure x and a score y whose slope
    depends on the pair of architectures, so that R^2 differs between architecture pairs."""
    rng = np.random.default_rng(seed)
    ids = [f"d/{a}_s{s}" for a in archs for s in range(seeds)]
    slope = {a: 1.0 + i for i, a in enumerate(archs)}
    ma, mb, x, y = [], [], [], []
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            for _ in range(layers * layers * 2):
                xi = rng.uniform()
                ma.append(a), mb.append(b), x.append(xi)
                y.append(slope[sa.architecture_of(a)] * slope[sa.architecture_of(b)] * xi + rng.normal())
    return np.array(x), np.array(y), np.array(ma), np.array(mb)


def _np_r2(x, y):
    return np.corrcoef(np.asarray(x, np.float64), np.asarray(y, np.float64))[0, 1] ** 2


def _arch_tol():
    return 1e-9 if jax.config.jax_enable_x64 else 1e-5


def test_architecture_pair_r2_equals_numpy_and_resamples_models():
    """Per unordered architecture pair (same-architecture pairs included): R^2 equals float64 NumPy on the rows
    of that pair, n and the model count are the rows' and models', and the interval is the model bootstrap of
    those rows (not the one resampling model pairs)."""
    x, y, ma, mb = _arch_rows()
    key = jax.random.key(1)
    cells = sa.architecture_pair_r2(x, y, ma, mb, key=key, n_resamples=300)
    la = np.array([sa.architecture_of(m) for m in ma])
    lb = np.array([sa.architecture_of(m) for m in mb])
    assert set(cells) == {(a, b) for a in ("cnn", "mlp", "res", "wide") for b in ("cnn", "mlp", "res", "wide")
                          if a <= b}
    for (a, b), c in cells.items():
        sel = ((la == a) & (lb == b)) | ((la == b) & (lb == a))
        np.testing.assert_allclose(c["value"], _np_r2(x[sel], y[sel]), rtol=_arch_tol())
        assert c["n"] == sel.sum() and c["models"] == len(set(ma[sel]) | set(mb[sel]))
        ref = st.bootstrap(st.r2, (x[sel], y[sel]), key=key, n_resamples=300, models=(ma[sel], mb[sel]))
        np.testing.assert_allclose(c["interval"], [ref.low, ref.high], rtol=1e-6)
        pairs = st.bootstrap(st.r2, (x[sel], y[sel]), key=key, n_resamples=300,
                             clusters=[f"{p}|{q}" for p, q in zip(ma[sel], mb[sel])])
        assert c["interval"] != [pairs.low, pairs.high]
    vals = [c["value"] for c in cells.values()]
    assert max(vals) - min(vals) > 0.05  # the pairs differ: the test can tell them apart
    # the manifest's names win over the ids
    names = {m: "one" for m in set(ma) | set(mb)}
    only = sa.architecture_pair_r2(x, y, ma, mb, architectures=names, key=key, n_resamples=50)
    assert list(only) == [("one", "one")]
    np.testing.assert_allclose(only["one", "one"]["value"], _np_r2(x, y), rtol=_arch_tol())


def test_architecture_cells_undefined_with_a_reason():
    """A constant measure or too few pairs: value None with the reason, never NaN; the matrix shows NaN there."""
    x, y, ma, mb = _arch_rows(archs=("cnn", "mlp"), seeds=2)
    la = np.array([sa.architecture_of(m) for m in ma])
    x = np.where((la == "cnn") & (np.array([sa.architecture_of(m) for m in mb]) == "cnn"), 0.5, x)
    keep = ~((la == "mlp") & (np.arange(len(x)) % 7 != 0))  # mlp x mlp: a few rows only
    cells = sa.architecture_pair_r2(x[keep], y[keep], ma[keep], mb[keep], key=jax.random.key(0), n_resamples=50)
    assert cells["cnn", "cnn"]["value"] is None and "constant" in cells["cnn", "cnn"]["reason"]
    assert cells["mlp", "mlp"]["value"] is None and "fewer than 4" in cells["mlp", "mlp"]["reason"]
    assert cells["cnn", "mlp"]["value"] is not None
    one = (ma == ma[-1]) & (mb == mb[-1])  # one model pair: a value, no interval
    c = sa.subset_r2(x, y, ma, mb, {"p": one}, key=jax.random.key(0), n_resamples=50)["p"]
    assert c["interval"] is None and "one model pair" in c["interval_reason"] and c["models"] == 2
    np.testing.assert_allclose(c["value"], _np_r2(x[one], y[one]), rtol=_arch_tol())
    names, m = sa.pair_matrix(cells)
    assert names == ["cnn", "mlp"] and np.isnan(m[0, 0]) and m[0, 1] == m[1, 0] == cells["cnn", "mlp"]["value"]


def test_leave_one_architecture_out_equals_r2_on_the_filtered_rows():
    """Without X: the same cell as the pairs with no model of X, recomputed on the filtered arrays (NumPy R^2,
    same interval); the change is that minus all; the family split: dense-only rows against the others."""
    x, y, ma, mb = _arch_rows(seed=2)
    key = jax.random.key(3)
    r = sa.leave_one_architecture_out(x, y, ma, mb, key=key, n_resamples=200)
    la = np.array([sa.architecture_of(m) for m in ma])
    lb = np.array([sa.architecture_of(m) for m in mb])
    np.testing.assert_allclose(r["all"]["value"], _np_r2(x, y), rtol=_arch_tol())
    assert set(r["without"]) == {"cnn", "mlp", "res", "wide"}
    for a, c in r["without"].items():
        sel = (la != a) & (lb != a)
        np.testing.assert_allclose(c["value"], _np_r2(x[sel], y[sel]), rtol=_arch_tol())
        alone = sa.subset_r2(x[sel], y[sel], ma[sel], mb[sel], {"k": np.ones(sel.sum(), bool)}, key=key,
                             n_resamples=200)["k"]
        assert alone == {k: v for k, v in c.items() if not k.startswith("change")}
        np.testing.assert_allclose(c["change"], _np_r2(x[sel], y[sel]) - _np_r2(x, y), rtol=1e-6, atol=1e-12)
        lo, hi = c["change_interval"]
        assert lo <= hi
    fam = sa.family_split_r2(x, y, ma, mb, {"mlp", "wide"}, key=key, n_resamples=50)
    dense = np.isin(la, ["mlp", "wide"]) & np.isin(lb, ["mlp", "wide"])
    np.testing.assert_allclose(fam["dense_only"]["value"], _np_r2(x[dense], y[dense]), rtol=_arch_tol())
    np.testing.assert_allclose(fam["with_conv"]["value"], _np_r2(x[~dense], y[~dense]), rtol=_arch_tol())
    assert fam["dense_only"]["n"] + fam["with_conv"]["n"] == len(x)


def test_rsa_skipped_cells_left_out_and_set_to_zero():
    """The cells skipped for width (NaN, a layer wider than the limit) left out, and set to 0, against NumPy;
    another NaN cell (a narrow pair) is left out both ways and counted apart."""
    x, y, ma, mb = _arch_rows(seed=4, archs=("cnn", "mlp"))
    rng = np.random.default_rng(5)
    wa, wb = rng.choice([64, 4096], len(x), p=[0.8, 0.2]), rng.choice([64, 4096], len(x), p=[0.8, 0.2])
    x = np.where(np.maximum(wa, wb) > 2048, np.nan, x)
    x[np.flatnonzero(np.maximum(wa, wb) <= 2048)[:3]] = np.nan  # undefined for another reason
    skipped = sa.rsa_skipped_mask(x, wa, wb, limit=2048)
    assert skipped.sum() == np.sum(np.maximum(wa, wb) > 2048) > 0
    assert not sa.rsa_skipped_mask(x, wa, wb, limit=None).any()
    r = sa.r2_skipped_both_ways(x, y, ma, mb, skipped, key=jax.random.key(0), n_resamples=100)
    fin = np.isfinite(x)
    zero = np.where(skipped, 0.0, x)
    np.testing.assert_allclose(r["excluded"]["value"], _np_r2(x[fin], y[fin]), rtol=_arch_tol())
    np.testing.assert_allclose(r["as_zero"]["value"], _np_r2(zero[~np.isnan(zero)], y[~np.isnan(zero)]),
                               rtol=_arch_tol())
    assert r["excluded"]["n"] == fin.sum() and r["as_zero"]["n"] == fin.sum() + skipped.sum()
    assert r["skipped_cells"] == skipped.sum() and r["other_undefined_cells"] == 3
    with pytest.raises(ValueError, match="skipped .*marks 1 cells where x is defined"):
        sa.r2_skipped_both_ways(x, y, ma, mb, skipped | fin & (np.cumsum(fin) == 1), key=jax.random.key(0))


def test_architecture_results_do_not_depend_on_names_or_row_order():
    """Renaming the architectures (a bijection that reverses their order) and permuting the rows gives the same
    cells under the new names: every subset is bootstrapped with one key over its own models."""
    x, y, ma, mb = _arch_rows(seed=6)
    key = jax.random.key(4)
    ids = sorted(set(ma) | set(mb))
    names = {m: sa.architecture_of(m) for m in ids}
    rename = {"cnn": "z4", "mlp": "z3", "res": "z2", "wide": "z1"}
    renamed = {m: rename[a] for m, a in names.items()}
    p = np.random.default_rng(0).permutation(len(x))
    kw = {"key": key, "n_resamples": 100}
    a = sa.architecture_pair_r2(x, y, ma, mb, architectures=names, **kw)
    b = sa.architecture_pair_r2(x[p], y[p], ma[p], mb[p], architectures=renamed, **kw)
    _assert_same({tuple(sorted(rename[n] for n in k)): v for k, v in a.items()}, b)
    a = sa.leave_one_architecture_out(x, y, ma, mb, architectures=names, **kw)
    b = sa.leave_one_architecture_out(x[p], y[p], ma[p], mb[p], architectures=renamed, **kw)
    _assert_same({"all": a["all"], "without": {rename[k]: v for k, v in a["without"].items()}}, b)
    _assert_same(sa.family_split_r2(x, y, ma, mb, {"mlp"}, architectures=names, **kw),
                 sa.family_split_r2(x[p], y[p], ma[p], mb[p], {"z3"}, architectures=renamed, **kw))


def _assert_same(a, b):
    """Nested dicts with the same keys, numbers equal up to the order of float sums."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (a, b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, float)):
        np.testing.assert_allclose(a, b, rtol=1e-9 if jax.config.jax_enable_x64 else 1e-5)
    else:
        assert a == b


def test_architecture_statistics_refuse_bad_input_naming_it():
    x, y, ma, mb = _arch_rows(archs=("cnn", "mlp"), seeds=2)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=rf"'model_b': \({len(x) - 1},\)"):
        sa.architecture_pair_r2(x, y, ma, mb[:-1], key=key)
    with pytest.raises(ValueError, match=rf"'x': \({len(x)},\), 'y': \({len(x)}, 1\)"):
        sa.leave_one_architecture_out(x, y[:, None], ma, mb, key=key)
    names = {m: sa.architecture_of(m) for m in set(ma) | set(mb) if m != mb[-1]}
    with pytest.raises(ValueError, match=rf"model_b \(shape \({len(x)},\)\) has model ids not in architectures "
                                         rf"\(3 models\): \['{mb[-1]}'\]"):
        sa.architecture_pair_r2(x, y, ma, mb, architectures=names, key=key)
    with pytest.raises(ValueError, match=r"masks\['a'\] has shape \(2,\)"):
        sa.subset_r2(x, y, ma, mb, {"a": [True, False]}, key=key)
    with pytest.raises(ValueError, match="x .* has 1 non-finite values"):
        sa.family_split_r2(np.where(np.arange(len(x)) == 0, np.nan, x), y, ma, mb, {"mlp"}, key=key)
    with pytest.raises(ValueError, match=r"width_b must be 1-D of one length, got shapes \(3,\), \(3,\), \(2,\)"):
        sa.rsa_skipped_mask(np.ones(3), np.ones(3), np.ones(2), limit=2)


def test_architecture_map_prefers_the_manifest_name():
    models = {"d/mlp_wide_s0": {"name": "mlp_wide", "feature_shapes": {"fc0": [16]}},
              "d/odd_s1": {"name": "conv_net", "feature_shapes": {"c0": [4, 4, 8], "fc": [10]}},
              "d/cnn_s2": {"feature_shapes": {"c0": [4, 4, 8]}}}
    names = sa.architecture_map(models)
    assert names == {"d/mlp_wide_s0": "mlp_wide", "d/odd_s1": "conv_net", "d/cnn_s2": "cnn"}
    assert sa.dense_architectures(models, names) == {"mlp_wide"}
