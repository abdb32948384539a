"""Monte Carlo and Gauss–Hermite estimators (similarity.estimators) against known Gaussian moments.

References: ``E[x^(2k)] = (2k-1)!!`` for ``x ~ N(0, 1)`` (textbook values) and
independence across coordinates; Monte Carlo against quadrature within 4 SE.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from funsim.similarity import BilinearLayer, LinearLayer, monte_carlo_inner, quadrature_inner
from tests._tensor_nets import bilinear, deep

SQUARE = BilinearLayer(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)))  # x -> x^2


def test_quadrature_reproduces_gaussian_moments():
    assert float(quadrature_inner(SQUARE, SQUARE)) == pytest.approx(3.0, rel=1e-13)  # E x^4
    x4 = (SQUARE, SQUARE)  # x -> x^4, depth 2: E[x^8] = 105
    assert float(quadrature_inner(x4, x4)) == pytest.approx(105.0, rel=1e-13)
    x8 = (SQUARE, SQUARE, SQUARE)  # depth 3: E[x^16] = 15!! = 2027025
    assert float(quadrature_inner(x8, x8)) == pytest.approx(2027025.0, rel=1e-12)
    # x1 * x2 + 1 against x1 * x2 + x3: E = E[x1^2 x2^2] = 1
    a = BilinearLayer(np.array([[1.0, 0, 0]]), np.array([[0, 1.0, 0]]), np.ones((1, 1)),
                      down_bias=np.ones(1))
    b = (a, LinearLayer(np.ones((1, 1))))
    assert float(quadrature_inner(a, b)) == pytest.approx(2.0, rel=1e-13)  # 1 + 1 * 1


def test_quadrature_outputs_slice():
    rng = np.random.default_rng(0)
    a, b = deep(rng, 2, [2]), deep(rng, 2, [3])
    full = quadrature_inner(a, b)
    parts = [quadrature_inner(a, b, outputs=[i]) for i in range(2)]
    assert float(full) == pytest.approx(float(sum(parts)), rel=1e-12)


@pytest.mark.parametrize("depth", [1, 2])
def test_monte_carlo_agrees_with_quadrature(depth):
    rng = np.random.default_rng(1)
    a = deep(rng, 2, [3] * depth)
    b = deep(rng, 2, [2] * depth)
    exact = float(quadrature_inner(a, b))
    est, se = monte_carlo_inner(a, b, n_samples=50_000, key=jax.random.key(1), chunk=4096)
    assert 0 < float(se) < abs(exact)
    assert abs(float(est) - exact) < 4 * float(se)


def test_monte_carlo_standard_error_scales_as_one_over_sqrt_n():
    _, se1 = monte_carlo_inner(SQUARE, SQUARE, n_samples=4_000, key=jax.random.key(2))
    _, se4 = monte_carlo_inner(SQUARE, SQUARE, n_samples=64_000, key=jax.random.key(3))
    assert float(se1) / float(se4) == pytest.approx(4.0, rel=0.25)
    # Var[x^4] = E x^8 - (E x^4)^2 = 105 - 9 = 96
    assert float(se4) == pytest.approx(np.sqrt(96 / 64_000), rel=0.15)


def test_validator_errors():
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="n_samples must be an int >= 2"):
        monte_carlo_inner(SQUARE, SQUARE, n_samples=1, key=jax.random.key(0))
    wide = (bilinear(rng, 14, 2, 1),)
    with pytest.raises(ValueError, match=r"needs \(2\^L \+ 1\)\^d = 3\^14 grid points.*monte_carlo"):
        quadrature_inner(wide, wide)
    with pytest.raises(ValueError, match="takes d=1 inputs but net_b takes d=14"):
        quadrature_inner(SQUARE, wide)


def test_the_old_module_name_still_imports_the_same_estimators():
    from funsim.similarity import estimators, validate_numerics

    for name in estimators.__all__:
        assert getattr(validate_numerics, name) is getattr(estimators, name), name
