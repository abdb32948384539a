"""`funsim similarity-study` and `funsim report usable-information` on the smoke zoo: end to end, the
mathematical claims per pair, and resumption after an interruption."""

import numpy as np
import pytest

from experiments import cli, similarity_study as S
from experiments import usable_information as ui
from experiments.io import read_json

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ("claim1_asymmetry.png", "claim2_monotonicity.png", "claim3_r2.png", "claim4_granularity.png",
           "claim5_sufficiency.png", "held_out_gap.png")


class Crash(Exception):
    """A simulated interruption (a killed process) in the middle of a study."""


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke zoo, the smoke study and its report, through the CLI."""
    root = tmp_path_factory.mktemp("study")
    assert cli.main(["zoo", "--config", "smoke", "--root", str(root), "--no-progress"]) == 0
    assert cli.main(["similarity-study", "--config", "smoke", "--root", str(root), "--no-progress"]) == 0
    run = root / "similarity_study" / "smoke"
    assert cli.main(["report", "usable-information", "--run", str(run), "--n-resamples", "100",
                     "--n-permutations", "100"]) == 0
    return root, run


def _where(t, **kw):
    mask = np.ones(len(t["value"]), bool)
    for k, v in kw.items():
        mask &= t[k] == v
    return mask


def _by_pair(t, mask):
    keys = zip(t["dataset"][mask], t["model_a"][mask], t["layer_a"][mask], t["model_b"][mask], t["layer_b"][mask],
               t["direction"][mask])
    return dict(zip(keys, t["value"][mask]))


def test_smoke_study_and_report_write_every_table_and_figure(smoke):
    root, run = smoke
    for f in ("config.json", "metrics.json", "summary.md", "comparisons.csv"):
        assert (run / f).stat().st_size > 0
    t = S.read_table(run / "comparisons.csv")
    assert set(t) == set(S.COLUMNS) and np.all(np.isfinite(t["value"]))
    cfg = S.CONFIGS["smoke"]
    assert set(t["measure"]) >= set(cfg.measures) | {f"stitch/{f}" for f in cfg.families} | \
        {f"task/{f}/relative_accuracy" for f in cfg.stitch_families}
    metrics = read_json(run / "metrics.json")
    # every layer pair of two different models, for each of 6 measures and 3 families x 2 splits x 2 directions
    n_pairs = metrics["layer_pair_comparisons"]
    assert n_pairs == 58 and np.sum(_where(t, measure="cka/linear")) == n_pairs
    assert np.sum(_where(t, measure="stitch/affine", split="held_out")) == 2 * n_pairs
    rep = run / "usable_information"
    for f in FIGURES:
        assert (rep / f).read_bytes()[:8] == PNG and (rep / f).stat().st_size > 5000
    summary = (rep / "summary.md").read_text()
    for claim in range(1, 6):
        assert f"## Claim {claim}" in summary
    assert "0.937" in summary and "0.912" in summary
    m = read_json(rep / "metrics.json")
    assert m["claim3"]["in_sample"]["scaled_orthogonal"]["cka/linear"]["n"] == 2 * n_pairs


def test_in_sample_scores_are_monotone_in_the_family_per_pair(smoke):
    """A theorem: the families are nested (orthogonal in scaled orthogonal in affine), and the in-sample
    score is one minus the least residual over the family on the rows it was fitted on. With the affine
    ridge r, affine >= scaled orthogonal - r min(d_src, d_tgt) (ui.ridge_slack). Held out, no theorem."""
    _, run = smoke
    t = S.read_table(run / "comparisons.csv")
    o, s, a = (_by_pair(t, _where(t, measure=f"stitch/{f}", split="in_sample")) for f in ui.FAMILIES)
    assert set(o) == set(s) == set(a) and len(o) == 116
    ridge = S.CONFIGS["smoke"].affine_ridge
    for k in o:
        assert o[k] <= s[k] + 1e-5, k
        assert s[k] <= a[k] + ridge * 16 + 1e-5, k  # 16: the widest smoke representation
    m = read_json(run / "usable_information" / "metrics.json")
    assert m["claim2"]["in_sample"]["orthogonal_gt_scaled"] == 0
    assert m["claim2"]["in_sample"]["scaled_gt_affine_beyond_ridge_bound"] == 0


def test_coarsened_predictions_are_at_least_as_accurate_per_pair(smoke):
    """A theorem: mapping a stitched model's fine prediction to its group is right whenever the fine
    prediction is, so its coarse accuracy is at least its fine accuracy (for the target's own layer too).
    The relative accuracy of a stitcher retrained on coarse labels is only empirically higher."""
    _, run = smoke
    t = S.read_table(run / "comparisons.csv")
    for q in ("accuracy", "own_accuracy"):
        fine = _by_pair(t, _where(t, measure=f"task/affine/{q}", task="fine"))
        coarse = _by_pair(t, _where(t, measure=f"task/affine/{q}", task="coarsened:parity"))
        assert set(fine) == set(coarse) and len(fine) > 20
        assert all(coarse[k] >= fine[k] for k in fine)
    m = read_json(run / "usable_information" / "metrics.json")
    assert m["claim4"]["affine/parity"]["coarsened_accuracy_below_fine"] == 0


def test_interrupted_study_resumes_to_the_same_table(smoke, monkeypatch):
    root, run = smoke
    args = ["similarity-study", "--config", "smoke", "--root", str(root), "--run", "resumed", "--no-progress"]
    real, calls = S._stitch_target, []

    def crashing(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise Crash("simulated interruption")
        return real(*a, **kw)

    monkeypatch.setattr(S, "_stitch_target", crashing)
    with pytest.raises(Crash):
        cli.main(args)
    out = root / "similarity_study" / "resumed"
    assert len(list((out / "pairs" / "digits").glob("*.json"))) == 15  # the grid was written pair by pair
    done = sorted(p.name for p in (out / "stitch").rglob("*.json"))
    assert len(done) == 2 * 2  # two stitching targets, fine and coarse task each
    stamps = {p: p.stat().st_mtime_ns for p in (out / "pairs").rglob("*.json")}
    monkeypatch.setattr(S, "_stitch_target", real)
    assert cli.main(args) == 0
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished units are not redone
    assert (out / "comparisons.csv").read_bytes() == (run / "comparisons.csv").read_bytes()
    # a changed config is refused, not mixed in
    with pytest.raises(ValueError, match="another config:\n  n_rows: saved 96, now 64"):
        S.run(S.config_from_dict({"base": "smoke", "n_rows": 64}), root=root, run_name="resumed", progress=False)


def test_bad_config_and_missing_zoo(tmp_path):
    with pytest.raises(ValueError, match="Unknown study config fields \\['n_row'\\]"):
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
