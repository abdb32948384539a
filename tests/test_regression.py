"""Directed linear-regression R^2 against NumPy least squares and the ridge normal equations."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funsim.similarity import linear_regression_r2


def ref_r2(x, y, ridge=0.0):
    xc, yc = x - x.mean(0), y - y.mean(0)
    if ridge == 0.0:
        w = np.linalg.lstsq(xc, yc, rcond=None)[0]
    else:
        w = np.linalg.solve(xc.T @ xc + ridge * np.eye(x.shape[1]), xc.T @ yc)
    return 1.0 - np.sum((yc - xc @ w) ** 2) / np.sum(yc**2)


def _data(kind, rng):
    if kind == "random":
        x = rng.normal(size=(20, 3))
        return x, np.tanh(x @ rng.normal(size=(3, 4))) + 0.3 * rng.normal(size=(20, 4))
    if kind == "collinear":  # duplicated and collinear predictors, offset
        x = rng.normal(size=(20, 3))
        x = np.c_[x, x[:, 0], 2 * x[:, 1] - x[:, 2]] + 3.0
        return x, x[:, :2] ** 2 + rng.normal(size=(20, 2))
    if kind == "wide":  # d > n: interpolates
        return rng.normal(size=(8, 12)), rng.normal(size=(8, 3))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "collinear", "wide"])
@pytest.mark.parametrize("ridge", [0.0, 0.5, 10.0])
def test_matches_reference(kind, ridge):
    x, y = _data(kind, np.random.default_rng(0))
    got = float(linear_regression_r2(x, y, ridge=ridge))
    assert got == pytest.approx(ref_r2(x, y, ridge), rel=1e-9, abs=1e-12)


def test_directed_and_wide_interpolates():
    x, y = _data("random", np.random.default_rng(1))
    assert abs(float(linear_regression_r2(x, y)) - float(linear_regression_r2(y, x))) > 1e-3
    x, y = _data("wide", np.random.default_rng(1))
    assert float(linear_regression_r2(x, y)) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_jit_vmap(dtype):
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(3, 16, 4)).astype(dtype)
    ys = (xs[..., :2] + rng.normal(size=(3, 16, 2))).astype(dtype)
    stack = np.array([float(linear_regression_r2(a, b)) for a, b in zip(xs, ys)])
    got = jax.jit(jax.vmap(linear_regression_r2))(xs, ys)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, stack, rtol=1e-5 if dtype == np.float32 else 1e-12)
    ref = [ref_r2(a.astype(float), b.astype(float)) for a, b in zip(xs, ys)]
    np.testing.assert_allclose(stack, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3), ridge=st.sampled_from([0.0, 1.0]))
def test_properties(seed, log_scale, ridge):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, 4)) * 10.0**log_scale
    y = rng.normal(size=(16, 4))
    v = float(linear_regression_r2(x, y, ridge=ridge))
    assert 0.0 <= v <= 1.0
    assert v == pytest.approx(ref_r2(x, y, ridge), rel=1e-8, abs=1e-12)


X8 = np.random.default_rng(9).normal(size=(8, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: linear_regression_r2(X8, X8[:6]), r"same number of samples.*\(8, 3\).*\(6, 3\)"),
        (lambda: linear_regression_r2(X8, X8[None]), r"y must be 2-D"),
        (lambda: linear_regression_r2(X8, np.ones((8, 2))), r"y of shape \(8, 2\) is constant"),
        (lambda: linear_regression_r2(np.ones((8, 2)), X8), r"x of shape \(8, 2\) is constant"),
        (lambda: linear_regression_r2(X8, X8, ridge=-1.0), r"ridge must be >= 0"),
        (lambda: linear_regression_r2(np.where(np.eye(8, 3) > 0, np.nan, X8), X8), r"contains 3 NaN"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_new_ridge_compiles_nothing():
    """The ridge is traced data: 0 and every positive value share one program (jax.monitoring)."""
    from funsim.runtime.compile_count import compiles

    rng = np.random.default_rng(14)
    x, y = rng.normal(size=(17, 3)), rng.normal(size=(17, 2))
    linear_regression_r2(x, y, ridge=0.5)
    for ridge in (0.0, 2.0):
        n, got = compiles(linear_regression_r2, x, y, ridge=ridge)
        assert n == 0, ridge
        assert float(got) == pytest.approx(ref_r2(x, y, ridge), rel=1e-9)
