"""Registry: names, metadata, and every declared property checked on every registered measure."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim import similarity
from funsim.similarity import INVARIANCES, list_measures, measure, register
from funsim.similarity.registry import _REGISTRY
from tests.invariance import invariance_data, random_transform

NAMES = list_measures()


def test_expected_names_present():
    for name in [
        "cka/linear", "cka/linear/debiased", "cka/rbf", "cka/rbf/debiased",
        "rsa/correlation/spearman", "rsa/sqeuclidean/cosine_cov", "rsa/euclidean/kendall",
        "svcca", "pwcca", "cca/r2", "shape/angular/alpha=0.5", "shape/angular/alpha=1",
        "nbs", "procrustes", "regression/r2",
    ]:
        assert name in NAMES, name
        assert measure(name).name == name


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    m = measure(name)
    assert m.kind in ("score", "distance")
    assert isinstance(m.symmetric, bool)
    assert isinstance(m.invariances, frozenset) and m.invariances <= set(INVARIANCES)
    assert m.description and "\n" not in m.description
    lo, hi = m.bounds
    assert lo < hi


def test_parametrised_names_parse():
    m = measure("shape/angular/alpha=0.25")
    assert m.name == "shape/angular/alpha=0.25"
    x, y = invariance_data(np.random.default_rng(0))
    assert float(m(x, y)) == pytest.approx(float(similarity.shape_distance(x, y, alpha=0.25)), abs=1e-12)
    assert measure("shape/angular/alpha=1.0").name == "shape/angular/alpha=1"
    assert "invertible_linear" in measure("shape/angular/alpha=0").invariances
    assert "isotropic_scale" not in measure("shape/angular/alpha=0.5").invariances


@pytest.mark.parametrize(
    "name, match",
    [
        ("cka/linaer", r"Unknown measure name 'cka/linaer'\. Did you mean 'cka/linear'"),
        ("svcaa", r"Did you mean 'svcca'"),
        ("shape/angular/alpha=2", r"alpha must be in \[0, 1\], got 2"),
        ("shape/angular/beta=0.5", r"takes alpha=\.\.\., not beta"),
        ("shape/angular/alpha=abc", r"alpha='abc' is not a number"),
    ],
)
def test_unknown_names(name, match):
    with pytest.raises(ValueError, match=match):
        measure(name)


def test_register_rejects_bad_entries():
    with pytest.raises(ValueError, match="already registered"):
        register("nbs", similarity.nbs, kind="score", symmetric=True, invariances=(), description="x")
    with pytest.raises(ValueError, match="Unknown invariance 'rotations'"):
        register("tmp/x", similarity.nbs, kind="score", symmetric=True,
                 invariances=("rotations",), description="x")
    with pytest.raises(ValueError, match="Unknown kind 'similarity'"):
        register("tmp/x", similarity.nbs, kind="similarity", symmetric=True,
                 invariances=(), description="x")
    assert "tmp/x" not in _REGISTRY


def test_register_adds_entry():
    try:
        register("tmp/neg-nbs", lambda x, y: 1 - similarity.nbs(x, y), kind="distance",
                 symmetric=True, invariances=("rotation",), description="1 - NBS")
        assert "tmp/neg-nbs" in list_measures()
        assert measure("tmp/neg-nbs").kind == "distance"
    finally:
        _REGISTRY.pop("tmp/neg-nbs", None)


# ------------------------------------------------------------ invariance (from declarations)


def _variants(m, x, y, tx, ty):
    """Value change when the map hits x only, y only, and both."""
    base = float(m(x, y))
    return base, [float(m(tx(x), y)) - base, float(m(x, ty(y))) - base, float(m(tx(x), ty(y))) - base]


@pytest.mark.parametrize("kind", list(INVARIANCES))
@pytest.mark.parametrize("name", NAMES)
def test_declared_invariances_and_non_invariances(name, kind):
    m = measure(name)
    rng = np.random.default_rng(1)
    x, y = invariance_data(rng)
    tx = random_transform(kind, x.shape[1], rng)
    ty = random_transform(kind, y.shape[1], rng)
    base, deltas = _variants(m, x, y, tx, ty)
    if kind in m.invariances:
        assert max(abs(d) for d in deltas) <= 1e-8 * max(1.0, abs(base)), (name, kind, base, deltas)
    else:
        assert max(abs(d) for d in deltas) > 1e-3, (
            f"{name} does not declare {kind} but a generic {kind} map changed it by only {deltas}"
        )


@pytest.mark.parametrize("name", NAMES)
def test_symmetry_as_declared(name):
    m = measure(name)
    x, y = invariance_data(np.random.default_rng(2))
    a, b = float(m(x, y)), float(m(y, x))
    if m.symmetric:
        assert a == pytest.approx(b, abs=1e-10)
    else:
        assert abs(a - b) > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_identical_inputs_are_optimal(name):
    m = measure(name)
    x, _ = invariance_data(np.random.default_rng(3))
    v = float(m(x, x))
    if "/ridge=" in name:  # shrinkage keeps a ridge fit below a perfect in-sample score
        assert 0.99 < v < 1.0
        return
    target = m.bounds[1] if m.kind == "score" else 0.0
    # kendall tau-a and rank correlations reach 1 on identical RDMs; distances reach 0
    assert v == pytest.approx(target, abs=1e-6), (name, v)


# ------------------------------------------------------------ transformations of the call


# Each case compiles anew, so the default run covers what the per-module tests do not
# (they check jit(vmap) and float32 for cka, rsa euclidean/spearman, cca, shape and
# regression); ``make test-slow`` runs the whole registry.
FAST_JIT = ["cka/linear/debiased", "cka/rbf", "rsa/euclidean/kendall", "rsa/sqeuclidean/cosine_cov",
            "rsa/correlation/pearson", "rsa/cosine/cosine", "svcca", "pwcca", "cca/r2", "procrustes"]
FAST_DTYPE = ["cka/linear/debiased", "cka/rbf", "rsa/correlation/spearman", "svcca", "pwcca", "procrustes"]


def _all_or(fast):
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in NAMES]


@pytest.mark.parametrize("name", _all_or(FAST_JIT))
def test_jit_vmap_match_eager(name):
    """``jit(vmap(f))`` over a stack of pairs equals the eager loop (jit and vmap at once)."""
    m = measure(name)
    rng = np.random.default_rng(4)
    pairs = [invariance_data(rng) for _ in range(3)]
    xs = jnp.stack([p[0] for p in pairs])
    ys = jnp.stack([p[1] for p in pairs])
    eager = np.array([float(m(x, y)) for x, y in pairs])
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(m.fn))(xs, ys)), eager, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", _all_or(FAST_DTYPE))
def test_float32_and_numpy_input(name):
    m = measure(name)
    x, y = invariance_data(np.random.default_rng(5))
    ref = m(x, y)
    assert isinstance(ref, jax.Array) and ref.shape == () and ref.dtype == np.float64
    out = m(x.astype(np.float32), y.astype(np.float32))
    assert isinstance(out, jax.Array) and out.shape == () and out.dtype == np.float32
    assert float(out) == pytest.approx(float(ref), abs=_float32_tol(name, float(ref)))


def _float32_tol(name: str, ref: float) -> float:
    """How far a float32 computation may sit from the float64 value ``ref`` on invariance_data."""
    # whitening (shape alpha < 1) works with the squared condition number (~2e4 here) in float32
    whitened = name.startswith("shape/") and not name.endswith("alpha=1")
    # the affine stitcher fits through a QR of the rows (error ~ eps times the condition number, 370
    # here), and its held-out score is extrapolated from only 8 training rows (5 parameters per output):
    # over 40 seeds of invariance_data and scales 1e-15 ... 1e18, float32 moved it by at most 3.3e-4
    # (in sample 1.0e-5); from the normal equations' moments it moved by up to 0.11 (5.6e-4)
    affine = name.startswith("stitch/affine")
    held_out_affine = affine and "/in_sample" not in name
    tol = 2e-3 if whitened or held_out_affine else 1e-4 if affine else 2e-5
    # a euclidean shape distance is unbounded (about the data's scale, ~12 here): its rounding is relative
    return tol * max(1.0, abs(ref)) if name.startswith("shape/euclidean") else tol


@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-2, 2), low_rank=st.booleans())
def test_bounds_property(seed, log_scale, low_rank):
    rng = np.random.default_rng(seed)
    x, y = invariance_data(rng)
    if low_rank:  # y lives near a 1-D subspace of its features
        y = np.outer(y[:, 0], np.arange(1.0, y.shape[1] + 1)) + 1e-2 * rng.normal(size=y.shape)
    x = x * 10.0**log_scale
    for name in NAMES:
        m = measure(name)
        v = float(m(x, y))
        lo, hi = m.bounds
        slack = 1e-9 * max(1.0, abs(v))
        assert lo - slack <= v <= hi + slack, (name, v, m.bounds)
        assert math.isfinite(v)


STATS_NAMES = [n for n in NAMES if measure(n).stats is not None]


def test_which_measures_have_layer_stats():
    """The measures whose per-layer work dominates have statistics (the grid relies on them)."""
    for prefix in ("rsa/", "cka/", "cca/", "svcca", "pwcca", "regression/", "shape/"):
        assert any(n.startswith(prefix) for n in STATS_NAMES), prefix
    assert all(measure(n).stats is not None
               for n in NAMES if n.startswith(("rsa/", "cka/", "regression/", "shape/", "pwcca", "cca/")))
    assert measure("regression/r2/ridge=0.3").stats is not None  # built on demand
    assert measure("shape/euclidean/alpha=0.3").stats is not None


def test_moment_measures_are_declared():
    """Every moment measure is one registry entry; the grid reads only these declarations."""
    moment = {n for n in NAMES if measure(n).moments is not None}
    stitch = {f"stitch/{f}{fig}" for f in similarity.FAMILIES for fig in ("", "/in_sample")}
    assert {"cka/linear", "nbs", "procrustes", "shape/angular/alpha=1", "shape/euclidean/alpha=1"} | stitch <= moment
    assert moment == set(similarity.MOMENT_MEASURES)
    assert {measure(n).moments.moments for n in stitch} == {"split"}
    assert measure("stitch/affine/ridge=1e-3").name == "stitch/affine/ridge=0.001"
    assert measure("stitch/affine/in_sample/ridge=0.5").moments is not None
    assert measure("shape/angular/alpha=0.5").moments is None  # whitening is not a function of the moments


def test_make_measure_validates_without_registering():
    m = similarity.make_measure("tmp/built", similarity.nbs, kind="score", symmetric=True,
                                invariances=("rotation",), description="x")
    assert m.name == "tmp/built" and "tmp/built" not in list_measures()
    with pytest.raises(ValueError, match="Unknown kind"):
        similarity.make_measure("tmp/built", similarity.nbs, kind="sim", symmetric=True, invariances=(),
                                description="x")


@pytest.mark.parametrize("name", STATS_NAMES)
def test_layer_stats_reproduce_the_measure(name):
    """``pair(layer(x), layer(y)) == fn(x, y)``, both argument orders, jitted too."""
    m = measure(name)
    rng = np.random.default_rng(5)
    x, y = invariance_data(rng)
    layer, pair = jax.jit(m.stats.layer), jax.jit(m.stats.pair)
    for a, b in ((x, y), (y, x)):
        np.testing.assert_allclose(float(pair(layer(a), layer(b))), float(m(a, b)), rtol=1e-9, atol=1e-12)


def test_register_checks_stats_type():
    with pytest.raises(TypeError, match="LayerStats"):
        register("demo/badstats", lambda x, y: jnp.zeros(()), kind="score", symmetric=True,
                 invariances=(), description="d", stats=(lambda x: x, lambda a, b: 0.0))


# ------------------------------------------------------------ input dtypes (similarity._validate)


@pytest.mark.parametrize("name", NAMES)
def test_half_precision_input_computes_in_float32(name):
    """float16 and bfloat16 are promoted to float32 for the computation (one policy for all).

    The value equals the measure on the same (rounded) data passed as float32, and it is
    the float64 value of that data to float32 accuracy; before the policy, half input gave
    0.0, inf, LAPACK's NotImplementedError or a wrong "constant representation" error.
    """
    m = measure(name)
    x, y = invariance_data(np.random.default_rng(6))
    for half in (np.float16, jnp.bfloat16):
        xh, yh = x.astype(half), y.astype(half)
        x32, y32 = (np.asarray(a, np.float32) for a in (xh, yh))
        out = m(xh, yh)
        assert isinstance(out, jax.Array) and out.dtype == np.float32, (name, half, out.dtype)
        assert float(out) == pytest.approx(float(m(x32, y32)), rel=1e-6, abs=1e-6), (name, half)
        ref = float(m(x32.astype(np.float64), y32.astype(np.float64)))
        assert float(out) == pytest.approx(ref, abs=_float32_tol(name, ref)), (name, half, float(out), ref)


@pytest.mark.parametrize("name", ["cka/linear", "rsa/euclidean/spearman", "cca/r2", "stitch/orthogonal"])
def test_complex_input_is_refused(name):
    x, y = invariance_data(np.random.default_rng(7))
    with pytest.raises(TypeError, match=r"(x|z_src) has complex dtype complex128; .* real arrays"):
        measure(name)(x + 1j * y, y)
    with pytest.raises(TypeError, match=r"(y|z_tgt) has complex dtype complex64"):
        measure(name)(x, (y + 0j).astype(np.complex64))
