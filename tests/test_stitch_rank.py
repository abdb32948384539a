"""One rule for rank deficiency in every stitching family, at ridge 0 and ridge > 0.

The rule: a fit that is not unique (a rank-deficient train source at ridge 0, or any orthogonal
fit whose train cross moment is rank-deficient) gives a score exactly where the score does not
depend on the choice, and is undefined (a ``ValueError`` eagerly, NaN with NaN derivatives under
a transformation) where it does. The affine fit at ridge 0 is the minimum-norm least-squares fit.

* A dead unit or an exactly duplicated column (on every row) leaves every score determined: a
  number, eagerly, under ``jit`` and under ``value_and_grad`` (finite gradients), for every
  family and ridge. The affine score at ridge 0 equals NumPy's minimum-norm ``lstsq`` on the
  train rows (an independent float64 reference), and with a dead unit it equals the score with
  that unit dropped, at any ridge.
* A unit that is constant on the train rows but varies on the held-out rows leaves the held-out
  score to the arbitrary choice: undefined for the orthogonal families and the affine family at
  ridge 0; the ridge makes the affine fit unique, so it is a number there.
* Constant train rows of a whole side, under ``value_and_grad``: NaN and NaN gradients, not an
  exception (before, the affine family raised there).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity as S

N, D = 40, 5
TRAIN, TEST = np.arange(0, N, 2), np.arange(1, N, 2)
SPLIT = (TRAIN, TEST)
CASES = [("affine", 0.0), ("affine", 1e-3), ("orthogonal", 0.0), ("scaled_orthogonal", 0.0)]
IDS = [f"{f}-ridge={r:g}" for f, r in CASES]


def _data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, D)) @ np.diag([2.0, 1.0, 0.8, 0.6, 0.4])
    y = np.tanh(x @ rng.normal(size=(D, 6))) + 0.2 * rng.normal(size=(N, 6))  # wider than x: an orthogonal
    # fit of a rank-deficient source is then not unique
    return x, y


def _dead(x):
    x = x.copy()
    x[:, 2] = 0.7
    return x


def _duplicated(x):
    x = x.copy()
    x[:, 2] = x[:, 1]
    return x


def _train_constant_unit(x):
    x = x.copy()
    x[TRAIN, 2] = 0.7  # varies on the held-out rows only
    return x


def _score(x, y, family, ridge):
    return S.reconstruction_score(x, y, family=family, ridge=ridge, split=SPLIT).held_out


def _np_affine_held_out(x, y, ridge):
    """Held-out R^2 of the affine fit on the train rows, in NumPy float64: minimum-norm least
    squares (``lstsq``) at ridge 0, else the ridge in units of the Frobenius-normalised sides."""
    xt, yt = x[TRAIN], y[TRAIN]
    mx, my = xt.mean(0), yt.mean(0)
    u, v = xt - mx, yt - my
    nx, ny = np.linalg.norm(u), np.linalg.norm(v)
    u, v = u / nx, v / ny
    if ridge == 0:
        w = np.linalg.lstsq(u, v, rcond=None)[0]
    else:
        w = np.linalg.solve(u.T @ u + ridge * np.eye(u.shape[1]), u.T @ v)
    pred = ((x[TEST] - mx) / nx) @ w * ny + my
    resid = y[TEST] - pred
    return 1.0 - np.sum(resid**2) / np.sum((y[TEST] - y[TEST].mean(0)) ** 2)


@pytest.mark.parametrize("family, ridge", CASES, ids=IDS)
@pytest.mark.parametrize("degenerate", [_dead, _duplicated], ids=["dead unit", "duplicated column"])
def test_dead_units_and_duplicated_columns_give_numbers(family, ridge, degenerate):
    x, y = _data()
    xd = degenerate(x)
    eager = float(_score(xd, y, family, ridge))
    assert np.isfinite(eager)
    jitted = float(jax.jit(lambda a: _score(a, y, family, ridge))(xd))
    assert jitted == pytest.approx(eager, rel=1e-12)
    value, grad = jax.value_and_grad(lambda a: _score(a, y, family, ridge))(jnp.asarray(xd))
    assert float(value) == pytest.approx(eager, rel=1e-12)
    assert np.all(np.isfinite(np.asarray(grad)))
    if family == "affine":
        assert eager == pytest.approx(_np_affine_held_out(xd, y, ridge), rel=1e-9, abs=1e-12)
    if degenerate is _dead:  # a dead unit carries nothing: the score without it
        assert eager == pytest.approx(float(_score(np.delete(xd, 2, axis=1), y, family, ridge)), rel=1e-9)


@pytest.mark.parametrize("family, ridge", CASES, ids=IDS)
def test_a_unit_constant_on_the_train_rows_only(family, ridge):
    x, y = _data()
    xd = _train_constant_unit(x)
    f = lambda a: _score(a, y, family, ridge)  # noqa: E731
    if family == "affine" and ridge > 0:  # unique fit: a number, NumPy's
        assert float(f(xd)) == pytest.approx(_np_affine_held_out(xd, y, ridge), rel=1e-9)
        return
    with pytest.raises(ValueError, match="not determined by the train rows"):
        f(xd)
    assert np.isnan(float(jax.jit(f)(xd)))
    value, grad = jax.value_and_grad(f)(jnp.asarray(xd))
    assert np.isnan(float(value)) and np.all(np.isnan(np.asarray(grad)))
    # the in-sample score never depends on the choice (the pairwise call raises for the held-out one)
    both = jax.jit(lambda a: S.reconstruction_score(a, y, family=family, ridge=ridge, split=SPLIT))(xd)
    assert np.isnan(float(both.held_out)) and np.isfinite(float(both.in_sample))


@pytest.mark.parametrize("ridge", [0.0, 1e-3])
@pytest.mark.parametrize("which", ["held_out", "in_sample"])
def test_constant_train_rows_under_value_and_grad_are_nan_not_an_exception(ridge, which):
    x, y = _data()
    xc = x.copy()
    xc[TRAIN] = 1.5

    def f(a, b):
        return getattr(S.reconstruction_score(a, b, ridge=ridge, split=SPLIT), which)

    with pytest.raises(ValueError, match="constant"):
        f(xc, y)
    value, (gx, gy) = jax.value_and_grad(f, argnums=(0, 1))(jnp.asarray(xc), jnp.asarray(y))
    assert np.isnan(float(value))
    assert np.all(np.isnan(np.asarray(gx))) and np.all(np.isnan(np.asarray(gy)))


def test_the_registry_and_the_grid_follow_the_rule():
    """The registered measures (default split) and a grid cell agree with the pairwise rule."""
    x, y = _data()
    xd = _duplicated(x)
    for name in ("stitch/affine", "stitch/affine/ridge=0.001", "stitch/orthogonal"):
        pair = float(S.measure(name)(xd, y))
        assert np.isfinite(pair), name
        grid = S.compare_grid([xd], [y], measures=[name])
        assert float(np.asarray(grid.tables[name])[0, 0]) == pytest.approx(pair, rel=1e-8, abs=1e-10), name
