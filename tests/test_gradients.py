"""Gradients of every registered measure against central finite differences (float64).

One registry-driven audit: each measure in ``similarity.list_measures()`` (parametrised
families through their listed instances), so a measure is covered the moment it is
registered. A measure declared ``differentiable`` must match finite differences at a
generic point and at the degenerate points users hit (``y == x``, ``y = x Q`` with ``Q``
orthogonal, ``y = s x``), and its gradient must respect its declared invariances; one
declared not differentiable must raise a clear error under ``jax.grad``, never return
zeros.

The finite differences are central differences ``D(h)`` along a random direction in
``(x, y)``, extrapolated once. At a generic point ``D(h) = f' + O(h^2)`` and the Richardson
step ``(4 D(h/2) - D(h)) / 3`` leaves ``O(h^4)``; so it does at a degenerate point where
the measure is smooth (a score at its maximum). A distance of zero is a kink: the one-sided
derivatives along ``v`` and ``-v`` are equal and opposite, so ``D(h) -> 0`` (the documented
subgradient), but only as ``O(|h|)``; there the linear extrapolation ``2 D(h/2) - D(h)``
removes that term, with a larger step, since a distance near zero is computed from a
difference of sums of squares and rounded relative to those.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.similarity import list_measures, measure
from tests.invariance import random_orthogonal

NAMES = list_measures()
N, D = 16, 3


def _points():
    """``{label: (x, y)}``: one generic pair and the three degenerate ones, all ``(16, 3)``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)) @ np.diag([3.0, 1.5, 0.7]) + 1.0
    y = np.tanh(x @ rng.normal(size=(D, D))) + 0.3 * rng.normal(size=(N, D))
    q = random_orthogonal(D, rng)
    return {"generic": (x, y), "y == x": (x, x.copy()), "y = x Q": (x, x @ q), "y = s x": (x, 2.5 * x)}


POINTS = _points()


def _directional_fd(f, x, y, vx, vy, h, *, kink=False):
    def central(step):
        return (float(f(x + step * vx, y + step * vy)) - float(f(x - step * vx, y - step * vy))) / (2 * step)

    if kink:
        return 2.0 * central(h / 2) - central(h)
    return (4.0 * central(h / 2) - central(h)) / 3.0


def _grad(m, x, y):
    gx, gy = jax.grad(lambda a, b: m(a, b), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(y))
    return np.asarray(gx), np.asarray(gy)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_matches_finite_differences_or_raises(name):
    m = measure(name)
    rng = np.random.default_rng(1)
    if not m.differentiable:
        assert m.gradient, name
        x, y = POINTS["generic"]
        for argnums in (0, 1):
            with pytest.raises(ValueError, match="not differentiable"):
                jax.grad(lambda a, b: m(a, b), argnums=argnums)(jnp.asarray(x), jnp.asarray(y))
        return
    for label, (x, y) in POINTS.items():
        gx, gy = _grad(m, x, y)
        assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gy)), (name, label)
        for _ in range(2):
            vx, vy = rng.normal(size=x.shape), rng.normal(size=y.shape)
            ad = float(np.sum(gx * vx) + np.sum(gy * vy))
            if m.kind == "distance" and abs(float(m(x, y))) < 1e-6:  # a kink: O(h^2) left
                fd = _directional_fd(m, x, y, vx, vy, 1e-3, kink=True)
                assert ad == pytest.approx(fd, rel=1e-5, abs=2e-6), (name, label, ad, fd)
            else:
                fd = _directional_fd(m, x, y, vx, vy, 1e-4)
                assert ad == pytest.approx(fd, rel=1e-6, abs=2e-7), (name, label, ad, fd)
        if label == "generic":
            # invariances hold for the gradient too: Euler's identity for scale, zero row sums for
            # translation (the rbf bandwidth's median once broke the first)
            for g, z in ((gx, x), (gy, y)):
                if "isotropic_scale" in m.invariances:
                    assert abs(np.sum(g * z)) <= 1e-9 * np.abs(g).sum() * np.abs(z).max(), (name, np.sum(g * z))
                if "translation" in m.invariances:
                    np.testing.assert_allclose(g.sum(axis=0), 0.0, atol=1e-9 * max(1.0, np.abs(g).max()))


def test_every_measure_declares_its_gradient():
    for name in NAMES:
        m = measure(name)
        assert isinstance(m.differentiable, bool), name
        assert m.differentiable or m.gradient, name
    # the rank-based comparisons are the non-differentiable ones
    assert {n for n in NAMES if not measure(n).differentiable} == {
        n for n in NAMES if n.endswith(("/spearman", "/kendall"))
    }


def test_rbf_cka_gradient_is_scale_invariant():
    """The RBF bandwidth is 0.5 x the median distance, so CKA ignores the data's scale: its
    derivative along x itself is 0 (it was 0.39 when the median passed no gradient)."""
    x, y = POINTS["generic"]
    for debiased in (False, True):
        g = jax.grad(lambda s: similarity.cka(s * x, y, kernel="rbf", debiased=debiased))(1.0)
        assert abs(float(g)) < 1e-10, float(g)


def test_registering_a_nondifferentiable_measure_needs_a_reason():
    with pytest.raises(ValueError, match="declared not differentiable"):
        similarity.make_measure("tmp/ranks", similarity.nbs, kind="score", symmetric=True, invariances=(),
                                description="x", differentiable=False)


def test_stitcher_fit_and_task_loss_gradients():
    """The closed-form stitcher fit and the task-stitching loss, through jax.grad."""
    x, y = POINTS["generic"]
    rng = np.random.default_rng(2)
    vx = rng.normal(size=x.shape)

    def fit_loss(family):
        def f(a):
            s = similarity.fit_stitcher(a, y, family=family)
            return jnp.sum((similarity.apply_stitcher(s, a) - y) ** 2)

        return f

    for family in similarity.FAMILIES:
        f = fit_loss(family)
        ad = float(np.sum(np.asarray(jax.grad(f)(jnp.asarray(x))) * vx))
        fd = _directional_fd(lambda a, _: f(a), x, y, vx, np.zeros_like(y), 1e-4)
        assert ad == pytest.approx(fd, rel=1e-6, abs=1e-7), family

    labels = jnp.asarray(rng.integers(0, 3, N))
    head = rng.normal(size=(D, 3))
    stitcher = similarity.fit_stitcher(x, y, family="affine")

    def task(w):
        s = similarity.Stitcher(w, stitcher.bias, stitcher.scale, "affine")
        return similarity.stitching_loss(s, x, labels, _linear_head, jnp.asarray(head))

    w0 = np.asarray(stitcher.weight)
    vw = rng.normal(size=w0.shape)
    ad = float(np.sum(np.asarray(jax.grad(task)(jnp.asarray(w0))) * vw))
    fd = _directional_fd(lambda w, _: task(w), w0, y, vw, np.zeros_like(y), 1e-4)
    assert ad == pytest.approx(fd, rel=1e-6, abs=1e-8)


def _linear_head(params, h):
    return h @ params


def test_the_numerics_page_lists_every_measure_and_its_gradient():
    """docs/numerics.md's table is the registry: every listed measure, its flag and its note."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "numerics.md"
    rows = re.findall(r"^\| `([^`]+)` \| (yes|no) \| (.*) \|$", page.read_text(), flags=re.M)
    assert [r[0] for r in rows] == NAMES
    for name, flag, note in rows:
        m = measure(name)
        assert (flag == "yes") == m.differentiable, name
        assert note.strip() == m.gradient, name
