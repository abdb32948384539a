"""Float options traced by the caller: ``jit``, ``vmap`` and ``grad`` over the option itself.

For every float option (CKA's ``rbf_scale``, ``rbf_gram``'s ``scale``, the regression and
stitching ``ridge``, the shape metric's ``alpha``, PWCCA's ``epsilon``, SVCCA's
``keep_variance``, the usable-information ``l2``): under ``jit`` and ``vmap`` the value equals
the eager call's; ``grad`` matches float64 central differences of the eager call (SVCCA's
``keep_variance`` only moves a mask: its derivative is 0 between the jumps); a traced value out
of range gives NaN with a NaN derivative, and a concrete one still raises eagerly with the
option's name. ``l2`` is fitted by an iterative optimiser: ``grad`` over it raises a clear
``TypeError``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity as S
from funsim.similarity import protocol
from funsim.similarity.stitching import stitch_core

N, D = 40, 5


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)) @ np.diag([2.0, 1.0, 0.8, 0.5, 0.3])
    y = np.tanh(x @ rng.normal(size=(D, 4))) + 0.3 * rng.normal(size=(N, 4))
    return x, y


X, Y = _data()

# (name, f(option) -> (), a regular value, a value out of range, the eager message's start)
OPTIONS = [
    ("cka rbf_scale", lambda s: S.cka(X, Y, kernel="rbf", rbf_scale=s), 0.7, -0.5, "rbf_scale must be"),
    ("cka rbf_scale debiased", lambda s: S.cka(X, Y, kernel="rbf", debiased=True, rbf_scale=s), 1.3, 0.0,
     "rbf_scale must be"),
    ("rbf_gram scale", lambda s: S.rbf_gram(X, scale=s)[0, 1], 0.7, 0.0, "scale must be"),
    ("regression ridge", lambda r: S.linear_regression_r2(X, Y, ridge=r), 0.3, -1.0, "ridge must be"),
    ("shape alpha", lambda a: S.shape_distance(X, Y, alpha=a), 0.4, 1.5, "alpha must be"),
    ("shape alpha euclidean", lambda a: S.shape_distance(X, Y, alpha=a, distance="euclidean"), 0.6, -0.1,
     "alpha must be"),
    ("pwcca epsilon", lambda e: S.pwcca(X, Y, epsilon=e), 0.02, 1.0, "epsilon must be"),
    ("svcca keep_variance", lambda k: S.svcca(X, Y, keep_variance=k), 0.9, 0.0, "keep_variance must be"),
    ("stitch ridge held-out", lambda r: S.reconstruction_score(X, Y, ridge=r).held_out, 0.05, -1.0,
     "ridge must be"),
    ("stitch ridge in-sample", lambda r: S.reconstruction_score(X, Y, ridge=r).in_sample, 0.05, -1.0,
     "ridge must be"),
    ("stitch_core ridge", lambda r: protocol.evaluate(stitch_core("affine", ridge=r), X, Y)[0], 0.05, -1.0,
     "ridge must be"),
    ("fit_stitcher ridge", lambda r: S.fit_stitcher(X, Y, ridge=r).weight[0, 0], 0.05, -1.0, "ridge must be"),
]
IDS = [o[0] for o in OPTIONS]


@pytest.mark.parametrize("name, f, value, bad, msg", OPTIONS, ids=IDS)
def test_jit_and_vmap_over_an_option_equal_the_eager_calls(name, f, value, bad, msg):
    del bad, msg
    values = np.array([value, value * 0.9])
    eager = np.array([float(f(v)) for v in values])
    assert np.all(np.isfinite(eager)), name
    np.testing.assert_allclose(float(jax.jit(f)(value)), eager[0], rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(jnp.asarray(values))), eager, rtol=1e-12, atol=1e-14,
                               err_msg=name)


@pytest.mark.parametrize("name, f, value, bad, msg", OPTIONS, ids=IDS)
def test_grad_over_an_option_matches_central_differences(name, f, value, bad, msg):
    del bad, msg
    ad = float(jax.grad(f)(value))

    def central(h):
        return (float(f(value + h)) - float(f(value - h))) / (2 * h)

    fd = (4.0 * central(1e-5) - central(2e-5)) / 3.0  # Richardson: O(h^4)
    assert np.isfinite(ad), name
    assert ad == pytest.approx(fd, rel=1e-6, abs=1e-9), (name, ad, fd)
    if "keep_variance" not in name:  # a mask's derivative is 0; every other option moves the value
        assert abs(ad) > 1e-8, (name, ad)


@pytest.mark.parametrize("name, f, value, bad, msg", [o for o in OPTIONS if o[3] is not None],
                         ids=[o[0] for o in OPTIONS if o[3] is not None])
def test_an_option_out_of_range_raises_eagerly_and_is_nan_traced(name, f, value, bad, msg):
    del value
    with pytest.raises(ValueError, match=msg):
        f(bad)
    assert np.isnan(float(jax.jit(f)(bad))), name
    out = np.asarray(jax.vmap(f)(jnp.asarray([bad, bad])))
    assert np.all(np.isnan(out)), name
    assert np.isnan(float(jax.grad(f)(bad))), name  # NaN, never a number such as 0


def test_a_traced_option_must_be_a_real_scalar():
    with pytest.raises(TypeError, match="rbf_scale must be a real scalar.*vmap over a vector"):
        jax.jit(lambda s: S.cka(X, Y, kernel="rbf", rbf_scale=s))(jnp.ones(2))


def test_a_concrete_array_option_is_checked_as_a_number():
    assert float(S.cka(X, Y, kernel="rbf", rbf_scale=jnp.asarray(0.7))) == float(
        S.cka(X, Y, kernel="rbf", rbf_scale=0.7))
    with pytest.raises(ValueError, match="rbf_scale must be a finite number > 0"):
        S.cka(X, Y, kernel="rbf", rbf_scale=jnp.asarray(-1.0))


def test_a_traced_ridge_with_too_few_rows_needs_ridge_above_zero():
    """Eagerly, ridge 0 with no more train rows than source features raises; a traced ridge defers
    that to the program: NaN at ridge 0, the eager value at ridge > 0."""
    x = np.random.default_rng(1).normal(size=(12, 8))
    y = x[:, :3] + 0.1
    with pytest.raises(ValueError, match="more fitting rows than source features"):
        S.reconstruction_score(x, y, ridge=0.0)
    f = jax.jit(lambda r: S.reconstruction_score(x, y, ridge=r))
    assert np.isnan(float(f(0.0).held_out)) and np.isnan(float(f(0.0).in_sample))
    want = S.reconstruction_score(x, y, ridge=0.1)
    got = f(0.1)
    np.testing.assert_allclose([float(got.held_out), float(got.in_sample)],
                               [float(want.held_out), float(want.in_sample)], rtol=1e-12)


def test_l2_traces_under_jit_and_vmap_and_refuses_grad_clearly():
    labels = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0).astype(int)

    def f(l2):
        return S.v_information(X, labels, l2=l2, max_iter=50).in_sample

    eager = [float(f(v)) for v in (1e-3, 1e-1)]
    np.testing.assert_allclose(float(jax.jit(f)(1e-3)), eager[0], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(jnp.asarray([1e-3, 1e-1]))), eager, rtol=1e-8)
    assert np.isnan(float(jax.jit(f)(-1.0)))
    with pytest.raises(ValueError, match="l2 must be a non-negative float"):
        f(-1.0)
    with pytest.raises(TypeError, match="l2 and tol can be traced .* but not differentiated"):
        jax.grad(f)(1e-3)
