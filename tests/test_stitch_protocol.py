"""The stitching measures on the measure protocol, the held-out ambiguity flag, and ``fit_stitchers``'
programs.

* :func:`stitch_core` on zero-padded layers equals the unpadded core (values and flags), and the
  core equals :func:`reconstruction_score` and a float64 NumPy reference;
* its ``reason`` gives the pairwise calls' messages on degenerate layers, from the core's flags and
  from the grid's (``stitch_moment_stats``' finish plus the row counts and layer flags);
* the held-out orthogonal scores where the fit is not unique: undefined exactly where a float64
  NumPy reference over random null-space completions spreads, and equal to that reference's (single)
  value where it does not; the threshold is tested on both sides in float64 and float32;
* ``fit_stitchers`` compiles one program for a call of mixed widths and families, none for a second call
  whose sizes fall in the same buckets, and each result equals the unpadded ``fit_stitcher``.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

import funsim.similarity as sim
from funsim.runtime.compile_count import CompileCounter, compiles
from funsim.similarity import protocol
from funsim.similarity import stitching as S
from funsim.similarity._stitch_core import default_weights
from funsim.similarity.moments import MomentPair, split_weights
from tests.test_stitching import held_out_ref

FAMS = S.FAMILIES
ORTHO = ("orthogonal", "scaled_orthogonal")
N = 40


def _train_rows(n: int) -> np.ndarray:
    """The default split's train rows, as a bool mask (``split_weights``, outside any core)."""
    return np.asarray(split_weights(n, 0.5, None, np.float64)[0]) > 0


def _split(n: int):
    tr = _train_rows(n)
    return np.flatnonzero(tr), np.flatnonzero(~tr)


def _pad(z, width):
    out = np.zeros((z.shape[0], width), z.dtype)
    out[:, : z.shape[1]] = z
    return out


@functools.lru_cache(maxsize=None)
def _padded_program(family: str, which: str):
    """The core on zero-padded layers, the real widths traced (as the grid runs it)."""
    core = S.stitch_core(family, which=which)

    @jax.jit
    def run(xp, dx, yp, dy, opts):
        return core.pair(core.layer(xp, dx, opts), core.layer(yp, dy, opts), opts)

    return run


def _core_padded(family, which, x, y, width=8):
    core = S.stitch_core(family, which=which)
    out = _padded_program(family, which)(_pad(x, width), np.int32(x.shape[1]), _pad(y, width),
                                         np.int32(y.shape[1]), protocol.opts_arrays(core, x.dtype))
    return jax.device_get(out)


def _core(family, which, x, y, ridge=0.0):
    return jax.device_get(protocol.evaluate(S.stitch_core(family, ridge=ridge, which=which), x, y))


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def _assert_flags_equal(a: dict, b: dict, err=""):
    assert set(a) == set(b), (set(a), set(b))
    for k in a:
        if isinstance(a[k], dict):
            _assert_flags_equal(a[k], b[k], f"{err}{k}.")
        elif k == "ambiguity":
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-13, err_msg=err + k)
        else:
            assert a[k] == b[k], (err + k, a[k], b[k])


# ------------------------------------------------------------------ the default split inside the program


@pytest.mark.parametrize("n", [4, 7, 40, 101])
def test_default_split_drawn_in_the_program_is_split_weights(n):
    w_tr, w_te = jax.jit(default_weights, static_argnums=(0, 1))(n, np.float64)
    ref_tr, ref_te = split_weights(n, 0.5, None, np.float64)
    np.testing.assert_array_equal(w_tr, ref_tr)
    np.testing.assert_array_equal(w_te, ref_te)


# ------------------------------------------------------------------ padded == unpadded, == pairwise


def _degenerate(kind: str, r, x, y):
    """Degeneracies that keep every score defined: a dead unit, a duplicated column, duplicated rows."""
    x, y = x.copy(), y.copy()
    if kind == "dead":
        x[:, 0] = 0.25
    elif kind == "dup_col":
        x[:, -1] = x[:, 0]
    elif kind == "dup_rows":  # a held-out row repeats a train row on both sides
        tr, te = _split(x.shape[0])
        x[te[:3]], y[te[:3]] = x[tr[:3]], y[tr[:3]]
    return x, y


