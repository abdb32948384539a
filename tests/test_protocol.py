"""The measure protocol, for every registered measure (similarity/protocol.py).

* Every registered measure has a compiled core; its public function equals the core's value,
  and the core's ``reason`` is the public function's message where it raises.
* Zero padding is free: ``pair(layer(pad(x), dx), layer(pad(y), dy))`` equals the unpadded value and
  flags (what lets ``compare_grid`` run every width in one program).
* Measures of one family that differ only in a numerical option share the core's functions (one
  compiled program) and carry the option as data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim import similarity as sim
from funsim.similarity import protocol

NAMES = sim.list_measures()


def _representatives() -> list[str]:
    """One registered name per distinct pair of core functions (the others differ only in an option)."""
    seen, out = set(), []
    for n in NAMES:
        core = sim.measure(n).core
        key = (core.layer, core.pair) if core is not None else n
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


REPS = _representatives()
# the full registry in the slow run
ALL = [pytest.param(n, marks=pytest.mark.slow) if n not in REPS else n for n in NAMES]
W = 32  # every padded layer: one compiled layer and pair program per core


def _pad(x, width):
    out = np.zeros((x.shape[0], width), x.dtype)
    out[:, : x.shape[1]] = x
    return out


def _padded(core, x, y, wx, wy):
    opts = protocol.opts_arrays(core, x.dtype)
    layer = jax.jit(core.layer)
    sx = layer(_pad(x, wx), jnp.int32(x.shape[1]), opts)
    sy = layer(_pad(y, wy), jnp.int32(y.shape[1]), opts)
    return jax.jit(core.pair)(sx, sy, opts)


def _pair(seed, n=40, d1=4, d2=3):
    r = np.random.default_rng(seed)
    x = r.normal(size=(n, d1)) + 0.3
    y = np.tanh(x @ r.normal(size=(d1, d2))) + 0.3 * r.normal(size=(n, d2))
    return x, y


def test_every_registered_measure_has_a_core():
    missing = [n for n in NAMES if sim.measure(n).core is None]
    assert not missing, missing
    for n in NAMES:
        assert isinstance(sim.measure(n).core, sim.Core), n


@pytest.mark.parametrize("name", ALL)
def test_public_function_is_the_core(name):
    m = sim.measure(name)
    x, y = _pair(0)
    value, flags = protocol.evaluate(m.core, jnp.asarray(x), jnp.asarray(y))
    assert np.isfinite(float(value)), name
    np.testing.assert_allclose(float(value), float(m(x, y)), rtol=1e-10, atol=1e-12, err_msg=name)
    assert bool(flags["x"]["finite"]) and bool(flags["y"]["varies"]), name


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=3)  # each example of new widths compiles its own programs, for every measure
@given(data=st.data())
def test_zero_padding_changes_nothing(name, data):
    m = sim.measure(name)
    seed = data.draw(st.integers(0, 2**16), label="seed")
    d1, d2 = data.draw(st.sampled_from([1, 3, 5]), label="d1"), data.draw(st.sampled_from([3, 5]), label="d2")
    x, y = _pair(seed, d1=d1, d2=d2)
    value, flags = _padded(m.core, x, y, W, W)
    want, want_flags = protocol.evaluate(m.core, jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(float(value), float(want), rtol=1e-9, atol=1e-11, err_msg=name)
    got_f, want_f = jax.device_get(flags), jax.device_get(want_flags)
    assert m.core.reason(got_f, x.shape, y.shape, m.core.opts) == m.core.reason(want_f, x.shape, y.shape,
                                                                                  m.core.opts), name


def _degenerate():
    r = np.random.default_rng(5)
    n = 24
    base = r.normal(size=(n, 3))
    relu = np.maximum(base @ r.normal(size=(3, 4)) + 0.5, 0.0)
    relu[:, 2] = 0.0  # a dead unit
    flat = r.normal(size=(n, 4))
    flat[7] = 0.25  # one sample constant across features
    collinear = np.concatenate([base, base[:, :1] - 2.0 * base[:, 1:2]], axis=1)
    return {"dead_unit": relu, "constant": np.full((n, 4), 0.5), "flat_row": flat, "collinear": collinear,
            "wide": r.normal(size=(n, 30)), "good": base @ r.normal(size=(3, 4)) + 0.3 * r.normal(size=(n, 4))}


_LAYERS = _degenerate()


@pytest.mark.parametrize("name", ALL)
def test_reasons_are_the_pairwise_messages_on_padded_layers(name):
    """On degenerate layers, padded to a wider width, the core's flags give the pairwise call's message
    (or no message where it returns a value, and then the same value)."""
    m = sim.measure(name)
    good = _LAYERS["good"]
    for kind, z in _LAYERS.items():
        if kind == "good":  # a distance of zero: arccos and sqrt amplify rounding there
            continue
        for x, y in ((z, good),) if m.symmetric else ((z, good), (good, z)):
            try:
                want, msg = float(m(x, y)), None
            except ValueError as e:
                want, msg = None, str(e)
            static = m.core.reason(None, x.shape, y.shape, m.core.opts)
            value, flags = _padded(m.core, x, y, W, W)
            got = static or m.core.reason(jax.device_get(flags), x.shape, y.shape, m.core.opts)
            assert got == msg, (name, kind, got, msg)
            if msg is None:
                np.testing.assert_allclose(float(value), want, rtol=1e-8, atol=1e-10, err_msg=f"{name} {kind}")
            elif static is None:
                assert np.isnan(float(value)), (name, kind)


def test_a_family_shares_its_core_and_traces_its_option():
    for a, b in (("shape/angular/alpha=0.3", "shape/angular/alpha=0.7"), ("pwcca", "pwcca/epsilon=1e-10"),
                 ("regression/r2", "regression/r2/ridge=1"), ("stitch/affine", "stitch/affine/ridge=0.001")):
        ca, cb = sim.measure(a).core, sim.measure(b).core
        assert ca.layer is cb.layer and ca.pair is cb.pair, (a, b)
        assert ca.opts != cb.opts, (a, b)
