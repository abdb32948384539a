"""Smoke test: the quickstart end to end on a tiny configuration."""

import json

import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import cli
from funsim.experiments.quickstart import TINY


def test_quickstart_tiny_end_to_end(tmp_path, capsys):
    rc = cli.main(["quickstart", "--tiny", "--no-progress", "--root", str(tmp_path), "--run", "smoke"])
    assert rc == 0
    out = tmp_path / "quickstart" / "smoke"
    printed = capsys.readouterr().out
    assert "[5/5] summary" in printed and str(out) in printed
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["steps"] == TINY.steps and cfg["measures"] == list(TINY.measures)
    m = json.loads((out / "metrics.json").read_text())
    assert set(m["accuracy"]) == {"mlp_s0", "mlp_s1", "bilinear_s0", "bilinear_s1"}
    rep = m["representational"]["mlp_seeds"]
    for name in TINY.measures:
        grid = np.array(rep[name], dtype=float)
        assert grid.shape == (2, 2)  # fc0, logits x fc0, logits
    # linear CKA of a layer with itself across seeds is a score in [0, 1]
    assert np.all((np.array(rep["cka/linear"]) >= 0) & (np.array(rep["cka/linear"]) <= 1 + 1e-6))
    for pair in ("mlp_seeds", "mlp_vs_bilinear"):
        st = m["stitching"][pair]
        assert set(st) >= set(similarity.FAMILIES)
        for fam in similarity.FAMILIES:
            assert np.array(st[fam]["a->b"]).shape == np.array(st[fam]["b->a"]).shape == ((2, 2) if pair == "mlp_seeds" else (2, 3))
            v = np.concatenate([np.array(st[fam][d], dtype=float).ravel() for d in ("a->b", "b->a")])
            assert np.all(v[np.isfinite(v)] <= 1 + 1e-6)
            # a NaN cell is a score the data leave open (e.g. a ReLU unit dead on the fitting rows
            # only), each named with its reason
            assert int(np.isnan(v).sum()) == len(st[fam]["undefined"]), (fam, st[fam]["undefined"])
        # a ridge makes the affine fit unique: every affine cell is a number
        assert all(np.all(np.isfinite(np.array(st["affine"][d], dtype=float))) for d in ("a->b", "b->a"))
    ts = m["tensor_similarity"]
    assert set(ts["seeds"]) >= {"frobenius", "symmetric", "gaussian", "weight cosine (baseline)"}
    assert ts["checkpoints"]["symmetric"][-1] == pytest.approx(1.0, abs=1e-5)  # final vs itself
    # a check that can fail (the seeded run's direction): an earlier checkpoint of the same run is further
    # from the final network than the final is from itself, and nearer than the other seed's final network
    for metric in ("symmetric", "gaussian"):
        to_final = ts["checkpoints"][metric]
        assert len(to_final) >= 2 and np.all(np.diff(to_final) > 0), (metric, to_final)
        assert to_final[-2] > ts["seeds"][metric], (metric, to_final, ts["seeds"][metric])
    assert (out / "tensor_checkpoints.png").exists()
    for png in ("overview.png", "training.png", "representational_mlp_seeds.png", "stitching_mlp_vs_bilinear.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not list(out.glob("**/*.tmp*"))  # atomic writes leave no temp files


def test_quickstart_rejects_unknown_measure_and_dataset(tmp_path):
    with pytest.raises(ValueError, match="Unknown measure|Did you mean"):
        cli.main(["quickstart", "--tiny", "--measures", "cka/lineer", "--root", str(tmp_path)])
    with pytest.raises(SystemExit):
        cli.main(["quickstart", "--dataset", "imagenet", "--root", str(tmp_path)])


def test_quickstart_refuses_a_changed_config_in_the_same_run_folder(tmp_path):
    """A rerun into the same run folder with another config overwrote config.json (and then mixed
    results of two configs); now it is refused before any work, and config.json is kept."""
    import dataclasses

    from funsim.experiments.io import check_run_config
    from funsim.experiments.quickstart import run

    out = tmp_path / "quickstart" / "again"
    out.mkdir(parents=True)
    assert check_run_config(out, TINY)  # what a first run of TINY leaves
    saved = (out / "config.json").read_text()
    changed = dataclasses.replace(TINY, n_compare=TINY.n_compare + 1)
    with pytest.raises(ValueError, match=r"(?s)Refusing to resume .*again.*n_compare.*another --run name"):
        run(changed, root=tmp_path, run_name="again", progress=False, log=lambda *_: None)
    assert (out / "config.json").read_text() == saved
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # nothing else written, lock released
