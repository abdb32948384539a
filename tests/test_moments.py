"""The moment types and per-layer statistics live in one public module, ``similarity.moments``."""

import ast
import pathlib

import funsim.similarity as sim
from funsim.similarity import moments

TYPES = ("LayerStats", "MomentStats", "MomentPair", "FullMoments", "LayerMoments", "PairMoments", "split_weights")
ROOT = pathlib.Path(sim.__file__).resolve().parent


def test_defined_in_moments_and_re_exported():
    for name in TYPES:
        obj = getattr(moments, name)
        assert obj.__module__ == "funsim.similarity.moments", name
        assert getattr(sim, name) is obj, name
    # the modules that use them see the same objects (one definition, no copies)
    assert sim.stitching.LayerMoments is moments.LayerMoments
    assert sim.stitching.split_weights is moments.split_weights


def test_no_module_imports_the_moment_types_from_elsewhere():
    """Every ``from ... import <moment type>`` in similarity/ names similarity.moments."""
    for path in sorted(ROOT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("funsim.similarity"):
                names = {a.name for a in node.names} & set(TYPES)
                if names and path.name != "__init__.py":
                    assert node.module == "funsim.similarity.moments", (path.name, node.module, names)
                assert not node.module.endswith("_layer_stats"), path.name
    assert not (ROOT / "_layer_stats.py").exists()


def test_full_moments_gram_norm_is_the_frobenius_norm_of_the_normalised_gram():
    import numpy as np

    from funsim.similarity import compare_grid

    r = np.random.default_rng(3)
    x = r.normal(size=(40, 5)) * np.array([1.0, 2.0, 3.0, 0.5, 1e3])
    m = moments.full_moments(x)
    xc = x - x.mean(axis=0)
    g = xc.T @ xc / np.sum(xc * xc)  # float64 reference: trace-1 gram
    np.testing.assert_allclose(float(m.gram_norm), np.linalg.norm(g), rtol=1e-12)
    # the grid forms it in its layer program, on zero-padded widths: its linear CKA is the reference's
    y = np.tanh(x @ r.normal(size=(5, 3)))
    yc = y - y.mean(axis=0)
    ref = np.sum((xc.T @ yc) ** 2) / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    out = compare_grid({"x": x}, {"y": y, "x": x}, measures=["cka/linear"]).tables["cka/linear"]
    np.testing.assert_allclose(np.asarray(out)[0], [ref, 1.0], rtol=1e-10)
