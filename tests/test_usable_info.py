"""V-information against float64 NumPy/scikit-learn references, and its properties.

Shapes are kept to a few fixed sizes (n=120, d in {2, 3, 5}, 3 classes) so that the
L-BFGS loop compiles only a handful of times.
"""

import jax
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

import funsim.similarity as sim
from funsim.similarity.usable_info import (
    conditional_v_information,
    pointwise_v_information,
    v_entropy,
    v_information,
)

N = 120
SPLIT = (np.arange(0, N, 2), np.arange(1, N, 2))  # deterministic, both halves hold every class


def _cls(seed=0, d=3, signal=1.5):
    r = np.random.default_rng(seed)
    z = r.normal(size=(N, d))
    logits = signal * z @ r.normal(size=(d, 3))
    y = np.array([r.choice(3, p=np.exp(l) / np.exp(l).sum()) for l in logits])
    return z, y


def _ent(y):
    p = np.bincount(y, minlength=3) / len(y)
    p = p[p > 0]
    return -(p * np.log(p)).sum()


# ------------------------------------------------------------------ references


@pytest.mark.parametrize("k", [1, 2])
def test_gaussian_linear_identity_and_held_out_reference(k):
    r = np.random.default_rng(1)
    z = r.normal(size=(N, 3))
    y = z @ r.normal(size=(3, k)) + r.normal(size=(N, k))
    yy = y[:, 0] if k == 1 else y
    got = v_information(z, yy, family="gaussian_linear", split=SPLIT)
    tr, te = SPLIT
    zc, yc = z[tr] - z[tr].mean(0), y[tr] - y[tr].mean(0)
    coef = np.linalg.lstsq(zc, yc, rcond=None)[0]
    sse, sst = ((yc - zc @ coef) ** 2).sum(), (yc**2).sum()
    r2 = 1 - sse / sst
    np.testing.assert_allclose(got.in_sample, -0.5 * k * np.log(1 - r2), atol=1e-10)
    # held-out: Gaussian NLL with train mean/coef/variance, evaluated on test rows
    def nll(pred, var):
        return np.mean(0.5 * k * np.log(2 * np.pi * var) + ((y[te] - pred) ** 2).sum(1) / (2 * var))
    pred1 = (z[te] - z[tr].mean(0)) @ coef + y[tr].mean(0)
    ref = nll(np.broadcast_to(y[tr].mean(0), y[te].shape), sst / (len(tr) * k)) - nll(pred1, sse / (len(tr) * k))
    np.testing.assert_allclose(got.held_out, ref, atol=1e-10)


def test_null_entropy_is_label_entropy():
    _, y = _cls()
    tr, te = SPLIT
    got = v_entropy(None, y, split=SPLIT)
    np.testing.assert_allclose(got.in_sample, _ent(y[tr]), atol=1e-12)
    p = np.bincount(y[tr], minlength=3) / len(tr)
    np.testing.assert_allclose(got.held_out, -np.log(p[y[te]]).mean(), atol=1e-12)


def test_linear_family_matches_sklearn_logistic_regression():
    z, y = _cls()
    tr, te = SPLIT
    l2 = 1e-2
    got = v_entropy(z, y, family="linear", split=SPLIT, l2=l2, tol=1e-9)
    # Same model on the whitened train features: sum CE + ||W||^2 / (2C), C = 1/(l2 n_tr).
    zc = z - z[tr].mean(0)
    chol = np.linalg.cholesky(np.cov(zc[tr].T, bias=True))
    h = np.linalg.solve(chol, zc.T).T
    lr = LogisticRegression(C=1.0 / (l2 * len(tr)), tol=1e-12, max_iter=10_000).fit(h[tr], y[tr])
    logp = lr.predict_log_proba(h)
    np.testing.assert_allclose(got.in_sample, -logp[tr, y[tr]].mean(), atol=1e-6)
    np.testing.assert_allclose(got.held_out, -logp[te, y[te]].mean(), atol=1e-6)


