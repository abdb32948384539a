"""``funsim similarity-study``: every measure on every layer pair of every model pair of a zoo.

Run::

    funsim zoo --config default                        # first: the zoo (results/zoo/default)
    funsim similarity-study --config smoke             # seconds: on the smoke zoo (the tests)
    funsim similarity-study --config default           # offline, on results/zoo/default
    funsim similarity-study --config paper             # a GPU/TPU: on the paper zoo, every layer
    funsim report usable-information --run results/similarity_study/default

For each data set of the zoo, two stages, both batched:

1. **Representational comparisons** through :func:`similarity.compare_grid`:
   one call per data set compares every layer of every model with every layer
   of every model (the full square, so entry ``[A_i, B_j]`` is the direction
   A -> B and ``[B_j, A_i]`` the direction B -> A), for every measure of the
   config: CKA (linear, debiased), RSA, SVCCA, PWCCA, the Procrustes distance,
   and the closed-form reconstruction scores of the three stitcher families,
   held out (fit on one half of the rows, scored on the other) and in sample
   (the paper's code's leaky figure). Each layer's statistics are computed once.
2. **Task-loss stitching** through :func:`similarity.train_stitchers`: for each
   target layer of each architecture, every source layer of every model at a
   matching relative depth (``|depth_A - depth_B| <= depth_tolerance``) is
   trained into the frozen tails of *both seeds* of that architecture in one
   compiled, vmapped call (``models.stack_tails``), then scored on held-out rows.
   With a coarse grouping of the labels the same stitchers are also trained on
   the coarse task, through the target's tail followed by the marginalisation of
   its softmax over each group (``train_stitchers``' ``label_groups``, the loss of
   :class:`CoarseTail`; fine and coarse in one compiled loop), and (``coarse_head``) through
   the paper code's readout: a new head per target model trained on its frozen
   penultimate features (``models.HeadTail``).

**Representations.** The feature convention is the config's: dense layers that end
in an activation are read before it (``activation_point="pre_activation"``, the paper
code's ``nn.Linear`` outputs) or after it; conv maps ``(n, H, W, C)`` are reduced by
``models.flatten`` with the ``flatten`` policy: ``flatten`` (C*H*W features, the paper
code's default) or ``spatial_mean`` (global average pooling, ``C`` features: what the
default config's main grid uses, so that the closed-form scores fit this CPU). RSA is
undefined (NaN, counted) for layers wider than ``rsa_max_features`` (2,048), as the paper
code skips it. Extra ``conventions`` add grids of ``convention_measures`` only, with rows
named ``<measure>@<point>/<flatten>``: the sensitivity of claim 3 to the convention.
Task-loss stitching always maps the raw post-activation outputs.

**Resumable.** Every unit of work is written atomically when it is done: one
file per model pair (``pairs/<data set>/<A>__<B>.json``: all its layer pairs,
all measures, both directions) and one per stitching target
(``stitch/<data set>/<task>/<family>/<target>.json``). A rerun of the same
command skips every file that exists, so an interrupted study loses at most
the unit in progress (the grid of one data set, or one stitching target), and
the assembled table is identical. A rerun with a changed config is refused.

**N processes** (``funsim launch -n N similarity-study ...``, or a cluster): each
data set's grid is one ``compare_grid`` call whose layer pairs are sharded over
every device of every process (every process gets the full tables), and model
pair ``k`` is written by process ``k mod N``; stitching target ``j`` is trained
by process ``j mod N`` on its own devices. Every process waits until all unit
files exist; process 0 then writes the table and the report, once. A rerun with
any number of processes computes only the missing units.

Writes ``results/similarity_study/<run>/``: ``config.json``, the unit files,
``comparisons.csv`` (the tidy table, columns in :data:`COLUMNS`),
``metrics.json`` (atomic) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import io
import pathlib
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from funsim.experiments import config as config_lib
from funsim.experiments import jit_memory
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.io import (
    open_run,
    read_json,
    releases_run_locks,
    write_json_atomic,
    write_table_atomic,
    write_text_atomic,
)

SUPPORTS_MULTIPROCESS = True  # `funsim launch -n N similarity-study`: units are split over the processes

__all__ = [
    "StudyConfig", "CONFIGS", "COLUMNS", "STATISTICS", "RULES", "CoarseTail", "config_from_dict", "run", "read_table",
    "add_arguments", "main",
]

COLUMNS = ("dataset", "model_a", "layer_a", "depth_a", "model_b", "layer_b", "depth_b",
           "measure", "direction", "split", "task", "value")
"""Columns of ``comparisons.csv``, one row per comparison:

* ``dataset``; ``model_a``/``model_b``: zoo ids (``A`` before ``B`` in zoo order);
  ``layer_a``/``layer_b`` and their relative depths ``depth_a``/``depth_b`` (``(i + 1) / L``).
