"""``funsim similarity-study``'s arguments: the study config, its named configs, the verdict rules and the
statistics they judge, and ``add_arguments``. No JAX: ``funsim similarity-study --help`` imports only this;
the run module, :mod:`funsim.experiments.similarity_study`, runs the study.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from funsim.experiments import config as config_lib
from funsim.experiments import verdict as verdict_lib

__all__ = ["StudyConfig", "CONFIGS", "STATISTICS", "RULES", "PRIMARY", "NOISE_PARAMETERS", "config_from_dict",
           "add_arguments"]

SUPPORTS_MULTIPROCESS = True  # `funsim launch -n N similarity-study`: units are split over the processes

# ----------------------------------------------------------------------------- verdict rules

#: The statistics ``funsim report usable-information`` computes for the verdicts
#: (``usable_information.verdict_statistics``); a rule may name any of them. Intervals are 95%
#: bootstrap intervals resampling models (``study_rules.model_interval``; before 2026-12-06 the first
#: 13 rules read intervals resampling model pairs, still reported beside). "Task-loss" numbers are held-out
#: relative accuracies (stitched / the target's own accuracy) of stitchers trained on the labels.
STATISTICS = {
    "share_below_095": "share of directed fine-task task-loss stitching pairs (every family of the run) with "
                       "relative accuracy < 0.95 (the design is below the ceiling where this is large)",
    "pairs_below_095": "the number of those pairs",
    "asymmetry_kurtosis_task_orthogonal": "excess kurtosis [interval] of forward - reverse task-loss relative "
                                          "accuracy per layer pair, orthogonal family",
    "asymmetry_kurtosis_task_scaled_orthogonal": "the same, scaled-orthogonal family",
    "asymmetry_kurtosis_task_affine": "the same, affine family",
    "asymmetry_kurtosis_closed_form": "excess kurtosis [interval] of forward - reverse held-out closed-form affine "
                                      "score per layer pair",
    "order_violations_held_out": "share of directed layer pairs whose held-out closed-form scores break "
                                 "orthogonal <= scaled orthogonal <= affine by more than 0.01",
    "order_violations_task": "the same on task-loss relative accuracy (needs two or more task-loss families)",
    "r2_cka": "R^2 [interval] of linear CKA against the in-sample scaled-orthogonal score (the paper code's "
              "protocol), every directed layer pair of the run's main convention",
    "r2_rsa": "the same for RSA (correlation-distance RDM, Spearman)",
    "r2_min_cka_rsa_minus_svcca": "min(R^2 CKA, R^2 RSA) - R^2 SVCCA [interval], same pairs and score",
    "granularity_coarse_minus_fine_summed": "mean paired (coarse - fine) task-loss relative accuracy [interval] over "
                                            "pairs with fine relative accuracy < 0.95; coarse readout: the target's "
                                            "fine softmax summed within each group",
    "granularity_coarse_minus_fine_head": "the same with the authors' coarse readout (a new head trained on the "
                                          "frozen penultimate features)",
    "sufficiency_p_high_given_cka_090": "P(task-loss relative accuracy >= 0.95 | linear CKA >= 0.9)",
    "high_with_low_cka_share": "share of pairs with task-loss relative accuracy >= 0.95 whose linear CKA is < 0.5",
    "order_margin_task": "min over the family chain's links of mean paired difference + z binomial SEs [interval]",
    "p_high_overall": "P(task-loss relative accuracy >= 0.95), every pair of the 5a lift",
    "sufficiency_lift_cka_090": "P(relative accuracy >= 0.95 | linear CKA >= 0.9) - P(relative accuracy >= 0.95)",
    "split_model_pairs": "model pairs selected below 0.95 on a half of the test rows (claim 4's split)",
    "granularity_split_summed": "mean coarse - fine on the other half of the test rows [interval], summed softmax",
    "granularity_split_head": "the same with the new coarse head",
}
NOISE_PARAMETERS = {"high": 0.95, "cka_high": 0.9, "below": 0.95, "z": 1.96}  # of similarity.study_rules.noise_statistics

_BELOW_CEILING = (verdict_lib.Rule("enough pairs below the ceiling (share)", "share_below_095", ">=", 0.2,
                                   labels=("below the ceiling", "ceiling")),
                  verdict_lib.Rule("enough pairs below the ceiling (count)", "pairs_below_095", ">=", 30,
                                   labels=("enough pairs", "ceiling")))
_HEAVY = ("heavy-tailed (reproduced)", "not heavy-tailed (not reproduced)")

#: The verdict rules, fixed in the config before the runs they judge (committed on their own; the
#: report prints each rule, its number and the label ``experiments.verdict`` computes). Thresholds:
#: the paper gives figures, not numbers, for claims 1, 2, 4 and 5, so the rules ask for the direction
#: with an interval that excludes no effect; claim 3 asks for R^2 > 0.8 (the paper: 0.937 CKA,
#: 0.912 RSA). Claims judged on task-loss stitching require a design below the ceiling.
RULES: tuple[verdict_lib.Rule, ...] = (
    verdict_lib.Rule("1a asymmetry, task loss (orthogonal)", "asymmetry_kurtosis_task_orthogonal", ">", 0.0,
                     labels=_HEAVY, interval=True, requires=_BELOW_CEILING[:1]),
    verdict_lib.Rule("1a asymmetry, task loss (scaled orthogonal)", "asymmetry_kurtosis_task_scaled_orthogonal", ">",
                     0.0, labels=_HEAVY, interval=True, requires=_BELOW_CEILING[:1]),
    verdict_lib.Rule("1a asymmetry, task loss (affine)", "asymmetry_kurtosis_task_affine", ">", 0.0, labels=_HEAVY,
                     interval=True, requires=_BELOW_CEILING[:1]),
    verdict_lib.Rule("1b asymmetry, closed-form held-out affine score", "asymmetry_kurtosis_closed_form", ">", 0.0,
                     labels=_HEAVY, interval=True),
    verdict_lib.Rule("2a family order holds held out (closed form)", "order_violations_held_out", "<=", 0.01,
                     labels=("holds", "broken")),
    verdict_lib.Rule("2b family order holds on task loss", "order_violations_task", "<=", 0.05,
                     labels=("holds", "broken"), requires=_BELOW_CEILING[:1]),
    verdict_lib.Rule("3a CKA estimates the scaled-orthogonal score", "r2_cka", ">", 0.8, interval=True),
    verdict_lib.Rule("3b RSA estimates the scaled-orthogonal score", "r2_rsa", ">", 0.8, interval=True),
    verdict_lib.Rule("3c SVCCA estimates it less well than CKA and RSA", "r2_min_cka_rsa_minus_svcca", ">", 0.0,
                     interval=True),
    verdict_lib.Rule("4 coarse >= fine (summed-softmax readout)", "granularity_coarse_minus_fine_summed", ">", 0.0,
                     interval=True, requires=_BELOW_CEILING),
    verdict_lib.Rule("4 coarse >= fine (new coarse head)", "granularity_coarse_minus_fine_head", ">", 0.0,
                     interval=True, requires=_BELOW_CEILING),
    verdict_lib.Rule("5a high CKA is sufficient", "sufficiency_p_high_given_cka_090", ">=", 0.9),
    verdict_lib.Rule("5b high CKA is not necessary", "high_with_low_cka_share", ">", 0.05),
    verdict_lib.Rule("2b' task-loss order, paired, noise tolerance", "order_margin_task", ">=", 0.0,
                     labels=("holds", "broken"), interval=True, requires=_BELOW_CEILING[:1]),
    *(verdict_lib.Rule(f"4' coarse >= fine, split halves ({k})", f"granularity_split_{s}", ">", 0.0, interval=True,
                       requires=(_BELOW_CEILING[0], verdict_lib.Rule("30 model pairs", "split_model_pairs", ">=", 30,
                                 labels=("enough model pairs", "fewer than 30 model pairs"))))
      for k, s in (("summed softmax", "summed"), ("new head", "head"))),
    verdict_lib.Rule("5a' high CKA lifts P(high)", "sufficiency_lift_cka_090", ">", 0.0, interval=True, requires=(
        verdict_lib.Rule("P(high) below the ceiling", "p_high_overall", "<=", 0.8, labels=("no ceiling", "ceiling")),)),
)
PRIMARY = tuple(r.claim for r in RULES[-4:])  # the noise-aware rules, beside the first 13: Holm over these; the rest uncorrected

# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class StudyConfig(config_lib.RuledConfig, statistics=STATISTICS):
    """A similarity study of a trained zoo.

    Attributes:
      name: the config's name (the default run name).
      zoo: the zoo run: a name under ``<root>/zoo/`` or a path to its directory.
      datasets: the data sets to study (None: every data set of the zoo).
      n_rows: comparison rows per data set: the test rows first, topped up with
        training rows when the test set is smaller (every model sees the same rows).
      activation_point: where dense layers that end in an activation are read for the
        comparisons: ``"pre_activation"`` (the raw linear output: the paper code's convention)
        or ``"post_activation"`` (``models`` layer outputs). Task-loss stitching maps the
        post-activation outputs either way.
      flatten: ``models.flatten`` policy for conv maps: ``"flatten"`` (C*H*W features: the
        paper code's convention) or ``"spatial_mean"`` (global average pooling, C features).
      rsa_max_features: RSA is left undefined (NaN in the table, counted in the summary and
        the report, never 0.0) for a layer pair whose wider layer has more features than this,
        as the paper's code skips it (None: no limit). In the extra conventions' grids the
        limit applies to every measure (their only cost bound).
      conventions: extra feature conventions, ``"<activation_point>/<flatten>"`` each
        (e.g. ``"post_activation/spatial_mean"``), compared with ``convention_measures`` only;
        their rows carry the measure name ``<measure>@<convention>`` (the sensitivity table).
      convention_measures: the measures of the extra conventions' grids.
      measures: registry names compared on every layer pair (the reconstruction
        scores are added from ``families``).
      families: stitcher families of the closed-form reconstruction scores.
      affine_ridge: ridge of the affine reconstruction score (scale-free units; 0: none).
      split: train fraction of the held-out reconstruction scores.
      spatial_scores: families of the paper code's conv-to-conv score (``similarity.spatial_score_table``: the
        source map pooled to the target's size, a 1x1 map over positions, uncentred, in sample), on every conv
        layer pair; rows ``stitch/spatial/<family>`` (empty: none).
      seed: seed of the split, stitcher inits and minibatches.
      stitch_families: families of task-loss stitching (empty: none).
      stitch_layers: ``"dense"`` (only 2-D layers: MLP layers, pooled features,
        logits) or ``"all"`` (conv maps too, stitched as 1x1 convolutions).
      depth_tolerance: a layer pair is stitched when its relative depths differ by at most this.
      stitch_steps, stitch_learning_rate, stitch_batch_size: the stitcher's training (Adam).
      stitch_train_rows: training rows for the stitchers (None: all).
      stitch_train_rows_by_dataset: per-data-set overrides of ``stitch_train_rows``,
        ``"<data set>=<rows>"`` each (few rows put stitching below the ceiling; choose them
        per data set from a probe of the share of pairs below 0.95 relative accuracy).
      coarse_groupings: coarse label groupings to stitch on when the data set has
        them (``experiments.data.COARSE_GROUPINGS``).
      coarse_head: also stitch through the paper's coarse readout: a new softmax-regression
        head per target model on its frozen penultimate features (``models.train_head``,
        full-batch Adam, ``coarse_head_steps`` steps, every training row), task
        ``coarse_head:<grouping>``, beside the summed-softmax readout (``coarse:<grouping>``).
      verdict_rules: the rules that label the claims (:data:`RULES`; JSON: a list of
        :class:`experiments.verdict.Rule` dicts). Each names one of :data:`STATISTICS`.
    """

    name: str
    zoo: str = "default"
    datasets: tuple[str, ...] | None = None
    n_rows: int = 600
    activation_point: str = "pre_activation"
    flatten: str = "flatten"
    rsa_max_features: int | None = 2048
    conventions: tuple[str, ...] = ()
    convention_measures: tuple[str, ...] = ("cka/linear", "rsa/correlation/spearman")
    measures: tuple[str, ...] = ("cka/linear", "cka/linear/debiased", "rsa/correlation/spearman", "svcca",
                                 "pwcca", "procrustes")
    families: tuple[str, ...] = ("orthogonal", "scaled_orthogonal", "affine")
    affine_ridge: float = 1e-4
    split: float = 0.5
    spatial_scores: tuple[str, ...] = ()
    seed: int = 0
    stitch_families: tuple[str, ...] = ("affine",)
    stitch_layers: str = "dense"
    depth_tolerance: float = 0.15
    stitch_steps: int = 200
    stitch_learning_rate: float = 1e-2
    stitch_batch_size: int | None = 128
    stitch_train_rows: int | None = 1500
    stitch_train_rows_by_dataset: tuple[str, ...] = ()
    coarse_groupings: tuple[str, ...] = ("coarse", "parity")
    coarse_head: bool = True
    coarse_head_steps: int = 500
    verdict_rules: tuple[verdict_lib.Rule, ...] = RULES


_SMOKE = StudyConfig(name="smoke", zoo="smoke", n_rows=96, flatten="spatial_mean", depth_tolerance=0.5,
                     spatial_scores=("scaled_orthogonal",), stitch_steps=20, stitch_batch_size=32, stitch_train_rows=128, coarse_groupings=("parity",),
                     conventions=("post_activation/spatial_mean", "pre_activation/flatten"))
# The offline run on results/zoo/default, sized to about 30 minutes on this 2-core CPU
# (README: measured time and load). PWCCA is left to the smoke and paper configs:
# on this CPU it alone took as long as every other measure together. 600 rows: the
# held-out scores fit on 300, more than the widest layer (256); 1,500 stitching rows
# (all of digits' training rows) keep one shape, so one compilation, across data sets.
# The main grid pools conv maps (`spatial_mean`): flattened maps (up to 6,272 features on
# mnist5k) make the closed-form scores and linear CKA d x d problems, beyond this CPU's budget
# (4 random layers of 784-3,136 features: RSA 147 s, CKA 30 s, the scores > 2 min at load 12).
# The paper code's conventions for the representational measures come from the extra grids:
# pre-activation dense layers with flattened conv maps (layers <= 2,048 features, as the
# paper code's RSA), and post-activation pooled maps (the first pass's convention).
_DEFAULT = StudyConfig(name="default", flatten="spatial_mean",
                       measures=("cka/linear", "cka/linear/debiased", "rsa/correlation/spearman",
                                 "rsa/correlation/pearson", "rsa/euclidean/spearman", "svcca", "procrustes"),
                       conventions=("post_activation/spatial_mean", "pre_activation/flatten"),
                       convention_measures=("cka/linear", "rsa/correlation/spearman"))
_PAPER = StudyConfig(name="paper", zoo="paper", n_rows=2000, flatten="flatten", affine_ridge=1e-3,
                     stitch_families=("orthogonal", "scaled_orthogonal", "affine"), stitch_layers="all",
                     stitch_steps=2000, stitch_train_rows=None, coarse_groupings=("coarse",))
# The granularity / task-loss design below the ceiling: three task-loss families at every depth
# pair (conv pairs as 1x1 convolutions), fitted on few rows. Measured on a 4-model digits subset
# (MLP 256x3 and CNN, two seeds: 9 targets and 36 source-target pairs per family, three families,
# three tasks): 7.6 min wall (grid 80 s, stitching 372 s) at load ~2; 31% of pairs below 0.95. The
# default zoo's digits models alone have 40 targets and 764 pairs per family (21x): about 2 hours per
# data set by that scale, 6 for the zoo's three; a GPU run (that measure predates the Stiefel stitchers:
# an orthogonal target from wide sources is now 8.8x faster, benchmarks/RESULTS.md). The rows come from
# the digits probe (100 rows: 21% of affine dense pairs below 0.95; 200: 0%).
_UNSATURATED = dataclasses.replace(
    _DEFAULT, name="unsaturated", stitch_families=("orthogonal", "scaled_orthogonal", "affine"), stitch_layers="all",
    stitch_train_rows=200, stitch_train_rows_by_dataset=("digits=100",))
# The authors' protocol for claim 1: they stitch every source block into every target block; the
# depth tolerance of `unsaturated` (0.15) drops the depth-mismatched pairs, where asymmetry lives.
# The rules are RULES, unchanged, committed with this config before any run of it. Its digits run (the default
# zoo, from 2026-12-07) is kept in experiments/ledger/authors_protocol-digits/ and continues across machines: each
# target layer of the two seeds of an architecture takes every one of the 80 source layers through three families
# and three tasks: 5.0 min for a 64-wide dense layer at load about 2 on this 2-core CPU, 1.4 min for 10-wide
# logits, about 35 min for a 256-wide one at load 2-5.
_AUTHORS = dataclasses.replace(_UNSATURATED, name="authors_protocol", depth_tolerance=1.0,
                               spatial_scores=("orthogonal", "scaled_orthogonal", "affine"))
# Claim 3 on the paper code's MLPs (zoo `authors_mlp`: its LinearNet with BatchNorm and dropout at its five
# presets' widths, a plain MLP and the CNN) with the paper code's representations as far as the offline data
# allow: all 5,000 mnist5k rows (the paper code: the first 10,000 shuffled training rows), so that every fit
# has more train rows (2,500) than the widest layer (2,048), pre-activation dense layers (its nn.Linear
# outputs), and its conv score beside ours. The grid only (claim 3's statistics): no task-loss stitching. The
# rules are RULES, unchanged, committed with this config before any run of it.
_AUTHORS_MLP = dataclasses.replace(_DEFAULT, name="authors_mlp", zoo="authors_mlp", datasets=("mnist5k",),
                                   n_rows=5000, conventions=(), stitch_families=(),
                                   spatial_scores=("orthogonal", "scaled_orthogonal", "affine"))
CONFIGS: dict[str, StudyConfig] = {"smoke": _SMOKE, "default": _DEFAULT, "unsaturated": _UNSATURATED,
                                   "authors_protocol": _AUTHORS, "authors_mlp": _AUTHORS_MLP, "paper": _PAPER}


def config_from_dict(d: Mapping[str, Any]) -> StudyConfig:
    """A :class:`StudyConfig` from its JSON form, or ``{"base": name, **overrides}``.

    Examples:
      >>> config_from_dict({"base": "smoke", "n_rows": 64}).n_rows
      64
    """
    return config_lib.from_dict(StudyConfig, CONFIGS, d)  # typed: lists become tuples


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, StudyConfig, CONFIGS, run_options=True)
    parser.add_argument("--zoo", default=None, help="the zoo run (a name under ROOT/zoo/ or a directory; "
                        "default: the config's)")
    parser.add_argument("--merge-units", default=None, metavar="RUN_DIR", help="copy the finished units of that "
                        "run (e.g. from a GPU machine) into this one, then exit; rerun to finish (docs/gpu.md)")

