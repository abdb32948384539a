"""The CCA family's compiled cores (``cca_core``, ``svcca_core``, ``pwcca_core``) on zero-padded layers.

The contract of :mod:`similarity.protocol`: ``pair(layer(pad(x), dx), layer(pad(y), dy))`` gives
the value of the public function on the unpadded arrays (the independent reference here: the
public functions are themselves tested against float64 NumPy references in tests/test_cca.py)
and the same flags; ``reason`` gives exactly the public function's ``ValueError`` message; one
program serves a stack of layers of many real widths.
"""

from __future__ import annotations

import functools
import sys

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funsim.similarity.cca  # noqa: F401  (the module; `similarity.cca` is the function)
from funsim import similarity
from funsim.runtime.compile_count import CompileCounter
from funsim.similarity import protocol

C = sys.modules["funsim.similarity.cca"]

# name: (core, the public function it must reproduce)
CORES = {
    "cca/r2": (C.cca_core(reduce="r2"), similarity.cca_r2),
    "cca/mean": (C.cca_core(reduce="mean"), similarity.cca_mean),
    "svcca": (C.svcca_core(), similarity.svcca),
    "svcca/keep=0.5": (C.svcca_core(keep_variance=0.5), functools.partial(similarity.svcca, keep_variance=0.5)),
    "pwcca": (C.pwcca_core(), similarity.pwcca),
    "pwcca/epsilon=1e-10": (C.pwcca_core(epsilon=1e-10), functools.partial(similarity.pwcca, epsilon=1e-10)),
    "pwcca/epsilon=1e-3": (C.pwcca_core(epsilon=1e-3), functools.partial(similarity.pwcca, epsilon=1e-3)),
}
TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def _pad(z: np.ndarray, width: int) -> np.ndarray:
    """``z`` with zero columns up to ``width`` (on the host)."""
    out = np.zeros((z.shape[0], width), z.dtype)
    out[:, : z.shape[1]] = z
    return out


def _padded(core, x, y, wx: int, wy: int):
    """``jit(pair)(jit(layer)(pad(x), dx), jit(layer)(pad(y), dy))``: ``(value, flags)`` fetched."""
    opts = protocol.opts_arrays(core, x.dtype)
    layer = jax.jit(core.layer)
    sx = layer(_pad(x, wx), np.int32(x.shape[1]), opts)
    sy = layer(_pad(y, wy), np.int32(y.shape[1]), opts)
    return jax.device_get(jax.jit(core.pair)(sx, sy, opts))


def _pair_data(rng, n: int, dx: int, dy: int, dtype=np.float64):
    """An offset, anisotropic ``x`` and a noisy nonlinear map of it (distinct canonical correlations)."""
    x = rng.normal(size=(n, dx)) * np.geomspace(4.0, 0.5, dx) + rng.normal(size=dx)
    y = np.tanh(x @ rng.normal(size=(dx, dy)) / 2) + 0.3 * rng.normal(size=(n, dy)) + 1.0
    return x.astype(dtype), y.astype(dtype)


