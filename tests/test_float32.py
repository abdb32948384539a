"""The default precision: float32 with x64 off, as a user gets it, against float64 references.

Run by ``make test-f32`` (``FUNSIM_TEST_X64=0``, ``-m float32``); with x64 on (every other
leg) the whole module skips itself. Each value computed here in float32 is compared with a
float64 NumPy/SciPy reference evaluated on the *same* float32-rounded data (cast to
float64), so the difference is the computation's rounding alone, and each test states the
tolerance it allows and why. The references are the ones the x64 suite uses (imported from
its modules); none of them calls funsim.

Covered: every registered measure (registry-driven: a newly registered measure fails here
until it has a reference), the comparison grid, closed-form stitching and a small task-loss
stitcher fit, tensor similarity, and the quickstart smoke run.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from tests._tensor_nets import deep, np_tree_inner
from tests.test_cca import ref_cca, ref_pwcca, ref_svcca
from tests.test_cka import ref_cka
from tests.test_regression import ref_r2
from tests.test_rsa import ref_rsa
from tests.test_shape import ref_nbs, ref_shape

pytestmark = [
    pytest.mark.float32,
    pytest.mark.skipif(jax.config.jax_enable_x64, reason="the float32 leg runs with x64 off (make test-f32)"),
]

F32 = np.float32
EPS32 = float(np.finfo(F32).eps)  # 1.19e-7


def pair_data(seed: int = 0, n: int = 48, d1: int = 5, d2: int = 4):
    """A related pair in float32: ``x`` with a spectrum spanning 10x, ``y`` a noisy nonlinear map of it.

    ``n = 48`` leaves each half of the stitching split (24 rows) well above the widths, and the
    covariances' condition numbers stay near 100, so every measure is well posed in float32.
    """
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.normal(size=(d1, d1)))[0]
    x = rng.normal(size=(n, d1)) * np.geomspace(3.0, 0.3, d1) @ q + 1.5
    y = np.tanh(x @ rng.normal(size=(d1, d2)) / 2) + 0.3 * rng.normal(size=(n, d2))
    return x.astype(F32), y.astype(F32)


# ------------------------------------------------------------------ float64 references by name


def _param(name: str, key: str, default: float) -> float:
    last = name.rsplit("/", 1)[-1]
    return float(last.split("=", 1)[1]) if last.startswith(key + "=") else default


def _stitch_ref(x, y, w_tr, w_te, family, ridge):
    """Held-out and in-sample reconstruction scores (``reconstruction_score``'s definition).

    Fit on the train rows, with train means and norms; held-out error over the test rows
    against the test target's variance around its own mean; the orthogonal families work
    in the zero-padded space.
    """
    tr, te = np.flatnonzero(w_tr), np.flatnonzero(w_te)
    mx, my = x[tr].mean(0), y[tr].mean(0)
    u = (x - mx) / np.linalg.norm(x[tr] - mx)
    v = (y - my) / np.linalg.norm(y[tr] - my)
    d = max(x.shape[1], y.shape[1])
    up = np.pad(u, ((0, 0), (0, d - x.shape[1])))
    vp = np.pad(v, ((0, 0), (0, d - y.shape[1])))
    if family == "affine":
        a = u[tr].T @ u[tr] + ridge * np.eye(x.shape[1])
        pred = np.pad(u @ np.linalg.solve(a, u[tr].T @ v[tr]), ((0, 0), (0, d - y.shape[1])))
    else:
        uu, _, vt = np.linalg.svd(up[tr].T @ vp[tr])
        q = uu @ vt  # argmin ||U Q - V||, Q orthogonal
        s = np.sum(vp[tr] * (up[tr] @ q)) / np.sum((up[tr] @ q) ** 2) if family == "scaled_orthogonal" else 1.0
        pred = s * up @ q
    held_out = 1 - ((vp[te] - pred[te]) ** 2).sum() / ((v[te] - v[te].mean(0)) ** 2).sum()
    in_sample = 1 - ((vp[tr] - pred[tr]) ** 2).sum() / (v[tr] ** 2).sum()
    return held_out, in_sample


def reference(name: str, x: np.ndarray, y: np.ndarray) -> float:
    """The float64 value of registered measure ``name`` on float64 arrays ``x``, ``y``."""
    parts = name.split("/")
    fam = parts[0]
    if fam == "cka":
        return ref_cka(x, y, parts[1], "debiased" in parts)
    if fam == "rsa":
        return ref_rsa(x, y, parts[1], parts[2])
    if name in ("cca/mean", "cca/r2"):
        rho, _ = ref_cca(x, y)
        return rho.mean() if name == "cca/mean" else (rho**2).mean()
    if name == "svcca":
        return ref_svcca(x, y)
    if fam == "pwcca":
        return ref_pwcca(x, y, _param(name, "epsilon", 0.0))
    if name == "nbs":
        return ref_nbs(x, y)
    if name == "procrustes":
        return 2 - 2 * ref_nbs(x, y)
    if fam == "shape":
        return ref_shape(x, y, _param(name, "alpha", math.nan), parts[1])
    if fam == "regression":
        return ref_r2(x, y, _param(name, "ridge", 0.0))
    if fam == "stitch":
        # the registered split (0.5, jax.random.key(0)) as row weights; the scores are the reference's
        try:
            from funsim.similarity.moments import split_weights
        except ImportError:  # before the moment types had their own module
            from funsim.similarity.stitching import split_weights

        w_tr, w_te = (np.asarray(w) for w in split_weights(x.shape[0], 0.5, None, jnp.float32))
        held, ins = _stitch_ref(x, y, w_tr, w_te, parts[1], _param(name, "ridge", 0.0))
        return ins if "in_sample" in parts else held
    raise KeyError(
        f"no float64 reference for the registered measure {name!r}: add one to tests/test_float32.py's "
        "reference() (the float32 leg covers every registered measure)."
    )


def float32_tolerance(name: str) -> float:
    """Absolute tolerance of measure ``name`` in float32 on :func:`pair_data`, and why.

    Rounding of a well-conditioned computation on data of unit size is a few ``eps`` (1.2e-7)
    per step: 5e-6 (~40 eps) for the measures built from Gram products, distances, ranks and
    SVDs of centred data (they sit within 6e-7 here). Measures that invert a covariance
    (CCA, SVCCA, PWCCA, whitened shape metrics, regression, the affine stitcher) can lose
    its condition number (~1e2 here) in relative accuracy: 5e-5. Ranks (Spearman, Kendall)
    are exact unless two float32 distances tie, which they do not here. A euclidean shape
    distance is in the data's units (~17 here), so its tolerance is relative.
    """
    fam = name.split("/")[0]
    whitening = fam in ("cca", "svcca", "pwcca", "regression") or name.startswith("stitch/affine") or (
        fam == "shape" and not name.endswith("alpha=1"))
    return 5e-5 if whitening else 5e-6


def _names():
    return similarity.list_measures()


@pytest.mark.parametrize("name", _names())
def test_every_registered_measure_matches_its_float64_reference(name):
    x, y = pair_data()
    got = similarity.measure(name)(x, y)
    assert got.dtype == jnp.float32 and got.shape == ()
    want = reference(name, x.astype(np.float64), y.astype(np.float64))
    tol = float32_tolerance(name)
    if name.startswith("shape/euclidean"):
        tol *= max(1.0, abs(want))
    assert np.isfinite(float(got)), name
    assert abs(float(got) - want) <= tol, (name, float(got), want, abs(float(got) - want), tol)


def test_every_registered_name_has_a_reference():
    """The registry-driven contract itself: listing a measure without a reference fails here."""
    x, y = (a.astype(np.float64) for a in pair_data(n=24))
    missing = []
    for name in similarity.list_measures():
        try:
            reference(name, x, y)
        except KeyError:
            missing.append(name)
    assert not missing, missing
    with pytest.raises(KeyError, match="no float64 reference"):
        reference("made/up", x, y)


# ------------------------------------------------------------------ the comparison grid


def grid_layers():
    """Three layers per model, widths 5/4/3, one of them far from the origin (a mean of 20 over a
    spread of ~1: the moment path must centre before it multiplies, or float32 cancels)."""
    x, y = pair_data(1)
    z, w = pair_data(2, d1=3, d2=5)
    a = {"a0": x, "a1": y + F32(20.0), "a2": z}
    b = {"b0": w, "b1": np.tanh(x[:, :4]).astype(F32), "b2": (z @ z.T[:3, :3] + y[:, :3]).astype(F32)}
    return a, b


#: every moment measure (streamable) and one generic measure per kind of per-layer statistic
GRID_MEASURES = list(similarity.MOMENT_MEASURES) + ["cka/rbf", "rsa/euclidean/spearman", "pwcca"]


def _grid_errors(g, a, b, names):
    """The worst error of each measure's table and reverse, in units of its float32 tolerance."""
    worst = {}
    for name in names:
        for table, flip in ((g.tables[name], False), (g.reverse[name], True)):
            assert table.dtype == jnp.float32
            for i, ka in enumerate(a):
                for j, kb in enumerate(b):
                    u, v = a[ka].astype(np.float64), b[kb].astype(np.float64)
                    want = reference(name, *((v, u) if flip else (u, v)))
                    tol = float32_tolerance(name) * (max(1.0, abs(want)) if name.startswith("shape/euclidean") else 1)
                    worst[name] = max(worst.get(name, 0.0), abs(float(table[i, j]) - want) / tol)
    return {k: v for k, v in worst.items() if not v <= 1.0}


def test_grid_matches_the_references_cell_by_cell():
    """Every cell and its reverse against the float64 reference; tolerances as for the measures.

    In memory, then streamed (``chunk_size``: only the moment measures can run). Their
    per-chunk sums are the float32 path most exposed to cancellation (the mean-20 layer).
    One test, so that both runs share one worker's compiled programs.
    """
    a, b = grid_layers()
    g = similarity.compare_grid(a, b, measures=GRID_MEASURES, reverse=True)
    assert not (bad := _grid_errors(g, a, b, GRID_MEASURES)), f"errors in units of the tolerance: {bad}"
    moments = list(similarity.MOMENT_MEASURES)
    g = similarity.compare_grid(a, b, measures=moments, reverse=True, chunk_size=16)
    assert not (bad := _grid_errors(g, a, b, moments)), f"streamed, errors in units of the tolerance: {bad}"


def test_grid_of_layers_wider_than_the_rows_matches_the_references():
    """Layers wider than the rows, which the grid compares in the rows' span (a QR of each layer), one
    of them far from the origin (a mean of 20: the rows are rotated before they are centred)."""
    r = np.random.default_rng(7)
    n = 24
    base = r.normal(size=(n, 3))
    a = {"w0": np.tanh(base @ r.normal(size=(3, 40))).astype(F32),
         "w1": (base @ r.normal(size=(3, 32)) + 0.1 * r.normal(size=(n, 32)) + 20.0).astype(F32)}
    b = {"w2": (base @ r.normal(size=(3, 50)) + 0.1 * r.normal(size=(n, 50))).astype(F32),
         "n0": r.normal(size=(n, 5)).astype(F32)}
    # the measures defined on every pair of these (the unregularised fits of wide sources are not)
    names = ["cka/linear", "nbs", "procrustes", "shape/angular/alpha=1", "shape/euclidean/alpha=1",
             "stitch/affine/ridge=0.001", "stitch/affine/in_sample/ridge=0.001"]
    g = similarity.compare_grid(a, b, measures=names, reverse=True)
    assert not (bad := _grid_errors(g, a, b, names)), f"errors in units of the tolerance: {bad}"


# ------------------------------------------------------------------ stitching


def _ref_stitch_predictions(x, y, family):
    """float64 least squares within the family, fitted on all rows, applied to ``x`` (raw units)."""
    if family == "affine":
        x1 = np.concatenate([x, np.ones((len(x), 1))], 1)
        return x1 @ np.linalg.lstsq(x1, y, rcond=None)[0]
    mx, my = x.mean(0), y.mean(0)
    nx, ny = np.linalg.norm(x - mx), np.linalg.norm(y - my)
    d = max(x.shape[1], y.shape[1])
    up = np.pad((x - mx) / nx, ((0, 0), (0, d - x.shape[1])))
    vp = np.pad((y - my) / ny, ((0, 0), (0, d - y.shape[1])))
    a, _, bt = np.linalg.svd(up.T @ vp)
    uq = up @ (a @ bt)
    s = np.sum(vp * uq) / np.sum(uq**2) if family == "scaled_orthogonal" else 1.0
    return my + ny * s * uq[:, : y.shape[1]]


@pytest.mark.parametrize("family", similarity.FAMILIES)
def test_closed_form_stitcher_matches_least_squares(family):
    """The fitted map, applied to the source, against float64 least squares within the family.

    Errors relative to the target's spread: 5e-6 (~40 eps) for the SVD-based orthogonal fits
    (they sit within 6e-7); 2e-5 for the affine normal equations (the source covariance's
    condition number, ~1e2, enters once through the Cholesky solve).
    """
    for x, y in (pair_data(3), pair_data(4)[::-1]):  # narrower and wider targets
        s = similarity.fit_stitcher(x, y, family=family)
        assert s.weight.dtype == jnp.float32
        got = np.asarray(similarity.apply_stitcher(s, x), np.float64)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        want = _ref_stitch_predictions(x64, y64, family)
        spread = np.linalg.norm(y64 - y64.mean(0))
        tol = 2e-5 if family == "affine" else 5e-6
        assert np.linalg.norm(got - want) / spread <= tol, (family, np.linalg.norm(got - want) / spread)


@pytest.mark.parametrize("family", similarity.FAMILIES)
def test_held_out_reconstruction_score_matches_least_squares(family):
    """``reconstruction_score`` with its default split (train and test rows, overlap check and
    all) in float32, against the float64 fit on the same train rows scored on the test rows.

    It once failed with x64 off only: the row-overlap check built a uint32 constant from a
    Python int, which JAX reads as int32 there. Tolerance as for the fit (1e-4 absolute on a
    score in [-1, 1], the score's denominator being the test rows' spread).
    """
    y, x = pair_data(3)  # a narrower source: the orthogonal families' padding adds no target columns
    idx = np.arange(x.shape[0])
    tr, te = idx[::2], idx[1::2]
    r = similarity.reconstruction_score(x, y, family=family, split=(tr, te))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    mx, my = x64[tr].mean(0), y64[tr].mean(0)
    if family == "affine":
        w, *_ = np.linalg.lstsq(x64[tr] - mx, y64[tr] - my, rcond=None)
        pred = (x64[te] - mx) @ w + my
    else:  # the fit of the train rows, applied to the test rows
        s = similarity.fit_stitcher(x[tr], y[tr], family=family)
        pred = np.asarray(similarity.apply_stitcher(s, x[te]), np.float64)
        assert np.allclose(np.asarray(similarity.apply_stitcher(s, x[tr]), np.float64),
                           _ref_stitch_predictions(x64[tr], y64[tr], family), atol=1e-4 * np.abs(y64).max())
    yc = y64[te] - y64[te].mean(0)
    want = 1 - np.sum((y64[te] - pred) ** 2) / np.sum(yc**2)  # residual about the fit, spread about the mean
    assert abs(float(r.held_out) - want) <= 1e-4, (family, float(r.held_out), want)


def test_task_loss_stitcher_fit_matches_plain_gradient_descent():
    """25 plain SGD steps of the affine stitcher on a linear head's mean cross-entropy, against the
    same steps written out in float64 NumPy (analytic gradient). Losses within 2e-6 relative and
    weights within 1e-5: float32 rounding of each step (~1e-7) compounds over 25 steps of a
    contraction (learning rate 0.3 on a loss with curvature below 1)."""
    rng = np.random.default_rng(7)
    z = rng.normal(size=(40, 5)).astype(F32)
    y = rng.integers(0, 3, 40)
    head = rng.normal(size=(4, 3)).astype(F32)
    s, hist = similarity.train_stitcher(z, jnp.asarray(y), _linear_head, jnp.asarray(head), family="affine",
                                        init="identity", target_shape=(4,), steps=25, eval_every=25,
                                        optimizer="sgd", learning_rate=0.3)
    assert s.weight.dtype == jnp.float32
    zz, hh = z.astype(np.float64), head.astype(np.float64)
    w, b = np.eye(5, 4), np.zeros(4)
    onehot = np.eye(3)[y]
    losses = []
    for _ in range(25):
        logits = (zz @ w + b) @ hh
        logits = logits - logits.max(1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        losses.append(-np.mean(np.log(p[np.arange(40), y])))
        dh = (p - onehot) @ hh.T / 40  # d loss / d (z W + b)
        w, b = w - 0.3 * zz.T @ dh, b - 0.3 * dh.sum(0)
    np.testing.assert_allclose(np.asarray(hist.train_loss, np.float64), losses, rtol=2e-6)
    np.testing.assert_allclose(np.asarray(s.weight, np.float64), w, atol=1e-5)
    np.testing.assert_allclose(np.asarray(s.bias, np.float64), b, atol=1e-5)


def _linear_head(w, h):
    return h @ w


# ------------------------------------------------------------------ tensor similarity


def _np_apply(net, x):
    """A multilinear network applied in float64 NumPy, from the layer definitions."""
    for layer in net:
        if isinstance(layer, similarity.LinearLayer):
            x = x @ np.asarray(layer.weight).T + (0 if layer.bias is None else np.asarray(layer.bias))
            continue
        lb = 0 if layer.left_bias is None else np.asarray(layer.left_bias)
        rb = 0 if layer.right_bias is None else np.asarray(layer.right_bias)
        db = 0 if layer.down_bias is None else np.asarray(layer.down_bias)
        h = (x @ np.asarray(layer.left).T + lb) * (x @ np.asarray(layer.right).T + rb)
        x = h @ np.asarray(layer.down).T + db + (x if layer.residual else 0)
    return x


def _np_gaussian_inner(a, b, d, order=6):
    """``E_x <f_a(x), f_b(x)>`` for ``x ~ N(0, I_d)`` by tensor Gauss-Hermite quadrature, exact for
    polynomials of degree < 2 ``order`` per coordinate (here degree <= 8 at depth 2)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(order)
    weights = weights / weights.sum()
    grid = np.stack(np.meshgrid(*[nodes] * d, indexing="ij"), -1).reshape(-1, d)
    w = np.prod(np.stack(np.meshgrid(*[weights] * d, indexing="ij"), -1).reshape(-1, d), 1)
    return float(w @ np.sum(_np_apply(a, grid) * _np_apply(b, grid), 1))


def _to32(net):
    return jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), net)


def test_tensor_similarity_matches_float64_references():
    """Depth 2 (embedding, two residual bilinear layers with biases, head), float32 weights.

    References in float64 from the layer definitions: tree tensors materialised in NumPy for the
    symmetric and Frobenius metrics, Gauss-Hermite quadrature of the network for the Gaussian one
    (exact: the networks are polynomials). The normalised similarities are within 5e-6 (they
    sit within 3e-7): the recursion is a chain of small contractions whose float32 rounding
    (~1e-7 each) adds up over the depth and the O(10) terms per contraction.
    """
    rng = np.random.default_rng(2)
    a = deep(rng, 2, [3, 4])
    b = deep(rng, 2, [4, 2])
    a, b = (jax.tree.map(lambda v: np.asarray(v, F32).astype(np.float64), n) for n in (a, b))  # float32-exact
    a32, b32 = _to32(a), _to32(b)
    for metric in ("symmetric", "frobenius"):
        sym = metric == "symmetric"
        want = np_tree_inner(a, b, symmetric=sym) / math.sqrt(
            np_tree_inner(a, a, symmetric=sym) * np_tree_inner(b, b, symmetric=sym))
        got = similarity.tensor_similarity(a32, b32, metric=metric)
        assert got.dtype == jnp.float32
        assert abs(float(got) - want) <= 5e-6, (metric, float(got), want)
    want = _np_gaussian_inner(a, b, 2) / math.sqrt(_np_gaussian_inner(a, a, 2) * _np_gaussian_inner(b, b, 2))
    got = similarity.tensor_similarity(a32, b32, metric="gaussian")
    assert got.dtype == jnp.float32
    assert abs(float(got) - want) <= 5e-6, ("gaussian", float(got), want)
    # the baselines: flattened-weight cosine (same architecture) and mean output cosine on probe inputs
    c = jax.tree.map(lambda v: np.asarray(v, F32).astype(np.float64), deep(rng, 2, [3, 4]))
    va = np.concatenate([np.ravel(v) for v in jax.tree.leaves(a)])
    vc = np.concatenate([np.ravel(v) for v in jax.tree.leaves(c)])
    got = float(similarity.weight_cosine(a32, _to32(c)))
    assert abs(got - va @ vc / np.linalg.norm(va) / np.linalg.norm(vc)) <= 1e-6
    probe = rng.normal(size=(9, 2)).astype(F32)
    ya, yb = _np_apply(a, probe.astype(np.float64)), _np_apply(b, probe.astype(np.float64))
    want = np.mean(np.sum(ya * yb, 1) / np.linalg.norm(ya, axis=1) / np.linalg.norm(yb, axis=1))
    assert abs(float(similarity.behavioural_similarity(a32, b32, probe)) - want) <= 1e-5


# ------------------------------------------------------------------ the quickstart smoke run


def test_quickstart_smoke_run_in_float32(tmp_path, capsys):
    """``funsim quickstart --tiny`` end to end in float32: it finishes and every number it reports is
    finite and inside its measure's bounds (self-comparisons at 1 within float32 rounding)."""
    from funsim.experiments import cli
    from funsim.experiments.quickstart import TINY

    rc = cli.main(["quickstart", "--tiny", "--no-progress", "--root", str(tmp_path), "--run", "f32"])
    assert rc == 0
    out = tmp_path / "quickstart" / "f32"
    m = json.loads((out / "metrics.json").read_text())
    for name in TINY.measures:
        arr = np.array(m["representational"]["mlp_seeds"][name], dtype=float)
        lo, hi = similarity.measure(name).bounds
        assert np.all(np.isfinite(arr)) and np.all((arr >= lo - 1e-5) & (arr <= hi + 1e-5)), (name, arr)
    for pair in ("mlp_seeds", "mlp_vs_bilinear"):
        fams = m["stitching"][pair]
        for fam in similarity.FAMILIES:
            v = np.concatenate([np.array(fams[fam][d], dtype=float).ravel() for d in ("a->b", "b->a")])
            assert np.all(v[np.isfinite(v)] <= 1 + 1e-5), (pair, fam, v)
            # a NaN cell is a held-out score the fitting rows leave open (a ReLU unit dead on them only),
            # and each is named with its reason; a ridge makes every affine cell a number
            assert int(np.isnan(v).sum()) == len(fams[fam]["undefined"]), (pair, fam, fams[fam]["undefined"])
            assert fam != "affine" or np.all(np.isfinite(v)), (pair, v)
    ts = m["tensor_similarity"]
    for metric, value in ts["seeds"].items():
        assert np.isfinite(value) and abs(value) <= 1 + 1e-5, (metric, value)
    for metric in ("symmetric", "gaussian"):
        arr = np.array(ts["checkpoints"][metric], dtype=float)
        assert np.all(np.isfinite(arr)) and np.all(np.abs(arr) <= 1 + 1e-5), (metric, arr)
        assert arr[-1] == pytest.approx(1.0, abs=1e-5)  # the final checkpoint against itself
    assert all(np.isfinite(v) for v in m["accuracy"].values())
    assert "[5/5] summary" in capsys.readouterr().out


# ------------------------------------------------------------------ the README's attention Monte Carlo


def _readme_attention_nets():
    """The README's two-layer example: attention-only BilinearTransformers, V=97, d=16, float32."""
    from flax import nnx

    from funsim import models

    return [models.BilinearTransformer(97, 16, d_model=16, n_layers=2, n_heads=2, d_head=4, mlp=False,
                                       rngs=nnx.Rngs(seed)).to_network() for seed in (0, 1)]


def _np_attention_logits(net, g):
    """``apply_attention_network`` written out in float64 NumPy: embed, causal bilinear attention, unembed."""
    w = jax.tree.map(lambda v: np.asarray(v, np.float64), net)
    x = np.einsum("ntv,vd->ntd", g, w.embed) + (0 if w.pos_embed is None else w.pos_embed[: g.shape[1]])
    causal = np.tril(np.ones((g.shape[1], g.shape[1]), bool))
    for lay in w.layers:
        p = lambda m: np.einsum("aed,ntd->nate", m, x)  # noqa: E731
        s = np.einsum("nate,nase->nats", p(lay.q1), p(lay.k1)) * np.einsum("nate,nase->nats", p(lay.q2), p(lay.k2))
        pattern = np.where(causal, s / lay.q1.shape[1] ** 2, 0.0)
        x = x + np.einsum("dae,nate->ntd", lay.o, np.einsum("nats,nase->nate", pattern, p(lay.v)))
    return np.einsum("od,ntd->nto", w.unembed, x)


def test_readme_two_layer_monte_carlo_is_finite_or_refused_with_the_fix():
    """At the authors' scale 1 the two-layer inner product (~4e46 in float64) exceeds float32's range: the
    estimator used to print ``nan nan``; it now refuses and names the fixes. At the one-hot-matched scale
    1/sqrt(V) it is finite and agrees with an independent float64 NumPy Monte Carlo (other draws) within
    5 combined standard errors."""
    a, b = _readme_attention_nets()
    with pytest.raises(ValueError, match=r"not finite in float32.*scale=V\*\*-0\.5.*jax_enable_x64"):
        similarity.attention_monte_carlo_inner(a, b, context=2, n_samples=20_000, key=jax.random.key(0))
    scale = 97**-0.5
    est, se = similarity.attention_monte_carlo_inner(a, b, context=2, n_samples=20_000, key=jax.random.key(0),
                                                     scale=scale)
    assert est.dtype == jnp.float32 and np.isfinite(float(est)) and float(se) > 0
    g = scale * np.random.default_rng(0).normal(size=(20_000, 2, 97))
    prods = np.einsum("ntv,ntv->n", _np_attention_logits(a, g), _np_attention_logits(b, g))
    ref, ref_se = prods.mean(), prods.std(ddof=1) / np.sqrt(len(prods))
    assert abs(float(est) - ref) <= 5 * math.hypot(float(se), ref_se), (float(est), float(se), ref, ref_se)


def test_exact_attention_similarity_refuses_an_inner_product_beyond_float32():
    """One layer has degree 5: at scale 1e6 the inner products (~1e60) overflow float32, where the
    normalised similarity used to come out as inf / inf = NaN."""
    rng = np.random.default_rng(0)
    lay = lambda: similarity.AttentionLayer(*(rng.normal(size=(1, 2, 3)).astype(F32) for _ in range(5)),  # noqa: E731
                                            rng.normal(size=(3, 1, 2)).astype(F32))
    a, b = (similarity.AttentionNetwork(rng.normal(size=(2, 3)).astype(F32), (lay(),), rng.normal(size=(2, 3)).astype(F32))
            for _ in range(2))
    assert np.isfinite(float(similarity.attention_similarity(a, b, context=2)))
    with pytest.raises(ValueError, match=r"not finite in float32.*scale=1e\+06.*jax_enable_x64"):
        similarity.attention_similarity(a, b, context=2, scale=1e6)


# ------------------------------------------------------------------ the README's examples, as users run them
def _readme_blocks():
    from tests.test_readme import README, python_blocks

    return [pytest.param(f"README.md:{line}", code, id=f"README.md:{line}")
            for line, code, marker in python_blocks(README.read_text()) if marker is None]


@pytest.mark.parametrize("where, code", _readme_blocks())
def test_readme_examples_run_with_x64_off(where, code, monkeypatch):
    """Each README example runs with x64 off, the default a user has, and every value it states
    (a number in a comment) holds at the digits shown. The x64 suite runs the same blocks in
    float64 (tests/test_readme.py); a crash that only float32 shows was once missed that way."""
    import warnings

    from tests.test_readme import ROOT, _run

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".* is float64 but JAX's x64 mode is off")  # NumPy input
        _run(code, where)


# ------------------------------------------------------------------ tensor similarity at extreme scales


def _bilinear_pair():
    from tests._tensor_nets import bilinear

    r = np.random.default_rng(8)
    a = (bilinear(r, 4, 5, 3),)
    b = (bilinear(r, 4, 5, 3),)
    return a, b


def _scaled(net, c):
    return jax.tree.map(lambda w: np.asarray(np.asarray(w, np.float64) * c, F32), net)


@pytest.mark.parametrize("c", [1e10, 1e-10, 1e5, 1e-5])
@pytest.mark.parametrize("metric", ["gaussian", "frobenius"])
def test_tensor_similarity_of_weights_far_from_one(c, metric):
    """A bias-free bilinear layer scaled by c computes c^3 times its function, and each metric's
    normalised inner product ignores such a factor: in float32 the raw inner products overflow
    (1e10: <a|a> ~ 1e60) or underflow (1e-10), and before, this said "the network is zero" (or
    returned 0.0 and inf at 1e5 and 1e-5). Against the float64 NumPy tree reference (frobenius) and
    the unscaled float32 value (gaussian, itself tested against references above)."""
    a, b = _bilinear_pair()
    got = float(similarity.tensor_similarity(_scaled(a, c), _scaled(b, c), metric=metric))
    if metric == "frobenius":
        def inner(p, q):
            return np_tree_inner(p, q, symmetric=False)

        want = inner(a, b) / math.sqrt(inner(a, a) * inner(b, b))
    else:
        want = float(similarity.tensor_similarity(_scaled(a, 1.0), _scaled(b, 1.0), metric=metric))
    assert got == pytest.approx(want, abs=2e-5), (c, metric, got, want)


def test_float64_tensor_weights_with_x64_off_warn_with_precision_warning(monkeypatch, recwarn):
    """float64 weights while x64 is off are computed in float32 with funsim's PrecisionWarning,
    not JAX's generic "explicitly requested dtype float64" UserWarning."""
    import warnings

    from funsim.similarity import _validate

    monkeypatch.setattr(_validate, "_warned_x64", False)
    a, b = _bilinear_pair()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = similarity.tensor_similarity(a, b)
    assert out.dtype == jnp.float32
    kinds = [w.category for w in caught]
    assert similarity.PrecisionWarning in kinds, [str(w.message) for w in caught]
    assert not [w for w in caught if "requested dtype" in str(w.message)], [str(w.message) for w in caught]


# ------------------------------------------------------------------ the docs' examples, in float32

def _doc_blocks():
    """Every python block of README.md and docs/*.md that tests/test_readme.py runs in the x64 leg,
    but those marked slow (they run under ``make test-slow``, with x64)."""
    from tests.test_readme import _params

    return [p for p in _params() if not p.marks]


@pytest.mark.parametrize("where, code", _doc_blocks())
def test_doc_block_runs_in_float32(where, code, monkeypatch):
    """The docs' examples in the users' default precision (x64 off), number comments included: a
    two-layer attention Monte Carlo example in docs/guide.md overflowed float32 while the x64 leg
    passed."""
    from tests.test_readme import ROOT, _run

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    _run(code, where)
