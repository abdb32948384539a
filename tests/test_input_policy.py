"""One input policy for every public function (similarity._validate).

* float16 / bfloat16 are promoted to float32 for the computation (result float32);
* complex input is refused with a TypeError naming the argument;
* boolean options take True/False (Python or NumPy bools) only;
* integer network weights are cast like integer representations;
* every stitcher family has the same minimum-rows rule, with the same message;
* ``compare_grid(measures="name")`` is one name, not a sequence of characters.

Every registry measure is checked with half precision in ``tests/test_registry.py``; the
cases here are the public functions outside the registry.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funsim.similarity as sim
from tests._tensor_nets import bilinear, deep

HALF = (np.float16, jnp.bfloat16)


def _reps(seed=0, n=24, d1=4, d2=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d1))
    y = np.tanh(x @ rng.normal(size=(d1, d2))) + 0.3 * rng.normal(size=(n, d2))
    return x, y


def _as32(*arrays, half):
    """The values a half-precision input really holds, as float32 arrays."""
    return [np.asarray(np.asarray(a).astype(half), np.float32) for a in arrays]


def _leaves32(tree):
    return [np.asarray(v) for v in jax.tree.leaves(tree)]


X, Y = _reps()
LABELS = np.arange(24) % 3
NET_A = (bilinear(np.random.default_rng(1), 3, 4, 2, bias=True),)
NET_B = (bilinear(np.random.default_rng(2), 3, 4, 2, bias=True),)
DEEP = deep(np.random.default_rng(3), 2, [3, 2])

# name -> f(cast) where cast(a) converts an array input to the dtype under test
REP_CASES = {
    "hsic": lambda c: sim.hsic(c(X @ X.T), c(Y @ Y.T), debiased=True),
    "linear_cka_from_stats": lambda c: sim.linear_cka_from_stats(sim.linear_stats(c(X)), sim.linear_stats(c(Y))),
    "centre_gram+rbf_gram": lambda c: sim.centre_gram(sim.rbf_gram(c(X))),
    "minibatch_cka": lambda c: sim.minibatch_cka(c(X), c(Y), batch_size=8),
    "cka_accumulate": lambda c: sim.cka_finalize(sim.cka_accumulate(sim.cka_init(jnp.float32), c(X), c(Y))),
    "rdm": lambda c: sim.rdm(c(X), metric="euclidean"),
    "cca": lambda c: sim.cca(c(X), c(Y)),
    "partial_whiten": lambda c: sim.partial_whiten(c(X), alpha=0.5),
    "fit_stitcher": lambda c: sim.apply_stitcher(sim.fit_stitcher(c(X), c(Y), family="scaled_orthogonal"), c(X)),
    "fit_stitchers": lambda c: sim.fit_stitchers([c(X)], [c(Y)], family="orthogonal")[0].weight,
    "stitching_asymmetry": lambda c: sim.stitching_asymmetry(c(X), c(Y), family="affine").difference.in_sample,
    "v_information": lambda c: sim.v_information(c(X), c(Y), family="gaussian_linear").in_sample,
    "conditional_v_information": lambda c: sim.conditional_v_information(
        c(X[:, :2]), c(X[:, 2:]), c(Y), family="gaussian_linear").in_sample,
    "compare_grid": lambda c: sim.compare_grid(
        [c(X)], [c(Y)], measures=["cka/linear", "stitch/affine", "rsa/euclidean/pearson", "svcca"]).tables,
    "compare_grid(chunked)": lambda c: sim.compare_grid(
        [np.asarray(c(X))], [np.asarray(c(Y))], measures=["nbs"], chunk_size=10).tables,
    "resize_spatial": lambda c: sim.resize_spatial(c(X[:, :4].reshape(6, 2, 2, 4)), size=(1, 1)),
    "spatial_reconstruction_score": lambda c: sim.spatial_reconstruction_score(
        c(X[:, :4].reshape(6, 2, 2, 4)), c(Y.reshape(6, 2, 2, 3)), family="scaled_orthogonal"),
    "spatial_score_table": lambda c: sim.spatial_score_table(
        [c(X[:, :4].reshape(6, 2, 2, 4))], [c(Y.reshape(6, 2, 2, 3))], families=("affine",))["affine"],
}


@pytest.mark.parametrize("name", list(REP_CASES))
def test_half_precision_public_functions(name):
    f = REP_CASES[name]
    for half in HALF:
        got = f(lambda a, half=half: np.asarray(a).astype(half))
        want = f(lambda a, half=half: _as32(a, half=half)[0])
        for g, w in zip(_leaves32(got), _leaves32(want)):
            assert g.dtype == np.float32, (name, half, g.dtype)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{name} {half}")
            assert np.all(np.isfinite(g))


def _cast_net(net, dtype):
    return jax.tree.map(lambda a: np.asarray(a).astype(dtype), net)


NET_CASES = {
    "tensor_similarity/gaussian": lambda a, b: sim.tensor_similarity(a, b),
    "tensor_similarity/symmetric": lambda a, b: sim.tensor_similarity(a, b, metric="symmetric"),
    "tensor_similarity/frobenius": lambda a, b: sim.tensor_similarity(a, b, metric="frobenius"),
    "tensor_inner": lambda a, b: sim.tensor_inner(a, b),
    "similarity_matrix": lambda a, b: sim.similarity_matrix([a, b]),
    "weight_cosine": lambda a, b: sim.weight_cosine(a, b),
    "behavioral_similarity": lambda a, b: sim.behavioral_similarity(a, b, X[:, :3].astype(np.float32)),
    "quadrature_inner": lambda a, b: sim.quadrature_inner(a, b),
    "interaction_tensor": lambda a, b: sim.interaction_tensor(sim.validate_network(a)[0]),
}


@pytest.mark.parametrize("name", list(NET_CASES))
def test_half_precision_networks(name):
    """Half-precision weights: float32 results, e.g. a network against itself has similarity 1 (was 0.0)."""
    f = NET_CASES[name]
    for half in HALF:
        got = f(_cast_net(NET_A, half), _cast_net(NET_B, half))
        want = f(_cast_net(_cast_net(NET_A, half), np.float32), _cast_net(_cast_net(NET_B, half), np.float32))
        assert got.dtype == np.float32
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    for metric in sim.TENSOR_METRICS:
        same = sim.tensor_similarity(_cast_net(DEEP, np.float16), _cast_net(DEEP, np.float16), metric=metric)
        assert float(same) == pytest.approx(1.0, abs=1e-6), metric


def test_integer_weights_are_cast():
    ints = jax.tree.map(lambda a: np.round(3 * np.asarray(a)).astype(np.int32), NET_A)
    floats = jax.tree.map(lambda a: np.asarray(a, np.float64), ints)
    for metric in sim.TENSOR_METRICS:
        assert float(sim.tensor_similarity(ints, NET_B, metric=metric)) == pytest.approx(
            float(sim.tensor_similarity(floats, NET_B, metric=metric)), rel=1e-12)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sim.hsic(X @ X.T + 0j, Y @ Y.T), r"k has complex dtype complex128"),
        (lambda: sim.rdm(X.astype(np.complex64)), r"x has complex dtype complex64"),
        (lambda: sim.fit_stitcher(X, Y + 1j), r"z_tgt has complex dtype"),
        (lambda: sim.compare_grid([X + 0j], [Y], measures=["cka/linear"]), r"reps_a\[0\] has complex dtype"),
        (lambda: sim.compare_grid([X], [Y + 0j], measures=["nbs"], chunk_size=8), r"reps_b\[0\] has complex dtype"),
        (lambda: sim.v_information(X + 0j, LABELS), r"z has complex dtype"),
        (lambda: sim.tensor_similarity(_cast_net(NET_A, np.complex64), NET_B),
         r"net_a\[0\]\.left has complex dtype complex64"),
        (lambda: sim.apply_stitcher(sim.fit_stitcher(X, Y), X + 0j), r"z has complex dtype"),
        (lambda: sim.spatial_score_table([X.reshape(6, 2, 2, 4)], [Y.reshape(6, 2, 2, 3) + 0j]),
         r"targets\[0\] has complex dtype complex128"),
    ],
)
def test_complex_input_is_refused(call, match):
    with pytest.raises(TypeError, match=match + r".*real arrays"):
        call()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda v: sim.cka(X, Y, debiased=v), "debiased"),
        (lambda v: sim.hsic(X @ X.T, Y @ Y.T, debiased=v), "debiased"),
        (lambda v: sim.minibatch_cka(X, Y, batch_size=8, debiased=v), "debiased"),
        (lambda v: sim.cka_accumulate(sim.cka_init(), X, Y, debiased=v), "debiased"),
        (lambda v: sim.linear_stats(X, debiased=v), "debiased"),
        (lambda v: sim.fit_stitcher(X, Y, normalize=v), "normalize"),
        (lambda v: sim.fit_stitchers([X], [Y], normalize=v), "normalize"),
        (lambda v: sim.fit_stitchers([X], [Y], bucket=v), "bucket"),
        (lambda v: sim.similarity_matrix([NET_A, NET_B], return_inner=v), "return_inner"),
        (lambda v: sim.interaction_tensor(NET_A[0], symmetric=v), "symmetric"),
        (lambda v: sim.validate_network(dataclasses.replace(NET_A[0], residual=v)), r"net\[0\]\.residual"),
        (lambda v: sim.register("tmp/boolean-check", sim.cka, kind="score", symmetric=v, invariances=(),
                                description="d", overwrite=True), "symmetric"),
    ],
)
def test_boolean_options_must_be_booleans(call, name):
    for bad in ("yes", "False", 1, 0.0, None):
        with pytest.raises(TypeError, match=rf"{name} must be True or False, got {bad!r}"):
            call(bad)
    try:
        call(np.False_)  # NumPy bools are booleans
    finally:
        sim.registry._REGISTRY.pop("tmp/boolean-check", None)


def test_register_overwrite_must_be_boolean():
    with pytest.raises(TypeError, match="overwrite must be True or False, got 'yes'"):
        sim.register("nbs", sim.nbs, kind="score", symmetric=True, invariances=(), description="d",
                     overwrite="yes")


def test_compare_grid_takes_one_name_as_a_string():
    one = sim.compare_grid([X], [Y], measures="cka/linear")
    assert list(one.tables) == ["cka/linear"]
    np.testing.assert_array_equal(one.tables["cka/linear"],
                                  sim.compare_grid([X], [Y], measures=["cka/linear"]).tables["cka/linear"])
    with pytest.raises(ValueError, match="Unknown measure name 'cka/lin'"):
        sim.compare_grid([X], [Y], measures="cka/lin")


RULE = (r"A stitcher fit needs more fitting rows than source features: .* has (\d+) rows "
        r"\(n - 1 = \d+ after centring\) but z_src has (\d+) features, so the (\w+) fit is not determined")


@pytest.mark.parametrize("family", sim.FAMILIES)
def test_one_minimum_rows_rule_for_every_family(family):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))  # split 0.5: 2 train rows
    with pytest.raises(ValueError, match=RULE) as e:
        sim.reconstruction_score(x, y, family=family)
    assert "2 rows" in str(e.value) and family in str(e.value)
    with pytest.raises(ValueError, match=RULE):
        sim.fit_stitcher(x[:3], y[:3], family=family)  # n - 1 = 2 < 3 features
    with pytest.raises(ValueError, match=RULE):
        sim.fit_stitchers([x[:3]], [y[:3]], family=family)
    with pytest.raises(ValueError, match=RULE):  # the grid refuses the same cell on request ...
        sim.compare_grid([x], [y], measures=[f"stitch/{family}"], on_undefined="raise")
    with pytest.warns(sim.UndefinedCellWarning, match=RULE):  # ... and by default keeps it as NaN
        grid = sim.compare_grid([x], [y], measures=[f"stitch/{family}"])
    name = f"stitch/{family}"
    assert np.isnan(np.asarray(grid.tables[name])[0, 0])
    assert re.search(RULE, grid.undefined[name][(0, 0)])
    ok = sim.reconstruction_score(rng.normal(size=(10, 3)), rng.normal(size=(10, 3)), family=family)
    assert np.isfinite(float(ok.held_out))  # 5 train rows > 3 features
    if family == "affine":  # the one family with a regulariser: ridge lifts the rule
        assert np.isfinite(float(sim.reconstruction_score(x, y, family=family, ridge=1e-3).held_out))
    else:  # ridge does not enter an orthogonal fit, so it cannot lift the rule
        with pytest.raises(ValueError, match=RULE):
            sim.reconstruction_score(x, y, family=family, ridge=1e-3)
