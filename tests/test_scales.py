"""Extreme scales and shapes: float32 data at 1e-20 ... 1e20, relative thresholds, clear refusals.

Registry-driven: every registered measure, in float32, on data multiplied by 1e-20, 1e-15,
1e18 or 1e20 (one side, then both), must give the float64 value of the same scaled data to
float32 accuracy; a scale-invariant measure must also give its unscaled value. Before each
side was normalised ahead of its products, float32 sums of squares overflowed near 1e19
(``nbs`` 0.0 instead of 0.64, ``procrustes_distance`` 2.0, ``shape_distance`` pi/2 from 1e17,
NaN from ``pwcca`` and ``shape_distance(alpha=0.5)``, a negative held-out orthogonal score),
and an absolute 1e-12 threshold called ``x * 1e-15`` constant.
"""

import os
import subprocess
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.similarity import HeldOutOverlapWarning, list_measures, measure
from tests.invariance import invariance_data

NAMES = list_measures()
SCALES = (1e-20, 1e-15, 1e18, 1e20)


def _f32_tol(name: str, ref: float) -> float:
    """How far float32 may sit from float64 on ``invariance_data`` (as in the registry's float32 test)."""
    whitened = name.startswith("shape/") and not name.endswith("alpha=1")
    affine = name.startswith("stitch/affine")
    held_out_affine = affine and "/in_sample" not in name
    tol = 2e-3 if whitened or held_out_affine else 1e-4 if affine else 2e-5
    return tol * max(1.0, abs(ref)) if name.startswith("shape/euclidean") else tol


@pytest.mark.parametrize("name", NAMES)
def test_float32_at_extreme_scales(name):
    m = measure(name)
    x, y = invariance_data(np.random.default_rng(5))
    unscaled = float(m(x, y))
    for s in SCALES:
        for xs, ys in ((s * x, y), (s * x, s * y)):
            ref = float(m(xs, ys))  # float64: no overflow anywhere near these scales
            got = float(m(xs.astype(np.float32), ys.astype(np.float32)))
            assert np.isfinite(got), (name, s)
            assert got == pytest.approx(ref, abs=_f32_tol(name, ref)), (name, s, got, ref)
            # netrep's absolute eigenvalue floor (1e-7) makes whitened shape metrics see tiny data
            # differently (every eigenvalue floored): their scale invariance holds above it
            floored = name.startswith("shape/") and not name.endswith("alpha=1") and s < 1
            if "isotropic_scale" in m.invariances and not floored:
                assert ref == pytest.approx(unscaled, rel=1e-9, abs=1e-12), (name, s, ref, unscaled)


def test_named_cases_at_1e18_to_1e20():
    """The reported cases, through the public functions (float32; true values from float64)."""
    x, y = invariance_data(np.random.default_rng(6), n=40, d1=5, d2=4)
    for s in (1e17, 1e18, 1e19, 1e20, 1e-15):
        x32, y32 = (s * x).astype(np.float32), y.astype(np.float32)
        assert float(similarity.nbs(x32, y32)) == pytest.approx(float(similarity.nbs(x, y)), abs=1e-5)
        assert float(similarity.procrustes_distance(x32, y32)) == pytest.approx(
            float(similarity.procrustes_distance(x, y)), abs=1e-5)
        assert float(similarity.pwcca(x32, y32)) == pytest.approx(float(similarity.pwcca(x, y)), abs=1e-4)
        for alpha in (1.0, 0.5):
            want = float(similarity.shape_distance(s * x, y, alpha=alpha))
            assert float(similarity.shape_distance(x32, y32, alpha=alpha)) == pytest.approx(want, abs=2e-3)
        r = similarity.reconstruction_score(x32, y32, family="orthogonal")
        r64 = similarity.reconstruction_score(x, y, family="orthogonal")
        assert float(r.held_out) == pytest.approx(float(r64.held_out), abs=1e-4)


def test_constant_is_relative_to_the_data_scale():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(12, 3))
    for s in (1e-15, 1e-30):
        assert float(similarity.cka(s * x, x)) == pytest.approx(1.0, abs=1e-9)  # not "constant"
        for dt in (np.float32, np.float64):
            const = np.full((12, 3), 0.1 * s, dtype=dt)
            with pytest.raises(ValueError, match="is constant across samples"):
                similarity.cka(const, x)
    # a constant float32 column whose mean is not exactly representable is still constant
    with pytest.raises(ValueError, match=r"y of shape \(12, 2\) is constant"):
        similarity.nbs(x.astype(np.float32), np.full((12, 2), 0.1, np.float32))