@given(
    shape=st.sampled_from([(3, 5), (5, 3)]),
    family=st.sampled_from(FAMS),
    kind=st.sampled_from(["plain", "dead", "dup_col", "dup_rows"]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 1e4]),
)
def test_core_on_padded_layers_equals_unpadded(shape, family, kind, seed, scale):
    r = np.random.default_rng(seed)
    d1, d2 = shape
    x = scale * r.normal(size=(N, d1)) + r.normal(size=d1)
    y = np.tanh(x @ r.normal(size=(d1, d2)) / scale) + 0.2 * r.normal(size=(N, d2))
    x, y = _degenerate(kind, r, x, y)
    if kind in ("dead", "dup_col") and family == "affine":
        family = "scaled_orthogonal"  # a dead or collinear column makes the plain affine fit singular
    value, flags = _core(family, "held_out", x, y)
    pvalue, pflags = _core_padded(family, "held_out", x, y)
    np.testing.assert_allclose(pvalue, value, rtol=1e-9, atol=1e-11)
    _assert_flags_equal(pflags, flags)
    assert bool(flags["determined"]) and bool(flags["result"])
    assert int(flags["shared"]) == (3 if kind == "dup_rows" else 0)
    assert int(flags["n_rows"]) == N and int(flags["n_test"]) == N - int(round(N / 2))
    ref = S.reconstruction_score(x, y, family=family) if kind != "dup_rows" else None
    if ref is not None:
        np.testing.assert_allclose(value, ref.held_out, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("family", FAMS)
@pytest.mark.parametrize("d1,d2", [(3, 5), (4, 4), (6, 2)])
def test_core_equals_float64_reference_both_scores(rng, family, d1, d2):
    x = rng.normal(size=(N, d1)) @ rng.normal(size=(d1, d1)) + 2.0
    y = np.tanh(x @ rng.normal(size=(d1, d2)) / 3) + 0.3 * rng.normal(size=(N, d2))
    tr, te = _split(N)
    ho, ins = held_out_ref(x, y, tr, te, family)
    for which, ref in (("held_out", ho), ("in_sample", ins)):
        value, _ = _core(family, which, x, y)
        np.testing.assert_allclose(value, ref, atol=1e-10, err_msg=which)
        name = f"stitch/{family}" + ("/in_sample" if which == "in_sample" else "")
        np.testing.assert_allclose(sim.measure(name)(x, y), ref, atol=1e-10, err_msg=name)
        pvalue, _ = _core_padded(family, which, x, y)
        np.testing.assert_allclose(pvalue, ref, atol=1e-10, err_msg=f"{which} padded")


def test_ridge_is_traced_and_shared_between_measures():
    """stitch/affine and stitch/affine/ridge=r run one program: the ridge is an option (data)."""
    r = np.random.default_rng(3)
    x, y = r.normal(size=(N, 4)), r.normal(size=(N, 3))
    sim.measure("stitch/affine")(x, y)
    n, got = compiles(sim.measure("stitch/affine/ridge=0.25"), x, y)
    assert n == 0
    np.testing.assert_allclose(got, S.reconstruction_score(x, y, ridge=0.25).held_out, atol=1e-12)


# ------------------------------------------------------------------ reasons: the pairwise messages


def _grid_flags(family: str, ridge: float, which: str, x, y, width=8):
    """What the grid hands ``core.reason``: the finish's flags on zero-padded moments, plus each
    side's ``finite``/``varies`` (on the train rows) and the row counts."""
    w_tr, w_te = split_weights(x.shape[0], 0.5, None, x.dtype)
    xp, yp = jnp.asarray(_pad(x, width)), jnp.asarray(_pad(y, width))
    mx, my = S.layer_moments(xp, w_tr, w_te), S.layer_moments(yp, w_tr, w_te)
    pm = S.pair_moments(xp, yp, mx, my, w_tr, w_te)
    spec = S.stitch_moment_stats(family, ridge=ridge, which=which)
    ex = {}
    if spec.layer is not None:  # the grid's hook sees a unit diagonal on the padded coordinates
        unit = lambda m, d: m._replace(gram_train=m.gram_train + jnp.diag((jnp.arange(width) >= d) * 1.0))  # noqa: E731
        ex = {spec.layer: (spec.layer(unit(mx, x.shape[1])), spec.layer(unit(my, y.shape[1])))}
    value, flags = spec.finish(MomentPair(mx, my, pm, pm.cross_train, extras=ex))
    tr = np.asarray(w_tr) > 0
    side = lambda z: {"finite": bool(np.all(np.isfinite(z))),  # noqa: E731
                      "varies": bool(np.ptp(z[tr], axis=0).max() > 1e-12 * np.abs(z[tr]).max())}
    flags = dict(jax.device_get(flags), x=side(x), y=side(y), n_rows=x.shape[0], n_test=int((~tr).sum()))
    return float(value), flags


def _degenerate_cases():
    r = np.random.default_rng(21)
    tr = _train_rows(N)
    x, y = r.normal(size=(N, 4)), r.normal(size=(N, 3))
    cases = {}
    xc = x.copy()
    xc[tr] = 1.5  # z_src constant on the train rows (not on the held-out rows)
    cases["constant z_src"] = ("affine", 0.0, xc, y, "z_src (train rows) of shape (20, 4) is constant")
    yc = y.copy()
    yc[tr] = -2.0
    cases["constant z_tgt"] = ("orthogonal", 0.0, x, yc, "z_tgt (train rows) of shape (20, 3) is constant")
    xa = x.copy()
    xa[tr, 1] = 0.5  # one unit constant on the train rows, varying on the held-out rows
    # (a unit dead on every row is not: the least-squares fit is then not unique, but the score is)
    cases["ambiguous affine"] = ("affine", 0.0, xa, y, "not determined by the train rows")
    ya = np.tanh(x[:, :3]) + 0.1 * r.normal(size=(N, 3))
    cases["ambiguous"] = ("orthogonal", 0.0, xa[:, :3], ya, "not determined by the train rows")
    cases["ambiguous scaled"] = ("scaled_orthogonal", 0.0, xa[:, :3], ya, "not determined by the train rows")
    cases["few rows"] = ("orthogonal", 0.0, r.normal(size=(N, 24)), y, "needs more fitting rows")
    cases["few rows affine"] = ("affine", 0.0, r.normal(size=(N, 24)), y, "pass ridge > 0")
    cases["split"] = ("affine", 0.0, x[:3], y[:3], "split gives 2 train and 1 test rows")
    return cases


@pytest.mark.parametrize("case", list(_degenerate_cases()))
def test_reasons_are_the_pairwise_messages(case):
    family, ridge, x, y, expect = _degenerate_cases()[case]
    want = _message(S.reconstruction_score, x, y, family=family, ridge=ridge)
    assert expect in want, want
    name = f"stitch/{family}" + (f"/ridge={ridge:g}" if ridge else "")
    assert _message(sim.measure(name), x, y) == want
    core = S.stitch_core(family, ridge=ridge)
    static = core.reason(None, x.shape, y.shape, core.opts)
    if case in ("few rows", "few rows affine", "split"):
        assert static == want
        return
    assert static is None
    value, flags = _core(family, "held_out", x, y, ridge)
    assert np.isnan(value)
    assert core.reason(flags, x.shape, y.shape, core.opts) == want
    # the grid's flags (the finish's, on zero-padded moments, with its own layer flags and counts)
    gvalue, gflags = _grid_flags(family, ridge, "held_out", x, y)
    assert core.reason(gflags, x.shape, y.shape, core.opts) == want
    if case.startswith("ambiguous"):
        assert np.isnan(gvalue)
        np.testing.assert_allclose(gflags["ambiguity"], flags["ambiguity"], rtol=1e-6)


def test_non_finite_input_names_the_argument():
    x, y = np.random.default_rng(2).normal(size=(2, N, 3))
    x[4, 1] = np.nan
    want = _message(S.reconstruction_score, x, y, family="orthogonal")
    assert want.startswith("z_src of shape (40, 3) contains 1 NaN and 0 Inf")
    assert _message(sim.measure("stitch/orthogonal"), x, y) == want


def test_in_sample_and_affine_scores_ignore_the_ambiguity():
    *_, xa, ya, _ = _degenerate_cases()["ambiguous"]
    for name in ("stitch/orthogonal/in_sample", "stitch/scaled_orthogonal/in_sample", "stitch/affine/ridge=0.001"):
        assert np.isfinite(float(sim.measure(name)(xa, ya))), name
    _, flags = _core("orthogonal", "in_sample", xa, ya)
    assert bool(flags["determined"]) and float(flags["ambiguity"]) > 1e-2  # measured, not used
    # under a caller's jit nothing raises: the undetermined held-out score is NaN, the in-sample one is not
    f = jax.jit(lambda a, b: S.reconstruction_score(a, b, family="orthogonal"))
    out = f(xa, ya)
    assert np.isnan(float(out.held_out)) and np.isfinite(float(out.in_sample))


# ------------------------------------------------------------------ the ambiguity against random completions


def _completion_scores(x, y, tr, te, family, k=24, seed=0):
    """float64 NumPy: held-out scores of ``k`` optimal padded ``Q`` with random null-space rotations.

    ``Q = A_+ B_+^T + A_0 R B_0^T`` from the full SVD of the padded train cross moment (singular values
    below ``1e-9 s_max`` count as zero: the data below are exactly rank-deficient), ``R`` Haar-random.
    """
    mx, my = x[tr].mean(0), y[tr].mean(0)
    nx, ny = np.linalg.norm(x[tr] - mx), np.linalg.norm(y[tr] - my)
    u, v = (x - mx) / nx, (y - my) / ny
    d = max(x.shape[1], y.shape[1])
    up, vp = _pad(u, d), _pad(v, d)
    a, s, bt = np.linalg.svd(up[tr].T @ vp[tr])
    r = int(np.sum(s > 1e-9 * s[0]))
    scale = s.sum() / np.sum(up[tr] ** 2) if family == "scaled_orthogonal" else 1.0
    sst = np.sum((v[te] - v[te].mean(0)) ** 2)
    if d - r > 1:
        rots = scipy.stats.ortho_group.rvs(d - r, size=k, random_state=seed)
    else:  # O(1) = {1, -1}
        rots = [np.full((1, 1), (-1.0) ** i) for i in range(k)]
    out = []
    for rot in rots:
        q = a[:, :r] @ bt[:r] + a[:, r:] @ rot @ bt[r:]
        out.append(1 - np.sum((vp[te] - scale * up[te] @ q) ** 2) / sst)
    return np.array(out), r


def _ambiguity_cases():
    """``(x, y, determined)`` on 40 rows: rank-deficient train cross moments, for d1 < d2, = and >."""
    r = np.random.default_rng(7)
    tr = _train_rows(N)
    cases = {}

    def related(d1, d2, src=None):
        x = r.normal(size=(N, d1)) if src is None else src
        return x, np.tanh(x @ r.normal(size=(x.shape[1], d2)) / 2) + 0.2 * r.normal(size=(N, d2))

    for d1, d2 in ((3, 5), (4, 4), (5, 3)):
        x, y = related(d1, d2)
        x[:, 0] = 0.7  # a dead unit (every row)
        cases[f"dead {d1}x{d2}"] = (x, y, True)
        x, y = related(d1, d2)
        x[:, 1] = x[:, 0]  # a duplicated column
        y[:, -1] = y[:, 0]
        cases[f"duplicated {d1}x{d2}"] = (x, y, True)
        base = r.normal(size=(N, 2))  # rank-deficient pre-activations on both sides
        cases[f"low rank {d1}x{d2}"] = (base @ r.normal(size=(2, d1)) + 1.0,
                                        np.tanh(base) @ r.normal(size=(2, d2)), True)
    for d1, d2, side in ((3, 5, "x"), (4, 4, "x"), (4, 4, "y"), (5, 3, "y")):
        x, y = related(d1, d2)
        (x if side == "x" else y)[tr, 0] = 0.3  # one unit constant on the train rows only
        cases[f"train-constant {side} {d1}x{d2}"] = (x, y, False)
    x, y = related(5, 3)
    x[tr, 0] = 0.3  # d1 > d2: a source unit constant on the train rows leaves rank C = d2 = 3: determined
    cases["train-constant x 5x3"] = (x, y, True)
    return cases


@pytest.mark.parametrize("case", list(_ambiguity_cases()))
@pytest.mark.parametrize("family", ORTHO)
def test_held_out_score_is_defined_exactly_where_the_completion_does_not_matter(case, family):
    x, y, determined = _ambiguity_cases()[case]
    tr, te = _split(N)
    scores, rank = _completion_scores(x, y, tr, te, family)
    assert rank < max(x.shape[1], y.shape[1])  # in every case the padded Q is not unique
    value, flags = _core(family, "held_out", x, y)
    if determined:
        assert np.ptp(scores) < 1e-10, np.ptp(scores)  # any completion gives the same score ...
        np.testing.assert_allclose(value, scores.mean(), atol=1e-10)  # ... and the core gives it too
        assert float(flags["ambiguity"]) < 1e-6 * S.ambiguity_threshold(np.float64)
        pvalue, _ = _core_padded(family, "held_out", x, y)
        np.testing.assert_allclose(pvalue, scores.mean(), atol=1e-10)
    else:
        assert np.ptp(scores) > 1e-3, np.ptp(scores)  # the completion moves the score visibly
        assert np.isnan(value) and not bool(flags["determined"])
        assert float(flags["ambiguity"]) > 1e3 * S.ambiguity_threshold(np.float64)
        msg = _message(sim.measure(f"stitch/{family}"), x, y)
        assert "not determined by the train rows" in msg and "constant on the train rows" in msg
        assert "more train rows" in msg and "drop that unit" in msg and "ridge" in msg


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ambiguity_threshold_on_both_sides(dtype):
    """Rounding sits far below the threshold, genuine ambiguities far above it, in either dtype
    (float32 data computed in float32: the core's program at that dtype)."""
    tau = S.ambiguity_threshold(dtype)
    assert tau == pytest.approx(np.sqrt(np.finfo(dtype).eps))
    below, above = [], []
    for case, (x, y, determined) in _ambiguity_cases().items():
        _, flags = jax.device_get(protocol.evaluate(S.stitch_core("orthogonal"), jnp.asarray(x, dtype),
                                                    jnp.asarray(y, dtype)))
        (below if determined else above).append(float(flags["ambiguity"]))
    # full-rank float layers whose singular values decay over five decades: nothing is ambiguous
    r = np.random.default_rng(5)
    for d1, d2 in ((16, 32), (32, 32), (32, 12)):
        x = r.normal(size=(400, d1)) * np.logspace(0, -5, d1)
        y = x @ r.normal(size=(d1, d2)) * np.logspace(0, -5, d2) + 1e-5 * r.normal(size=(400, d2))
        _, flags = jax.device_get(protocol.evaluate(S.stitch_core("orthogonal"), jnp.asarray(x, dtype),
                                                    jnp.asarray(y, dtype)))
        below.append(float(flags["ambiguity"]))
    margin = 10.0 if dtype == np.float32 else 1e4
    assert max(below) < tau / margin, (max(below), tau)
    assert min(above) > tau * margin, (min(above), tau)


def test_ambiguity_by_the_grid_equals_the_core():
    for case, (x, y, determined) in _ambiguity_cases().items():
        for which in ("held_out", "in_sample"):
            value, flags = _core("scaled_orthogonal", which, x, y)
            gvalue, gflags = _grid_flags("scaled_orthogonal", 0.0, which, x, y)
            assert set(gflags) == set(flags)
            np.testing.assert_allclose(gvalue, value, rtol=1e-9, atol=1e-11, err_msg=case)
            assert bool(gflags["determined"]) == bool(flags["determined"]) == (determined or which == "in_sample")
            np.testing.assert_allclose(gflags["ambiguity"], flags["ambiguity"], rtol=1e-6, atol=1e-14)


# ------------------------------------------------------------------ fit_stitchers: programs and values


def _problems(shapes, n=60, seed=0, dtype=np.float64):
    r = np.random.default_rng(seed)
    xs, ys = [], []
    for d1, d2 in shapes:
        x = r.normal(size=(n, d1)) + r.normal(size=d1)
        xs.append(x.astype(dtype))
        ys.append((x @ r.normal(size=(d1, d2)) + 0.3 * r.normal(size=(n, d2))).astype(dtype))
    return xs, ys


SHAPES16 = [(3, 5), (5, 3), (4, 7), (7, 4)] * 4  # 16 pairs of 4 widths


@pytest.mark.parametrize("family", FAMS)
def test_fit_stitchers_of_mixed_widths_compile_one_program(family):
    xs, ys = _problems(SHAPES16, seed=1)
    ridge = 0.01 if family == "affine" else 0.0
    with CompileCounter() as c:
        fits = jax.block_until_ready(sim.fit_stitchers(xs, ys, family=family, ridge=ridge))
    assert c.count <= 2, c.names
    assert all("convert_element_type" not in nm and "slice" not in nm for nm in c.names), c.names
    for x, y, s in zip(xs, ys, fits):
        ref = sim.fit_stitcher(x, y, family=family, ridge=ridge)
        assert s.weight.shape == ref.weight.shape and s.bias.shape == ref.bias.shape and s.family == family
        np.testing.assert_allclose(s.weight, ref.weight, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s.bias, ref.bias, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s.scale, ref.scale, rtol=1e-9, atol=1e-12)
    # another call whose widths and count fall in the same buckets compiles nothing
    xs2, ys2 = _problems([(2, 6), (8, 8), (6, 2), (5, 5)] * 4, seed=2)
    n, fits2 = compiles(sim.fit_stitchers, xs2, ys2, family=family, ridge=ridge)
    assert n == 0
    for x, y, s in zip(xs2[:3], ys2[:3], fits2[:3]):
        np.testing.assert_allclose(s.weight, sim.fit_stitcher(x, y, family=family, ridge=ridge).weight,
                                   rtol=1e-9, atol=1e-12)


def test_fit_stitchers_mixed_families_and_integer_input_compile_one_program():
    xs, ys = _problems(SHAPES16[:6], seed=3)
    xs = [np.round(4 * x).astype(np.int32) for x in xs]  # cast on the host: no convert program
    fams = ["affine", "orthogonal", "scaled_orthogonal"] * 2
    with CompileCounter() as c:
        fits = jax.block_until_ready(sim.fit_stitchers(xs, ys, family=fams, ridge=0.1))
    assert c.count == 1, c.names
    assert all("convert_element_type" not in nm for nm in c.names), c.names
    for x, y, fam, s in zip(xs, ys, fams, fits):
        ref = sim.fit_stitcher(x.astype(np.float64), y, family=fam, ridge=0.1)
        assert s.family == fam
        np.testing.assert_allclose(s.weight, ref.weight, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s.bias, ref.bias, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s.scale, ref.scale, rtol=1e-9, atol=1e-12)


def test_fit_stitchers_per_problem_options_and_names():
    """ridge and normalise per problem, as b separate fit_stitcher calls would have them; names in messages."""
    xs, ys = _problems(SHAPES16[:4], seed=6)
    fams = ["affine", "orthogonal", "affine", "scaled_orthogonal"]
    ridges, norms = [0.0, 0.0, 0.5, 0.0], [True, False, False, True]
    with CompileCounter() as c:
        fits = sim.fit_stitchers(xs, ys, family=fams, ridge=ridges, normalise=norms)
    assert c.count == 1, c.names
    for x, y, fam, r, nz, s in zip(xs, ys, fams, ridges, norms, fits):
        ref = sim.fit_stitcher(x, y, family=fam, ridge=r, normalise=nz)
        for a, b in zip((s.weight, s.bias, s.scale), (ref.weight, ref.bias, ref.scale)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # the options do matter (else the comparison above proves nothing)
    assert not np.allclose(fits[1].scale, sim.fit_stitcher(xs[1], ys[1], family="orthogonal").scale)
    assert not np.allclose(fits[2].weight, sim.fit_stitcher(xs[2], ys[2], ridge=0.0).weight)
    with pytest.raises(ValueError, match="ridge has 3 entries but there are 4 problems"):
        sim.fit_stitchers(xs, ys, ridge=[0.0] * 3)
    with pytest.raises(TypeError, match="normalise must be True or False, got 1"):
        sim.fit_stitchers(xs, ys, normalise=[True, 1, True, True])
    with pytest.raises(ValueError, match="ridge must be a non-negative"):
        sim.fit_stitchers(xs, ys, ridge=[0.0, -1.0, 0.0, 0.0])
    bad = list(ys)
    bad[3] = np.full_like(ys[3], 2.0)
    with pytest.raises(ValueError, match=re.escape("the target of conv2->fc1 is constant across samples")):
        sim.fit_stitchers(xs, bad, names=["a", "b", "c", "conv2->fc1"])
    with pytest.raises(TypeError, match="names must be a sequence of b = 4 values"):
        sim.fit_stitchers(xs, ys, names="abcd")


def test_fit_stitchers_without_buckets_and_under_jit():
    xs, ys = _problems([(3, 5), (5, 2), (4, 4)], seed=4)
    exact = sim.fit_stitchers(xs, ys, family="scaled_orthogonal", bucket=False)
    bucketed = sim.fit_stitchers(xs, ys, family="scaled_orthogonal")
    traced = jax.jit(lambda a, b: sim.fit_stitchers(a, b, family="scaled_orthogonal"))(xs, ys)
    for s0, s1, s2 in zip(exact, bucketed, traced):
        for f in ("weight", "bias", "scale"):
            np.testing.assert_allclose(getattr(s0, f), getattr(s1, f), rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(getattr(s2, f), getattr(s1, f), rtol=1e-10, atol=1e-13)
    with pytest.raises(TypeError, match="bucket must be True or False"):
        sim.fit_stitchers(xs, ys, bucket=1)


def test_fit_stitchers_errors_name_the_problem():
    xs, ys = _problems([(3, 2), (4, 2), (2, 2)], seed=5)
    ys[2] = np.full_like(ys[2], 3.0)
    with pytest.raises(ValueError, match=re.escape("zs_tgt[2] is constant across samples")):
        sim.fit_stitchers(xs, ys)
    xs[1] = xs[1].copy()
    xs[1][0, 0] = np.inf
    with pytest.raises(ValueError, match=re.escape("zs_src[1] or zs_tgt[1] contains NaN or Inf")):
        sim.fit_stitchers(xs, ys)
    with pytest.raises(ValueError, match=re.escape("zs_src[0] must be 2-D")):
        sim.fit_stitchers([xs[0][:, 0]], [ys[0]])
    with pytest.raises(TypeError, match="complex"):
        sim.fit_stitchers([xs[0] + 0j], [ys[0]])
    # a duplicated column is rank deficiency, not an error: a least-squares fit (the two copies'
    # weights are determined only in sum), whose predictions are NumPy's minimum-norm lstsq's
    xd = xs[0].copy()
    xd[:, 1] = xd[:, 0]
    (st, _) = sim.fit_stitchers([xd, xs[2]], [ys[0], ys[0]])
    xc, yc = xd - xd.mean(0), ys[0] - ys[0].mean(0)
    want = xc @ np.linalg.lstsq(xc, yc, rcond=None)[0] + ys[0].mean(0)
    np.testing.assert_allclose(np.asarray(sim.apply_stitcher(st, xd)), want, rtol=1e-9, atol=1e-10)
