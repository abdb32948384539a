"""The paper code's conv score (similarity.spatial): a closed-form 1x1 map over spatial positions.

Against an independent float64 reference (explicit pooling loops with PyTorch's adaptive bins,
``np.linalg.lstsq`` with a bias column, SVD Procrustes on the zero-padded channels), its
special cases, its invariances, the nesting of the families, bad input, and the batched table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from funsim import similarity as sim
from funsim.runtime.compile_count import CompileCounter

FAMS = ("orthogonal", "scaled_orthogonal", "affine")


# ----------------------------------------------------------------------------- float64 reference


def ref_bins(n_in: int, n_out: int) -> list[tuple[int, int]]:
    """PyTorch's AdaptiveAvgPool bins: ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))``."""
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def ref_pool(x: np.ndarray, hy: int, wy: int) -> np.ndarray:
    n, hx, wx, c = x.shape
    out = np.zeros((n, hy, wy, c))
    for i, (h0, h1) in enumerate(ref_bins(hx, hy)):
        for j, (w0, w1) in enumerate(ref_bins(wx, wy)):
            out[:, i, j] = x[:, h0:h1, w0:w1].mean(axis=(1, 2))
    return out


def ref_rows_score(p: np.ndarray, y: np.ndarray, family: str) -> float:
    """Uncentred in-sample ``1 - ||Y - g(P)||^2 / ||Y||^2`` of rows ``p (N, Cx)``, ``y (N, Cy)``."""
    p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
    if family == "affine":
        a = np.hstack([p, np.ones((len(p), 1))])
        coef = np.linalg.lstsq(a, y, rcond=None)[0]
        sse = np.sum((y - a @ coef) ** 2)
    else:  # Procrustes on the channels zero-padded to D = max(Cx, Cy); the error in the padded space
        d = max(p.shape[1], y.shape[1])
        pp = np.hstack([p, np.zeros((len(p), d - p.shape[1]))])
        yp = np.hstack([y, np.zeros((len(y), d - y.shape[1]))])
        u, s, vt = np.linalg.svd(pp.T @ yp)
        q = u @ vt
        scale = 1.0 if family == "orthogonal" else s.sum() / np.sum(pp**2)
        sse = np.sum((yp - scale * pp @ q) ** 2)
    return 1.0 - sse / np.sum(y**2)


def ref_score(x: np.ndarray, y: np.ndarray, family: str) -> float:
    p = ref_pool(np.asarray(x, np.float64), *y.shape[1:3])
    return ref_rows_score(p.reshape(-1, p.shape[-1]), y.reshape(-1, y.shape[-1]), family)


def score(x, y, family, clip=False):
    return float(sim.spatial_reconstruction_score(x, y, family=family, clip=clip))


def maps(rng, n, hx, wx, cx, hy, wy, cy, *, related=True):
    """A source map and a target that depends on it (a nonlinear channel map of its pooled form, plus noise)."""
    x = rng.normal(size=(n, hx, wx, cx)) + 0.5
    if not related:
        return x, rng.normal(size=(n, hy, wy, cy)) + 0.3
    y = np.tanh(ref_pool(x, hy, wy) @ rng.normal(size=(cx, cy))) + 0.3 * rng.normal(size=(n, hy, wy, cy))
    return x, y


# ----------------------------------------------------------------------------- the pooling rule


def test_pooling_bins_are_pytorchs():
    """Hand-checked bins: 5 -> 3 overlaps ([0,2), [1,4), [3,5)); a smaller source (2 -> 3) repeats and averages."""
    assert ref_bins(5, 3) == [(0, 2), (1, 4), (3, 5)] and ref_bins(2, 3) == [(0, 1), (0, 2), (1, 2)]
    z = np.arange(5.0).reshape(1, 5, 1, 1)
    np.testing.assert_allclose(np.asarray(sim.resize_spatial(z, size=(3, 1)))[0, :, 0, 0], [0.5, 2.0, 3.5])
    z = np.arange(2.0).reshape(1, 2, 1, 1)
    np.testing.assert_allclose(np.asarray(sim.resize_spatial(z, size=(3, 1)))[0, :, 0, 0], [0.0, 0.5, 1.0])


# ----------------------------------------------------------------------------- the reference


