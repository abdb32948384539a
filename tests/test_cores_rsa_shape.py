"""The compiled cores of RSA, the shape metrics, NBS/Procrustes and regression on zero-padded layers.

The contract (similarity.protocol): ``pair(layer(pad(x), dx), layer(pad(y), dy))`` equals the
unpadded ``pair(layer(x), layer(y))`` to rounding, flags included, and ``reason`` reads from
those flags exactly the message the public function raises. The reference for the padded
programs is the unpadded core (``protocol.evaluate``, which the public functions run), itself
checked against SciPy / netrep transcriptions in tests/test_rsa.py, test_shape.py and
test_regression.py.

Programs are shared where the options are data (the RDM metric, alpha, the ridge), so the tests
loop over each program group's options inside one compiled program; shapes are kept to a few so
that the unpadded references compile a few times, not once per example.
"""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim.runtime.compile_count import CompileCounter
from funsim.similarity import list_measures, measure, protocol
from funsim.similarity.regression import regression_core
from funsim.similarity.rsa import COMPARISONS, KENDALL_MAX_ENTRIES, RDM_METRICS, rsa_core
from funsim.similarity.shape import nbs_core, procrustes_core, shape_core

N = 12
#: every measure this file covers: the registered names plus family members built on demand
NAMES = sorted(
    {n for n in list_measures() if n.startswith(("rsa/", "shape/", "regression/")) or n in ("nbs", "procrustes")}
    | {"shape/angular/alpha=0.3", "shape/euclidean/alpha=0.3", "regression/r2/ridge=0.01"}
)


def _groups() -> dict[tuple, list[str]]:
    """The names by compiled program: measures whose cores share ``layer`` and ``pair`` share every program."""
    out: dict[tuple, list[str]] = {}
    for name in NAMES:
        core = measure(name).core
        out.setdefault((core.layer, core.pair), []).append(name)
    return out


GROUPS = list(_groups().values())
GROUP_IDS = [g[0] for g in GROUPS]


# ----------------------------------------------------------------------------- helpers


def _pad(z: np.ndarray, width: int) -> np.ndarray:
    """``z`` with zero features up to ``width`` (on the host: no program per shape)."""
    out = np.zeros((z.shape[0], width), z.dtype)
    out[:, : z.shape[1]] = z
    return out


@functools.lru_cache(maxsize=None)
def _padded_program(layer, pair):
    def run(x, wx, y, wy, opts):
        return pair(layer(x, wx, opts), layer(y, wy, opts), opts)

    return jax.jit(run)


def _padded(core, x, y, wx: int, wy: int):
    """``(value, flags)`` of the core on ``x``, ``y`` zero-padded to ``wx``, ``wy`` features (real widths traced)."""
    with jax.default_matmul_precision("highest"):  # as the public functions trace (shares their programs)
        v, f = _padded_program(core.layer, core.pair)(
            _pad(x, wx), np.int32(x.shape[1]), _pad(y, wy), np.int32(y.shape[1]), protocol.opts_arrays(core, x.dtype)
        )
    return float(v), jax.device_get(f)


def _unpadded(core, x, y):
    """``(value, flags)`` of the unpadded program the public function runs."""
    with jax.default_matmul_precision("highest"):
        v, f = protocol.evaluate(core, x, y)
    return float(v), jax.device_get(f)


def _assert_flags_equal(a, b, where):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb, where
    for u, v in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=str(where))


def _reason(core, flags, x, y):
    return core.reason(flags, x.shape, y.shape, core.opts)


def _public(name, x, y):
    """``(value, None)`` of the public call, or ``(None, message)`` where it raises."""
    try:
        return float(measure(name)(x, y)), None
    except ValueError as e:
        return None, str(e)


def _data(rng, dx: int, dy: int, dtype=np.float64):
    """An anisotropic, offset ``x (N, dx)`` and a noisy nonlinear function of it ``y (N, dy)``."""
    x = rng.normal(size=(N, dx)) * rng.uniform(0.5, 3.0, size=dx) + rng.normal(size=dx)
    y = np.tanh(x @ rng.normal(size=(dx, dy)) / np.sqrt(dx)) + 0.3 * rng.normal(size=(N, dy)) + 1.0
    return x.astype(dtype), y.astype(dtype)


