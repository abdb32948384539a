"""The comparison grid agrees with the pairwise functions, streams, and shards."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import similarity as sim
from similarity.grid import compare_grid

N = 36
MOMENT = ["stitch/affine", "stitch/scaled_orthogonal", "stitch/orthogonal", "cka/linear", "nbs", "procrustes"]


def _layers(seed=0):
    r = np.random.default_rng(seed)
    base = r.normal(size=(N, 3))
    a = {"l0": base, "l1": base @ r.normal(size=(3, 5)) + 0.3 * r.normal(size=(N, 5)), "l2": r.normal(size=(N, 3))}
    b = [np.tanh(base @ r.normal(size=(3, 4))), r.normal(size=(N, 3)) + base]
    return a, b


@pytest.fixture(scope="module")
def grid():
    a, b = _layers()
    return a, b, compare_grid(a, b, measures=MOMENT + ["rsa/correlation/pearson"])


def test_grid_equals_pairwise_functions(grid):
    a, b, g = grid
    assert g.rows == ("l0", "l1", "l2") and g.cols == (0, 1)
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
                np.testing.assert_allclose(g.tables[key + "/reverse"][i, j], bwd.held_out, atol=1e-10)
                np.testing.assert_allclose(
                    g.tables[key + "/reverse/in_sample"][i, j], bwd.in_sample, atol=1e-10
                )


def test_streaming_equals_one_shot(grid):
    a, b, g = grid
    s = compare_grid(a, b, measures=MOMENT, chunk_size=7)  # 7 does not divide 36
    for k, t in s.tables.items():
        np.testing.assert_allclose(t, g.tables[k], atol=1e-10, err_msg=k)
    # host (numpy) arrays stay on the host, one chunk at a time
    s2 = compare_grid({k: np.asarray(v) for k, v in a.items()}, b, measures=["cka/linear"], chunk_size=36)
    np.testing.assert_allclose(s2.tables["cka/linear"], g.tables["cka/linear"], atol=1e-10)


def test_partial_split_and_single_families(grid):
    """A split that leaves rows out (all-rows moments get their own pass), and each
    measure family alone (only the moments it needs are accumulated)."""
    a, b, g = grid
    tr, te = np.arange(0, 20), np.arange(24, N)  # rows 20..23 in neither part
    p = compare_grid(a, b, measures=MOMENT, split=(tr, te))
    for i, x in enumerate(a.values()):
        for j, y in enumerate(b):
            for fam in sim.FAMILIES:
                want = sim.reconstruction_score(x, y, family=fam, split=(tr, te))
                np.testing.assert_allclose(p.tables[f"stitch/{fam}"][i, j], want.held_out, atol=1e-10)
                back = sim.reconstruction_score(y, x, family=fam, split=(tr, te))
                np.testing.assert_allclose(p.tables[f"stitch/{fam}/reverse/in_sample"][i, j], back.in_sample,
                                           atol=1e-10)
    for m in ("cka/linear", "nbs", "procrustes"):  # all-rows measures ignore the split
        np.testing.assert_allclose(p.tables[m], g.tables[m], atol=1e-10, err_msg=m)
        np.testing.assert_allclose(compare_grid(a, b, measures=[m]).tables[m], g.tables[m], atol=1e-10, err_msg=m)
    only = compare_grid(a, b, measures=["stitch/scaled_orthogonal"])
    assert set(only.tables) == {"stitch/scaled_orthogonal" + k for k in ("", "/in_sample", "/reverse", "/reverse/in_sample")}
    for k, t in only.tables.items():
        np.testing.assert_allclose(t, g.tables[k], atol=1e-10, err_msg=k)


GENERIC = ["rsa/correlation/spearman", "cka/rbf/debiased", "cca/mean", "svcca", "pwcca", "regression/r2"]


def test_generic_measures_by_layer_stats(grid):
    """Measures with per-layer statistics give the pairwise values, with or without the statistics."""
    a, b, _ = grid
    fast = compare_grid(a, b, measures=GENERIC)
    slow = compare_grid(a, b, measures=GENERIC, stats_budget=0)  # forces the per-pair path
    for m in GENERIC:
        np.testing.assert_allclose(fast.tables[m], slow.tables[m], rtol=1e-9, atol=1e-12, err_msg=m)
        for i, x in enumerate(a.values()):
            for j, y in enumerate(b):
                np.testing.assert_allclose(fast.tables[m][i, j], sim.measure(m)(x, y), rtol=1e-9, atol=1e-12,
                                           err_msg=m)


def test_generic_non_finite_entry_is_an_error(grid):
    a, b, _ = grid
    # a layer whose rows are constant across features: the correlation RDM is 0/0
    bad = dict(a, l1=np.repeat(np.arange(N, dtype=float)[:, None], 5, axis=1))
    with pytest.raises(ValueError, match="rows\\[1\\] = 'l1'.*not finite"):
        compare_grid(bad, b, measures=["rsa/correlation/pearson"])


def test_square_grid_and_float32():
    a, _ = _layers(1)
    a32 = [v.astype(np.float32) for v in a.values()]
    g = compare_grid(a32, measures=["cka/linear", "stitch/orthogonal"])
    t = np.asarray(g.tables["cka/linear"])
    assert t.dtype == np.float32 and t.shape == (3, 3)
    np.testing.assert_allclose(np.diag(t), 1.0, atol=1e-5)
    np.testing.assert_allclose(t, t.T, atol=1e-6)
    # a directed score: forward[i, j] is reverse[j, i]
    f, r = (np.asarray(g.tables[k]) for k in ("stitch/orthogonal", "stitch/orthogonal/reverse"))
    np.testing.assert_allclose(f, r.T, atol=1e-6)


def test_registered_stitch_measures():
    for fam in sim.FAMILIES:
        m = sim.measure(f"stitch/{fam}")
        assert m.kind == "score" and not m.symmetric and "invertible_linear" not in m.invariances


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
    for ms in (["cka/linear"], ["stitch/orthogonal"]):
        with pytest.raises(ValueError, match="constant"):
            compare_grid(const, b, measures=ms)
    with pytest.raises(ValueError, match="ridge > 0"):
        compare_grid([np.random.default_rng(0).normal(size=(N, 30))], b, measures=["stitch/affine"])


SHARDED = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from similarity.grid import _make_plan, _put_pairs, compare_grid
    assert len(jax.devices()) == 4, jax.devices()
    ia, = _put_pairs(_make_plan(None), np.arange(5))
    assert len(ia.sharding.device_set) == 4 and ia.shape == (8,)  # padded to a multiple of 4
    r = np.random.default_rng(0)
    a = [r.normal(size=(24, 3)), r.normal(size=(24, 3)), r.normal(size=(24, 2))]
    b = [a[0] @ r.normal(size=(3, 3)), r.normal(size=(24, 2))]
    ms = ["stitch/affine", "cka/linear", "rsa/correlation/pearson"]
    many = compare_grid(a, b, measures=ms)
    one = compare_grid(a, b, measures=ms, devices=jax.devices()[:1])
    streamed = compare_grid(a, b, measures=ms[:2], chunk_size=5)
    for k in many.tables:
        np.testing.assert_allclose(many.tables[k], one.tables[k], atol=1e-12, err_msg=k)
    for k in streamed.tables:
        np.testing.assert_allclose(streamed.tables[k], one.tables[k], atol=1e-10, err_msg=k)
    print("SHARDED-OK")
    """
)


def test_sharded_over_four_forced_host_devices():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=str(root), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SHARDED], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SHARDED-OK" in out.stdout


def test_integer_and_list_layers_are_cast(grid):
    a, b, g = grid
    ints = np.round(4 * a["l1"]).astype(np.int32)
    got = compare_grid([ints, ints.tolist()], b, measures=["cka/linear", "stitch/orthogonal"])
    want = compare_grid([ints.astype(np.float64)] * 2, b, measures=["cka/linear", "stitch/orthogonal"])
    for k, t in want.tables.items():
        np.testing.assert_allclose(got.tables[k], t, atol=1e-10, err_msg=k)