# ------------------------------------------------------------------ properties


def test_linear_invariant_to_invertible_linear_map():
    z, y = _cls()
    a = np.random.default_rng(5).normal(size=(3, 3)) + 3 * np.eye(3)
    r1 = v_information(z, y, split=SPLIT)
    r2 = v_information(z @ a + 7.0, y, split=SPLIT)
    np.testing.assert_allclose(r2.held_out, r1.held_out, atol=1e-6)
    np.testing.assert_allclose(r2.in_sample, r1.in_sample, atol=1e-6)
    # declared non-invariance: a non-invertible (rank-dropping) map loses information
    drop = np.diag([1.0, 1.0, 0.0]) + np.eye(3)[:, [0]] @ np.ones((1, 3)) * 0
    zd = z @ drop
    zd[:, 2] = np.random.default_rng(9).normal(size=N)  # replace the lost column with noise
    assert float(v_information(zd, y, split=SPLIT).in_sample) < float(r1.in_sample) - 0.01


def test_independent_noise_has_no_held_out_information():
    _, y = _cls()
    noise = np.random.default_rng(7).normal(size=(N, 3))
    r = v_information(noise, y, split=SPLIT)
    # held out, pure noise carries no usable information (the estimate is slightly
    # negative from overfitting 12 parameters on 60 rows); in-sample it looks positive
    assert -0.1 < float(r.held_out) < 0.01
    assert float(r.in_sample) > 0.01
    _, y2 = _cls(signal=3.0)
    assert float(v_information(_cls(signal=3.0)[0], y2, split=SPLIT).held_out) > 0.3


def test_joint_dominates_singles_and_chain_rule():
    z, y = _cls(d=5)
    z1, z2 = z[:, :2], z[:, 2:]
    joint = v_information(z, y, split=SPLIT)
    i1 = v_information(z1, y, split=SPLIT)
    i2 = v_information(z2, y, split=SPLIT)
    assert float(joint.in_sample) >= max(float(i1.in_sample), float(i2.in_sample)) - 1e-6
    cond = conditional_v_information(z1, z2, y, split=SPLIT)
    # chain rule, exact by definition: I(Z1 Z2) = I(Z2) + I(Z1 | Z2), here with Z1 first
    joint12 = v_information(np.concatenate([z1, z2], 1), y, split=SPLIT)
    np.testing.assert_allclose(cond.in_sample + i2.in_sample, joint12.in_sample, atol=1e-6)
    np.testing.assert_allclose(cond.held_out + i2.held_out, joint12.held_out, atol=1e-6)


def test_nested_families_are_monotone_in_sample():
    z, y = _cls(signal=0.7)
    lin = v_entropy(z, y, family="linear", split=SPLIT, l2=1e-4)
    mlp = v_entropy(z, y, family="mlp", split=SPLIT, l2=1e-4, hidden=8, max_iter=200)
    assert float(mlp.in_sample) <= float(lin.in_sample) + 1e-3
    assert float(mlp.in_sample) < float(lin.in_sample) - 1e-3  # the MLP does fit more


def test_pointwise_mean_is_v_information():
    z, y = _cls()
    pvi = pointwise_v_information(z, y, split=SPLIT)
    vi = v_information(z, y, split=SPLIT)
    te = ~np.asarray(pvi.is_train)
    np.testing.assert_array_equal(np.flatnonzero(te), SPLIT[1])
    np.testing.assert_allclose(np.asarray(pvi.values)[te].mean(), vi.held_out, atol=1e-10)
    np.testing.assert_allclose(np.asarray(pvi.values)[~te].mean(), vi.in_sample, atol=1e-10)