# ----------------------------------------------------------------------------- programs shared


def test_the_groups_share_programs():
    """One program group per static option: the RDM metric, alpha (when whitening) and the ridge are data."""
    assert len(GROUPS) == len(COMPARISONS) + 4 + 2 + 1  # rsa per compare; shape by (whiten, distance); nbs,
    # procrustes; regression
    for compare in COMPARISONS:
        cores = [rsa_core(rdm_metric=m, compare=compare) for m in RDM_METRICS]
        assert all(c.layer is cores[0].layer and c.pair is cores[0].pair and c.reason is cores[0].reason
                   for c in cores)
    for distance in ("angular", "euclidean"):
        a, b = shape_core(alpha=0.0, distance=distance), shape_core(alpha=0.7, distance=distance)
        assert (a.layer, a.pair, a.reason) == (b.layer, b.pair, b.reason) and a.opts != b.opts
        assert shape_core(alpha=1.0, distance=distance).pair is not a.pair  # no whitening: its own program
    # NBS, Procrustes and the unwhitened shape metrics share the per-layer work
    assert nbs_core().layer is procrustes_core().layer is shape_core(alpha=1.0).layer
    assert regression_core(ridge=1.0).pair is regression_core().pair
    for name in NAMES:
        assert measure(name).core is not None, name


def test_moment_measures_reason_from_side_flags_alone():
    """NBS, Procrustes and the alpha = 1 shape metrics are also moment measures: the grid gives their
    ``reason`` only each side's flags ("x", "y"), which is all they read."""
    ok = {"finite": True, "varies": True, "max_abs": 1.0}
    dead = {"finite": True, "varies": False, "max_abs": 0.0}
    for name in ("nbs", "procrustes", "shape/angular/alpha=1", "shape/euclidean/alpha=1"):
        m = measure(name)
        assert m.moments is not None, name
        assert m.core.reason({"x": ok, "y": ok}, (N, 5), (N, 3), m.core.opts) is None, name
        msg = m.core.reason({"x": ok, "y": dead}, (N, 5), (N, 3), m.core.opts)
        assert msg.startswith("y of shape (12, 3) is constant across samples"), (name, msg)


# ----------------------------------------------------------------------------- padded == unpadded

# (real width, padded width) of x and of y; d1 != d2, x the narrower side and the wider one. Not 2
# features: their correlation distances are all 0 or 2 (exact ties in exact arithmetic, so their
# ranks would be decided by rounding, which differs between any two summation orders)
SHAPES = [((5, 8), (3, 6)), ((3, 7), (6, 9))]


def _check_padded(names, x, y, wx, wy, tol):
    for name in names:
        core = measure(name).core
        want, fw = _unpadded(core, x, y)
        got, fg = _padded(core, x, y, wx, wy)
        assert np.isfinite(want), name
        assert got == pytest.approx(want, rel=tol, abs=tol), (name, x.shape, y.shape, wx, wy)
        _assert_flags_equal(fg, fw, (name, wx, wy))
        assert _reason(core, fg, x, y) is None, name


@pytest.mark.parametrize("names", GROUPS, ids=GROUP_IDS)
@settings(max_examples=4)
@given(seed=st.integers(0, 2**32 - 1), shapes=st.sampled_from(SHAPES))
def test_padded_equals_unpadded_float64(names, seed, shapes):
    (dx, wx), (dy, wy) = shapes
    x, y = _data(np.random.default_rng(seed), dx, dy)
    _check_padded(names, x, y, wx, wy, 1e-10)


@pytest.mark.parametrize("names", GROUPS, ids=GROUP_IDS)
def test_padded_equals_unpadded_float32(names):
    (dx, wx), (dy, wy) = SHAPES[0]
    for seed in (0, 1):
        x, y = _data(np.random.default_rng(seed), dx, dy, np.float32)
        _check_padded(names, x, y, wx, wy, 1e-5)


# ----------------------------------------------------------------------------- degenerate layers


