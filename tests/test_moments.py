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
