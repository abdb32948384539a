"""Composition beyond first order: second derivatives, NaN derivatives, tracers.

* RBF CKA's Hessian, against float64 references: central differences of ``jax.grad``, and
  second differences of an independent NumPy implementation (Kornblith et al.'s median
  heuristic). Its bandwidth is a median with a custom derivative rule, and that rule must
  itself be differentiable: when it was not, the Hessian was asymmetric and 50-100% off.
  The median-bandwidth RBF CKA is invariant to scaling the data, ``f(s x) = f(x)``, so
  ``d^2/ds^2 f(s x) = x . H x = 0`` at ``s = 1``, and differentiating Euler's identity
  ``x . grad f(x) = 0`` gives ``H x = -grad f(x)``.
* A NaN value (a measure undefined for its input, under a transformation) has NaN
  derivatives, along every entry of both inputs: never a number such as 0.
* ``compare_grid`` refuses tracers with a clear ``TypeError``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity

# ----------------------------------------------------------------- RBF CKA's Hessian

N, D = 12, 3


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)) @ np.diag([2.0, 1.0, 0.5]) + 0.5
    y = np.tanh(x @ rng.normal(size=(D, 4))) + 0.3 * rng.normal(size=(N, 4))
    return x, y


def _np_rbf_gram(x, scale=0.5):
    """Kornblith et al.'s ``gram_rbf``: the median over all n^2 squared distances, diagonal included."""
    g = x @ x.T
    sq = np.diag(g)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.exp(-d2 / (2.0 * scale**2 * np.median(d2)))


def _np_hsic(k, l, debiased):
    n = k.shape[0]
    if not debiased:
        h = np.eye(n) - 1.0 / n
        return np.trace(k @ h @ l @ h) / (n - 1) ** 2
    kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    one = np.ones(n)
    return (np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * (one @ kt @ lt @ one)) / (n * (n - 3))


def _np_rbf_cka(x, y, debiased):
    k, l = _np_rbf_gram(x), _np_rbf_gram(y)
    return _np_hsic(k, l, debiased) / np.sqrt(_np_hsic(k, k, debiased) * _np_hsic(l, l, debiased))


@pytest.mark.parametrize("debiased", [False, True])
def test_rbf_cka_hessian_is_right(debiased):
    x, y = _data()

    def f(a):
        return similarity.cka(a, jnp.asarray(y), kernel="rbf", debiased=debiased)

    assert float(f(x)) == pytest.approx(_np_rbf_cka(x, y, debiased), rel=1e-10)
    # the premise: the value does not change with the data's scale (so x . H x must be 0)
    for s in (0.5, 0.9, 1.1, 3.0):
        assert _np_rbf_cka(s * x, y, debiased) == pytest.approx(_np_rbf_cka(x, y, debiased), rel=1e-12)

    m = N * D
    hess = np.asarray(jax.jit(jax.hessian(f))(jnp.asarray(x))).reshape(m, m)
    grad = jax.jit(jax.grad(f))
    g = np.asarray(grad(jnp.asarray(x))).reshape(m)
    scale = np.abs(hess).max()
    assert scale > 1e-3  # a real curvature, not a vanishing one

    # symmetric (max |H - H^T| was 0.021 biased, 0.034 debiased, for max |H| of 0.06-0.1)
    assert np.abs(hess - hess.T).max() <= 1e-10 * scale

    # central differences of the gradient, column by column (it was 52% off biased, 101% debiased)
    h = 1e-5
    fd = np.empty((m, m))
    for i in range(m):
        e = np.zeros(m)
        e[i] = h
        fd[:, i] = (np.asarray(grad(jnp.asarray(x + e.reshape(N, D)))).reshape(m)
                    - np.asarray(grad(jnp.asarray(x - e.reshape(N, D)))).reshape(m)) / (2 * h)
    assert np.abs(hess - fd).max() <= 1e-6 * np.abs(fd).max()

    # bilinear forms against second differences of the NumPy reference alone
    rng = np.random.default_rng(1)
    h2 = 1e-4
    for _ in range(3):
        u, v = rng.normal(size=(2, N, D))
        ref = (_np_rbf_cka(x + h2 * u + h2 * v, y, debiased) - _np_rbf_cka(x + h2 * u - h2 * v, y, debiased)
               - _np_rbf_cka(x - h2 * u + h2 * v, y, debiased)
               + _np_rbf_cka(x - h2 * u - h2 * v, y, debiased)) / (4 * h2 * h2)
        got = u.reshape(m) @ hess @ v.reshape(m)
        assert got == pytest.approx(ref, abs=1e-5 * scale * np.abs(u).max() * np.abs(v).max() * m)

    # scale invariance, to second order: x . H x = 0 (it was 0.095 biased, 0.5 debiased), and H x = -grad f
    xf = x.reshape(m)
    assert abs(xf @ hess @ xf) <= 1e-10 * scale * (xf @ xf)
    np.testing.assert_allclose(hess @ xf, -g, atol=1e-10 * scale * np.abs(xf).max() * m)
    # translation invariance, to second order: moving every row alike changes no gradient
    np.testing.assert_allclose(hess.reshape(m, N, D).sum(axis=1), 0.0, atol=1e-10 * scale * N)