def _assert_same_flags(got, want, rtol):
    """Two flag trees: the same keys, bools and counts equal, floats (``max_abs``) to rounding."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=rtol)
        else:
            assert g == w, (got, want)


def _message(f, x, y) -> str | None:
    try:
        f(x, y)
    except ValueError as e:
        return str(e)
    return None


# ------------------------------------------------------------------------- padded == unpadded

# One n and a few shapes and padded widths for every test here, so that they share compiled
# programs; dx + dy < n - 1 (PWCCA's weights are only defined with distinct canonical correlations).
N = 16
SHAPES = [(3, 5), (5, 3), (1, 9)]
WIDTHS = [12, 24]  # one below n, one above


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), shape=st.sampled_from(SHAPES), width=st.sampled_from(WIDTHS))
def test_padded_layers_give_the_public_value(seed, shape, width):
    """Both sides padded to one width (the grid's case)."""
    x, y = _pair_data(np.random.default_rng(seed), N, *shape)
    for name, (core, f) in CORES.items():
        value, flags = _padded(core, x, y, width, width)
        assert float(value) == pytest.approx(float(f(x, y)), rel=1e-10, abs=1e-12), name
        _assert_same_flags(flags, jax.device_get(protocol.evaluate(core, x, y)[1]), 1e-12)
        assert core.reason(flags, x.shape, y.shape, core.opts) is None


@pytest.mark.parametrize("dtype, dx, dy, wx, wy", [(np.float64, 5, 3, 24, 12), (np.float32, 3, 5, 3, 12)])
def test_padded_layers_of_different_widths(dtype, dx, dy, wx, wy):
    """Each side padded to its own width (one of them not padded); float32 too."""
    x, y = _pair_data(np.random.default_rng(dx), N, dx, dy, dtype)
    for name, (core, f) in CORES.items():
        value, flags = _padded(core, x, y, wx, wy)
        want = f(x, y)
        assert value.dtype == want.dtype == dtype
        assert float(value) == pytest.approx(float(want), rel=TOL[np.dtype(dtype)], abs=1e-12), name
        assert core.reason(flags, x.shape, y.shape, core.opts) is None


def test_all_canonical_correlations_then_zeros():
    """``cca_core(reduce="all")``: the ``min(dx, dy)`` correlations of :func:`cca`, then zeros for the padding."""
    x, y = _pair_data(np.random.default_rng(3), N, 3, 5)
    value, _ = _padded(C.cca_core(reduce="all"), x, y, 12, 24)
    assert value.shape == (12,)
    np.testing.assert_allclose(value[:3], similarity.cca(x, y), rtol=1e-10)
    assert np.all(value[3:] == 0.0)


# ------------------------------------------------------------------------- degenerate layers

_RNG = np.random.default_rng(7)
_X = _RNG.normal(size=(N, 4)) * [3.0, 1.0, 0.5, 2.0] + 1.0
_Y = np.tanh(_X[:, :3]) + 0.3 * _RNG.normal(size=(N, 3))
_Y4 = np.c_[_Y, _RNG.normal(size=N)]
DEGENERATE = {  # (x, y), of the shapes above where possible
    "dead unit": (np.c_[_X[:, :2], np.full(N, 2.5), _X[:, 2:]], _Y),
    "collinear features": (_X[:, :3], np.c_[_Y4, _Y4[:, 0] - 2.0 * _Y4[:, 2]]),
    "constant layer": (_X[:, :3], np.full((N, 5), -1.5)),
    "nearly constant layer": (1.0 + 1e-14 * _RNG.normal(size=(N, 1)), _RNG.normal(size=(N, 9))),
    "d >= n": (_RNG.normal(size=(N, N)), _Y),
    "d >= n, y": (_X[:, :3], _RNG.normal(size=(N, N + 3))),
}


@pytest.mark.parametrize("case", list(DEGENERATE))
@pytest.mark.parametrize("name", list(CORES))
def test_degenerate_layers_give_the_public_message(case, name):
    core, f = CORES[name]
    x, y = DEGENERATE[case]
    want = _message(f, x, y)
    if case.startswith("d >= n") and not name.startswith("pwcca/epsilon"):
        assert want is not None and "CCA needs more samples than features" in want
        assert core.reason(None, x.shape, y.shape, core.opts) == want  # decided by the shapes alone
        return
    assert core.reason(None, x.shape, y.shape, core.opts) is None
    if case != "dead unit" and case != "collinear features":
        assert want is not None  # refused by every member of the family
    value_u, flags_u = jax.device_get(protocol.evaluate(core, x, y))
    assert core.reason(flags_u, x.shape, y.shape, core.opts) == want
    for width in WIDTHS:
        if width < max(x.shape[1], y.shape[1]):
            continue
        value_p, flags_p = _padded(core, x, y, width, width)
        _assert_same_flags(flags_p, flags_u, 1e-12)
        assert core.reason(flags_p, x.shape, y.shape, core.opts) == want
        if want is None:
            assert float(value_p) == pytest.approx(float(f(x, y)), rel=1e-10)
        else:
            assert np.isnan(value_p) and np.isnan(value_u)


def test_degenerate_messages_are_the_documented_ones():
    """Which member refuses which layer (the messages themselves are compared with the cores above)."""
    x, y = DEGENERATE["dead unit"]
    for f in (similarity.cca_r2, similarity.cca_mean, similarity.pwcca):
        with pytest.raises(ValueError, match=r"x of shape \(16, 5\) has centred rank 4 < 5 features"):
            f(x, y)
    assert 0.0 < float(similarity.svcca(x, y)) < 1.0
    assert 0.0 < float(similarity.pwcca(x, y, epsilon=1e-10)) < 1.0  # the dead unit is dropped
    with pytest.raises(ValueError, match=r"y of shape \(16, 5\) has centred rank 4 < 5 features"):
        similarity.cca_r2(*DEGENERATE["collinear features"])
    with pytest.raises(ValueError, match=r"y of shape \(16, 5\) is constant across samples .* so SVCCA"):
        similarity.svcca(*DEGENERATE["constant layer"])
    with pytest.raises(ValueError, match=r"y of shape \(16, 5\) has centred rank 0 < 5 features"):
        similarity.cca_r2(*DEGENERATE["constant layer"])
    # a side that varies only below CONSTANT_RTOL is constant for CCA too (it used to be a silent NaN)
    with pytest.raises(ValueError, match=r"x of shape \(16, 1\) is constant across samples .* so CCA"):
        similarity.cca_mean(*DEGENERATE["nearly constant layer"])
    with pytest.raises(ValueError, match=r"x \(its 16 kept neurons\) has shape \(16, 16\): CCA needs more samples"):
        similarity.pwcca(*DEGENERATE["d >= n"], epsilon=1e-10)


# ------------------------------------------------------------------------- compiled programs


@pytest.mark.parametrize("name", ["cca/r2", "svcca", "pwcca"])
def test_one_program_for_a_stack_of_widths_and_one_for_all_pairs(name):
    """``jit(vmap(layer))`` over layers of real widths 1, 3, 5, 9 padded to 10 compiles once (and a second
    stack with other widths and another option value, nothing); ``jit(pair)`` once for all pairs."""
    core, f = CORES[name]
    rng = np.random.default_rng(11)
    widths = [1, 3, 5, 9]
    reps = [_pair_data(rng, N, d, 1)[0] for d in widths]
    stack = np.stack([_pad(z, 10) for z in reps])
    layer = jax.jit(jax.vmap(core.layer, in_axes=(0, 0, None)))
    pair = jax.jit(lambda sx, sy, opts: core.pair(sx, sy, opts))  # a fresh program (no other test's)
    opts = protocol.opts_arrays(core, np.float64)
    with CompileCounter() as c:
        stats = jax.device_get(layer(stack, np.asarray(widths, np.int32), opts))
    assert c.count == 1, c.names
    other = {"cca/r2": C.cca_core(reduce="mean"), "svcca": C.svcca_core(keep_variance=0.6),
             "pwcca": C.pwcca_core(epsilon=1e-3)}[name]
    assert other.layer is core.layer  # the options are data: the same programs
    with CompileCounter() as c:
        jax.block_until_ready(layer(stack[::-1], np.asarray(widths[::-1], np.int32),
                                    protocol.opts_arrays(other, np.float64)))
    assert c.count == 0, c.names
    pairs = [(i, j) for i in range(len(widths)) for j in range(len(widths))]
    with CompileCounter() as c:
        values = {ij: float(pair(*(jax.tree.map(lambda a: a[k], stats) for k in ij), opts)[0])  # host slices
                  for ij in pairs}
    assert c.count == 1, c.names
    for i, j in ((1, 2), (2, 1), (0, 3)):  # the shapes of SHAPES (their programs are shared)
        assert values[i, j] == pytest.approx(float(f(reps[i], reps[j])), rel=1e-10, abs=1e-12), (i, j)


def test_cores_share_their_functions():
    """The same function objects for the same static options (one program each), options in ``opts``."""
    assert C.cca_core(reduce="r2").pair is C.cca_core(reduce="r2").pair
    assert C.cca_core(reduce="r2").layer is C.cca_core(reduce="mean").layer
    assert C.cca_core(reduce="r2").pair is not C.cca_core(reduce="mean").pair
    assert C.svcca_core(keep_variance=0.5)[:3] == C.svcca_core()[:3]
    assert C.svcca_core(keep_variance=0.5).opts == (0.5,)
    assert C.pwcca_core(epsilon=1e-3)[:3] == C.pwcca_core()[:3]
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\)"):
        C.pwcca_core(epsilon=1.0)
    with pytest.raises(ValueError, match=r"keep_variance must be in \(0, 1\]"):
        C.svcca_core(keep_variance=0.0)
    with pytest.raises(ValueError, match=r"Unknown reduce 'sum'"):
        C.cca_core(reduce="sum")


