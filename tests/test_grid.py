"""The comparison grid agrees with the pairwise functions, streams, and shards."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funsim.similarity as sim
from funsim.runtime.compile_count import CompileCounter
from funsim.similarity.grid import compare_grid

N = 36
STITCH = [f"stitch/{fam}{fig}" for fam in ("affine", "scaled_orthogonal", "orthogonal") for fig in ("", "/in_sample")]
MOMENT = STITCH + ["cka/linear", "nbs", "procrustes"]


def _layers(seed=0):
    r = np.random.default_rng(seed)
    base = r.normal(size=(N, 3))
    a = {"l0": base, "l1": base @ r.normal(size=(3, 5)) + 0.3 * r.normal(size=(N, 5)), "l2": r.normal(size=(N, 3))}
    b = [np.tanh(base @ r.normal(size=(3, 4))), r.normal(size=(N, 3)) + base]
    return a, b


@pytest.fixture(scope="module")
def grid():
    a, b = _layers()
    return a, b, compare_grid(a, b, measures=MOMENT + ["rsa/correlation/pearson"], reverse=True)


def test_grid_equals_pairwise_functions(grid):
    a, b, g = grid
    assert g.rows == ("l0", "l1", "l2") and g.cols == (0, 1)
    assert list(g.tables) == MOMENT + ["rsa/correlation/pearson"] and set(g.reverse) == set(g.tables)
    for i, x in enumerate(a.values()):
        for j, y in enumerate(b):
            for m in ("cka/linear", "nbs", "procrustes", "rsa/correlation/pearson"):
                np.testing.assert_allclose(g.tables[m][i, j], sim.measure(m)(x, y), atol=1e-10)
            np.testing.assert_allclose(g.tables["cka/linear"][i, j], sim.cka(x, y), atol=1e-10)
            for fam in sim.FAMILIES:
                fwd = sim.reconstruction_score(x, y, family=fam)
                bwd = sim.reconstruction_score(y, x, family=fam)
                key = f"stitch/{fam}"
                assert g.tables[key].shape == (3, 2)
                np.testing.assert_allclose(g.tables[key][i, j], fwd.held_out, atol=1e-10)
                np.testing.assert_allclose(g.tables[key + "/in_sample"][i, j], fwd.in_sample, atol=1e-10)
                np.testing.assert_allclose(g.reverse[key][i, j], bwd.held_out, atol=1e-10)
                np.testing.assert_allclose(g.reverse[key + "/in_sample"][i, j], bwd.in_sample, atol=1e-10)


def _pairwise(name, xs, ys):
    m = sim.measure(name)
    return np.array([[float(m(x, y)) for y in ys] for x in xs])


# every moment measure the registry lists, and measures with per-layer statistics of every module
EVERY = list(sim.MOMENT_MEASURES) + ["rsa/euclidean/spearman", "cka/rbf", "cca/r2", "svcca", "pwcca",
                                     "pwcca/epsilon=1e-10", "regression/r2/ridge=0.5", "shape/angular/alpha=0.5",
                                     "shape/euclidean/alpha=0"]


def test_every_table_is_a_registered_measure():
    """The grid's contract: ``tables[k][i, j] == measure(k)(A_i, B_j)`` and
    ``reverse[k][i, j] == measure(k)(B_j, A_i)``, for every key it returns."""
    assert {"nbs", "procrustes", "cka/linear", "shape/angular/alpha=1", "shape/euclidean/alpha=1", *STITCH,
            "stitch/affine/ridge=0.001", "stitch/affine/in_sample/ridge=0.001"} <= set(sim.MOMENT_MEASURES)
    r = np.random.default_rng(2)  # one width per side (unequal): two compiled shapes per pairwise measure
    xs = [r.normal(size=(N, 3)) * [3.0, 1.0, 0.3] + 1.0 for _ in range(2)]
    ys = [np.tanh(xs[0] @ r.normal(size=(3, 4))) + 0.5 * r.normal(size=(N, 4)), r.normal(size=(N, 4))]
    a, b = {"p": xs[0], "q": xs[1]}, ys
    g = compare_grid(a, b, measures=EVERY, reverse=True)
    assert list(g.tables) == EVERY and list(g.reverse) == EVERY
    for k in EVERY:
        np.testing.assert_allclose(g.tables[k], _pairwise(k, xs, ys), rtol=1e-9, atol=1e-10, err_msg=k)
        np.testing.assert_allclose(g.reverse[k], _pairwise(k, ys, xs).T, rtol=1e-9, atol=1e-10, err_msg=k)
        if sim.measure(k).symmetric:
            assert g.reverse[k] is g.tables[k]
    plain = compare_grid(a, b, measures=EVERY)
    assert plain.reverse == {}
    for k in EVERY:
        np.testing.assert_allclose(plain.tables[k], g.tables[k], rtol=1e-12, atol=1e-13, err_msg=k)
    zs = [*xs, *ys]  # one side with itself: a symmetric measure computes each unordered pair once, and the
    sq = compare_grid(zs, measures=EVERY, reverse=True)  # reverse table is the forward one transposed
    off = ~np.eye(len(zs), dtype=bool)
    for k in EVERY:
        want = _pairwise(k, zs, zs)
        for got, w in ((sq.tables[k], want), (sq.reverse[k], want.T)):
            np.testing.assert_allclose(got[off], w[off], rtol=1e-9, atol=1e-10, err_msg=k)
            # a distance of a layer to itself is the square root of a cancellation (arccos(1 - eps) for the
            # angular one), about sqrt(eps) = 1.5e-8 of the table's scale in either computation
            np.testing.assert_allclose(np.diag(got), np.diag(w), atol=1e-7 * (1 + np.abs(want).max()), err_msg=k)


def test_the_reverse_of_a_side_with_itself_is_its_forward_table_transposed(monkeypatch):
    """``reverse[k][i, j] = measure(A_j, A_i) = tables[k][j, i]`` for one side with itself, so nothing is
    computed for the reverse: no moment entry asks for it and every generic table is forward only;
    undefined cells and reasons transpose with it."""
    from funsim.similarity.grid import generic as G
    from funsim.similarity.grid import moment_passes as M

    asked, entries = [], []
    real_table, real_moments = G.generic_table, M.moment_tables
    monkeypatch.setattr(G, "generic_table", lambda *a, directions, **k: asked.append(directions) or
                        real_table(*a, directions=directions, **k))
    monkeypatch.setattr(M, "moment_tables", lambda lay, e, **k: entries.extend(e) or real_moments(lay, e, **k))
    r = np.random.default_rng(13)
    reps = [r.normal(size=(N, w)) for w in (3, 5, 4)] + [np.zeros((N, 3))]
    ms = ["stitch/affine", "cka/linear", "pwcca", "regression/r2", "svcca"]
    with pytest.warns(sim.UndefinedCellWarning):
        g = compare_grid(reps, measures=ms, reverse=True)
    assert asked and set(asked) == {("fwd",)} and entries and not any(e.reverse for e in entries)
    for m in ms:
        # exact for a directed measure; a symmetric one's reverse is its own table (equal to rounding)
        np.testing.assert_allclose(g.reverse[m], np.asarray(g.tables[m]).T, rtol=0 if not sim.measure(m).symmetric
                                   else 1e-12, atol=0 if not sim.measure(m).symmetric else 1e-15, err_msg=m)
        assert g.reverse_undefined[m] and {(j, i): w for (i, j), w in g.reverse_undefined[m].items()}.keys() \
            == g.undefined[m].keys(), m
        for (i, j), why in g.reverse_undefined[m].items():
            with pytest.raises(ValueError) as e:
                sim.measure(m)(reps[j], reps[i])
            assert why == str(e.value), (m, i, j)


def test_streaming_equals_one_shot(grid):
    a, b, g = grid
    s = compare_grid(a, b, measures=MOMENT, chunk_size=7, reverse=True)  # 7 does not divide 36
    for k, t in s.tables.items():
        np.testing.assert_allclose(t, g.tables[k], atol=1e-10, err_msg=k)
        np.testing.assert_allclose(s.reverse[k], g.reverse[k], atol=1e-10, err_msg=k)
    # host (numpy) arrays stay on the host, one chunk at a time
    s2 = compare_grid({k: np.asarray(v) for k, v in a.items()}, b, measures=["cka/linear"], chunk_size=36)
    np.testing.assert_allclose(s2.tables["cka/linear"], g.tables["cka/linear"], atol=1e-10)


def test_partial_split_and_single_families(grid):
    """A split that leaves rows out (all-rows moments get their own pass), and each
    measure family alone (only the moments it needs are accumulated)."""
    a, b, g = grid
    tr, te = np.arange(0, 20), np.arange(24, N)  # rows 20..23 in neither part
    p = compare_grid(a, b, measures=MOMENT, split=(tr, te), reverse=True)
    for i, x in enumerate(a.values()):
        for j, y in enumerate(b):
            for fam in sim.FAMILIES:
                want = sim.reconstruction_score(x, y, family=fam, split=(tr, te))
                np.testing.assert_allclose(p.tables[f"stitch/{fam}"][i, j], want.held_out, atol=1e-10)
                back = sim.reconstruction_score(y, x, family=fam, split=(tr, te))
                np.testing.assert_allclose(p.reverse[f"stitch/{fam}/in_sample"][i, j], back.in_sample,
                                           atol=1e-10)
    full_only = ("cka/linear", "nbs", "procrustes")  # all-rows measures ignore the split
    alone = compare_grid(a, b, measures=list(full_only)).tables  # only all-rows moments accumulated
    for m in full_only:
        np.testing.assert_allclose(p.tables[m], g.tables[m], atol=1e-10, err_msg=m)
        np.testing.assert_allclose(alone[m], g.tables[m], atol=1e-10, err_msg=m)
    only = compare_grid(a, b, measures=["stitch/scaled_orthogonal"], reverse=True)
    assert set(only.tables) == set(only.reverse) == {"stitch/scaled_orthogonal"}
    np.testing.assert_allclose(only.tables["stitch/scaled_orthogonal"], g.tables["stitch/scaled_orthogonal"],
                               atol=1e-10)
    np.testing.assert_allclose(only.reverse["stitch/scaled_orthogonal"], g.reverse["stitch/scaled_orthogonal"],
                               atol=1e-10)


def test_in_sample_identities(grid):
    """In sample, scaled_orthogonal scores NBS^2 and orthogonal 2 NBS - 1 on the train rows (so both
    are symmetric and their reverse is the forward table); affine is the regression R^2."""
    a, b, g = grid
    for fam in ("orthogonal", "scaled_orthogonal"):
        assert sim.measure(f"stitch/{fam}/in_sample").symmetric
        assert g.reverse[f"stitch/{fam}/in_sample"] is g.tables[f"stitch/{fam}/in_sample"]
    assert not sim.measure("stitch/affine/in_sample").symmetric
    w_tr, _ = sim.stitching.split_weights(N, 0.5, None, np.float64)
    tr = np.flatnonzero(np.asarray(w_tr))
    for i, x in enumerate(a.values()):
        for j, y in enumerate(b):
            nbs = float(sim.nbs(x[tr], y[tr]))
            np.testing.assert_allclose(g.tables["stitch/scaled_orthogonal/in_sample"][i, j], nbs**2, atol=1e-10)
            np.testing.assert_allclose(g.tables["stitch/orthogonal/in_sample"][i, j], 2 * nbs - 1, atol=1e-10)
            np.testing.assert_allclose(g.tables["stitch/affine/in_sample"][i, j],
                                       sim.linear_regression_r2(x[tr], y[tr]), atol=1e-10)


def test_ridge_is_part_of_the_name(grid):
    a, b, _ = grid
    names = ["stitch/affine/ridge=0.01", "stitch/affine/in_sample/ridge=0.01"]
    g = compare_grid(a, b, measures=names, reverse=True)
    for i, x in enumerate(a.values()):
        for j, y in enumerate(b):
            want = sim.reconstruction_score(x, y, family="affine", ridge=0.01)
            np.testing.assert_allclose(g.tables[names[0]][i, j], want.held_out, atol=1e-10)
            np.testing.assert_allclose(g.tables[names[1]][i, j], want.in_sample, atol=1e-10)
            back = sim.reconstruction_score(y, x, family="affine", ridge=0.01)
            np.testing.assert_allclose(g.reverse[names[0]][i, j], back.held_out, atol=1e-10)
    for bad, match in (("stitch/affine/ridge=-1", "ridge must be a non-negative finite float"),
                       ("stitch/affine/ridge=inf", "ridge must be a non-negative finite float"),
                       ("stitch/orthogonal/ridge=0.1", "Unknown measure name")):
        with pytest.raises(ValueError, match=match):
            compare_grid(a, b, measures=[bad])


def test_compiles_once_per_shape_and_measure_set(grid):
    """A second call with the same shapes and measures reuses every compiled program."""
    a, b, _ = grid
    ms = ["stitch/affine", "stitch/orthogonal/in_sample", "nbs", "pwcca"]
    with CompileCounter() as first:
        compare_grid(a, b, measures=ms, reverse=True)
    a2 = {k: v + 1.0 for k, v in a.items()}  # new values, same shapes
    with CompileCounter() as second:
        compare_grid(a2, b, measures=ms, reverse=True)
    assert first.count > 0 and second.count == 0


def _architecture(widths, n=30, seed=0):
    r = np.random.default_rng(seed)
    base = r.normal(size=(n, 2))
    return [np.tanh(base @ r.normal(size=(2, d)) + 0.5 * r.normal(size=(n, d))) for d in widths]


def test_second_architecture_pair_of_the_same_buckets_compiles_nothing():
    """Each side is padded to the bucket of its widest layer (7 and 8: 8; 10 and 12: 12) and of its layer
    count (6 layers: 6; 3: 3). The second pair of architectures compiles no program, and every value
    equals the unpadded grid's (and, on three cells, the pairwise call's)."""
    ms = ["cka/linear", "shape/euclidean/alpha=1", "stitch/affine", "stitch/scaled_orthogonal/in_sample",
          "stitch/affine/ridge=0.01"]
    first = (_architecture([5] * 5 + [7]), _architecture([10, 10, 3], seed=1))
    second = (_architecture([6] * 4 + [2, 8], seed=2), _architecture([12, 11, 3], seed=3))
    with CompileCounter() as c1:
        compare_grid(*first, measures=ms, reverse=True)
    with CompileCounter() as c2:
        g = compare_grid(*second, measures=ms, reverse=True)
    assert c1.count > 0 and c2.count == 0, (c1.count, c2.count)
    exact = compare_grid(*second, measures=ms, reverse=True, buckets=False)
    for k in ms:
        np.testing.assert_allclose(g.tables[k], exact.tables[k], rtol=1e-10, atol=1e-12, err_msg=k)
        np.testing.assert_allclose(g.reverse[k], exact.reverse[k], rtol=1e-10, atol=1e-12, err_msg=k)
    # and the pairwise calls, on cells of three different width pairs (every cell compiles its own shapes
    # pairwise; the unpadded grid above covers the rest)
    (xs, ys), cells = second, [(0, 0), (4, 1), (5, 2)]
    for k in ms:
        want = [float(sim.measure(k)(xs[i], ys[j])) for i, j in cells]
        np.testing.assert_allclose([g.tables[k][i, j] for i, j in cells], want, rtol=1e-9, atol=1e-10, err_msg=k)


def test_every_moment_measure_is_unchanged_by_padding():
    """Zero-padded widths and repeated layers leave every registered moment measure's value as it is."""
    a, b = _architecture([5, 7, 5]), _architecture([10, 3], seed=1)  # widths padded on both sides
    names = list(sim.MOMENT_MEASURES)
    g, exact = (compare_grid(a, b, measures=names, reverse=True, buckets=bk) for bk in (True, False))
    for k in names:
        np.testing.assert_allclose(g.tables[k], exact.tables[k], rtol=1e-10, atol=1e-12, err_msg=k)
        np.testing.assert_allclose(g.reverse[k], exact.reverse[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="inspects the CPU program's LAPACK SVD kernels")
def test_moment_programs_have_unbatched_svds(grid, monkeypatch):
    """The compiled moment evaluator runs every SVD unbatched on the CPU (see similarity._linalg)."""
    from funsim.similarity.grid import moment_passes as M
    from tests.test_linalg import _gesdd_operands

    seen, real = [], M.block_evaluator

    def spy(*key):
        f = real(*key)
        return lambda *args: seen.append((f, args)) or f(*args)

    monkeypatch.setattr(M, "block_evaluator", spy)
    a, b, _ = grid
    compare_grid(a, b, measures=["stitch/orthogonal", "stitch/scaled_orthogonal/in_sample", "nbs", "procrustes",
                                 "shape/euclidean/alpha=1"], reverse=True)
    assert seen
    for f, args in seen:
        ops = _gesdd_operands(f, *args)
        assert ops and all(len(shape) == 2 for shape in ops), ops


def test_user_registered_moment_measure(grid):
    """A measure registered with MomentStats is computed (and streamed) from the moments by the grid."""
    from funsim.similarity.registry import _REGISTRY

    a, b, g = grid

    def finish(ctx):  # squared NBS, from the SVD the grid shares with nbs and procrustes
        return jnp.sum(ctx.svd()[1]) ** 2

    try:
        sim.register("tmp/nbs2", lambda x, y: sim.nbs(x, y) ** 2, kind="score", symmetric=True,
                     invariances=("translation", "rotation", "isotropic_scale", "permutation"),
                     description="NBS squared", moments=sim.MomentStats("full", finish))
        for chunk in (None, 5):
            t = compare_grid(a, b, measures=["tmp/nbs2", "nbs"], chunk_size=chunk).tables
            np.testing.assert_allclose(t["tmp/nbs2"], np.asarray(g.tables["nbs"]) ** 2, atol=1e-10)
    finally:
        _REGISTRY.pop("tmp/nbs2", None)
    with pytest.raises(ValueError, match="Unknown MomentStats.moments 'all'"):
        sim.register("tmp/bad", sim.nbs, kind="score", symmetric=True, invariances=(), description="x",
                     moments=sim.MomentStats("all", finish))
    with pytest.raises(TypeError, match="must be a MomentStats"):
        sim.register("tmp/bad", sim.nbs, kind="score", symmetric=True, invariances=(), description="x",
                     moments=("full", finish))
    assert "tmp/bad" not in _REGISTRY


GENERIC = ["rsa/correlation/spearman", "cka/rbf/debiased", "cca/mean", "svcca", "pwcca", "regression/r2"]


def test_generic_measures_by_layer_stats(grid):
    """Measures with per-layer statistics give the pairwise values, with or without the statistics."""
    a, b, _ = grid
    fast = compare_grid(a, b, measures=GENERIC, reverse=True)
    # the per-pair path (one generic program for every measure: two of them suffice)
    per_pair = GENERIC[::3]
    slow = compare_grid(a, b, measures=per_pair, stats_budget=0, reverse=True)
    for m in per_pair:
        np.testing.assert_allclose(fast.tables[m], slow.tables[m], rtol=1e-9, atol=1e-12, err_msg=m)
        np.testing.assert_allclose(fast.reverse[m], slow.reverse[m], rtol=1e-9, atol=1e-12, err_msg=m)
        for i, x in enumerate(a.values()):
            for j, y in enumerate(b):
                np.testing.assert_allclose(fast.tables[m][i, j], sim.measure(m)(x, y), rtol=1e-9, atol=1e-12,
                                           err_msg=m)


def _split_width_groups(monkeypatch):
    """Make :func:`layers.partition` split layers of different widths into up to 3 groups (the most it
    makes); by default the small widths of these tests share one group."""
    from funsim.similarity.grid import layers as L

    monkeypatch.setattr(L, "PAD_COST", 0.0)
    monkeypatch.setattr(L, "PAD_FLOOR", 0.0)


@pytest.mark.parametrize("split_groups", [False, True])
def test_generic_statistics_over_the_budget_are_computed_in_blocks(monkeypatch, split_groups):
    """Above ``stats_budget`` the per-layer statistics are computed a block of layers at a time: the same
    tables as all at once, with layers of several widths in one group or three, blocks that span groups
    (width-free statistics: RSA's RDMs) or not (SVCCA's bases), blocks that do not divide a group, and
    reverse."""
    from funsim.similarity.grid import generic as G
    from funsim.similarity.grid import layers as L

    if split_groups:
        _split_width_groups(monkeypatch)
    r = np.random.default_rng(3)
    a = {f"a{k}": r.normal(size=(N, w)) for k, w in enumerate((3, 4, 5, 3, 7, 9, 3))}
    b = [r.normal(size=(N, w)) for w in (4, 3, 6, 5, 8)]
    a["a6"] = np.tanh(a["a0"] @ r.normal(size=(3, 3)))  # one related pair
    measures = ["rsa/correlation/pearson", "cka/rbf/debiased", "svcca"]
    assert len(L.make_groups(list(a.values()), buckets=True)) == (3 if split_groups else 1)
    whole = compare_grid(a, b, measures=measures, reverse=True)
    square = compare_grid(a, measures=measures)  # one side with itself: one copy of each layer's statistics
    seen = []
    real = G.block_size

    for size in (2, 3):
        def fixed(*args, size=size):
            seen.append(real(*args))
            return size

        monkeypatch.setattr(G, "block_size", fixed)
        blocked = compare_grid(a, b, measures=measures, reverse=True)
        for m in measures:
            np.testing.assert_allclose(blocked.tables[m], whole.tables[m], rtol=1e-12, atol=1e-14, err_msg=(m, size))
            np.testing.assert_allclose(blocked.reverse[m], whole.reverse[m], rtol=1e-12, atol=1e-14,
                                       err_msg=(m, size))
        blocked = compare_grid(a, measures=measures)
        for m in measures:
            np.testing.assert_allclose(blocked.tables[m], square.tables[m], rtol=1e-12, atol=1e-14, err_msg=(m, size))
        with CompileCounter() as again:  # new values, same shapes: the block programs are reused
            compare_grid({k: v + 1.0 for k, v in a.items()}, b, measures=measures, reverse=True)
        assert again.count == 0, size
    assert seen and set(seen) == {0}  # within the default budget, all at once
    np.testing.assert_allclose(whole.tables["rsa/correlation/pearson"][6, 1],
                               sim.measure("rsa/correlation/pearson")(a["a6"], b[1]), rtol=1e-10)


def test_blocks_span_width_groups_where_the_statistics_do_not_depend_on_the_width(monkeypatch):
    """RDMs have one shape at every width, so their blocks take consecutive layers across groups; SVCCA's
    bases do not, so its blocks stay in a group. Each layer is in exactly one block, and a side with itself
    computes each block once and each other block once per earlier block (the pairs of both while both are
    held): K + K (K - 1) / 2 block computations for K blocks, against K + K^2 for two sides."""
    from funsim.similarity.grid import generic as G
    from funsim.similarity.grid import layers as L

    _split_width_groups(monkeypatch)
    r = np.random.default_rng(5)
    reps = [r.normal(size=(N, w)) for w in (3, 4, 5, 3, 7, 9, 3, 12)]
    lay = L.prepare(reps, reps, buckets=True)
    groups = lay.groups("a")
    assert len(groups) == 3
    rdm, basis = sim.measure("rsa/correlation/pearson").core, sim.measure("svcca").core
    spans = G.side_blocks(rdm, lay, groups, 3)
    assert [len(b.layers) for b in spans] == [3, 3, 2] and all(b.slots == 3 for b in spans)
    assert any(len(b.segments) > 1 for b in spans)  # a block across groups
    assert sorted(np.concatenate([b.layers for b in spans]).tolist()) == list(range(len(reps)))
    per_group = G.side_blocks(basis, lay, groups, 3)
    assert all(len(b.segments) == 1 for b in per_group)
    assert len(per_group) == sum(-(-len(g.idx) // min(3, L.bucket(len(g.idx)))) for g in groups) > len(spans)
    assert sorted(np.concatenate([b.layers for b in per_group]).tolist()) == list(range(len(reps)))

    calls = []
    real = G._block_stats
    monkeypatch.setattr(G, "block_size", lambda *a: 3)
    monkeypatch.setattr(G, "_block_stats", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    m = "rsa/correlation/pearson"
    square = compare_grid(reps, measures=m)
    assert len(calls) == 3 + 3
    calls.clear()
    two = compare_grid(reps, list(reps), measures=m, reverse=True)
    assert len(calls) == 3 + 3 * 3
    for i, x in enumerate(reps):
        for j, y in enumerate(reps):
            want = float(sim.measure(m)(x, y))
            np.testing.assert_allclose([square.tables[m][i, j], two.tables[m][i, j], two.reverse[m][j, i]], want,
                                       rtol=1e-10, err_msg=(i, j))


@pytest.mark.parametrize("path", ["per_layer", "groups", "blocked", "per_pair"])
def test_a_symmetric_measure_of_a_side_with_itself_computes_each_pair_once(monkeypatch, path):
    """``measure(A_i, A_j) == measure(A_j, A_i)`` for a symmetric measure, so a grid of one side with itself
    computes each unordered pair once, ``L (L + 1) / 2`` of its ``L^2`` cells (per layer in one width group or
    three, over the budget in blocks, or per pair), and mirrors the rest. An undefined cell's reason names the
    arguments in order ("x of shape ... is constant"), so there the mirrored cells are computed: every cell
    and reason is the pairwise call's, forward and reverse."""
    from funsim.similarity.grid import generic as G
    from funsim.similarity.grid import layers as L

    if path == "groups":
        _split_width_groups(monkeypatch)
    if path == "blocked":
        monkeypatch.setattr(G, "block_size", lambda *a: 2)
    budget = 0 if path == "per_pair" else None  # not one layer's statistics fit: per pair
    r = np.random.default_rng(11)
    reps = [r.normal(size=(N, w)) for w in (3, 4, 5, 3, 7, 6)]
    reps[5] = np.tanh(reps[1] @ r.normal(size=(4, 6)))  # a related pair
    assert len(L.make_groups(reps, buckets=True)) == (3 if path == "groups" else 1)
    counted = []
    real = G._positions
    monkeypatch.setattr(G, "_positions", lambda *a: counted.append(len((out := real(*a))[0])) or out)
    L_ = len(reps)
    for m in ("rsa/correlation/pearson", "svcca", "cka/rbf/debiased"):
        assert sim.measure(m).symmetric
        counted.clear()
        g = compare_grid(reps, measures=m, stats_budget=budget)
        assert sum(counted) == L_ * (L_ + 1) // 2, (m, counted)
        want = np.array([[float(sim.measure(m)(x, y)) for y in reps] for x in reps])
        np.testing.assert_allclose(g.tables[m], want, rtol=1e-10, atol=1e-12, err_msg=m)

    dead = [*reps[:3], np.zeros((N, 3)), *reps[3:]]  # a constant layer: its cells are undefined
    for m in ("rsa/correlation/pearson", "svcca"):
        _check_square(compare_grid(dead, measures=m, stats_budget=budget, reverse=True), dead, m, dead_at=3,
                      rtol=1e-10, atol=1e-12)


def _check_square(g, reps, m: str, *, dead_at: int, rtol: float, atol: float) -> None:
    """Every cell of a square grid with ``reverse=True`` against the pairwise call, forward and reverse: the
    cells of layer ``dead_at`` (constant) undefined with the pairwise call's message, the others its value."""
    for i, x in enumerate(reps):
        for j, y in enumerate(reps):
            for table, undefined, (u, v) in ((g.tables, g.undefined, (x, y)), (g.reverse, g.reverse_undefined, (y, x))):
                if dead_at in (i, j):
                    with pytest.raises(ValueError) as e:
                        sim.measure(m)(u, v)
                    assert undefined[m][i, j] == str(e.value), (m, i, j)
                    assert np.isnan(table[m][i, j])
                else:
                    assert (i, j) not in undefined[m]
                    np.testing.assert_allclose(table[m][i, j], float(sim.measure(m)(u, v)), rtol=rtol, atol=atol,
                                               err_msg=(m, i, j))


@pytest.mark.parametrize("chunk", [None, 7])
def test_moment_measures_of_a_side_with_itself_across_width_groups(monkeypatch, chunk):
    """One side with itself, layers in three width groups, streamed or not, with ``reverse=True`` (the
    forward table transposed): every cell, undefined reason and reverse cell is the pairwise call's."""
    _split_width_groups(monkeypatch)
    r = np.random.default_rng(14)
    reps = [r.normal(size=(N, w)) for w in (3, 5, 3, 8, 5)]
    reps[4] = np.tanh(reps[1] @ r.normal(size=(5, 5)))
    reps.append(np.zeros((N, 8)))  # a constant layer: its cells are undefined
    ms = ["stitch/affine", "stitch/orthogonal/in_sample", "cka/linear", "procrustes"]
    with pytest.warns(sim.UndefinedCellWarning):
        g = compare_grid(reps, measures=ms, reverse=True, chunk_size=chunk)
    for m in ms:
        _check_square(g, reps, m, dead_at=5, rtol=1e-9, atol=1e-10)


def test_a_symmetric_measure_without_a_core_is_mirrored_at_its_own_widths():
    """A user's symmetric measure (no core: exact widths, one group per width) of a side with itself is
    mirrored too; a constant layer's cells keep the generic reason, naming its argument in order."""
    from funsim.similarity.registry import _REGISTRY

    r = np.random.default_rng(12)
    reps = [r.normal(size=(N, w)) for w in (3, 4, 3, 5)] + [np.ones((N, 4))]
    try:
        sim.register("tmp/nbs_sq", lambda x, y: sim.nbs(x, y) ** 2, kind="score", symmetric=True, invariances=(), description="NBS^2")
        g = compare_grid(reps, measures="tmp/nbs_sq", buckets=False)
        for i, x in enumerate(reps):
            for j, y in enumerate(reps):
                if 4 in (i, j):
                    assert np.isnan(g.tables["tmp/nbs_sq"][i, j])
                    assert g.undefined["tmp/nbs_sq"][i, j].startswith("x" if i == 4 else "y"), (i, j)
                else:
                    np.testing.assert_allclose(g.tables["tmp/nbs_sq"][i, j], float(sim.nbs(x, y)) ** 2,
                                               rtol=1e-9, err_msg=(i, j))
    finally:
        _REGISTRY.pop("tmp/nbs_sq", None)


def test_block_size_fits_two_blocks_in_the_budget():
    from funsim.similarity.grid import generic as G
    from funsim.similarity.grid import layers as L

    r = np.random.default_rng(0)
    reps = {k: r.normal(size=(N, 4)) for k in range(10)}
    lay = L.prepare(reps, reps, buckets=True)
    groups = {s: lay.groups(s) for s in "ab"}
    core = sim.measure("rsa/correlation/pearson").core
    out = jax.eval_shape(core.layer, jax.ShapeDtypeStruct((N, 4), lay.dtype), jax.ShapeDtypeStruct((), jnp.int32),
                         tuple(jax.ShapeDtypeStruct((), lay.dtype) for _ in core.opts))
    per = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(out))
    assert per >= N * (N - 1) // 2 * 8  # at least the condensed float64 RDM
    total = per * sum(len(g.pidx) for g in groups["a"])  # a side with itself: one copy of the statistics
    assert lay.same and G.block_size(core, lay, groups, total) == 0 < G.block_size(core, lay, groups, total - 1)
    other = L.prepare(reps, dict(reps), buckets=True)  # two sides: both copies
    assert not other.same and G.block_size(core, other, groups, 2 * total - 1) > 0
    assert G.block_size(core, lay, groups, 0) == 1
    for k in (1, 2, 3, 5):  # all 12 padded layers fit in 12 layers' bytes
        assert G.block_size(core, lay, groups, 2 * k * per) == k
        assert G.block_size(core, lay, groups, 2 * (k + 1) * per - 1) == k


def test_default_stats_budget_is_a_quarter_of_the_smallest_free_device_memory():
    """Where every device reports its memory (a GPU, a TPU) the default budget is a quarter of the least free;
    where one does not (the CPU reports none), 2 GiB."""
    from funsim.similarity.grid import devices as D

    class Dev:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    gib = 2.0**30
    assert jax.devices()[0].memory_stats() is None  # this suite runs on the CPU
    assert D.default_stats_budget() == D.default_stats_budget(jax.devices()) == D.DEFAULT_STATS_BUDGET == 2 * gib
    big = Dev({"bytes_limit": int(139 * gib), "bytes_in_use": int(3 * gib)})
    small = Dev({"bytes_limit": int(80 * gib), "bytes_in_use": int(40 * gib)})
    assert D.default_stats_budget([big]) == 34 * gib
    assert D.default_stats_budget([big, small]) == 10 * gib
    assert D.default_stats_budget([Dev({"bytes_limit": int(16 * gib)})]) == 4 * gib  # nothing in use reported
    assert D.default_stats_budget([big, Dev(None)]) == D.default_stats_budget([big, Dev({})]) == 2 * gib
    assert D.default_stats_budget([Dev({"bytes_limit": 10, "bytes_in_use": 20})]) == 0  # full: per pair


@pytest.mark.parametrize("budget", [-1, "2GiB", True, np.bool_(True), float("nan"), np.float32(-1.0)])
def test_bad_stats_budget_is_refused_by_name(grid, budget):
    a, b, _ = grid
    with pytest.raises(ValueError, match=r"stats_budget must be a number of bytes >= 0 .* got " + re.escape(repr(budget))):
        compare_grid(a, b, measures="rsa/correlation/pearson", stats_budget=budget)


def test_a_numpy_stats_budget_is_a_number_of_bytes(grid):
    a, b, _ = grid
    want = compare_grid(a, b, measures="rsa/correlation/pearson").tables["rsa/correlation/pearson"]
    for budget in (np.int64(2**30), np.float32(2**30), np.int32(0)):
        got = compare_grid(a, b, measures="rsa/correlation/pearson", stats_budget=budget)
        np.testing.assert_allclose(got.tables["rsa/correlation/pearson"], want, rtol=1e-12, err_msg=repr(budget))


def test_the_grid_keeps_one_measures_statistics_at_a_time(grid, monkeypatch):
    """Per-layer statistics stay cached only while a later measure uses them (the shape metrics of one alpha
    share theirs, and are computed one after the other whatever the order asked): the grid's memory is one
    measure's statistics, not every measure's."""
    from funsim.similarity.grid import generic as G

    a, b, _ = grid
    measures = ["shape/angular/alpha=0.5", "rsa/correlation/pearson", "shape/euclidean/alpha=0.5", "svcca"]
    layer = {m: sim.measure(m).core.layer for m in measures}
    assert layer[measures[0]] is layer[measures[2]] and len(set(map(id, layer.values()))) == 3
    live, computed = [], []
    real_table, real_layers = G.generic_table, G._layers_jit

    def spy(lay, measure, *, stats_cache, **kw):
        live.append({k[0] for k in stats_cache})
        return real_table(lay, measure, stats_cache=stats_cache, **kw)

    def counted(fn):
        computed.append(fn)
        return real_layers(fn)

    monkeypatch.setattr(G, "generic_table", spy)
    monkeypatch.setattr(G, "_layers_jit", counted)
    g = compare_grid(a, b, measures=measures)
    assert live == [set(), {layer[measures[0]]}, set(), set()]  # angular, euclidean (shared), rsa, svcca
    assert list(g.tables) == measures
    assert computed.count(layer[measures[0]]) == len(computed) // 3  # the shared statistics computed once
    for m in measures:
        x, y = next(iter(a.values())), b[0]
        np.testing.assert_allclose(g.tables[m][0, 0], sim.measure(m)(x, y), rtol=1e-9, atol=1e-12, err_msg=m)


def test_generic_non_finite_entry_is_an_error(grid):
    a, b, _ = grid
    # a layer whose rows are constant across features: the correlation RDM is 0/0
    bad = dict(a, l1=np.repeat(np.arange(N, dtype=float)[:, None], 5, axis=1))
    with pytest.raises(ValueError, match="rows\\[1\\] = 'l1'.*not finite"):
        compare_grid(bad, b, measures=["rsa/correlation/pearson"], on_undefined="raise")
    # by default the row is undefined (NaN, with the pairwise call's reason), the rest is kept
    with pytest.warns(sim.UndefinedCellWarning, match=r"2 cell\(s\) are undefined.*rsa/correlation/pearson"):
        g = compare_grid(bad, b, measures=["rsa/correlation/pearson"])
    t, und = np.asarray(g.tables["rsa/correlation/pearson"]), g.undefined["rsa/correlation/pearson"]
    assert np.all(np.isnan(t[1])) and np.all(np.isfinite(t[[0, 2]])) and set(und) == {(1, 0), (1, 1)}
    with pytest.raises(ValueError) as e:
        sim.measure("rsa/correlation/pearson")(bad["l1"], b[0])
    assert und[1, 0] == str(e.value)
    from funsim.similarity.registry import _REGISTRY

    try:  # a directed measure undefined when its second argument has 5 features (A's layer l1)
        sim.register("tmp/undef5", lambda x, y: jnp.asarray(np.nan if y.shape[1] == 5 else 0.0), kind="score",
                     symmetric=False, invariances=(), description="NaN for a 5-wide target")
        assert np.all(np.asarray(compare_grid(a, b, measures=["tmp/undef5"]).tables["tmp/undef5"]) == 0.0)
        # cells are settled one pair of widths at a time: the narrower B layer's first
        with pytest.raises(ValueError, match=r"tmp/undef5 \(reverse\): the entry for \(cols\[1\] = 1, "
                                             r"rows\[1\] = 'l1'\) is not finite"):
            compare_grid(a, b, measures=["tmp/undef5"], reverse=True)
    finally:
        _REGISTRY.pop("tmp/undef5", None)


def _degenerate_layers():
    """Healthy layers beside a ReLU layer with a dead unit, a constant layer, collinear features and a
    full-rank layer with one sample constant across features."""
    r = np.random.default_rng(5)
    n = 24
    base = r.normal(size=(n, 3))
    relu = np.maximum(base @ r.normal(size=(3, 4)) + 0.5, 0.0)
    relu[:, 2] = 0.0  # a dead unit: rank-deficient
    one_flat_row = r.normal(size=(n, 4))
    one_flat_row[7] = 0.25  # full rank, but one sample constant across features (correlation distance undefined)
    a = {"good": base @ r.normal(size=(3, 4)) + 0.3 * r.normal(size=(n, 4)), "dead_unit": relu,
         "constant": np.full((n, 4), 0.5), "noise": r.normal(size=(n, 4)), "flat_row": one_flat_row}
    b = [np.tanh(base @ r.normal(size=(3, 4))) + 0.2 * r.normal(size=(n, 4)),
         np.concatenate([base, base[:, :1] - 2.0 * base[:, 1:2]], axis=1),  # collinear features
         r.normal(size=(n, 4)) + base[:, :1]]
    return a, b


def _pairwise_outcome(m, x, y):
    try:
        return float(m(x, y)), None
    except ValueError as e:
        return None, str(e)


def test_undefined_cells_agree_with_the_pairwise_calls_for_every_measure():
    """For every registered measure: where ``measure(name)(A_i, B_j)`` raises, the cell is NaN and the
    reason is its message; elsewhere the values agree (forward and reverse tables)."""
    a, b = _degenerate_layers()
    names = sim.list_measures()
    with pytest.warns(sim.UndefinedCellWarning, match="undefined and set to NaN"):
        g = compare_grid(a, b, measures=names, reverse=True)
    assert set(g.undefined) == set(g.reverse_undefined) == set(names)
    kinds = set()
    for name in names:
        m = sim.measure(name)
        for rev, tables, undefined in ((False, g.tables, g.undefined), (True, g.reverse, g.reverse_undefined)):
            t = np.asarray(tables[name])
            for i, x in enumerate(a.values()):
                for j, y in enumerate(b):
                    value, reason = _pairwise_outcome(m, y, x) if rev else _pairwise_outcome(m, x, y)
                    where = (name, "reverse" if rev else "forward", i, j)
                    if reason is None:
                        assert (i, j) not in undefined[name], where
                        np.testing.assert_allclose(t[i, j], value, rtol=1e-9, atol=1e-10, err_msg=str(where))
                    else:
                        assert np.isnan(t[i, j]) and undefined[name].get((i, j)) == reason, where
                        kinds.add("constant" if "constant" in reason else "other")
            assert set(undefined[name]) <= {(i, j) for i in range(len(a)) for j in range(3)}, name
        if m.symmetric and g.undefined[name].keys() == g.reverse_undefined[name].keys():
            assert g.reverse[name] is g.tables[name], name
    # the cases the grid used to get wrong: CCA on a rank-deficient layer, and a constant layer
    assert set(g.undefined["cca/mean"]) >= {(1, j) for j in range(3)} | {(i, 1) for i in range(4)}
    with pytest.raises(ValueError, match="rank"):
        sim.cca_mean(a["dead_unit"], b[0])
    assert "constant" in g.undefined["cka/linear"][2, 0] and np.isfinite(np.asarray(g.tables["cka/linear"])[1, 1])
    assert kinds == {"constant", "other"}
    # a full-rank layer with one flat sample: RSA's correlation distance is undefined there (the grid once
    # gave a number), its Euclidean distance is not
    assert set(g.undefined["rsa/correlation/spearman"]) >= {(4, j) for j in range(3)}
    assert not any(i == 4 for i, _ in g.undefined["rsa/euclidean/spearman"])


def test_the_grid_never_calls_a_pairwise_function(grid, monkeypatch):
    """Every cell, healthy or undefined, comes from the batched programs: their flags decide the undefined
    cells and the measures' reasons name them (no pairwise call, no eager per-cell fallback)."""
    from funsim.similarity import protocol

    def refuse(*args, **kwargs):
        raise AssertionError("compare_grid called a pairwise measure")

    monkeypatch.setattr(protocol, "call", refuse)
    a, b, _ = grid
    g = compare_grid(a, b, measures=MOMENT + ["rsa/correlation/pearson"], reverse=True)
    assert all(u == {} for u in (*g.undefined.values(), *g.reverse_undefined.values()))
    with pytest.warns(sim.UndefinedCellWarning):  # a dead layer: its row undefined, in both directions
        g = compare_grid(dict(a, l1=0.0 * a["l1"]), b, measures=["cka/linear", "stitch/affine"], reverse=True)
    for name in ("cka/linear", "stitch/affine"):
        assert set(g.undefined[name]) == set(g.reverse_undefined[name]) == {(1, 0), (1, 1)}, name
    monkeypatch.undo()
    with pytest.raises(ValueError) as e:
        sim.measure("stitch/affine")(0.0 * a["l1"], b[0])
    assert g.undefined["stitch/affine"][1, 0] == str(e.value)


def test_square_grid_and_float32():
    a, _ = _layers(1)
    a32 = [v.astype(np.float32) for v in a.values()]
    g = compare_grid(a32, measures=["cka/linear", "stitch/orthogonal"], reverse=True)
    t = np.asarray(g.tables["cka/linear"])
    assert t.dtype == np.float32 and t.shape == (3, 3)
    np.testing.assert_allclose(np.diag(t), 1.0, atol=1e-5)
    np.testing.assert_allclose(t, t.T, atol=1e-6)
    # a directed score: forward[i, j] is reverse[j, i]
    f, r = (np.asarray(t[k]) for t, k in ((g.tables, "stitch/orthogonal"), (g.reverse, "stitch/orthogonal")))
    np.testing.assert_allclose(f, r.T, atol=1e-6)


def test_float32_layers_far_from_the_origin():
    """The all-rows Gram matrix comes from the uncentred one only where that is exact enough: a float32
    layer with a large offset (X^T X - n m m^T would lose every digit) is centred first."""
    a, b = _layers(3)
    x64 = [np.asarray(v, np.float32).astype(np.float64) for v in (a["l1"] + 1e3, a["l2"] - 50.0)]
    y64 = [np.asarray(v, np.float32).astype(np.float64) for v in b]
    g = compare_grid([v.astype(np.float32) for v in x64], [v.astype(np.float32) for v in y64],
                     measures=["cka/linear", "nbs"])
    for k in ("cka/linear", "nbs"):  # against float64 on the same (float32-rounded) values
        np.testing.assert_allclose(np.asarray(g.tables[k]), _pairwise(k, x64, y64), atol=2e-5, err_msg=k)


def test_registered_stitch_measures():
    for fam in sim.FAMILIES:
        m = sim.measure(f"stitch/{fam}")
        assert m.kind == "score" and not m.symmetric and "invertible_linear" not in m.invariances
        assert m.moments is not None and m.moments.moments == "split"


def test_bad_input(grid):
    a, b, _ = grid
    with pytest.raises(ValueError, match="Unknown measure name"):
        compare_grid(a, b, measures=["cka/linaer"])
    with pytest.raises(ValueError, match="Unknown measure name"):
        compare_grid(a, b, measures=["stitch/affien"])
    with pytest.raises(ValueError, match="cannot stream"):
        compare_grid(a, b, measures=["rsa/correlation/pearson"], chunk_size=8)
    with pytest.raises(ValueError, match="same samples"):
        compare_grid(a, [b[0][:20]])
    with pytest.raises(ValueError, match="chunk_size"):
        compare_grid(a, b, measures=["nbs"], chunk_size=0)
    bad = dict(a, l0=np.where(np.arange(N)[:, None] == 3, np.nan, a["l0"]))
    with pytest.raises(ValueError, match="NaN"):
        compare_grid(bad, b)
    with pytest.raises(ValueError, match="empty"):
        compare_grid([], b)
    const = dict(a, l1=np.ones((N, 5)))
    for ms in (["cka/linear"], ["stitch/orthogonal"], ["rsa/correlation/pearson"]):
        with pytest.raises(ValueError, match="constant"):
            compare_grid(const, b, measures=ms, on_undefined="raise")
        with pytest.warns(sim.UndefinedCellWarning, match="constant"):  # by default: that row is undefined
            g = compare_grid(const, b, measures=ms)
        assert np.all(np.isnan(np.asarray(g.tables[ms[0]])[1])) and set(g.undefined[ms[0]]) == {(1, 0), (1, 1)}
        assert all("constant" in why for why in g.undefined[ms[0]].values())
    with pytest.raises(ValueError, match=r"stitch/affine with source reps_a\[0\]: .*ridge > 0"):
        compare_grid([np.random.default_rng(0).normal(size=(N, 30))], b, measures=["stitch/affine"],
                     on_undefined="raise")
    wide_b = [np.random.default_rng(0).normal(size=(N, 30))]
    compare_grid(a, wide_b, measures=["stitch/affine"])  # a wide target is fine one way...
    with pytest.raises(ValueError, match=r"with source reps_b\[0\]: .*ridge > 0"):
        compare_grid(a, wide_b, measures=["stitch/affine"], reverse=True,
                     on_undefined="raise")  # ...but not as a source
    with pytest.warns(sim.UndefinedCellWarning, match="more fitting rows than source features"):
        g = compare_grid(a, wide_b, measures=["stitch/affine"], reverse=True)
    assert np.all(np.isfinite(np.asarray(g.tables["stitch/affine"]))) and g.undefined["stitch/affine"] == {}
    assert np.all(np.isnan(np.asarray(g.reverse["stitch/affine"]))) and len(g.reverse_undefined["stitch/affine"]) == 3
    with pytest.raises(ValueError, match="split must be a train fraction"):
        compare_grid(a, b, measures=["nbs"], split=1.5)  # checked even when no measure uses it
    with pytest.raises(ValueError, match=r"got an array of shape \(36,\) and dtype bool; for a boolean train "
                                         r"mask m pass \(np.flatnonzero\(m\), np.flatnonzero\(~m\)\)\.$"):
        compare_grid(a, b, measures=["nbs"], split=np.arange(N) < N // 2)  # named, not printed in full
    # a symmetric measure's reverse table is its own, but the reverse sources are checked all the same,
    # as measure(name)(B_j, A_i) would be
    in_sample = "stitch/orthogonal/in_sample"
    compare_grid(a, wide_b, measures=[in_sample])
    with pytest.raises(ValueError, match="more fitting rows than source features"):
        sim.measure(in_sample)(wide_b[0], a["l0"])
    with pytest.raises(ValueError, match=rf"{in_sample} with source reps_b\[0\]: .*more fitting rows"):
        compare_grid(a, wide_b, measures=[in_sample], reverse=True, on_undefined="raise")
    with pytest.warns(sim.UndefinedCellWarning):  # the forward table is defined, its reverse is not
        g = compare_grid(a, wide_b, measures=[in_sample], reverse=True)
    assert g.reverse[in_sample] is not g.tables[in_sample] and np.all(np.isfinite(np.asarray(g.tables[in_sample])))
    assert np.all(np.isnan(np.asarray(g.reverse[in_sample]))) and g.undefined[in_sample] == {}
    with pytest.raises(ValueError, match="on_undefined"):
        compare_grid(a, b, measures=["nbs"], on_undefined="ignore")
    with pytest.raises(TypeError, match="reverse must be True or False"):
        compare_grid(a, b, measures=["nbs"], reverse="yes")


def test_duplicated_columns_give_defined_affine_cells_equal_to_the_pairwise_calls(grid):
    """Identical columns on the train rows make the unregularised normal equations singular. That was an
    undefined cell ("not finite") while the same rank deficiency elsewhere gave a number; under the one
    rank-deficiency rule of the stitching families the held-out affine score is defined wherever the
    held-out rows share the deficiency, as here, at ridge 0 as at ridge > 0, and each cell equals the
    pairwise call."""
    a, b, _ = grid
    dup = dict(a, l1=np.repeat(a["l0"][:, :1], 5, axis=1) + np.arange(5.0) * 1e-300)
    names = ["stitch/affine", "stitch/affine/ridge=0.001"]
    g = compare_grid(dup, b, measures=names, on_undefined="raise")
    for name in names:
        assert g.undefined[name] == {}, name
        for i, xa in enumerate(dup.values()):
            for j, yb in enumerate(b.values() if isinstance(b, dict) else b):
                np.testing.assert_allclose(np.asarray(g.tables[name])[i, j], float(sim.measure(name)(xa, yb)),
                                           rtol=1e-8, atol=1e-10, err_msg=f"{name} {i} {j}")


SHARDED = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from funsim.similarity.grid import compare_grid
    from funsim.similarity.grid.devices import make_plan, put_pairs
    assert len(jax.devices()) == 4, jax.devices()
    ia, = put_pairs(make_plan(None), np.arange(5))
    assert len(ia.sharding.device_set) == 4 and ia.shape == (8,)  # padded to a multiple of 4
    r = np.random.default_rng(0)
    a = [r.normal(size=(24, 3)), r.normal(size=(24, 3)), r.normal(size=(24, 2))]
    b = [a[0] @ r.normal(size=(3, 3)), r.normal(size=(24, 2))]
    ms = ["stitch/affine", "stitch/orthogonal/in_sample", "cka/linear", "pwcca"]
    many = compare_grid(a, b, measures=ms, reverse=True)
    one = compare_grid(a, b, measures=ms, devices=jax.devices()[:1], reverse=True)
    streamed = compare_grid(a, b, measures=ms[:3], chunk_size=5, reverse=True)
    for k in many.tables:
        np.testing.assert_allclose(many.tables[k], one.tables[k], atol=1e-12, err_msg=k)
        np.testing.assert_allclose(many.reverse[k], one.reverse[k], atol=1e-12, err_msg=k)
    for k in streamed.tables:
        np.testing.assert_allclose(streamed.tables[k], one.tables[k], atol=1e-10, err_msg=k)
        np.testing.assert_allclose(streamed.reverse[k], one.reverse[k], atol=1e-10, err_msg=k)
    rdm = 24 * 23 // 2 * 8 + 64  # a layer's condensed float64 RDM and its flags: blocks of 2 layers
    want = compare_grid(a, b, measures="rsa/correlation/pearson", reverse=True, devices=jax.devices()[:1])
    for budget in (4 * rdm, None):  # the statistics filled in place across the devices, and all at once
        got = compare_grid(a, b, measures="rsa/correlation/pearson", reverse=True, stats_budget=budget)
        np.testing.assert_allclose(got.tables["rsa/correlation/pearson"], want.tables["rsa/correlation/pearson"],
                                   atol=1e-12, err_msg=budget)
    for budget in (4 * rdm, None):  # one side with itself: each unordered pair once, mirrored
        got = compare_grid(a, measures=["rsa/correlation/pearson", "svcca"], stats_budget=budget)
        one = compare_grid(a, list(a), measures=["rsa/correlation/pearson", "svcca"], devices=jax.devices()[:1])
        for k in got.tables:
            np.testing.assert_allclose(got.tables[k], one.tables[k], atol=1e-12, err_msg=(k, budget))
    print("SHARDED-OK")
    """
)


def test_sharded_over_four_forced_host_devices():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SHARDED], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SHARDED-OK" in out.stdout


FEATURE_SHARDED = textwrap.dedent(
    """
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from funsim.similarity import compare_grid
    assert jax.device_count() == 4
    r = np.random.default_rng(3)
    n = 48
    a = {"l1": r.normal(size=(n, 8)), "l2": r.normal(size=(n, 20)), "l3": r.normal(size=(n, 4))}
    b = [r.normal(size=(n, 12)), r.normal(size=(n, 4))]
    ms = ["cka/linear", "stitch/affine/ridge=0.001", "pwcca", "nbs"]
    want = compare_grid(a, b, measures=ms, reverse=True)
    flat = Mesh(np.array(jax.devices()), ("d",))
    square = Mesh(np.array(jax.devices()).reshape(2, 2), ("r", "d"))
    for sharding in (NamedSharding(flat, P(None, "d")),  # a tensor-parallel layer's features
                     NamedSharding(square, P("r", "d")),  # rows and features
                     NamedSharding(square, P(None, ("r", "d")))):  # features over both mesh axes
        put = lambda z: jax.device_put(z, sharding)
        got = compare_grid({k: put(z) for k, z in a.items()}, [put(z) for z in b], measures=ms, reverse=True)
        for k in ms:
            np.testing.assert_allclose(got.tables[k], want.tables[k], rtol=1e-12, atol=1e-13, err_msg=k)
            np.testing.assert_allclose(got.reverse[k], want.reverse[k], rtol=1e-12, atol=1e-13, err_msg=k)
        got = compare_grid([put(z) for z in b], measures=["cka/linear"], chunk_size=16)  # streamed
        np.testing.assert_allclose(got.tables["cka/linear"], compare_grid(b, measures=["cka/linear"]).tables[
            "cka/linear"], rtol=1e-12)
    print("FEATURE-SHARDED-OK")
    """
)


def test_feature_sharded_layers_over_four_forced_host_devices():
    """Layers sharded over their features (``PartitionSpec(None, "d")``, as a tensor-parallel layer
    comes), over rows and features, or over features on a 2-D mesh: the grid reshards as it needs
    and its tables equal those of the same layers on the host."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", FEATURE_SHARDED], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FEATURE-SHARDED-OK" in out.stdout


def test_integer_and_list_layers_are_cast(grid):
    a, b, g = grid
    ints = np.round(4 * a["l1"]).astype(np.int32)
    got = compare_grid([ints, ints.tolist()], b, measures=["cka/linear", "stitch/orthogonal"])
    want = compare_grid([ints.astype(np.float64)] * 2, b, measures=["cka/linear", "stitch/orthogonal"])
    for k, t in want.tables.items():
        np.testing.assert_allclose(got.tables[k], t, atol=1e-10, err_msg=k)


def test_on_step_counts_every_block_and_measure(grid):
    """``on_step(done, total)`` after each block of the moment measures and each other measure: ``done``
    counts up to ``total``, which is final from the first call; the tables are those without it."""
    a, b, g = grid
    names = ["cka/linear", "nbs", "rsa/correlation/pearson"]
    calls = []
    t = compare_grid(a, b, measures=names, on_step=lambda done, total: calls.append((done, total))).tables
    total = calls[0][1]
    assert total >= 2 and calls == [(k, total) for k in range(1, total + 1)], calls  # a block, then RSA
    for name in names:
        np.testing.assert_array_equal(np.asarray(t[name]), np.asarray(g.tables[name]))
    with pytest.raises(TypeError, match="on_step must be a function on_step\\(done, total\\) or None, got str"):
        compare_grid(a, b, measures=names, on_step="bar")


def _pairwise_or_reason(name, x, y):
    try:
        return float(sim.measure(name)(x, y)), None
    except ValueError as e:
        return np.nan, str(e)


def _wide_layers(r, n):
    base = r.normal(size=(n, 4))
    a = [np.tanh(base @ r.normal(size=(4, 40))) + 0.1 * r.normal(size=(n, 40)), r.normal(size=(n, 30))]
    b = [base @ r.normal(size=(4, 50)) + 0.01 * r.normal(size=(n, 50)), np.c_[base, r.normal(size=(n, 2))]]
    return a, b


def test_layers_wider_than_the_rows_are_compared_in_the_rows_span(monkeypatch):
    """Every built-in moment measure is invariant to rotations and to zero padding, so layers wider
    than the rows are evaluated from their rows rotated into the rows' span (n x n per pair, not W x W):
    the values, undefined cells and reasons of the pairwise calls, both directions, whole or streamed."""
    from funsim.similarity.grid import MOMENT_MEASURES
    from funsim.similarity.grid import moment_passes as M

    n = 24
    a, b = _wide_layers(np.random.default_rng(3), n)
    widths = []
    real = M.row_space
    monkeypatch.setattr(M, "row_space", lambda z, scale: (widths.append(z.shape[2]), real(z, scale))[1])
    M.layer_program.cache_clear()  # trace afresh, so that the spy sees the programs
    names = list(MOMENT_MEASURES)
    with pytest.warns(sim.UndefinedCellWarning):
        g = compare_grid(a, b, measures=names, reverse=True)
    assert widths and min(widths) > n  # side a (40, 30 wide) and side b's 50-wide layer were rotated
    with pytest.warns(sim.UndefinedCellWarning):
        streamed = compare_grid(a, b, measures=names, reverse=True, chunk_size=10)  # W x W moments
    defined = 0
    for name in names:
        for i, x in enumerate(a):
            for j, y in enumerate(b):
                for table, undefined, (src, tgt) in ((g.tables, g.undefined, (x, y)),
                                                     (g.reverse, g.reverse_undefined, (y, x))):
                    want, why = _pairwise_or_reason(name, src, tgt)
                    got = float(table[name][i, j])
                    if why is None:
                        np.testing.assert_allclose(got, want, atol=1e-9, err_msg=f"{name} {i} {j}")
                        defined += 1
                    else:
                        assert np.isnan(got) and undefined[name][i, j].startswith(why[:60]), (name, i, j)
            np.testing.assert_allclose(np.asarray(g.tables[name]), np.asarray(streamed.tables[name]), atol=1e-9)
    assert defined > 60  # most cells are numbers (the held-out orthogonal fits of wide sources are not)


def test_a_measure_not_declared_rotation_invariant_is_not_rotated():
    """A registered moment measure that reads the features themselves (here the largest diagonal entry
    of the normalised Gram matrix, which a rotation changes) keeps the layers' own W features."""
    from funsim.similarity.registry import _REGISTRY

    def diag_max(x, y):
        xc = np.asarray(x) - np.asarray(x).mean(0)
        return jnp.asarray(np.max(np.sum(xc * xc, 0)) / np.sum(xc * xc))

    a, b = _wide_layers(np.random.default_rng(4), 24)
    try:
        sim.register("tmp/diag_max", diag_max, kind="score", symmetric=False, invariances=("translation",),
                     description="largest feature share of the variance",
                     moments=sim.MomentStats("full", lambda ctx: jnp.max(jnp.diagonal(ctx.x.gram))))
        t = compare_grid(a, b, measures=["tmp/diag_max", "cka/linear"]).tables["tmp/diag_max"]
        for i, x in enumerate(a):
            np.testing.assert_allclose(np.asarray(t)[i], float(diag_max(x, b[0])), rtol=1e-9)
    finally:
        _REGISTRY.pop("tmp/diag_max", None)


def test_rank_deficient_layers_are_batched_and_equal_the_pairwise_calls():
    """Linear layers of a narrower input (pre-activations: rank below the width, widths padded): every cell
    is the batched program's own and equals the pairwise call, the held-out orthogonal scores included
    (their maps are not unique there, but the held-out rows lie in the span the train rows determine, so
    the score does not depend on the arbitrary part)."""
    r = np.random.default_rng(11)
    n, inp = 40, 5
    x = r.normal(size=(n, inp))
    # rank 5 in widths 7 and 13 (two buckets, both padded); one full-rank target. Every cell compiles its
    # own pairwise programs (9 measures x 2 cells x 2 directions), hence few cells
    a = {f"pre{w}": x @ r.normal(size=(inp, w)) + r.normal(size=w) for w in (7, 13)}
    b = [np.tanh(x @ r.normal(size=(inp, 6))) + 0.1 * r.normal(size=(n, 6))]
    names = ["cka/linear", "nbs", "procrustes", "stitch/orthogonal/in_sample", "stitch/affine/ridge=0.001",
             "rsa/correlation/pearson", "regression/r2", "stitch/orthogonal", "stitch/scaled_orthogonal"]
    g = compare_grid(a, b, measures=names, reverse=True)
    for name in names:
        m = sim.measure(name)
        assert g.undefined[name] == {} and g.reverse_undefined[name] == {}, name
        for i, xa in enumerate(a.values()):
            for j, yb in enumerate(b):
                np.testing.assert_allclose(np.asarray(g.tables[name])[i, j], float(m(xa, yb)), rtol=1e-8,
                                           atol=1e-10, err_msg=f"{name} {i} {j}")
                np.testing.assert_allclose(np.asarray(g.reverse[name])[i, j], float(m(yb, xa)), rtol=1e-8,
                                           atol=1e-10, err_msg=f"{name} reverse {i} {j}")


def test_robust_to_names_degeneracies():
    with pytest.raises(ValueError, match="robust_to"):
        sim.make_measure("tmp/bad", lambda x, y: 0.0, kind="score", symmetric=True, invariances=(),
                         description="d", robust_to=("rank",))
    assert set(sim.DEGENERACIES) == {"rank_deficient", "constant_rows"}