SHAPES = [  # (n, Hx, Wx, Cx, Hy, Wy, Cy)
    (5, 4, 4, 3, 4, 4, 3),  # equal sizes: no pooling
    (4, 4, 6, 5, 2, 3, 2),  # integer ratios, Cx > Cy
    (4, 5, 3, 2, 3, 2, 4),  # non-divisible (overlapping bins), Cx < Cy
    (3, 2, 3, 3, 3, 5, 3),  # a smaller source: bins of one or two cells
    (3, 6, 2, 4, 4, 3, 3),  # larger in H, smaller in W
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("family", FAMS)
def test_matches_the_float64_reference(shape, family, tol):
    rng = np.random.default_rng(sum(shape))
    x, y = maps(rng, *shape)
    np.testing.assert_allclose(score(x, y, family), ref_score(x, y, family), rtol=0, atol=tol[np.dtype(np.float64)])


def test_clip_is_the_paper_codes():
    """Clipped to [0, 1] by default; the orthogonal family's raw value can be negative (a source much larger than
    the target), where the clipped one is 0."""
    rng = np.random.default_rng(1)
    x, y = maps(rng, 6, 3, 3, 3, 3, 3, 3, related=False)
    raw = score(10.0 * x, y, "orthogonal")
    assert raw < 0 and score(10.0 * x, y, "orthogonal", clip=True) == 0.0
    np.testing.assert_allclose(raw, ref_score(10.0 * x, y, "orthogonal"), atol=1e-10)


# ----------------------------------------------------------------------------- special cases


@pytest.mark.parametrize("family", FAMS)
def test_identical_maps_score_one(family):
    x, _ = maps(np.random.default_rng(2), 4, 3, 5, 4, 1, 1, 1)
    np.testing.assert_allclose(score(x, x, family), 1.0, atol=1e-12)


@pytest.mark.parametrize("family", FAMS)
def test_one_by_one_target_is_the_uncentred_score_of_pooled_features(family):
    """``Hy = Wy = 1``: the source pools to its spatial mean (``models.flatten``'s ``spatial_mean``), and the
    score is the ordinary uncentred score of the (n, C) features."""
    x, y = maps(np.random.default_rng(3), 12, 4, 3, 3, 1, 1, 2)
    pooled = x.mean(axis=(1, 2))
    np.testing.assert_allclose(score(x, y, family), ref_rows_score(pooled, y[:, 0, 0], family), atol=1e-10)


@pytest.mark.parametrize("family,cx,cy", [("orthogonal", 3, 5), ("scaled_orthogonal", 3, 5), ("affine", 5, 3),
                                          ("affine", 3, 5), ("orthogonal", 4, 4)])
def test_an_exact_map_of_the_pooled_source_scores_one(family, cx, cy):
    """The target is exactly the family's 1x1 map of the pooled source. For the orthogonal families that needs
    ``Cx <= Cy`` (``Q`` with orthonormal rows): with ``Cx > Cy`` the padded coordinates carry error."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 6, 4, cx)) + 1.0
    p = ref_pool(x, 3, 2)
    q = np.linalg.qr(rng.normal(size=(max(cx, cy), max(cx, cy))))[0][:cx, :cy]
    y = {"orthogonal": p @ q, "scaled_orthogonal": 2.5 * p @ q,
         "affine": p @ rng.normal(size=(cx, cy)) + rng.normal(size=cy)}[family]
    np.testing.assert_allclose(score(x, y, family), 1.0, atol=1e-10)


# ----------------------------------------------------------------------------- invariances


@pytest.mark.parametrize("family", FAMS)
def test_channel_rotation_of_the_source(family):
    rng = np.random.default_rng(5)
    x, y = maps(rng, 4, 4, 4, 3, 2, 3, 4)
    r = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    np.testing.assert_allclose(score(x @ r, y, family), score(x, y, family), atol=1e-10)


@pytest.mark.parametrize("family", ["scaled_orthogonal", "affine"])
def test_source_scaling(family):
    x, y = maps(np.random.default_rng(6), 4, 4, 2, 3, 2, 2, 2)
    np.testing.assert_allclose(score(7.0 * x, y, family), score(x, y, family), atol=1e-10)
    np.testing.assert_allclose(score(x, 0.01 * y, family), score(x, y, family), atol=1e-10)


def test_the_orthogonal_score_is_not_scale_invariant():
    x, y = maps(np.random.default_rng(6), 4, 4, 2, 3, 2, 2, 2)
    assert abs(score(3.0 * x, y, "orthogonal") - score(x, y, "orthogonal")) > 1e-3


@pytest.mark.parametrize("family", FAMS)
def test_channel_permutation_of_either_side(family):
    rng = np.random.default_rng(7)
    x, y = maps(rng, 4, 3, 3, 4, 3, 1, 3)
    base = score(x, y, family)
    np.testing.assert_allclose(score(x[..., rng.permutation(4)], y, family), base, atol=1e-10)
    np.testing.assert_allclose(score(x, y[..., rng.permutation(3)], family), base, atol=1e-10)


# ----------------------------------------------------------------------------- properties


@given(st.integers(1, 4), st.tuples(*[st.integers(1, 4)] * 6), st.integers(0, 2**16), st.booleans())
def test_at_most_one_and_nested_in_the_family(n, dims, seed, related):
    """Any sizes (a smaller, larger or equal source; one sample; one channel): every score is at most 1, the
    scaled-orthogonal and affine ones at least 0, and orthogonal <= scaled orthogonal <= affine."""
    hx, wx, cx, hy, wy, cy = dims
    x, y = maps(np.random.default_rng(seed), n, hx, wx, cx, hy, wy, cy, related=related)
    s = [score(x, y, f) for f in FAMS]
    assert max(s) <= 1 + 1e-9 and min(s[1:]) >= -1e-9
    assert s[0] <= s[1] + 1e-9 and s[1] <= s[2] + 1e-9, s
    np.testing.assert_allclose(s, [ref_score(x, y, f) for f in FAMS], atol=1e-8)


def test_jit_and_vmap():
    rng = np.random.default_rng(8)
    xs = rng.normal(size=(3, 4, 4, 4, 2)) + 0.2
    ys = rng.normal(size=(3, 4, 2, 2, 3))
    f = lambda a, b: sim.spatial_reconstruction_score(a, b, family="scaled_orthogonal")  # noqa: E731
    each = np.array([float(f(a, b)) for a, b in zip(xs, ys)])
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(xs, ys)), each, atol=1e-12)
    np.testing.assert_allclose(float(jax.jit(f)(xs[0], ys[0])), each[0], atol=1e-12)
    ys[1] = 0.0  # a zero target under vmap: NaN for that pair only (no exception can be raised there)
    out = np.asarray(jax.vmap(f)(xs, ys))
    assert np.isnan(out[1]) and np.allclose(out[[0, 2]], each[[0, 2]])


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_naming_the_argument():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(4, 3, 3, 2)), rng.normal(size=(4, 2, 2, 3))
    f = sim.spatial_reconstruction_score
    with pytest.raises(ValueError, match=r"y_map must be a conv map \(n, H, W, C\), got shape \(4, 12\)"):
        f(x, y.reshape(4, -1))
    with pytest.raises(ValueError, match=r"x_map must be a conv map.*\(4, 3, 3, 2, 1\)"):
        f(x[..., None], y)
    with pytest.raises(ValueError, match=r"x_map and y_map must have the same number of samples.*\(3, 2, 2, 3\)"):
        f(x, y[:3])
    with pytest.raises(ValueError, match=r"x_map has shape \(4, 0, 3, 2\)"):
        f(x[:, :0], y)
    bad = x.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"x_map of shape \(4, 3, 3, 2\) contains 1 NaN and 0 Inf"):
        f(bad, y)
    bad = y.copy()
    bad[1, 1, 1, 1] = np.inf
    with pytest.raises(ValueError, match=r"y_map of shape \(4, 2, 2, 3\) contains 0 NaN and 1 Inf"):
        f(x, bad)
    with pytest.raises(ValueError, match=r"y_map of shape \(4, 2, 2, 3\) is zero everywhere.*0/0"):
        f(x, np.zeros_like(y))
    with pytest.raises(ValueError, match="Unknown family 'procrustes'"):
        f(x, y, family="procrustes")
    with pytest.raises(TypeError, match="clip must be True or False"):
        f(x, y, clip=1)


def test_a_zero_or_constant_source_is_defined():
    """Only a zero target is undefined: a zero source scores 0 for the orthogonal families, and the affine fit
    predicts the target's mean (uncentred: ``n ||mean||^2 / ||Y||^2``)."""
    rng = np.random.default_rng(10)
    y = rng.normal(size=(5, 2, 2, 3)) + 1.0
    x = np.zeros((5, 3, 3, 2))
    assert score(x, y, "orthogonal") == 0.0 and score(x, y, "scaled_orthogonal") == 0.0
    rows = y.reshape(-1, 3)
    expect = len(rows) * np.sum(rows.mean(0) ** 2) / np.sum(rows**2)
    np.testing.assert_allclose(score(x + 3.0, y, "affine"), expect, atol=1e-12)


# ----------------------------------------------------------------------------- the table


def test_table_equals_the_pairwise_function_in_few_programs():
    """Sources and targets of three spatial sizes and several widths (padded and bucketed, with dummy rows):
    each entry equals the pairwise call, and the table compiles one program per target spatial size."""
    rng = np.random.default_rng(11)
    shapes = [(4, 4, 3), (4, 4, 5), (2, 2, 6), (2, 2, 2), (2, 2, 4), (1, 3, 3)]
    zs = [rng.normal(size=(5, *s)) + 0.3 * k for k, s in enumerate(shapes)]
    with CompileCounter() as c:
        t = sim.spatial_score_table(zs, zs[:5], families=FAMS, clip=False)
    assert sum("table_program" in n for n in c.names) == 2, c.names  # target sizes (4, 4) and (2, 2)
    for fam in FAMS:
        assert t[fam].shape == (6, 5)
        for i, x in enumerate(zs):
            for j, y in enumerate(zs[:5]):
                np.testing.assert_allclose(t[fam][i, j], score(x, y, fam), atol=1e-10, err_msg=f"{fam} {i}->{j}")
    clipped = sim.spatial_score_table(zs, zs[:5], families=("orthogonal",))["orthogonal"]
    np.testing.assert_array_equal(clipped, np.clip(t["orthogonal"], 0.0, 1.0))


def test_table_bad_input_names_the_map():
    rng = np.random.default_rng(12)
    zs = [rng.normal(size=(4, 2, 2, 2)), rng.normal(size=(4, 3, 3, 2))]
    bad = zs[1].copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"sources\[1\] of shape \(4, 3, 3, 2\) contains 1 NaN"):
        sim.spatial_score_table([zs[0], bad], zs)
    with pytest.raises(ValueError, match=r"targets\[0\] of shape \(4, 2, 2, 2\) is zero everywhere"):
        sim.spatial_score_table(zs, [np.zeros_like(zs[0])])
    with pytest.raises(ValueError, match=r"sources\[0\] and targets\[1\] must have the same number of samples"):
        sim.spatial_score_table(zs, [zs[0], zs[1][:3]])
    with pytest.raises(ValueError, match=r"targets\[0\] must be a conv map"):
        sim.spatial_score_table(zs, [zs[0].reshape(4, -1)])