def test_svcca_refuses_more_features_than_samples():
    """On pure noise with d >= n SVCCA gave 0.92-1.0; it now refuses as cca does."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(20, 20)), rng.normal(size=(20, 30))
    for a, b, name in ((x, y[:, :5], "x"), (y[:, :5], y, "y")):
        with pytest.raises(ValueError, match=rf"{name} has shape .*CCA needs more samples than features"):
            similarity.svcca(a, b)
    with pytest.raises(ValueError, match="CCA needs more samples than features"):
        similarity.cca(x, y[:, :5])


def test_held_out_stitching_warns_when_test_rows_repeat_train_rows():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(30, 3))
    y = np.tanh(x @ rng.normal(size=(3, 2))) + 0.5 * rng.normal(size=(30, 2))
    xd, yd = np.concatenate([x, x]), np.concatenate([y, y])  # every input twice
    with pytest.warns(HeldOutOverlapWarning, match=r"of the 30 held-out rows repeat a train row"):
        dup = similarity.reconstruction_score(xd, yd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = similarity.reconstruction_score(x, y)
        # disjoint index split of the duplicated data: each input on one side only
        similarity.reconstruction_score(xd, yd, split=(np.arange(0, 15), np.arange(45, 60)))
    assert float(dup.held_out) > float(clean.held_out)  # the inflation the warning is about
    # the registered held-out measure (split=0.5) warns too
    with pytest.warns(HeldOutOverlapWarning):
        measure("stitch/affine")(xd, yd)


def test_float64_input_with_x64_off_warns_once():
    """JAX computes float64 input in float32 when x64 is off: one PrecisionWarning per process
    (a UserWarning subclass, so it can be filtered), not silence and not one per call."""
    code = (
        "import warnings, numpy as np\n"
        "warnings.simplefilter('always')\n"
        "from funsim import similarity\n"
        "from funsim.similarity import PrecisionWarning\n"
        "x = np.random.default_rng(0).normal(size=(10, 3))\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    a = similarity.cka(x, 2 * x)\n"
        "    similarity.nbs(x, x)\n"
        "    similarity.rsa(x, x)\n"
        "mine = [v for v in w if issubclass(v.category, PrecisionWarning)]\n"
        "assert issubclass(PrecisionWarning, UserWarning)\n"
        "print(len(mine), a.dtype, 'x64' in str(mine[0].message) if mine else '')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "float32", "True"], out.stdout


def test_float32_input_gives_float32_without_warning():
    x = np.random.default_rng(10).normal(size=(10, 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert similarity.cka(jnp.asarray(x), x).dtype == np.float32


def _cell_outcome(m, x, y):
    try:
        return float(m(x, y)), None
    except ValueError as e:
        return None, str(e)


def _grid_agrees_with_pairwise(names):
    """Every cell of a float32 grid is the pairwise value to float32 accuracy, or NaN with the pairwise
    message where that call raises; the layers include 1e-20 ... 1e20 scales and a wide one (d >= n).
    Returns the measures that refused a cell."""
    from funsim.similarity.grid import compare_grid

    rng = np.random.default_rng(11)
    x = rng.normal(size=(16, 4)) + 1.0  # well conditioned: not a rank suspect in float32
    y = np.tanh(x @ rng.normal(size=(4, 3))) + 0.3 * rng.normal(size=(16, 3))
    wide = rng.normal(size=(16, 18))
    a = [v.astype(np.float32) for v in (1e20 * x, 1e-20 * x, 1e18 * wide)]
    b = [v.astype(np.float32) for v in (1e19 * y, 1e-19 * y)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", similarity.UndefinedCellWarning)
        g = compare_grid(a, b, measures=names, reverse=True)
    refused = set()
    for name in names:
        m = measure(name)
        for rev, tables, undefined in ((False, g.tables, g.undefined), (True, g.reverse, g.reverse_undefined)):
            t = np.asarray(tables[name])
            assert t.dtype == np.float32, name
            for i, xa in enumerate(a):
                for j, yb in enumerate(b):
                    value, reason = _cell_outcome(m, yb, xa) if rev else _cell_outcome(m, xa, yb)
                    where = (name, "reverse" if rev else "forward", i, j)
                    if reason is None:
                        assert (i, j) not in undefined[name] and np.isfinite(t[i, j]), (where, undefined[name].get((i, j)))
                        assert t[i, j] == pytest.approx(value, abs=2 * _f32_tol(name, value)), (where, t[i, j], value)
                    else:
                        assert np.isnan(t[i, j]) and undefined[name].get((i, j)) == reason, (where, t[i, j])
                        refused.add(name)
    return refused


def test_grid_agrees_with_pairwise_at_extreme_scales_float32():
    """The grid forms its own moments, so it pre-scales each layer by its power of two as the pairwise
    functions do (before, its float32 moments overflowed near 1e19 and tiny layers looked constant).
    Every cell at 1e-20 ... 1e20 is the grid's own and agrees; the CCA family refuses the wide layer
    as the pairwise calls do (the full registry: the slow variant below)."""
    moment = [n for n in list_measures() if measure(n).moments is not None]
    assert len(moment) > 10
    refused = _grid_agrees_with_pairwise(moment + ["svcca", "cca/mean", "pwcca"])
    assert {"svcca", "cca/mean", "pwcca"} <= refused


@pytest.mark.slow
def test_grid_agrees_with_pairwise_at_extreme_scales_float32_every_measure():
    refused = _grid_agrees_with_pairwise(list_measures())
    assert {"svcca", "cca/mean", "pwcca"} <= refused


def test_full_moments_at_extreme_scales_float32():
    """``similarity.moments.full_moments`` / ``full_pair`` sum squares of each side divided by its power
    of two: before, float32 data at 1e20 gave an infinite norm and a NaN Gram matrix, 1e-20 underflowed."""
    from funsim.similarity.moments import full_moments, full_pair

    rng = np.random.default_rng(13)
    x, y = rng.normal(size=(20, 3)) + 2.0, rng.normal(size=(20, 2))
    ref, ref_pair = full_moments(x), full_pair(x, y)
    for s in (1e-20, 1e20):
        m = full_moments((s * x).astype(np.float32))
        np.testing.assert_allclose(np.asarray(m.gram), np.asarray(ref.gram), atol=1e-6, err_msg=str(s))
        assert float(m.norm) == pytest.approx(s * float(ref.norm), rel=1e-5)
        p = full_pair((s * x).astype(np.float32), y.astype(np.float32))
        np.testing.assert_allclose(np.asarray(p.cross), np.asarray(ref_pair.cross), atol=1e-6, err_msg=str(s))
        assert float(p.y.norm) == pytest.approx(float(ref_pair.y.norm), rel=1e-5)
