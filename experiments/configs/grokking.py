"""``funsim grokking``'s arguments: :class:`GrokkingConfig`, its named configs, verdict rules and the paper's numbers.

Imports no JAX (``funsim grokking --help`` answers at once); the run module,
:mod:`funsim.experiments.grokking`, does the work and re-exports these names.
"""

from __future__ import annotations

import argparse
import dataclasses

from funsim.experiments import config as config_lib
from funsim.experiments.verdict import Rule

#: The statistics ``experiments.grokking.verdict_statistics`` computes; a rule may name any of them.
STATISTICS = {
    "boundaries_near_landmarks": "phase boundaries of the symmetric tensor matrix (primary cost) within "
                                 "`landmark_tolerance` checkpoints of an accuracy landmark (of n_segments - 1)",
    "to_final_tensor": "symmetric tensor similarity of the first checkpoint with every held-out pair right to the "
                       "final checkpoint",
    "to_final_behavioural": "the same for behavioural similarity",
    "boundaries_matching_authors": "phase boundaries of the symmetric tensor matrix within `landmark_tolerance` "
                                   "checkpoints of the authors' on the common grid up to the common horizon",
    "tensor_only_boundaries": "boundaries of the symmetric tensor matrix more than `landmark_tolerance` "
                              "checkpoints from every boundary of the behavioural matrix",
}

#: The verdict rules of every config, fixed before the runs that use them (the summary prints each
#: rule, its number and the label it gives; ``experiments.verdict``). Tolerances are in checkpoints
#: (``landmark_tolerance``). The same rules are applied to the authors' released run where its data
#: allows, as a calibration: their run has 3 of its 4 boundaries at a landmark.
RULES: tuple[Rule, ...] = (
    Rule("segmenting the tensor-similarity matrix finds the phases of grokking", "boundaries_near_landmarks",
         ">=", 3, labels=("reproduced", "not reproduced")),
    Rule("the network keeps reorganising after held-out accuracy reaches 1", "to_final_tensor", "<", 0.9,
         labels=("reproduced", "not reproduced")),
    Rule("our phases match the authors' at a matched grid and horizon", "boundaries_matching_authors", ">=", 3,
         labels=("match", "differ")),
    Rule("tensor similarity finds a phase boundary behavioural similarity does not", "tensor_only_boundaries",
         ">=", 1, labels=("tensor-specific", "same phases as behavioural similarity")),
)


@dataclasses.dataclass(frozen=True)
class GrokkingConfig(config_lib.RuledConfig, statistics=STATISTICS):
    """Everything the grokking experiment does; saved as config.json.

    Attributes:
      p: the modulus; inputs are one-hot ``(a, b)`` of width ``2p``.
      train_fraction: fraction of the ``p^2`` pairs used for training.
      data_seed: seed of the train/held-out split.
      d_hidden: hidden units of the bilinear layer.
      seed: model initialisation and minibatch order.
      steps: optimiser steps.
      batch_size: minibatch size (None: full batch, every training pair each step).
      sampling: how minibatches are drawn below the full batch (``models.train.TrainConfig.sampling``):
        ``"independent"`` or ``"epochs"`` (a fresh shuffle per epoch, as the authors' data loader; ``paper``).
      learning_rate, weight_decay: AdamW.
      n_checkpoints, checkpoint_power, checkpoint_rule: the checkpoint steps,
        :func:`models.modular.checkpoint_schedule` (``"authors"``: their rule, the default; ``"power"``:
        ``models.train.power_schedule``).
      eval_every: the training history's evaluation period (the checkpoints are evaluated too).
      n_eval: held-out pairs (a seeded subset) for behavioural similarity and CKA.
      n_segments: phases to split each similarity matrix into.
      segment_cost: ``"pairwise"`` (the authors' choice) or ``"kernel"``; both are reported.
      n_top_frequencies: k of the "power in the top-k frequencies" statistic.
      compare_authors: set the authors' released run beside ours (:func:`models.modular.authors_run`;
        skipped, with a note in the summary, when its files are not given: ``run(authors_dir=)``,
        ``--authors-run DIR`` or ``FUNSIM_GROKKING_AUTHORS``).
      compare_horizon: the common horizon of that comparison (None: the shorter run's last step).
      landmark_tolerance: checkpoints within which two boundaries (or a boundary and a
        landmark) count as the same, in the verdict statistics.
      verdict_rules: the rules that label the claims (:data:`RULES`; JSON: a list of
        :class:`experiments.verdict.Rule` dicts). Each names one of :data:`STATISTICS`.
    """

    p: int = 113
    train_fraction: float = 0.3
    data_seed: int = 0
    d_hidden: int = 64
    seed: int = 0
    steps: int = 50_000
    batch_size: int | None = None
    sampling: str = "independent"
    learning_rate: float = 1e-3
    weight_decay: float = 0.3
    n_checkpoints: int = 100
    checkpoint_power: float = 5.0
    checkpoint_rule: str = "authors"
    eval_every: int = 250
    n_eval: int = 1000
    n_segments: int = 5
    segment_cost: str = "pairwise"
    n_top_frequencies: int = 5
    compare_authors: bool = True
    compare_horizon: int | None = None
    landmark_tolerance: int = 2
    verdict_rules: tuple[Rule, ...] = RULES

    def __post_init__(self):
        super().__post_init__()
        if self.sampling not in ("independent", "epochs"):
            raise ValueError(f"GrokkingConfig.sampling must be 'independent' or 'epochs', got {self.sampling!r}.")
        if self.checkpoint_rule not in CHECKPOINT_RULES:
            raise ValueError(f"GrokkingConfig.checkpoint_rule must be one of {', '.join(CHECKPOINT_RULES)}, "
                             f"got {self.checkpoint_rule!r}.")
        if isinstance(self.landmark_tolerance, bool) or not isinstance(self.landmark_tolerance, int) \
                or self.landmark_tolerance < 0:
            raise ValueError(f"GrokkingConfig.landmark_tolerance must be an integer >= 0, got {self.landmark_tolerance!r}.")
        if self.compare_horizon is not None and (isinstance(self.compare_horizon, bool)
                                                 or not isinstance(self.compare_horizon, int) or self.compare_horizon < 1):
            raise ValueError(f"GrokkingConfig.compare_horizon must be None or a positive integer step, "
                             f"got {self.compare_horizon!r}.")


