"""Composition beyond first order (issue 29): second derivatives.

* RBF CKA's Hessian, against float64 references: central differences of ``jax.grad``, and
  second differences of an independent NumPy implementation (Kornblith et al.'s median
  heuristic). Its bandwidth is a median with a custom derivative rule, and that rule must
  itself be differentiable: when it was not, the Hessian was asymmetric and 50-100% off.
  The median-bandwidth RBF CKA is invariant to scaling the data, ``f(s x) = f(x)``, so
  ``d^2/ds^2 f(s x) = x . H x = 0`` at ``s = 1``, and differentiating Euler's identity
  ``x . grad f(x) = 0`` gives ``H x = -grad f(x)``.
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
