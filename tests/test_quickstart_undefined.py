"""The quickstart's undefined cells come from the grid (GridResult.undefined), not from a pair loop of its own."""

import warnings

import numpy as np

import funsim.similarity as sim
from funsim.experiments import quickstart


def test_quickstart_lists_the_grids_undefined_cells():
    r = np.random.default_rng(0)
    x = r.normal(size=(40, 3))
    relu = np.maximum(x @ r.normal(size=(3, 4)), 0.0)
    relu[:, 1] = 0.0  # a dead unit: CCA is undefined for this layer
    feats_a = {"h0": x @ r.normal(size=(3, 4)) + 0.1 * r.normal(size=(40, 4)), "h1": relu}
    feats_b = {"h0": np.tanh(x @ r.normal(size=(3, 4)))}
    cfg = quickstart.QuickstartConfig(measures=("cka/linear", "cca/mean"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the quickstart logs undefined cells itself; no warning escapes
        g = quickstart._grid(cfg, feats_a, feats_b)
    assert set(g.tables) == {"cka/linear", "cca/mean", *quickstart._stitch_names(cfg).values()}
    t = np.asarray(g.tables["cca/mean"])
    np.testing.assert_allclose(t[0, 0], sim.cca_mean(feats_a["h0"], feats_b["h0"]), rtol=1e-6)
    assert np.isnan(t[1, 0]) and np.isfinite(np.asarray(g.tables["cka/linear"])).all()
    (line,) = quickstart._undefined(g, cfg.measures)
    assert line.startswith("cca/mean(h1, h0): x of shape (40, 4) has centred rank 3 < 4 features"), line