#: The rules of ``models.modular.checkpoint_schedule`` (named here too: this module imports no JAX).
CHECKPOINT_RULES = ("authors", "power")

#: The environment variable that names the authors' released run (``models.modular.AUTHORS_ENV``).
AUTHORS_ENV = "FUNSIM_GROKKING_AUTHORS"


CONFIGS: dict[str, GrokkingConfig] = {
    "smoke": GrokkingConfig(
        p=11, train_fraction=0.5, d_hidden=8, steps=120, learning_rate=1e-2, n_checkpoints=10,
        eval_every=40, n_eval=40, n_segments=3, n_top_frequencies=2,
    ),
    # 50k full-batch steps (held-out accuracy reaches 1 at about 22k on this CPU), checkpoints by the
    # authors' rule: 88 checkpoints with step 0 (theirs: 90 over 100k steps). 7.0 min wall, 213 s CPU
    # time on the shared 2-core CPU (load ~9-14).
    "default": GrokkingConfig(),
    # The authors' run (tdooms/tensor-similarity, grokking summary bundle): batch 512 drawn epoch by epoch
    # (their shuffled data loader), 100k steps, 100 checkpoints by their rule (the same 89 steps after 0
    # as theirs). Their seed (1337) is a PyTorch seed: the run cannot be replayed, only its protocol.
    # 4.8 min wall, 114 s CPU time on the shared 2-core CPU (load ~11; about 2 ms per step).
    "paper": GrokkingConfig(steps=100_000, batch_size=512, sampling="epochs", eval_every=500, n_eval=2000),
}

#: The tensor-similarity authors' released grokking run, for comparison (tdooms/tensor-similarity,
#: ``workspaces/logan/grokking_summary_bundle``: p = 113, hidden 64, AdamW lr 1e-3, weight decay
#: 0.3, 30% train, batch 512, 100k steps, seed 1337, 90 power-spaced checkpoints). Event steps:
#: the first checkpoint meeting each condition in its ``training_history.json``. Phase starts:
#: K = 5 segments of its symmetric tensor-similarity matrix with the pairwise cost, as the DP
#: optimum gives them (``similarity.change_points`` on their ``tn_similarity.npy``; their figure
#: then moves the 4th start by hand one checkpoint earlier, to 7517). ``to_final``: similarity of
#: the first checkpoint with val accuracy 1 (step 23333) to the last (100k), from their
#: ``tn_similarity.npy`` and ``act_similarity.npy`` (mean per-sample cosine of the logits on all
#: p^2 pairs, i.e. behavioural similarity). Not numbers printed in the paper: read off its data,
#: which the project does not ship: :func:`models.modular.authors_run` reads the authors' files from a clone; the
#: tests recompute every number here from them when ``FUNSIM_GROKKING_AUTHORS`` points at that folder.
PAPER = {
    "steps": 100_000,
    "events": {
        "train accuracy >= 0.5": 352,
        "train accuracy >= 0.99": 1076,
        "val loss peak": 1545,
        "val accuracy >= 0.5": 8176,
        "val accuracy >= 0.99": 13168,
        "val accuracy = 1": 23333,
    },
    "phase_starts": [0, 124, 1545, 8176, 24953],
    "to_final": {"tensor (symmetric)": 0.718, "behavioural": 0.741},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, GrokkingConfig, CONFIGS, run_options=True)
    parser.add_argument("--authors-run", default=None, metavar="DIR",
                        help="the authors' released run to compare with: a clone's workspaces/logan/"
                             f"grokking_summary_bundle/results_grokking_summary/ (default: ${AUTHORS_ENV}; "
                             "unset: not compared)")