def test_registered_cores():
    """The registry's entries carry the cores, and the core reproduces the registered function."""
    x, y = _pair_data(np.random.default_rng(5), N, 3, 5)
    for name, opts in (("cca/r2", ()), ("cca/mean", ()), ("svcca", (0.99,)), ("pwcca", (0.0,)),
                       ("pwcca/epsilon=1e-10", (1e-10,))):
        m = similarity.measure(name)
        assert m.core is not None and m.core.opts == opts, name
        assert float(protocol.call(m.core, x, y)) == pytest.approx(float(m(x, y)), rel=1e-12), name
    assert similarity.measure("pwcca/epsilon=1e-10").core.layer is similarity.measure("pwcca").core.layer


def test_layer_stats_still_reproduce_the_measures():
    """The public per-layer statistics (now the cores on unpadded layers)."""
    x, y = _pair_data(np.random.default_rng(6), N, 5, 3)
    for stats, f in ((C.cca_layer_stats(reduce="r2"), similarity.cca_r2),
                     (C.cca_layer_stats(reduce="mean"), similarity.cca_mean),
                     (C.svcca_layer_stats(keep_variance=0.5), functools.partial(similarity.svcca, keep_variance=0.5)),
                     (C.pwcca_layer_stats(epsilon=1e-3), functools.partial(similarity.pwcca, epsilon=1e-3))):
        got = jax.jit(stats.pair)(jax.jit(stats.layer)(x), jax.jit(stats.layer)(y))
        assert float(got) == pytest.approx(float(f(x, y)), rel=1e-10)
