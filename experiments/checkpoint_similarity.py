"""Former home of the checkpoint x checkpoint matrices, kept only for ``grokking`` and ``language``.

The matrices moved to :mod:`funsim.similarity.checkpoints` (exported from ``funsim.similarity``),
the figures to :mod:`funsim.experiments.plotting`. This module re-exports them under their old
names until those two drivers import from there; then it is deleted.
"""

# ruff: noqa: F401  (re-exports)
from funsim.experiments.plotting import curves_over_steps, heatmap_panels
from funsim.similarity.checkpoints import (
    CHECKPOINT_METRICS,
    behavioral_matrix,
    behavioural_matrix,
    block_gap,
    block_summary,
    checkpoint_matrices,
    cka_matrix,
    monte_carlo_matrices,
    network_outputs,
    normalise_gram,
    stack_networks,
    tensor_matrices,
    tensor_similarity_to,
    weight_cosine_matrix,
)