# ----------------------------------------------------------------------------- float32


@pytest.mark.float32
@pytest.mark.skipif(jax.config.jax_enable_x64, reason="the float32 leg runs with x64 off (make test-f32)")
@pytest.mark.parametrize("family", FAMS)
def test_float32_against_the_float64_reference(family):
    """float32 maps (x64 off) against the float64 reference on the same rounded data: moments over 96 position
    rows with condition numbers near 10 lose a few float32 ulps, far below 1e-4."""
    x, y = maps(np.random.default_rng(13), 8, 4, 4, 3, 3, 4, 4)
    x, y = x.astype(np.float32), y.astype(np.float32)
    got = sim.spatial_reconstruction_score(jnp.asarray(x), jnp.asarray(y), family=family, clip=False)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), ref_score(x, y, family), atol=1e-4)
    t = sim.spatial_score_table([x], [y], families=(family,), clip=False)[family]
    np.testing.assert_allclose(t[0, 0], float(got), atol=1e-5)


@pytest.mark.parametrize("family", ["orthogonal", "scaled_orthogonal", "affine"])
def test_gradient_matches_central_differences_and_vanishes_at_identical_maps(family):
    """``jax.grad`` with respect to the source map against float64 central differences along a random
    direction (error O(eps^2) ~ 1e-12, so 1e-6 relative is far above it), at a generic pair and at
    ``x == y``, where the score is at its maximum 1 and the gradient must be 0 (not NaN)."""
    r = np.random.default_rng(7)
    x, y = r.normal(size=(6, 4, 4, 3)), r.normal(size=(6, 2, 2, 2))
    for a, b, generic in ((x, y, True), (x, x, False)):
        f = lambda z, b=b: sim.spatial_reconstruction_score(z, b, family=family, clip=False)  # noqa: E731
        g = np.asarray(jax.grad(f)(jnp.asarray(a)))
        assert np.all(np.isfinite(g))
        d, eps = r.normal(size=a.shape), 1e-6
        fd = (float(f(jnp.asarray(a + eps * d))) - float(f(jnp.asarray(a - eps * d)))) / (2 * eps)
        if generic:
            np.testing.assert_allclose(np.sum(g * d), fd, rtol=1e-6)
        else:
            np.testing.assert_allclose(float(f(jnp.asarray(a))), 1.0, atol=1e-12)
            assert np.max(np.abs(g)) < 1e-8 and abs(fd) < 1e-8