def _degenerate(rng) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{case: (x (N, 5), y (N, 3))}``, the degenerate side first or second."""
    x, y = _data(rng, 5, 3)
    cases = {"random": (x, y)}
    for side, z in (("x", x), ("y", y)):
        d = z.shape[1]
        bad = {}
        b = z.copy()
        b[:, 1] = 0.0
        bad["dead unit"] = b
        b = z.copy()
        b[:, d - 1] = 2.0 * b[:, 0]
        bad["collinear"] = b
        bad["constant"] = np.tile(z[:1], (N, 1))
        b = z.copy()
        b[4] = 1.5
        bad["constant row"] = b
        b = z.copy()
        b[6] = 0.0
        bad["zero row"] = b
        b = z.copy()
        b[2] = b[7]
        bad["duplicated sample"] = b
        b = z.copy()
        b[3, 0] = np.nan
        bad["nan"] = b
        for case, b in bad.items():
            cases[f"{case} ({side})"] = (b, y) if side == "x" else (x, b)
    cases["ties (x)"] = (np.eye(N)[:, :5] + np.eye(N)[:, 5:10], y)  # duplicated unit rows and zero rows
    return cases


DEGENERATE = _degenerate(np.random.default_rng(7))


@pytest.mark.parametrize("names", GROUPS, ids=GROUP_IDS)
def test_degenerate_layers_flags_and_reasons(names):
    """Flags and reasons of the padded program equal the unpadded ones, and the reason is the public
    function's message (NaN/Inf input: the non-finite flag; protocol.call counts it on the host)."""
    for name in names:
        core = measure(name).core
        for case, (x, y) in DEGENERATE.items():
            want, fw = _unpadded(core, x, y)
            got, fg = _padded(core, x, y, 8, 6)
            _assert_flags_equal(fg, fw, (name, case))
            value, message = _public(name, x, y)
            if case.startswith("nan"):
                assert not (fw["x"]["finite"] and fw["y"]["finite"]) and "NaN" in message, (name, case)
                assert np.isnan(got) and np.isnan(want), (name, case)
                continue
            reason = _reason(core, fw, x, y)
            assert reason == message, (name, case, reason, message)
            if reason is None:
                assert got == pytest.approx(want, rel=1e-10, abs=1e-10), (name, case)
                assert want == pytest.approx(value, rel=1e-12, abs=1e-12), (name, case)
            else:  # undefined: NaN, never a number, padded or not
                assert np.isnan(want) and np.isnan(got), (name, case)


@pytest.mark.parametrize("names", GROUPS, ids=GROUP_IDS)
def test_more_features_than_samples(names):
    """``d >= n``: the whitened metrics refuse it from the shapes alone (``reason(None)``); the others
    (the regression's rank tolerance counts the real d) give the unpadded value when padded."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(N, 14)), _data(rng, 5, 3)[1]
    for name in names:
        core = measure(name).core
        shape_only = core.reason(None, x.shape, y.shape, core.opts)
        value, message = _public(name, x, y)
        want, fw = _unpadded(core, x, y)
        got, fg = _padded(core, x, y, 16, 6)
        _assert_flags_equal(fg, fw, name)
        if "alpha=" in name and not name.endswith("alpha=1"):
            assert shape_only == message and "d < n" in message, name
            assert np.isnan(got) and np.isnan(want), name  # the rank flag says so too
            assert not fg["rank_x"], name
            continue
        assert shape_only is None and message is None, (name, message)
        assert _reason(core, fw, x, y) is None, name
        assert got == pytest.approx(want, rel=1e-10, abs=1e-10) and want == pytest.approx(value, rel=1e-12), name


def test_shape_only_reasons_match_the_public_messages():
    """What the shapes decide is refused before any program runs, with the public function's message."""
    rng = np.random.default_rng(4)
    cases = [
        ("rsa/correlation/pearson", rng.normal(size=(N, 1)), rng.normal(size=(N, 3))),
        ("rsa/correlation/kendall", rng.normal(size=(N, 4)), rng.normal(size=(N, 1))),
        ("rsa/euclidean/kendall", rng.normal(size=(700, 2)), rng.normal(size=(700, 2))),
        ("rsa/cosine/spearman", rng.normal(size=(2, 4)), rng.normal(size=(2, 3))),
        ("shape/angular/alpha=0.5", rng.normal(size=(N, 3)), rng.normal(size=(N, N))),
        ("shape/euclidean/alpha=1", rng.normal(size=(1, 3)), rng.normal(size=(1, 2))),
        ("nbs", rng.normal(size=(1, 3)), rng.normal(size=(1, 2))),
        ("regression/r2/ridge=1", rng.normal(size=(1, 3)), rng.normal(size=(1, 2))),
    ]
    assert 700 * 699 // 2 > KENDALL_MAX_ENTRIES
    for name, x, y in cases:
        core = measure(name).core
        reason = core.reason(None, x.shape, y.shape, core.opts)
        with CompileCounter() as c:
            value, message = _public(name, x, y)
        assert reason is not None and reason == message, (name, reason, message)
        assert c.count == 0, name  # refused on the host