def test_rbf_cka_hessian_under_jit_and_vmap():
    """The Hessian is jit- and vmap-able: a batch of targets gives each target's own Hessian."""
    x, y = _data()
    ys = jnp.stack([jnp.asarray(y), jnp.asarray(np.cos(y))])
    hess = jax.hessian(lambda a, b: similarity.cka(a, b, kernel="rbf"))
    batched = np.asarray(jax.jit(jax.vmap(hess, in_axes=(None, 0)))(jnp.asarray(x), ys))
    for k in range(2):
        np.testing.assert_allclose(batched[k], np.asarray(hess(jnp.asarray(x), ys[k])), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------- NaN values, NaN derivatives

NR, DR = 20, 4


def _regular():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(NR, DR)) @ np.diag([2.0, 1.0, 0.7, 0.4])
    y = np.tanh(x @ rng.normal(size=(DR, 3))) + 0.3 * rng.normal(size=(NR, 3))
    return x, y


def _dead_unit(x):
    x = x.copy()
    x[:, 1] = 0.7
    return x


def _duplicated_column(x):
    x = x.copy()
    x[:, 2] = x[:, 0]
    return x


def _constant(x):
    return np.full_like(x, 1.5)


# (label, function, how x becomes degenerate); the first four once had an all-zero gradient. SVCCA and
# RSA of a constant layer have values that no longer depend on that layer's entries at all,
# so only the protocol's zero-valued probe carries NaN to them.
DEGENERATE = [
    ("pwcca, a dead unit", similarity.pwcca, _dead_unit),
    ("shape_distance alpha=0.5, a dead unit", lambda a, b: similarity.shape_distance(a, b, alpha=0.5), _dead_unit),
    ("cca_mean, a duplicated column", similarity.cca_mean, _duplicated_column),
    ("regression R^2, a constant predictor", similarity.linear_regression_r2, _constant),
    ("regression R^2, a constant target", lambda a, b: similarity.linear_regression_r2(b, a), _constant),
    ("svcca, a constant side", similarity.svcca, _constant),
    ("rsa euclidean/pearson, a constant side", similarity.measure("rsa/euclidean/pearson"), _constant),
]


@pytest.mark.parametrize("label, fn, degenerate", DEGENERATE, ids=[c[0] for c in DEGENERATE])
def test_a_nan_value_has_nan_derivatives(label, fn, degenerate):
    x, y = _regular()
    xd = degenerate(x)
    with pytest.raises(ValueError):  # eagerly, the pairwise call says why
        fn(xd, y)
    value, (gx, gy) = jax.value_and_grad(fn, argnums=(0, 1))(jnp.asarray(xd), jnp.asarray(y))
    assert np.isnan(float(value)), label
    assert np.all(np.isnan(np.asarray(gx))) and np.all(np.isnan(np.asarray(gy))), (label, gx, gy)
    # forward mode too, along a direction that does not touch the degenerate column
    v = np.zeros_like(xd)
    v[:, 0] = 1.0
    _, tangent = jax.jvp(fn, (jnp.asarray(xd), jnp.asarray(y)), (jnp.asarray(v), jnp.zeros_like(jnp.asarray(y))))
    assert np.isnan(float(tangent)), label