* ``measure``: a registry name (``cka/linear``, ``rsa/correlation/spearman``, ``svcca``,
  ``pwcca``, ``procrustes`` (a distance), ``stitch/<family>`` (closed-form reconstruction
  score)), or ``task/<family>/<quantity>`` for task-loss stitching, quantity one of
  ``relative_accuracy`` (stitched / target's own accuracy), ``accuracy``, ``own_accuracy``,
  ``ce_gap`` (stitched minus own cross-entropy, nats).
* ``direction``: ``a->b`` (A's layer is the source, B's the target), ``b->a``, or ``sym``
  for a symmetric measure.
* ``split``: ``held_out`` (fit on the train half, scored on the other half; task-loss
  stitching: trained on training rows, scored on test rows), ``in_sample`` (fit and scored
  on the train half), or ``all`` (a measure with no fit, on all comparison rows).
* ``task``: ``-`` (no labels), ``fine``, ``coarse:<grouping>`` (a stitcher trained on the
  coarse labels through the target's summed softmax), ``coarse_head:<grouping>`` (the
  same through a new head on the target's penultimate features) or ``coarsened:<grouping>``
  (the fine stitcher's and the target's
  predictions mapped to their groups: accuracy can only go up).
* ``value``: the number.
"""

# ----------------------------------------------------------------------------- verdict rules

#: The statistics ``funsim report usable-information`` computes for the verdicts
#: (``usable_information.verdict_statistics``); a rule may name any of them. Intervals are
#: 95% cluster-bootstrap intervals resampling model pairs. "Task-loss" numbers are held-out
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
}

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
)

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
                     stitch_steps=20, stitch_batch_size=32, stitch_train_rows=128, coarse_groupings=("parity",),
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
# data set by that scale, 6 for the zoo's three; a GPU run. The rows come from
# the digits probe (100 rows: 21% of affine dense pairs below 0.95; 200: 0%).
_UNSATURATED = dataclasses.replace(
    _DEFAULT, name="unsaturated", stitch_families=("orthogonal", "scaled_orthogonal", "affine"), stitch_layers="all",
    stitch_train_rows=200, stitch_train_rows_by_dataset=("digits=100",))
CONFIGS: dict[str, StudyConfig] = {"smoke": _SMOKE, "default": _DEFAULT, "unsaturated": _UNSATURATED,
                                   "paper": _PAPER}


def config_from_dict(d: Mapping[str, Any]) -> StudyConfig:
    """A :class:`StudyConfig` from its JSON form, or ``{"base": name, **overrides}``.

    Examples:
      >>> config_from_dict({"base": "smoke", "n_rows": 64}).n_rows
      64
    """
    return config_lib.from_dict(StudyConfig, CONFIGS, d)  # typed: lists become tuples


def _check_config(cfg: StudyConfig) -> None:
    from funsim import similarity
    if cfg.flatten not in ("spatial_mean", "flatten"):
        raise ValueError(f"flatten must be 'spatial_mean' or 'flatten', got {cfg.flatten!r}.")
    if cfg.activation_point not in ("pre_activation", "post_activation"):
        raise ValueError(f"activation_point must be 'pre_activation' or 'post_activation', got "
                         f"{cfg.activation_point!r}.")
    if cfg.rsa_max_features is not None and cfg.rsa_max_features < 1:
        raise ValueError(f"rsa_max_features must be a positive int or None, got {cfg.rsa_max_features!r}.")
    for c in cfg.conventions:
        point, _, flat = c.partition("/")
        if point not in ("pre_activation", "post_activation") or flat not in ("spatial_mean", "flatten"):
            raise ValueError(f"conventions has {c!r}; each must be '<pre_activation|post_activation>/"
                             "<flatten|spatial_mean>', e.g. 'post_activation/spatial_mean'.")
        if (point, flat) == (cfg.activation_point, cfg.flatten):
            raise ValueError(f"conventions has {c!r}, the main grid's own convention; list only the extra ones.")
    if cfg.stitch_layers not in ("dense", "all"):
        raise ValueError(f"stitch_layers must be 'dense' or 'all', got {cfg.stitch_layers!r}.")
    for f in (*cfg.families, *cfg.stitch_families):
        if f not in similarity.FAMILIES:
            raise ValueError(f"Unknown stitcher family {f!r}; valid: {', '.join(similarity.FAMILIES)}.")
    known = set(similarity.list_measures())
    for m in (*cfg.measures, *cfg.convention_measures):
        if m.startswith("stitch/"):
            raise ValueError(f"measures has {m!r}: the reconstruction scores come from `families`; list only "
                             "the other measures.")
        if m not in known and "=" not in m:
            raise ValueError(f"Unknown measure {m!r} in measures; valid: {', '.join(sorted(known))}.")
    _rows_by_dataset(cfg)
    if not 0 < cfg.split < 1:
        raise ValueError(f"split must be in (0, 1), got {cfg.split!r}.")
    if cfg.n_rows < 8:
        raise ValueError(f"n_rows must be at least 8, got {cfg.n_rows}.")


def _rows_by_dataset(cfg: StudyConfig) -> dict[str, int]:
    out = {}
    for e in cfg.stitch_train_rows_by_dataset:
        name, _, n = e.partition("=")
        if not name or not n.isdigit() or int(n) < 2:
            raise ValueError(f"stitch_train_rows_by_dataset has {e!r}; each entry is '<data set>=<rows>' with "
                             "rows >= 2, e.g. 'digits=100'.")
        out[name] = int(n)
    return out


def stitch_measure_names(cfg: StudyConfig) -> dict[str, tuple[str, str]]:
    """Registry name -> (family, split) of the closed-form reconstruction scores of ``cfg``."""
    out = {}
    for fam in cfg.families:
        ridge = f"/ridge={cfg.affine_ridge:g}" if fam == "affine" and cfg.affine_ridge > 0 else ""
        out[f"stitch/{fam}{ridge}"] = (fam, "held_out")
        out[f"stitch/{fam}/in_sample{ridge}"] = (fam, "in_sample")
    return out


# ----------------------------------------------------------------------------- coarse tails


@dataclasses.dataclass(frozen=True)
class CoarseTail:
    """A tail followed by the marginalisation of its softmax over label groups: coarse logits.

    ``coarse_logits[c] = logsumexp_{k in group c} logits[k]``, so ``softmax(coarse_logits)``
    is the fine softmax summed within each group. Hashable by value (for ``train_stitchers``).

    Attributes:
      tail: ``tail(params, h) -> (b, n_fine)`` logits.
      groups: the coarse class of each fine class.
    """

    tail: Any
    groups: tuple[int, ...]

    def __call__(self, params: Any, h):
        return coarsen_logits(self.tail(params, h), self.groups)


def coarsen_logits(logits, groups):
    """``(..., n_fine) -> (..., n_coarse)``: log of the fine softmax summed within each group (up to a constant).

    Examples:
      >>> import numpy as np
      >>> np.round(np.asarray(coarsen_logits(np.log(np.array([[0.1, 0.2, 0.7]])), (0, 0, 1))), 3).tolist()
      [[-1.204, -0.357]]
    """
    import jax
    import jax.numpy as jnp

    groups = np.asarray(groups)
    if isinstance(logits, np.ndarray):  # on the host: no compiled program per shape
        return np.stack([np.logaddexp.reduce(logits[..., groups == c], axis=-1)
                         for c in range(groups.max() + 1)], axis=-1)
    onehot = jnp.asarray(np.arange(groups.max() + 1)[:, None] == groups[None, :])  # (n_coarse, n_fine)
    masked = jnp.where(onehot, jnp.asarray(logits)[..., None, :], -jnp.inf)
    return jax.nn.logsumexp(masked, axis=-1)


# ----------------------------------------------------------------------------- helpers


def _zoo_dir(cfg: StudyConfig, root) -> pathlib.Path:
    p = pathlib.Path(cfg.zoo)
    if p.is_dir() and (p / "zoo.json").is_file():
        return p
    return pathlib.Path(root) / "zoo" / cfg.zoo


def _slug(model_id: str) -> str:
    return model_id.split("/", 1)[1]


def _rows(ds, n_rows: int) -> np.ndarray:
    """The comparison inputs: the test rows first, topped up with training rows."""
    x = ds.x_test[:n_rows]
    if len(x) < n_rows:
        x = np.concatenate([x, ds.x_train[: n_rows - len(x)]])
    return x


def _features(model, x, batch: int = 1000, point: str | None = None) -> dict[str, np.ndarray]:
    """``model.features(x, point=point)`` on ``x``, compiled, in batches, as NumPy."""
    import funsim.models as models_lib

    return models_lib.compiled(model, chunk=batch).features(np.asarray(x), as_numpy=True, point=point)


def _row(ds, a, la, b, lb, measure, direction, split, task, value) -> dict:
    return {"dataset": ds, "model_a": a.id, "layer_a": la, "depth_a": round(a.relative_depth[la], 6),
            "model_b": b.id, "layer_b": lb, "depth_b": round(b.relative_depth[lb], 6), "measure": measure,
            "direction": direction, "split": split, "task": task, "value": float(value)}


# ----------------------------------------------------------------------------- stage 1: the grid


def _grid(reps: dict, measures: list[str], cfg: StudyConfig) -> dict[str, np.ndarray]:
    """One :func:`similarity.compare_grid` call over every layer of every model: ``{measure: (L, L)}``.

    The grid compiles a handful of programs (padded widths); the stitching stage after it compiles more
    per target. Each program holds about 55 memory mappings of JIT code on XLA:CPU, and a process past
    Linux's default limit of 65,530 mappings dies with a segmentation fault, so the study releases the
    compiled programs when the process is near that limit (:func:`jit_memory.release_if_near_limit`),
    and keeps them for the next grid or target of the same shapes otherwise.
    """
    import jax

    from funsim import similarity
    if not measures:
        return {}
    g = similarity.compare_grid(reps, reps, measures=measures, split=cfg.split, key=jax.random.key(cfg.seed))
    tables = {name: np.asarray(t, np.float64) for name, t in g.tables.items()}
    jit_memory.release_if_near_limit()
    return tables


def _limited_grid(reps: dict, measures: list[str], cfg: StudyConfig, limit: int | None) -> tuple[dict, int]:
    """:func:`_grid` on the layers of at most ``limit`` features; the other cells NaN. Returns the tables and
    the number of layers left out."""
    names = list(reps)
    keep = [k for k, n in enumerate(names) if limit is None or reps[n].shape[1] <= limit]
    sub = _grid({names[k]: reps[names[k]] for k in keep}, measures, cfg) if keep else {}
    out = {}
    for m in measures:
        t = np.full((len(names), len(names)), np.nan)
        if m in sub:
            t[np.ix_(keep, keep)] = sub[m]
        out[m] = t
    return out, len(names) - len(keep)


def _pair_rows(ds: str, a, b, index: dict, tables: dict, cfg: StudyConfig) -> list[dict]:
    """Every layer pair of models a, b: all measures, both directions (from the full square)."""
    from funsim import similarity
    stitch = stitch_measure_names(cfg)
    rows = []
    for la in a.layers:
        for lb in b.layers:
            i, j = index[a.id, la], index[b.id, lb]
            for name, t in tables.items():
                if name in stitch:
                    fam, split = stitch[name]
                    rows.append(_row(ds, a, la, b, lb, f"stitch/{fam}", "a->b", split, "-", t[i, j]))
                    rows.append(_row(ds, a, la, b, lb, f"stitch/{fam}", "b->a", split, "-", t[j, i]))
                elif similarity.measure(name.split("@")[0]).symmetric:
                    rows.append(_row(ds, a, la, b, lb, name, "sym", "all", "-", t[i, j]))
                else:
                    rows.append(_row(ds, a, la, b, lb, name, "a->b", "all", "-", t[i, j]))
                    rows.append(_row(ds, a, la, b, lb, name, "b->a", "all", "-", t[j, i]))
    return rows


def _model_pairs(models: list) -> list[tuple]:
    return [(a, b) for k, a in enumerate(models) for b in models[k + 1:]]


def _grid_stage(ds: str, models: list, x: np.ndarray, cfg: StudyConfig, out: pathlib.Path, log) -> dict:
    """Compare every model pair of ``ds`` (skipping the pairs already written); returns timings."""
    import funsim.models as models_lib
    from funsim.experiments import distributed

    pdir = out / "pairs" / ds
    pairs = _model_pairs(models)
    todo = [(a, b) for a, b in pairs if not _unit_done(pdir / f"{_slug(a.id)}__{_slug(b.id)}.json")]
    # N processes: the grid is one compare_grid call over the global mesh (a collective), so all of them run
    # it if any process misses a pair file; each then writes its own share of the pair files.
    units = [pdir / f"{_slug(a.id)}__{_slug(b.id)}.json" for a, b in pairs]
    if not any(distributed.all_agree(bool(todo))):
        log(f"      {ds}: all {len(pairs)} model pairs compared before")
        return {"pairs": len(pairs), "computed": 0, "seconds": 0.0, "units": units}
    t0 = time.time()

    def representations(point: str, flat: str) -> tuple[dict, dict]:
        reps, index = {}, {}
        for m in models:
            for layer, z in models_lib.flatten_features(_features(m.model, x, point=point), policy=flat).items():
                index[m.id, layer] = len(reps)
                reps[f"{m.id}:{layer}"] = np.asarray(z, np.float32)
        return reps, index

    reps, index = representations(cfg.activation_point, cfg.flatten)
    rsa = [m for m in cfg.measures if m.startswith("rsa/")]
    measures = [m for m in cfg.measures if m not in rsa] + list(stitch_measure_names(cfg))
    log(f"      {ds}: {len(reps)} layers x {len(reps)} layers, {len(measures) + len(rsa)} measures "
        f"({cfg.activation_point}, {cfg.flatten})")
    tables = _grid(reps, measures, cfg)
    rsa_tables, skipped = _limited_grid(reps, rsa, cfg, cfg.rsa_max_features)
    tables.update(rsa_tables)
    undefined = {"rsa_layers_over_max_features": skipped if rsa else 0}
    for conv in cfg.conventions:
        point, _, flat = conv.partition("/")
        creps, cindex = representations(point, flat)
        assert cindex == index  # the same layers in the same order
        ctables, cskipped = _limited_grid(creps, list(cfg.convention_measures), cfg, cfg.rsa_max_features)
        log(f"      {ds}: convention {conv}: {len(creps) - cskipped} layers of <= {cfg.rsa_max_features} features "
            f"({cskipped} left out, NaN)")
        tables.update({f"{m}@{conv}": t for m, t in ctables.items()})
        undefined[f"layers_over_max_features@{conv}"] = cskipped
    mine = {(a.id, b.id) for a, b in distributed.my_units(pairs)}
    for a, b in todo:
        if (a.id, b.id) not in mine:
            continue
        write_json_atomic(pdir / f"{_slug(a.id)}__{_slug(b.id)}.json",
                          {"model_a": a.id, "model_b": b.id, "rows": _pair_rows(ds, a, b, index, tables, cfg)})
    return {"pairs": len(pairs), "computed": len(todo), "seconds": round(time.time() - t0, 1), "units": units,
            "undefined": undefined}


# ----------------------------------------------------------------------------- stage 2: task-loss stitching


def _eligible(m, cfg: StudyConfig) -> list[str]:
    return [la for la in m.layers if cfg.stitch_layers == "all" or len(m.feature_shapes[la]) == 1]


def _stitch_targets(models: list, cfg: StudyConfig) -> list[tuple[str, str, list[tuple]]]:
    """``[(architecture name, target layer, [(source model, source layer), ...])]``, in zoo order."""
    names = list(dict.fromkeys(m.name for m in models))
    out = []
    for name in names:
        tgt = next(m for m in models if m.name == name)
        for lt in _eligible(tgt, cfg):
            conv = len(tgt.feature_shapes[lt]) == 3  # a conv target takes conv sources (1x1 convolutions)
            srcs = [(m, ls) for m in models for ls in _eligible(m, cfg)
                    if abs(m.relative_depth[ls] - tgt.relative_depth[lt]) <= cfg.depth_tolerance + 1e-9
                    and (not conv or len(m.feature_shapes[ls]) == 3)]
            if srcs:
                out.append((name, lt, srcs))
    return out


def _scores(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy (nats), float64."""
    logits = np.asarray(logits, np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return float(np.mean(np.argmax(logits, -1) == y)), float(-np.mean(logp[np.arange(len(y)), y]))


def _head_eligible(model, layer: str) -> bool:
    """Whether a new head on ``model``'s penultimate stage can follow ``layer`` (at or before that stage)."""
    import funsim.models as models_lib

    pen = models_lib.penultimate(model.model)
    return pen is not None and model.layers.index(layer) <= model.layers.index(pen)


def _train_heads(models: list, ds_obj, zdata, groupings: dict, cfg: StudyConfig) -> dict:
    """``{model id: {grouping: head}}``: each model's new coarse head on its frozen penultimate features,
    trained on every training row of the data set with the coarse labels."""
    import funsim.models as models_lib

    heads = {}
    for m in models:
        pen = models_lib.penultimate(m.model)
        if pen is None:
            continue
        z = _features(m.model, ds_obj.x_train)[pen].reshape(len(ds_obj.x_train), -1)
        heads[m.id] = {g: models_lib.train_head(z, zdata.coarse[g].y_train, max(mp) + 1, steps=cfg.coarse_head_steps)
                       for g, mp in groupings.items()}
    return heads


def _family_keys(seed: int, jobs: tuple[int, ...], k_count: int, repeat: int):
    """The stitchers' keys of one target in one compiled program (not an eager op per key and shape).

    Family ``f``'s K keys are ``split(fold_in(key(seed), jobs[f]), K)``; returns them family by family,
    ``repeat`` times over (one block per task trained through the target's tail), and once.
    """
    return _family_keys_jit()(seed, np.asarray(jobs, np.int32), k_count, repeat)


@functools.cache
def _family_keys_jit():
    import jax
    import jax.numpy as jnp

    def run(seed, jobs, k_count, repeat):
        base = jax.random.key(seed)
        keys = jax.vmap(lambda j: jax.random.split(jax.random.fold_in(base, j), k_count))(jobs).reshape(-1)
        return jnp.concatenate([keys] * repeat), keys

    return jax.jit(run, static_argnums=(2, 3))


def _stitch_target(ds: str, lt: str, srcs: list, targets: list, order: dict, feats: dict, ys: dict, tasks: dict,
                   families: dict, cfg: StudyConfig, heads: dict | None = None) -> dict[str, dict[str, list[dict]]]:
    """Train every source into layer ``lt`` of every target model (the seeds of one architecture).

    ``families`` maps each family to train to its job index, which seeds its key
    (``fold_in(key(cfg.seed), index)``, split over the sources: :func:`_family_keys`). Training and
    evaluation are one compiled program each per tail, not per task or family: the fine and coarse
    tasks' stitchers of every family train in one ``train_stitchers`` call through the target's own
    tail (a coarse task's with
    its ``label_groups``: the summed softmax of each group, as :class:`CoarseTail`) and are evaluated
    together (a coarse task's logits are the fine ones coarsened on the host); each coarse head's
    stitchers train and evaluate through that head. Every task's stitchers get the keys a call of
    its own would have split from each family's key. The targets' own logits come from the same
    evaluation program, through identity stitchers on their own activations. Returns
    ``{family: {task: rows}}``.
    """
    import funsim.models as models_lib
    from funsim import similarity
    tail, params = models_lib.stack_tails([t.model for t in targets], lt)
    z_tr = [feats[m.id]["train"][ls] for m, ls in srcs]
    z_te = [feats[m.id]["test"][ls] for m, ls in srcs]
    z_tgt = np.stack([feats[t.id]["train"][lt] for t in targets])
    z_own = [feats[t.id]["test"][lt] for t in targets]
    tshape = targets[0].feature_shapes[lt]
    fams = list(families)
    k_count, m_count, width = len(srcs), len(targets), tshape[-1]
    identity = [similarity.Stitcher(np.broadcast_to(np.eye(width, dtype=z_own[0].dtype), (m_count, width, width)),
                                    np.zeros((m_count, width), z_own[0].dtype), np.ones(m_count, z_own[0].dtype),
                                    "affine")] * m_count
    # the fine and coarse tasks: one train_stitchers call through the target's own tail, the coarse
    # stitchers with their grouping (a coarse label is the grouping of the fine one); each task's
    # stitchers get the keys its own call would have had (family by family)
    plain = [t for t in tasks if not t.startswith("coarse_head:")]
    y_fine = ys["fine"][0]
    for task in plain:
        if tasks[task] is not None and not np.array_equal(ys[task][0], np.asarray(tasks[task])[y_fine]):
            raise ValueError(f"The {task!r} training labels are not the grouping {tasks[task]} of the fine "
                             "labels; the zoo's manifest and its data disagree (rebuild the zoo).")
    keys, head_keys = _family_keys(cfg.seed, tuple(families.values()), k_count, len(plain))
    trained_plain = similarity.train_stitchers(
        z_tr * len(fams) * len(plain), y_fine, tail, params, family=[f for _ in plain for f in fams for _ in srcs],
        label_groups=[tasks[t] for t in plain for _ in fams for _ in srcs], init="closed_form", z_tgt=z_tgt,
        stacked_tails=True, steps=cfg.stitch_steps, learning_rate=cfg.stitch_learning_rate,
        batch_size=cfg.stitch_batch_size, eval_every=cfg.stitch_steps, key=keys,
    )
    per_task = len(fams) * k_count
    trained = {t: trained_plain[i * per_task:(i + 1) * per_task] for i, t in enumerate(plain)}
    evals = {"own tail": (tail, params, plain)}  # tail name -> (tail, params, [tasks])
    for task in tasks:
        if not task.startswith("coarse_head:") or not _head_eligible(targets[0], lt):
            continue
        # the paper's coarse readout: each target's new head on its frozen penultimate features
        g = task.split(":", 1)[1]
        tail_t, params_t = models_lib.stack_head_tails([t.model for t in targets], lt,
                                                       [heads[t.id][g] for t in targets])
        evals[task] = (tail_t, params_t, [task])
        trained[task] = similarity.train_stitchers(
            z_tr * len(fams), ys[task][0], tail_t, params_t, family=[f for f in fams for _ in srcs],
            init="closed_form", z_tgt=z_tgt, stacked_tails=True, steps=cfg.stitch_steps,
            learning_rate=cfg.stitch_learning_rate, batch_size=cfg.stitch_batch_size, eval_every=cfg.stitch_steps,
            key=head_keys,
        )
    out = {f: {} for f in fams}
    for tail_e, params_e, names in evals.values():
        stitchers = [t.stitcher for task in names for t in trained[task]] + identity
        logits_all = similarity.stitched_logits(tail_e, params_e, stitchers, z_te * len(fams) * len(names) + z_own, tshape)
        own_all = logits_all[-m_count:][np.arange(m_count), np.arange(m_count)]  # (M, n, C): target m's own
        for ti, task in enumerate(names):
            groups = tasks[task]
            coarse = task.startswith("coarse:")  # trained through the coarsened tail: coarsen here too
            logits_task = logits_all[ti * len(fams) * k_count:(ti + 1) * len(fams) * k_count]
            own = np.asarray(coarsen_logits(own_all, groups)) if coarse else own_all
            if coarse:
                logits_task = np.asarray(coarsen_logits(logits_task, groups))
            evaluations = [(task, None)]
            if groups is None:  # the fine stitchers' predictions, coarsened: accuracy can only go up
                evaluations += [(t.replace("coarse:", "coarsened:"), gr) for t, gr in tasks.items()
                                if gr is not None and t.startswith("coarse:")]
            for fi, family in enumerate(fams):
                logits = logits_task[fi * k_count:(fi + 1) * k_count]
                out[family][task] = _target_rows(ds, lt, srcs, targets, order, ys, ys[task][1], own, logits,
                                                 evaluations, family)
    return out


def _target_rows(ds, lt, srcs, targets, order, ys, y_te, own, logits, evaluations, family) -> list[dict]:
    """The table rows of one family's K stitchers (``logits (K, M, n, C)``) into layer ``lt`` on one task."""
    rows = []
    for k, (src, ls) in enumerate(srcs):
        for mi, tgt in enumerate(targets):
            if src.id == tgt.id:
                continue  # a model stitched into itself
            for ev_task, coarsen in evaluations:
                if coarsen is None:
                    yv, st_logits, own_logits = y_te, logits[k, mi], own[mi]
                else:
                    yv = ys[ev_task.replace("coarsened", "coarse")][1]
                    pick = np.asarray(coarsen)
                    st_logits = np.eye(max(coarsen) + 1)[pick[np.argmax(logits[k, mi], -1)]]
                    own_logits = np.eye(max(coarsen) + 1)[pick[np.argmax(own[mi], -1)]]
                acc, ce = _scores(st_logits, yv)
                own_acc, own_ce = _scores(own_logits, yv)
                # rows keep zoo order (A before B); the direction says which is the source
                a, la, b, lb, direction = (src, ls, tgt, lt, "a->b") if order[src.id] < order[tgt.id] else \
                    (tgt, lt, src, ls, "b->a")
                vals = {"relative_accuracy": acc / own_acc if own_acc > 0 else float("nan"),
                        "accuracy": acc, "own_accuracy": own_acc}
                if coarsen is None:
                    vals["ce_gap"] = ce - own_ce
                for q, v in vals.items():
                    rows.append(_row(ds, a, la, b, lb, f"task/{family}/{q}", direction, "held_out", ev_task, v))
    return rows


def _stitch_stage(ds: str, models: list, zdata, manifest_ds: dict, cfg: StudyConfig, out: pathlib.Path, log,
                  progress: bool) -> dict:
    from tqdm.auto import tqdm

    from funsim.experiments import distributed

    targets_all = _stitch_targets(models, cfg)
    groupings = {g: tuple(int(c) for c in manifest_ds["coarse"][g]["map"])
                 for g in cfg.coarse_groupings if g in manifest_ds.get("coarse", {})
                 and "map" in manifest_ds["coarse"][g]}
    tasks = {"fine": None, **{f"coarse:{g}": m for g, m in groupings.items()}}
    if cfg.coarse_head:
        tasks.update({f"coarse_head:{g}": m for g, m in groupings.items()})
    jobs = [(fam, name, lt, srcs) for fam in cfg.stitch_families for name, lt, srcs in targets_all]
    path = lambda task, fam, name, lt: out / "stitch" / ds / task.replace(":", "_") / fam / f"{name}__{lt}.json"  # noqa: E731
    # N processes: target layer t (all its families) is trained by process t mod N, on its own devices. The
    # job (family f, target t) keeps its index j = f * T + t, which seeds its key: the same when resumed.
    n_t = len(targets_all)
    todo = []
    for t, (name, lt, srcs) in distributed.my_units(list(enumerate(targets_all))):
        fams = {fam: f * n_t + t for f, fam in enumerate(cfg.stitch_families)
                if not all([_unit_done(path(task, fam, name, lt)) for task in tasks])}
        if fams:
            todo.append((name, lt, srcs, fams))
    n_todo = sum(len(fams) for *_, fams in todo)
    n_pairs = sum(len(s) for _, _, _, s in jobs)
    units = [path(t, *job[:3]) for job in jobs for t in tasks]
    if not todo:
        log(f"      {ds}: all {len(jobs)} stitching targets done before")
        return {"targets": len(jobs), "computed": 0, "seconds": 0.0, "source_target_pairs": n_pairs, "units": units}
    t0 = time.time()
    ds_obj = zdata.dataset
    rows = _rows_by_dataset(cfg).get(ds, cfg.stitch_train_rows)
    n_tr = len(ds_obj.x_train) if rows is None else min(rows, len(ds_obj.x_train))
    x_tr, x_te = ds_obj.x_train[:n_tr], ds_obj.x_test
    feats = {m.id: {"train": _features(m.model, x_tr), "test": _features(m.model, x_te)} for m in models}
    ys = {"fine": (ds_obj.y_train[:n_tr], ds_obj.y_test)}
    for g in groupings:
        c = zdata.coarse[g]
        ys[f"coarse:{g}"] = ys[f"coarse_head:{g}"] = (c.y_train[:n_tr], c.y_test)
    heads = _train_heads(models, ds_obj, zdata, groupings, cfg) if cfg.coarse_head and groupings else {}
    log(f"      {ds}: task-loss stitching, {n_todo} targets ({len(todo)} layers x families "
        f"{', '.join(cfg.stitch_families)}; tasks {', '.join(tasks)}), {n_tr} training rows, {len(x_te)} held-out rows")
    order = {m.id: k for k, m in enumerate(models)}
    bar = tqdm(todo, desc=f"stitch {ds}", disable=not distributed.show_progress(progress), leave=False)
    for name, lt, srcs, fams in bar:
        bar.set_postfix_str(f"{name}:{lt}")
        targets = [m for m in models if m.name == name]
        jit_memory.release_if_near_limit()  # each target compiles its own programs (see _grid)
        rows = _stitch_target(ds, lt, srcs, targets, order, feats, ys, tasks, fams, cfg, heads)
        for fam in fams:
            for task in tasks:  # a task the target cannot take (no head after this layer): an empty unit
                write_json_atomic(path(task, fam, name, lt), {"target": f"{name}:{lt}", "family": fam, "task": task,
                                                              "rows": rows[fam].get(task, [])})
    bar.close()
    return {"targets": len(jobs), "computed": n_todo, "seconds": round(time.time() - t0, 1),
            "source_target_pairs": n_pairs, "units": units}


# ----------------------------------------------------------------------------- the table


def _unit_done(path: pathlib.Path) -> bool:
    """Whether the unit file ``path`` is written and reads back; a damaged one is removed, with a warning
    naming it, so that the rerun recomputes it."""
    from funsim.experiments.io import DamagedFileError

    if not path.is_file():
        return False
    try:
        ok = isinstance(read_json(path).get("rows"), list)
    except (DamagedFileError, AttributeError):
        ok = False
    if not ok:
        warnings.warn(f"{path} is damaged (truncated or changed); recomputing it.", RuntimeWarning, stacklevel=2)
        path.unlink()
    return ok


def _unit_files(out: pathlib.Path, ds_list: list[str]) -> list[pathlib.Path]:
    files = []
    for ds in ds_list:
        files += sorted((out / "pairs" / ds).glob("*.json"))
        files += sorted((out / "stitch" / ds).rglob("*.json"))
    return files


def _write_table(out: pathlib.Path, files: list[pathlib.Path]) -> int:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    n = 0
    for f in files:
        for r in read_json(f)["rows"]:
            # an undefined cell (NaN) is stored as JSON null in its unit file; "nan" in the table
            w.writerow({**r, "value": repr(float("nan") if r["value"] is None else float(r["value"]))})
            n += 1
    write_table_atomic(out / "comparisons.csv", buf.getvalue().encode(), n)  # with its manifest: rows, SHA-256
    return n


def _rerun_hint(path: pathlib.Path) -> str:
    run = path.parent
    return (f"Rerun the similarity study that wrote it (`funsim similarity-study --config {run / 'config.json'} "
            f"--run {run.name} --root {run.parent.parent}`, or the command you ran): it keeps every finished unit "
            "and rewrites the table.")


def read_table(path: str | pathlib.Path, *, verify: bool = True) -> dict[str, np.ndarray]:
    """``comparisons.csv`` as columns: ``{column: (n,) array}`` (strings, or floats for depths and values).

    Args:
      path: the table.
      verify: check it against its manifest (``comparisons.manifest.json``: the row
        count, size and SHA-256 written with it) first, so that a table cut short
        (even at a line boundary) or changed is refused, not read.

    Raises:
      DamagedFileError: (a ``ValueError``) the table does not match its manifest, or
        a row is cut or malformed; the message names the file (and line) and says
        how to rewrite it.
      ValueError: the file is not a similarity-study table.
    """
    from funsim.experiments.io import DamagedFileError, verify_table

    path = pathlib.Path(path)
    manifest = verify_table(path, fix=_rerun_hint(path)) if verify else None
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f)) or [[]]
    missing = set(COLUMNS) - set(header)
    if missing:
        raise ValueError(f"{path} lacks the columns {sorted(missing)}; it is not a similarity-study table.")
    if not rows:
        raise ValueError(f"{path} has no comparisons.")
    for i, r in enumerate(rows):
        if len(r) != len(header):
            raise DamagedFileError(f"{path}, line {i + 2}: {len(r)} fields where the header has {len(header)}: the "
                                   f"row is cut or malformed. {_rerun_hint(path)}")
    if manifest is not None and len(rows) != manifest.get("rows"):
        raise DamagedFileError(f"{path} has {len(rows)} rows where its manifest says {manifest.get('rows')}. "
                               f"{_rerun_hint(path)}")
    col = {c: header.index(c) for c in COLUMNS}
    out = {c: np.array([r[col[c]] for r in rows]) for c in COLUMNS}
    for c in ("depth_a", "depth_b", "value"):
        try:
            out[c] = out[c].astype(np.float64)
        except ValueError:
            bad = next(i for i, v in enumerate(out[c]) if not _is_float(v))
            raise DamagedFileError(f"{path}, line {bad + 2}: column {c} holds {out[c][bad]!r}, not a number. "
                                   f"{_rerun_hint(path)}") from None
    return out


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------- run


@releases_run_locks
def run(cfg: StudyConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the study; returns the metrics dict.

    Raises:
      FileNotFoundError: no zoo at ``cfg.zoo``.
      ValueError: a bad config, or a run directory holding a study with another config.
    """
    from tqdm.auto import tqdm

    from funsim.experiments import distributed
    from funsim.experiments import zoo as zoo_lib

    _check_config(cfg)
    t0 = time.time()
    n_proc = distributed.process_count()
    if n_proc > 1:
        log = (lambda say: lambda msg: say(distributed.log_prefix() + msg))(log)
    zoo_dir = _zoo_dir(cfg, root)
    manifest = zoo_lib.read_manifest(zoo_dir)
    out = open_run("similarity_study", run_name or cfg.name, root=root, config=cfg)  # locked; a changed config is refused
    available = [k for k, d in manifest["datasets"].items() if d["status"] == "ok"]
    ds_list = available if cfg.datasets is None else list(cfg.datasets)
    missing = sorted(set(ds_list) - set(available))
    if missing:
        raise ValueError(f"Data sets {missing} are not trained in the zoo {zoo_dir}; it has {available}.")
    stages = {}
    bar = tqdm(ds_list, desc="similarity study", disable=not distributed.show_progress(progress))
    for ds in bar:
        bar.set_postfix_str(ds)
        zoo = zoo_lib.load_zoo(zoo_dir, datasets=(ds,))
        zdata = zoo.data(ds)
        models = zoo.by_dataset(ds)
        log(f"[{ds}] {len(models)} models, {sum(len(m.layers) for m in models)} layers")
        grid = _grid_stage(ds, models, _rows(zdata.dataset, cfg.n_rows), cfg, out, log)
        stitch = (_stitch_stage(ds, models, zdata, manifest["datasets"][ds], cfg, out, log, progress)
                  if cfg.stitch_families else {})
        stages[ds] = {"models": len(models), "grid": grid, "stitch": stitch}
        jit_memory.release_if_near_limit()  # this data set's programs, if near the limit (see _grid)
    bar.close()
    units = [f for s in stages.values() for f in s["grid"].pop("units") + s["stitch"].pop("units", [])]
    if n_proc > 1:  # the other processes' units: model pairs and stitching targets
        distributed.wait_for_files(units, what="study units", done=_unit_done, log=log)
    if not distributed.is_main_process():  # process 0 writes the table and the report; wait, then read them
        distributed.barrier("similarity study: merged")
        return {**read_json(out / "metrics.json"), "out": str(out)}
    n_rows = _write_table(out, _unit_files(out, ds_list))
    seconds = round(time.time() - t0, 1)
    metrics = {
        "zoo": str(zoo_dir), "datasets": ds_list, "stages": stages, "comparisons": n_rows,
        "layer_pair_comparisons": sum(_layer_pairs(zoo_lib, zoo_dir, ds) for ds in ds_list),
        "seconds_this_invocation": seconds,
    }
    write_json_atomic(out / "metrics.json", metrics)
    write_text_atomic(out / "summary.md", summary(cfg, metrics))
    log(f"[done] {n_rows} comparisons in {out}/comparisons.csv; {seconds:.0f} s this invocation")
    distributed.barrier("similarity study: merged")
    return {**metrics, "out": str(out)}


def _layer_pairs(zoo_lib, zoo_dir, ds) -> int:
    """Layer pairs across the model pairs of ``ds`` (each unordered pair once)."""
    m = zoo_lib.read_manifest(zoo_dir)["models"]
    sizes = [len(e["layers"]) for e in m.values() if e["dataset"] == ds]
    return (sum(sizes) ** 2 - sum(s * s for s in sizes)) // 2


def summary(cfg: StudyConfig, metrics: dict) -> str:
    """The run's summary.md: what ran and how long; the findings are in ``funsim report usable-information``."""
    lines = [f"# Similarity study `{cfg.name}`", "",
             f"Zoo: `{metrics['zoo']}`; data sets: {', '.join(metrics['datasets'])}. "
             f"{metrics['layer_pair_comparisons']} layer pairs (each unordered pair of layers of two different models "
             f"once), {metrics['comparisons']} rows in `comparisons.csv`.", "",
             f"Representations: {cfg.n_rows} rows per data set, dense layers {cfg.activation_point.replace('_', '-')}, "
             f"conv maps by `{cfg.flatten}`; RSA undefined (NaN) where a layer has more than {cfg.rsa_max_features} "
             f"features; extra conventions {', '.join(cfg.conventions) or 'none'} (measures "
             f"{', '.join(cfg.convention_measures)}, layers of at most {cfg.rsa_max_features} features); measures "
             f"{', '.join(cfg.measures)}; closed-form reconstruction scores of {', '.join(cfg.families)} "
             f"(affine ridge {cfg.affine_ridge:g}), held out (train fraction {cfg.split}) and in sample.", "",
             f"Task-loss stitching: families {', '.join(cfg.stitch_families) or 'none'}, {cfg.stitch_layers} layers at "
             f"relative depths within {cfg.depth_tolerance}, {cfg.stitch_steps} Adam steps (learning rate "
             f"{cfg.stitch_learning_rate}, batch {cfg.stitch_batch_size}) from the closed-form init, coarse groupings "
             f"{', '.join(cfg.coarse_groupings) or 'none'} where the data set has them.", "",
             "| data set | models | model pairs | grid seconds | stitching targets | source-target pairs | stitching seconds |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for ds, s in metrics["stages"].items():
        st = s["stitch"] or {"targets": 0, "source_target_pairs": 0, "seconds": 0}
        lines.append(f"| {ds} | {s['models']} | {s['grid']['pairs']} | {s['grid']['seconds']} | {st['targets']} | "
                     f"{st['source_target_pairs']} | {st['seconds']} |")
    for ds, s in metrics["stages"].items():
        for what, n in s["grid"].get("undefined", {}).items():
            if n:
                lines.append(f"- {ds}: {n} layers left out ({what.replace('_', ' ')}): their cells are NaN.")
    lines += ["", f"{metrics['seconds_this_invocation']:.0f} s this invocation (units done before are not redone).",
              "", "The findings: `funsim report usable-information --run <this directory>`.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, StudyConfig, CONFIGS)
    parser.add_argument("--zoo", default=None, help="the zoo run (a name under ROOT/zoo/ or a directory; "
                        "default: the config's)")
    parser.add_argument("--run", default=None,
                        help="run name (default: the config's name and its --set overrides; reruns resume it)")
    parser.add_argument("--root", default="results", help="results root directory (default: results)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")


def main(args: argparse.Namespace) -> int:
    cfg, name = config_lib.from_args(args, StudyConfig, CONFIGS)
    cfg = cfg if args.zoo is None else dataclasses.replace(cfg, zoo=args.zoo)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        run(cfg, root=args.root, run_name=args.run or name, progress=not args.no_progress)
    except FileNotFoundError as e:
        print(f"funsim similarity-study: {e}")
        return 1
    return 0
