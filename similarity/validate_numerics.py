"""The old name of :mod:`funsim.similarity.estimators`, kept so that existing imports work.

The Monte Carlo and quadrature estimators live in :mod:`funsim.similarity.estimators`
(and in the ``funsim.similarity`` namespace); import them from there.
"""

# ruff: noqa: F401  (re-exports)
from funsim.similarity.estimators import MAX_QUADRATURE_POINTS as MAX_QUADRATURE_POINTS
from funsim.similarity.estimators import attention_monte_carlo_inner as attention_monte_carlo_inner
from funsim.similarity.estimators import attention_quadrature_inner as attention_quadrature_inner
from funsim.similarity.estimators import monte_carlo_inner as monte_carlo_inner
from funsim.similarity.estimators import quadrature_inner as quadrature_inner

__all__ = ["monte_carlo_inner", "quadrature_inner", "attention_monte_carlo_inner", "attention_quadrature_inner",
           "MAX_QUADRATURE_POINTS"]