def test_jit_and_vmap_match_eager():
    r = np.random.default_rng(3)
    z = r.normal(size=(N, 3))
    y = z[:, 0] + r.normal(size=N)
    key = jax.random.key(2)
    f = lambda a, b: v_information(a, b, family="gaussian_linear", key=key)  # noqa: E731
    np.testing.assert_allclose(jax.jit(f)(z, y).held_out, f(z, y).held_out, atol=1e-10)
    zs, ys = np.stack([z, -z]), np.stack([y, 2 * y])
    np.testing.assert_allclose(
        jax.vmap(f)(zs, ys).held_out, [f(a, b).held_out for a, b in zip(zs, ys)], atol=1e-10
    )
    assert sim.v_information is v_information


# ------------------------------------------------------------------ bad input


def test_bad_input():
    z, y = _cls()
    with pytest.raises(ValueError, match="integer dtype"):
        v_information(z, y.astype(float))
    with pytest.raises(ValueError, match="outside"):
        v_information(z, y, n_classes=2)
    with pytest.raises(ValueError, match="same number of samples"):
        v_information(z[:10], y)
    bad = z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        v_information(bad, y)
    with pytest.raises(ValueError, match="Unknown family.*linear"):
        v_entropy(z, y, family="linera")
    with pytest.raises(ValueError, match="more train rows than features"):
        v_information(np.random.default_rng(0).normal(size=(N, 70)), y)
    with pytest.raises(ValueError, match="at least 2 rows"):
        v_information(z, y, split=0.01)
    y_missing = y.copy()
    y_missing[SPLIT[0]] = np.where(y[SPLIT[0]] == 2, 0, y[SPLIT[0]])
    y_missing[1] = 2
    with pytest.raises(ValueError, match="not in the train rows"):
        v_information(z, y_missing, split=SPLIT)
    with pytest.raises(ValueError, match="max_iter"):
        v_information(z, y, max_iter=0)


def test_new_l2_and_tol_compile_nothing():
    """l2 and tol are traced data (counted through jax.monitoring): a new penalty reuses the
    program and still matches scikit-learn's logistic regression with that penalty."""
    from funsim.runtime.compile_count import compiles

    z, y = _cls(seed=3)
    tr, te = SPLIT
    v_entropy(z, y, family="linear", split=SPLIT, l2=1e-2, tol=1e-9)
    n, got = compiles(v_entropy, z, y, family="linear", split=SPLIT, l2=0.1, tol=1e-10)
    assert n == 0
    zc = z - z[tr].mean(0)
    h = np.linalg.solve(np.linalg.cholesky(np.cov(zc[tr].T, bias=True)), zc.T).T
    lr = LogisticRegression(C=1.0 / (0.1 * len(tr)), tol=1e-12, max_iter=10_000).fit(h[tr], y[tr])
    logp = lr.predict_log_proba(h)
    np.testing.assert_allclose(got.held_out, -logp[te, y[te]].mean(), atol=1e-6)


def test_docstrings_are_as_written_in_the_source():
    """No docstring is patched at import: each public function's help is the text in its source, and every
    keyword option of the V-information functions is documented there (directly or by reference)."""
    import ast
    import inspect

    for name in dir(sim):
        f = inspect.unwrap(getattr(sim, name))
        if name.startswith("_") or not inspect.isfunction(f):
            continue
        tree = ast.parse(inspect.getsource(inspect.getmodule(f)))
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f.__name__), None)
        if node is None:  # not defined at module level under its own name (e.g. made by a factory)
            continue
        assert inspect.cleandoc(f.__doc__ or "") == (ast.get_docstring(node) or ""), name
    for f in (sim.v_entropy, sim.v_information, sim.conditional_v_information, sim.pointwise_v_information):
        options = [p.name for p in inspect.signature(f).parameters.values() if p.kind is p.KEYWORD_ONLY]
        args = f.__doc__.split("Args:")[1].split("Returns:")[0]
        assert all(o in args for o in options), (f.__name__, [o for o in options if o not in args])
        assert "COMMON" not in f.__doc__