@pytest.mark.parametrize("label, fn, degenerate", DEGENERATE, ids=[c[0] for c in DEGENERATE])
def test_the_gradient_at_a_regular_point_matches_finite_differences(label, fn, degenerate):
    del degenerate
    x, y = _regular()
    gx, gy = jax.grad(fn, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(y))
    assert np.all(np.isfinite(np.asarray(gx))) and np.all(np.isfinite(np.asarray(gy))), label
    rng = np.random.default_rng(3)
    for _ in range(2):
        vx, vy = rng.normal(size=x.shape), rng.normal(size=y.shape)

        def central(h, vx=vx, vy=vy):
            return (float(fn(x + h * vx, y + h * vy)) - float(fn(x - h * vx, y - h * vy))) / (2 * h)

        fd = (4.0 * central(5e-5) - central(1e-4)) / 3.0  # Richardson: O(h^4)
        ad = float(np.sum(np.asarray(gx) * vx) + np.sum(np.asarray(gy) * vy))
        assert ad == pytest.approx(fd, rel=1e-6, abs=1e-8), (label, ad, fd)


def test_a_vector_of_nan_correlations_has_nan_jacobians():
    """cca returns every canonical correlation, a vector: each NaN entry has NaN derivatives, and at
    a regular point the Jacobian matches central differences."""
    x, y = _regular()
    jac = jax.jacobian(similarity.cca, argnums=(0, 1))
    jx, jy = jac(jnp.asarray(_duplicated_column(x)), jnp.asarray(y))
    assert np.all(np.isnan(np.asarray(jx))) and np.all(np.isnan(np.asarray(jy)))
    jx, _ = jac(jnp.asarray(x), jnp.asarray(y))
    v = np.random.default_rng(5).normal(size=x.shape)
    h = 1e-5
    fd = (np.asarray(similarity.cca(x + h * v, y)) - np.asarray(similarity.cca(x - h * v, y))) / (2 * h)
    np.testing.assert_allclose(np.einsum("kij,ij->k", np.asarray(jx), v), fd, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------- compare_grid


_X = np.random.default_rng(4).normal(size=(30, 3))
GRID_CALLS = [
    ("reps_a[0]", lambda: jax.jit(lambda a: similarity.compare_grid([a], [a]).tables["cka/linear"])(_X)),
    ("reps_a['x']", lambda: jax.grad(
        lambda a: similarity.compare_grid({"x": a}, measures="cka/linear").tables["cka/linear"].sum())(_X)),
    ("reps_b[0]", lambda: jax.jit(
        lambda a: similarity.compare_grid([_X], [a], measures="rsa/euclidean/pearson").tables["rsa/euclidean/pearson"]
    )(_X)),
    ("reps_a[0]", lambda: jax.vmap(
        lambda a: similarity.compare_grid([a], measures="cka/linear").tables["cka/linear"])(np.stack([_X, _X]))),
    ("reps_a", lambda: jax.jit(lambda a: similarity.compare_grid(a).tables["cka/linear"])(np.stack([_X, _X]))),
    ("key", lambda: jax.jit(lambda k: similarity.compare_grid([_X], key=k).tables["stitch/affine"])(jax.random.key(1))),
    ("split", lambda: jax.jit(
        lambda i: similarity.compare_grid([_X], split=(i, i + 15)).tables["stitch/affine"])(jnp.arange(15))),
]


@pytest.mark.parametrize("argument, call", GRID_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(GRID_CALLS)])
def test_compare_grid_refuses_tracers_clearly(argument, call):
    """Not a bare TracerArrayConversionError: a TypeError naming the traced argument and its shape,
    saying why (a host-level driver) and what to use instead (the per-pair measures)."""
    with pytest.raises(TypeError) as info:
        call()
    assert not isinstance(info.value, jax.errors.TracerArrayConversionError)
    msg = str(info.value)
    assert msg.startswith(f"compare_grid got a traced {argument} of shape ("), msg
    assert "host-level driver" in msg and "per-pair measures" in msg and "jax.vmap(similarity.measure(" in msg


def test_the_flag_returning_path_gives_the_message_inside_jit():
    """Inside ``jit`` the measure returns NaN; ``protocol.evaluate`` returns the flags beside it,
    and the core's ``reason`` turns them into the pairwise call's own message (the documented
    route in place of ``checkify``), for cca_mean and pwcca on rank-deficient input."""
    from funsim.similarity import protocol

    x, y = _regular()
    for name, degenerate in (("cca/mean", _duplicated_column), ("pwcca", _dead_unit)):
        core = similarity.measure(name).core
        xd = degenerate(x)
        with pytest.raises(ValueError) as eager:
            similarity.measure(name)(xd, y)
        value, flags = jax.jit(lambda a, b, core=core: protocol.evaluate(core, a, b))(xd, y)
        assert np.isnan(float(value)), name
        assert core.reason(jax.device_get(flags), xd.shape, y.shape, core.opts) == str(eager.value), name
