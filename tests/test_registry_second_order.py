"""Registry-wide composition checks, over every registered measure that claims ``jax.grad``.

* Degenerate layers (a dead unit, a duplicated column, a constant side): one rule for all of
  them. Either the measure is defined there (no eager error, a finite value and a finite
  gradient, also under ``value_and_grad``) or it is not (the eager call raises, and under
  ``value_and_grad`` the value is NaN and every gradient entry is NaN): never a NaN value with a
  number for a gradient, never an exception inside a transformation, and a measure that declares
  itself robust to a degeneracy (``robust_to``) is defined on it.
* Second order (slow): at a generic point in float64 the Hessian in ``x`` is symmetric, its
  products with random directions match central differences of ``jax.grad``, and a measure
  invariant to ``x -> s x`` has ``H x = -grad f(x)`` (Euler's identity differentiated).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity as S

N, D = 24, 3
NAMES = [m for m in S.list_measures() if S.measure(m).differentiable]


def _generic():
    rng = np.random.default_rng(31)
    x = rng.normal(size=(N, D)) @ np.diag([1.5, 1.0, 0.6])
    y = np.tanh(x @ rng.normal(size=(D, 4))) + 0.3 * rng.normal(size=(N, 4))
    return x, y


def _dead(x):
    x = x.copy()
    x[:, 1] = 0.7
    return x


def _duplicated(x):
    x = x.copy()
    x[:, 2] = x[:, 0]
    return x


def _constant(x):
    return np.full_like(x, 1.5)


DEGENERATE = {"dead unit": (_dead, "rank_deficient"), "duplicated column": (_duplicated, "rank_deficient"),
              "constant side": (_constant, None)}


@pytest.mark.slow  # about 5 s a measure (three layers, eager and under value_and_grad, compiled)
@pytest.mark.parametrize("name", NAMES)
def test_degenerate_layers_follow_one_rule(name):
    for label in DEGENERATE:
        _check_rule(name, label)


def test_pwcca_epsilon_dead_unit_has_a_finite_gradient():
    """PWCCA with epsilon > 0 drops a dead unit: a finite value, and a gradient that matches central
    differences along directions that keep the unit dead (its variance stays below epsilon)."""
    _check_rule("pwcca/epsilon=1e-10", "dead unit")
    m = S.measure("pwcca/epsilon=1e-10")
    x, y = _generic()
    xd = DEGENERATE["dead unit"][0](x)
    dead = np.std(xd, axis=0) < 1e-12
    assert dead.sum() == 1
    gx, gy = (np.asarray(g) for g in jax.grad(m, argnums=(0, 1))(jnp.asarray(xd), jnp.asarray(y)))
    rng, h = np.random.default_rng(8), 1e-6
    for _ in range(3):
        dx, dy = rng.normal(size=xd.shape) * ~dead, rng.normal(size=y.shape)
        fd = (float(m(xd + h * dx, y + h * dy)) - float(m(xd - h * dx, y - h * dy))) / (2 * h)
        assert np.sum(gx * dx) + np.sum(gy * dy) == pytest.approx(fd, rel=1e-6, abs=1e-9)


def _check_rule(name, label):
    m = S.measure(name)
    x, y = _generic()
    make, degeneracy = DEGENERATE[label]
    xd = make(x)
    try:
        eager = float(m(xd, y))
        raised = False
    except ValueError:
        raised = True
    value, (gx, gy) = jax.value_and_grad(m, argnums=(0, 1))(jnp.asarray(xd), jnp.asarray(y))
    gx, gy = np.asarray(gx), np.asarray(gy)
    if raised:
        assert np.isnan(float(value)), (name, label, float(value))
        assert np.all(np.isnan(gx)) and np.all(np.isnan(gy)), (name, label)
    else:
        assert np.isfinite(eager) and float(value) == pytest.approx(eager, rel=1e-9, abs=1e-12), (name, label)
        assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gy)), (name, label)
    if degeneracy is not None and degeneracy in m.robust_to:
        assert not raised, (name, label, "declares robust_to", degeneracy)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_second_order_at_a_generic_point(name):
    m = S.measure(name)
    x, y = _generic()

    def f(a):
        return m(a, jnp.asarray(y))

    xj = jnp.asarray(x)
    grad = np.asarray(jax.grad(f)(xj)).ravel()
    hess = np.asarray(jax.hessian(f)(xj)).reshape(x.size, x.size)
    scale = np.max(np.abs(hess)) + 1e-12
    assert np.max(np.abs(hess - hess.T)) <= 1e-7 * scale, (name, np.max(np.abs(hess - hess.T)), scale)
    rng = np.random.default_rng(4)
    g = jax.grad(f)
    for _ in range(2):
        v = rng.normal(size=x.shape)
        h = 1e-4
        fd = (np.asarray(g(xj + h * v)) - np.asarray(g(xj - h * v))).ravel() / (2 * h)
        np.testing.assert_allclose(hess @ v.ravel(), fd, rtol=1e-4, atol=1e-5 * scale, err_msg=name)
    if "isotropic_scale" in m.invariances:
        np.testing.assert_allclose(hess @ x.ravel(), -grad, rtol=1e-5, atol=1e-6 * scale, err_msg=name)