# ----------------------------------------------------------------------------- program counts


def _stack(rng, widths, big_w, dtype=np.float64):
    """``(L, N, big_w)``: layers of the given real widths, zero-padded (on the host)."""
    out = np.zeros((len(widths), N, big_w), dtype)
    layers = []
    for k, d in enumerate(widths):
        z = _data(rng, d, 1, dtype)[0]
        out[k, :, :d] = z
        layers.append(z)
    return out, np.asarray(widths, np.int32), layers


@pytest.mark.parametrize("name, other", [
    ("rsa/correlation/spearman", "rsa/euclidean/spearman"),
    ("rsa/sqeuclidean/cosine_cov", "rsa/cosine/cosine_cov"),
    ("shape/euclidean/alpha=0.5", "shape/euclidean/alpha=0.3"),
    ("procrustes", "procrustes"),
    ("regression/r2", "regression/r2/ridge=1"),
])
def test_a_padded_stack_of_widths_compiles_once(name, other):
    """A vmapped layer over a padded stack of layers of several real widths is one program, the
    all-pairs program another; new widths, new data and another option value compile nothing."""
    core, core2 = measure(name).core, measure(other).core
    assert (core2.layer, core2.pair) == (core.layer, core.pair)
    layer = jax.jit(jax.vmap(core.layer, in_axes=(0, 0, None)))
    pair = jax.jit(jax.vmap(jax.vmap(core.pair, in_axes=(None, 0, None)), in_axes=(0, None, None)))
    rng = np.random.default_rng(5)
    big_w = 9

    def grid(c, widths):
        stack, w, layers = _stack(rng, widths, big_w)
        with jax.default_matmul_precision("highest"):
            stats = layer(stack, w, protocol.opts_arrays(c, stack.dtype))
            values, flags = pair(stats, stats, protocol.opts_arrays(c, stack.dtype))
        return np.asarray(values), jax.device_get(flags), layers

    with CompileCounter() as first:
        values, flags, layers = grid(core, [5, 2, 3, 7])
    assert first.count == 2, first.names
    with CompileCounter() as again:
        values2, _, layers2 = grid(core2, [3, 9, 5, 1 if name.startswith("rsa/") else 4])
    assert again.count == 0, again.names
    # the stacked cells are the pairwise values (5 x 3 and 3 x 5 features)
    for (c, v, ls) in ((core, values, layers), (core2, values2, layers2)):
        i, j = (0, 2) if c is core else (2, 0)
        want, fw = _unpadded(c, ls[i], ls[j])
        assert v[i, j] == pytest.approx(want, rel=1e-10, abs=1e-10), (name, i, j)
    _assert_flags_equal(jax.tree.map(lambda a: a[0, 2], flags), _unpadded(core, layers[0], layers[2])[1], name)


# ----------------------------------------------------------------------------- the public functions


def test_ranked_comparisons_still_raise_under_grad():
    import jax.numpy as jnp

    x, y = _data(np.random.default_rng(6), 5, 3)
    for compare in ("spearman", "kendall"):
        with pytest.raises(ValueError, match="not differentiable"):
            jax.grad(lambda a: measure(f"rsa/euclidean/{compare}")(a, jnp.asarray(y)))(jnp.asarray(x))


def test_option_errors_name_the_option():
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        shape_core(alpha=1.5)
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        regression_core(ridge=-1.0)
    with pytest.raises(ValueError, match="Unknown compare 'pearsn'"):
        rsa_core(compare="pearsn")
