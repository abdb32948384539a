"""``funsim grokking``: modular addition with one bilinear layer, and the phases of training it.

Run::

    funsim grokking --config default      # 50k full-batch steps, 90 checkpoints spaced by the 5th power
    funsim grokking --config smoke        # seconds (the test suite runs it)
    funsim grokking --config paper        # the authors' 100k steps at batch 512 (about 5 min here)
    funsim grokking --config my.json      # any GrokkingConfig fields
    funsim grokking --authors-run DIR     # beside the authors' released run (see below)

Rerunning the same command resumes: the run directory defaults to the config's
name, training continues from its last checkpoint and the analysis is redone.

Steps:

1. train :class:`models.BilinearMLP` with ``embed=False, head=False``: one-hot
   ``(a, b)`` of width ``2p`` -> one bilinear layer with ``d_hidden`` hidden
   units whose ``down`` projection is the head to the ``p`` classes; AdamW,
   full batch by default, power-spaced checkpoints (``models.train``);
2. evaluate every checkpoint (and the initial network) on the train pairs and
   the held-out pairs;
3. checkpoint x checkpoint similarity matrices (:func:`checkpoint_matrices`):
   tensor similarity under the symmetric and the Gaussian metric, from the
   weights alone, beside weight cosine, behavioural similarity and linear CKA
   of the logits on held-out pairs;
4. split each matrix into ``n_segments`` contiguous phases
   (:func:`similarity.change_points`) and set the boundaries beside the
   accuracy events (:func:`accuracy_events`);
5. Fourier power of the bilinear layer's input weights for token a and for
   token b, and of its output weights, along the token axis, per checkpoint;
6. the authors' released run (:func:`authors_run`) beside ours at a matched
   checkpoint grid and horizon (:func:`compare_runs`): phase starts and
   similarity to the final checkpoint, like with like; their matrix alone under
   each protocol (:func:`reference_protocols`) shows how much the phase starts
   move with the spacing and the run length. The project ships none of their
   files: clone https://github.com/tdooms/tensor-similarity and point
   ``--authors-run`` (or ``FUNSIM_GROKKING_AUTHORS``) at its
   ``workspaces/logan/grokking_summary_bundle/results_grokking_summary/``
   (``checkpoint_steps.npy``, ``tn_similarity.npy``, ``act_similarity.npy``,
   ``training_history.json``, ``config.json``; checked at commit
   bc914a4babc943541d414b4239b1df7f032d115b). Without it the summary says
   how to get them and the comparison's verdict is inconclusive;
7. the verdicts: every rule of ``GrokkingConfig.verdict_rules`` applied to the
   statistics of :func:`verdict_statistics` (:mod:`experiments.verdict`);
8. write ``results/grokking/<run>/``: ``config.json``, ``metrics.json``
   (atomic), ``matrices.npz``, ``model/`` (checkpoints), ``accuracy.png``,
   ``similarity_matrices.png``, ``similarity_to_final.png``, ``fourier.png``
   and ``summary.md`` (our numbers beside the paper's, and the verdicts).

**Checkpoint spacing.** The phase starts that ``change_points`` finds depend on
where the checkpoints lie (the pairwise cost counts checkpoint pairs, so a
densely sampled stretch weighs more) and on how long the run is. Every config
therefore uses the authors' rule, ``floor(T (i / (n - 1))^5)`` for
``i = 0..n-1`` (:func:`checkpoint_schedule`), and the comparison with their run
is made on a common grid up to a common horizon.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import time

import numpy as np

from funsim.experiments import config as config_lib
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.io import (
    open_run,
    releases_run_locks,
    write_atomic,
    write_json_atomic,
    write_text_atomic,
)
from funsim.experiments.verdict import Rule

__all__ = [
    "GrokkingConfig",
    "CONFIGS",
    "PAPER",
    "MEASURES",
    "RULES",
    "STATISTICS",
    "checkpoint_schedule",
    "make_model",
    "authors_run",
    "mutual_nearest",
    "matched_grid",
    "phase_starts",
    "compare_runs",
    "reference_protocols",
    "verdict_statistics",
    "run",
    "checkpoint_matrices",
    "evaluate_checkpoints",
    "fourier_power",
    "operand_spectra",
    "spectrum_summary",
    "accuracy_events",
    "compare_boundaries",
    "add_arguments",
    "main",
]


#: The statistics :func:`verdict_statistics` computes; a rule may name any of them.
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
        :func:`checkpoint_schedule` (``"authors"``: their rule, the default; ``"power"``:
        ``models.train.power_schedule``).
      eval_every: the training history's evaluation period (the checkpoints are evaluated too).
      n_eval: held-out pairs (a seeded subset) for behavioural similarity and CKA.
      n_segments: phases to split each similarity matrix into.
      segment_cost: ``"pairwise"`` (the authors' choice) or ``"kernel"``; both are reported.
      n_top_frequencies: k of the "power in the top-k frequencies" statistic.
      compare_authors: set the authors' released run beside ours (:func:`authors_run`;
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


CHECKPOINT_RULES = ("authors", "power")


def checkpoint_schedule(total_steps: int, n: int, /, *, power: float = 5.0, rule: str = "authors") -> tuple[int, ...]:
    """The checkpoint steps after step 0 (which is always evaluated: the initialisation).

    ``rule="authors"``: ``floor(T (i / (n - 1))^power)`` for ``i = 0..n-1``, and ``T``
    (the authors' power schedule; with ``T = 100_000, n = 100, power = 5`` it gives the 89
    steps of their released run). ``rule="power"``: ``round(T (i / n)^power)`` for
    ``i = 1..n`` (:func:`models.train.power_schedule`). Duplicates merge, so fewer than
    ``n`` steps can come back; the last is always ``T``.

    Examples:
      >>> checkpoint_schedule(1000, 5, power=2.0)
      (62, 250, 562, 1000)
      >>> checkpoint_schedule(1000, 5, power=2.0, rule="power")
      (40, 160, 360, 640, 1000)
    """
    from funsim.models.train import power_schedule

    if rule not in CHECKPOINT_RULES:
        raise ValueError(f"checkpoint rule must be one of {', '.join(CHECKPOINT_RULES)}, got {rule!r}.")
    if rule == "power":
        return power_schedule(total_steps, n, power=power)
    if total_steps < 1 or n < 2 or not power > 0:
        raise ValueError(f"checkpoint_schedule needs total_steps >= 1, n >= 2, power > 0; got {total_steps}, {n}, {power}.")
    t = np.floor(total_steps * np.linspace(0.0, 1.0, n) ** power).astype(np.int64)
    return tuple(sorted({int(s) for s in t if s > 0} | {int(total_steps)}))


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
#: which the project does not ship: :func:`authors_run` reads the authors' files from a clone; the
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

MEASURES = ("tensor (symmetric)", "tensor (gaussian)", "weight cosine", "behavioural", "CKA (logits)")


# --------------------------------------------------------------------------- analysis


def checkpoint_matrices(nets, x_eval, /) -> dict[str, np.ndarray]:
    """Checkpoint x checkpoint similarity: tensor similarity beside three baselines.

    A thin naming layer over :func:`experiments.checkpoint_similarity.checkpoint_matrices`.

    Args:
      nets: a stacked network: a tuple of layers whose every leaf has a leading
        checkpoint axis of length ``n``.
      x_eval: ``(m, d)`` held-out inputs for the data-based baselines.

    Returns:
      ``{measure: (n, n)}`` float64, keyed by :data:`MEASURES`:
      ``similarity_matrix`` under the symmetric and the Gaussian metric (one
      vmapped call each); ``weight_cosine`` of every pair; behavioural similarity
      (``behavioral_similarity``: the mean per-sample cosine of the logits on
      ``x_eval``) and linear CKA of the logits on ``x_eval`` (``similarity.cka``),
      both from the logits computed once per checkpoint.

    Raises:
      ValueError: a non-finite matrix (a checkpoint's logits zero or constant on ``x_eval``).
    """
    from funsim.experiments import checkpoint_similarity as cs

    mats = cs.checkpoint_matrices(nets, data={"eval": x_eval}, metrics=("symmetric", "gaussian"), per_output=False)
    keys = ("tensor/symmetric", "tensor/gaussian", "weight_cosine", "behavioral/eval", "cka/eval")
    out = {name: np.asarray(mats[k], np.float64) for name, k in zip(MEASURES, keys)}
    for k, v in out.items():
        if not np.all(np.isfinite(v)):
            raise ValueError(f"The {k} matrix has non-finite entries: a checkpoint's logits are zero "
                             "or constant on x_eval, where the measure is undefined.")
    return out


@functools.cache
def _evaluate():
    """The jitted ``evaluate(nets, x, y) -> (loss, correct)`` (built on first use: importing this module stays jax-free)."""
    import jax
    import jax.numpy as jnp
    import optax

    from funsim.similarity.multilinear import apply_network

    @jax.jit
    def evaluate(nets, x, y):
        def one(net):
            logits = apply_network(net, x)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, jnp.sum(jnp.argmax(logits, axis=-1) == y)  # a count: a float32 mean of 1s can fall short of 1

        return jax.lax.map(one, nets)

    return evaluate


def evaluate_checkpoints(nets, x, y, /) -> dict[str, np.ndarray]:
    """Cross-entropy and accuracy of every checkpoint of a stacked network.

    Args:
      nets: stacked network (leading checkpoint axis ``n``).
      x: ``(m, d)`` inputs.
      y: ``(m,)`` integer labels.

    Returns:
      ``{"loss": (n,), "accuracy": (n,)}``.
    """
    import jax.numpy as jnp

    loss, correct = _evaluate()(nets, jnp.asarray(x), jnp.asarray(y))
    return {"loss": np.asarray(loss, np.float64), "accuracy": np.asarray(correct, np.float64) / len(y)}


def fourier_power(w, /) -> np.ndarray:
    """Power of ``w`` per frequency along its last (token) axis.

    The discrete Fourier transform over ``Z_p``, ``F_k = sum_t w_t exp(-2 pi i k t / p)``;
    frequencies ``k`` and ``p - k`` describe the same real wave and are pooled
    into bin ``k``, so bin ``k`` in ``0..p//2`` holds ``|F_k|^2 + |F_{p-k}|^2``
    (``|F_0|^2`` for ``k = 0``, and ``|F_{p/2}|^2`` alone for even ``p``). By
    Parseval the bins sum to ``p * sum_t w_t^2``.

    Args:
      w: ``(..., p)`` real.

    Returns:
      ``(..., p // 2 + 1)`` float64.

    Examples:
      >>> t = np.arange(7)
      >>> fourier_power(np.cos(2 * np.pi * 2 * t / 7)).round(6).tolist()   # all power at k = 2
      [0.0, 0.0, 24.5, 0.0]
    """
    w = np.asarray(w, np.float64)
    p = w.shape[-1]
    pooled = np.full(p // 2 + 1, 2.0)
    pooled[0] = 1.0
    if p % 2 == 0:
        pooled[-1] = 1.0
    return np.abs(np.fft.rfft(w, axis=-1)) ** 2 * pooled


def operand_spectra(net, p: int, /) -> dict[str, np.ndarray]:
    """Fourier power of a one-bilinear-layer modular-addition network, per operand and per unit.

    ``"a"``: the rows of ``left`` and of ``right`` restricted to the one-hot of
    token a (input columns ``0..p-1``), each a function of a; ``"b"``: the same
    for token b (columns ``p..2p-1``); ``"out"``: each hidden unit's column of
    ``down``, a function of the output class.

    Args:
      net: ``(BilinearLayer,)`` with ``left, right: (..., h, 2p)`` and
        ``down: (..., p, h)`` (leading checkpoint axes allowed).
      p: the modulus.

    Returns:
      ``{"a": (..., 2h, K), "b": (..., 2h, K), "out": (..., h, K)}``, ``K = p // 2 + 1``
      (:func:`fourier_power` of every row; sum over the row axis for the layer's spectrum).
    """
    (layer,) = net
    left, right, down = (np.asarray(x) for x in (layer.left, layer.right, layer.down))
    if left.shape[-1] != 2 * p or down.shape[-2] != p:
        raise ValueError(f"operand_spectra expects left/right (..., h, {2 * p}) and down (..., {p}, h) "
                         f"for p={p}, got {left.shape} and {down.shape}.")
    rows = lambda cols: np.concatenate([left[..., cols], right[..., cols]], axis=-2)
    return {
        "a": fourier_power(rows(slice(0, p))),
        "b": fourier_power(rows(slice(p, 2 * p))),
        "out": fourier_power(np.swapaxes(down, -1, -2)),
    }


def spectrum_summary(power, /, *, n_top: int) -> dict[str, np.ndarray]:
    """Summary statistics of per-unit power spectra over the non-constant frequencies ``k >= 1``.

    Args:
      power: ``(..., r, K)``: the power per frequency bin (:func:`fourier_power`)
        of ``r`` units (rows); bin 0 is the constant.
      n_top: how many of the strongest frequencies ``top_fraction`` counts.

    Returns:
      ``{"top_fraction", "effective_frequencies", "unit_purity", "constant_fraction": (...),
      "distribution": (..., K - 1)}``. With ``q`` the layer's normalised non-constant power
      (summed over the units; ``distribution``): the share of it in the ``n_top`` strongest
      frequencies; its participation ratio ``1 / sum_k q_k^2`` (1 for a single frequency,
      ``K - 1`` for a flat spectrum); ``unit_purity``, the share of each unit's non-constant
      power in its own strongest frequency, averaged over the units weighted by their power
      (1 when every unit is a single wave, whatever the frequencies); the share of all power
      in bin 0.
    """
    power = np.asarray(power, np.float64)
    total = power[..., 1:].sum(axis=(-2, -1))
    layer = power.sum(axis=-2)
    q = layer[..., 1:] / total[..., None]
    return {
        "top_fraction": np.sort(q, axis=-1)[..., ::-1][..., :n_top].sum(axis=-1),
        "effective_frequencies": 1.0 / np.sum(q * q, axis=-1),
        "unit_purity": power[..., 1:].max(axis=-1).sum(axis=-1) / total,
        "constant_fraction": layer[..., 0] / layer.sum(axis=-1),
        "distribution": q,
    }


def accuracy_events(steps, train_acc, val_acc, val_loss, /) -> dict[str, int | None]:
    """Steps of the landmarks of grokking, read off per-checkpoint curves.

    Each is the first checkpoint at which the condition holds (None if never):
    train accuracy >= 0.5 and >= 0.99 (memorisation), the peak of the held-out
    loss, held-out accuracy >= 0.5, >= 0.99 and = 1 (generalisation).

    Args:
      steps: ``(n,)`` checkpoint steps, increasing.
      train_acc, val_acc, val_loss: ``(n,)`` per checkpoint.

    Returns:
      ``{event name: step or None}`` (the names of :data:`PAPER` ``["events"]``).
    """
    steps = [int(s) for s in steps]
    train_acc, val_acc, val_loss = (np.asarray(v, np.float64) for v in (train_acc, val_acc, val_loss))

    def first(mask):
        return steps[int(np.argmax(mask))] if np.any(mask) else None

    return {
        "train accuracy >= 0.5": first(train_acc >= 0.5),
        "train accuracy >= 0.99": first(train_acc >= 0.99),
        "val loss peak": steps[int(np.argmax(val_loss))],
        "val accuracy >= 0.5": first(val_acc >= 0.5),
        "val accuracy >= 0.99": first(val_acc >= 0.99),
        "val accuracy = 1": first(val_acc >= 1.0),
    }


def compare_boundaries(starts, steps, events, /) -> list[dict]:
    """Each phase boundary beside its nearest accuracy event, in checkpoints.

    Args:
      starts: ``(K,)`` segment starts (checkpoint indices, ``starts[0] == 0``).
      steps: ``(n,)`` checkpoint steps.
      events: ``{name: step or None}`` (:func:`accuracy_events`); every step is one of ``steps``.

    Returns:
      one dict per boundary ``k = 1..K-1``: ``start_step`` (first step of the new
      phase), ``after_step`` (last step of the previous one), ``nearest_event``,
      ``event_step`` and ``checkpoints_apart`` (boundary index minus event index:
      0 when the event's checkpoint opens the new phase, negative when the
      boundary comes first).
    """
    steps = [int(s) for s in steps]
    located = {name: steps.index(int(s)) for name, s in events.items() if s is not None}
    rows = []
    for s in (int(v) for v in list(starts)[1:]):
        row = {"start_step": steps[s], "after_step": steps[s - 1], "nearest_event": None,
               "event_step": None, "checkpoints_apart": None}
        if located:
            name = min(located, key=lambda e: (abs(s - located[e]), located[e]))
            row.update(nearest_event=name, event_step=steps[located[name]], checkpoints_apart=s - located[name])
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- the authors' run, matched protocols

#: Where the authors' released grokking run lives: a clone of tdooms/tensor-similarity, this folder.
#: The project ships none of their files; :func:`authors_run` reads them from a directory the user
#: points at (``--authors-run DIR`` or the environment variable :data:`AUTHORS_ENV`).
AUTHORS_REPOSITORY = "https://github.com/tdooms/tensor-similarity"
AUTHORS_BUNDLE = "workspaces/logan/grokking_summary_bundle/results_grokking_summary"
AUTHORS_ENV = "FUNSIM_GROKKING_AUTHORS"
#: The files :func:`authors_run` reads (as the authors released them).
AUTHORS_FILES = ("checkpoint_steps.npy", "tn_similarity.npy", "act_similarity.npy", "training_history.json",
                 "config.json")
AUTHORS_HOWTO = (f"to compare, clone {AUTHORS_REPOSITORY} (checked against commit bc914a4babc9) and pass "
                 f"`--authors-run <clone>/{AUTHORS_BUNDLE}` (or set {AUTHORS_ENV} to that directory)")


def authors_run(directory: str | pathlib.Path | None = None) -> dict | None:
    """The authors' released grokking run (tdooms/tensor-similarity), read from their original files.

    The files are the authors' (:data:`AUTHORS_FILES`, in their
    ``workspaces/logan/grokking_summary_bundle/results_grokking_summary/``): their checkpoint
    steps, symmetric tensor-similarity matrix (``tn_similarity.npy``), behavioural
    similarity (``act_similarity.npy``: mean per-sample cosine of the logits on all
    ``p^2`` pairs; ours is on ``n_eval`` held-out pairs), training history and config.
    Their run: p = 113, hidden 64, AdamW lr 1e-3, weight decay 0.3, 30% of pairs for
    training, batch 512, 100k steps, seed 1337, 90 checkpoints by the 5th-power rule.

    Args:
      directory: the folder holding those files. None: the environment variable
        :data:`AUTHORS_ENV`; unset (or empty), the run is not available and None comes back.

    Returns:
      ``{"steps": (n,) int, "matrices": {"tensor (symmetric)", "behavioural": (n, n)},
      "train_accuracy", "val_accuracy", "train_loss", "val_loss": (n,), "source": dict}``,
      or None when no directory is given.

    Raises:
      ValueError: a directory that does not exist, a missing or damaged file, wrong
        shapes, non-finite numbers, a history without a checkpoint's step; the message
        names the file.
    """
    import os

    if directory is None:
        directory = os.environ.get(AUTHORS_ENV) or None
        if directory is None:
            return None
    d = pathlib.Path(directory)
    if not d.is_dir():
        raise ValueError(f"The authors' grokking run: {d} is not a directory; {AUTHORS_HOWTO}.")
    for name in AUTHORS_FILES:
        if not (d / name).is_file():
            raise ValueError(f"The authors' grokking run: {d / name} is missing (expected the files "
                             f"{', '.join(AUTHORS_FILES)} of {AUTHORS_BUNDLE}/); {AUTHORS_HOWTO}.")

    def npy(name):
        try:
            return np.load(d / name, allow_pickle=False)
        except Exception as e:  # truncated or not an .npy file
            raise ValueError(f"{d / name}: not a readable .npy file ({type(e).__name__}: {e}).") from None

    def js(name):
        try:
            return json.loads((d / name).read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{d / name}: not a readable JSON file ({type(e).__name__}: {e}).") from None

    raw = npy("checkpoint_steps.npy")
    steps = np.asarray(raw)
    if steps.ndim != 1 or len(steps) < 2 or not np.all(np.isfinite(steps)) or np.any(steps != np.round(steps)):
        raise ValueError(f"{d / 'checkpoint_steps.npy'}: expected a 1-D array of at least 2 integer steps, "
                         f"got shape {steps.shape}.")
    steps = steps.astype(np.int64)
    if steps[0] != 0 or np.any(np.diff(steps) <= 0):
        raise ValueError(f"{d / 'checkpoint_steps.npy'}: steps must increase strictly from 0, got "
                         f"{steps[:5].tolist()}...")
    n = len(steps)
    out = {"steps": steps, "matrices": {}}
    for name, key in (("tn_similarity.npy", "tensor (symmetric)"), ("act_similarity.npy", "behavioural")):
        m = np.asarray(npy(name), np.float64)
        if m.shape != (n, n):
            raise ValueError(f"{d / name}: expected a {n} x {n} matrix (one row per checkpoint of "
                             f"checkpoint_steps.npy), got shape {m.shape}.")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"{d / name}: {int(np.sum(~np.isfinite(m)))} non-finite entries.")
        if not np.allclose(m, m.T, atol=1e-6):
            raise ValueError(f"{d / name}: not symmetric (largest |S - S^T| = {np.abs(m - m.T).max():.3g}).")
        out["matrices"][key] = m
    hist = js("training_history.json")
    fields = {"train_accuracy": "train_acc", "val_accuracy": "val_acc", "train_loss": "train_loss",
              "val_loss": "val_loss"}
    if not isinstance(hist, dict):
        raise ValueError(f"{d / 'training_history.json'}: expected an object keyed by step, got {type(hist).__name__}.")
    for ours, theirs in fields.items():
        vals = []
        for s in steps:
            row = hist.get(str(int(s)))
            if not isinstance(row, dict) or theirs not in row:
                raise ValueError(f"{d / 'training_history.json'}: no {theirs!r} at checkpoint step {int(s)}.")
            vals.append(row[theirs])
        try:
            v = np.asarray(vals, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{d / 'training_history.json'}: {theirs!r} must be numbers.") from None
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{d / 'training_history.json'}: non-finite {theirs!r} at steps "
                             f"{steps[~np.isfinite(v)][:5].tolist()}.")
        out[ours] = v
    cfg = js("config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{d / 'config.json'}: expected a JSON object, got {type(cfg).__name__}.")
    out["source"] = {"repository": AUTHORS_REPOSITORY, "path": AUTHORS_BUNDLE, "directory": str(d.resolve()),
                     "files": list(AUTHORS_FILES),
                     "config": {k: v for k, v in cfg.items() if k != "output_dir"}}
    return out


def _check_steps(steps, name):
    s = np.asarray(steps)
    if s.ndim != 1 or len(s) == 0 or not np.issubdtype(s.dtype, np.integer) and not np.all(s == np.round(s)):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integer steps, got shape {s.shape}.")
    s = s.astype(np.int64)
    if np.any(np.diff(s) <= 0) or s[0] < 0:
        raise ValueError(f"{name} must be strictly increasing and non-negative, got {s[:5].tolist()}...")
    return s


def mutual_nearest(steps_a, steps_b, /) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(i, j)`` whose steps are each other's nearest checkpoint (ties: the earlier one).

    The pairs are one-to-one and increasing in both ``i`` and ``j``: a common grid at
    the locally sparser spacing of the two runs.

    Args:
      steps_a, steps_b: strictly increasing checkpoint steps.

    Returns:
      ``(ia, ib)``, int arrays of equal length.

    Examples:
      >>> ia, ib = mutual_nearest([0, 10, 20, 30, 40], [0, 19, 41])
      >>> ia.tolist(), ib.tolist()
      ([0, 2, 4], [0, 1, 2])
    """
    a = _check_steps(steps_a, "steps_a")
    b = _check_steps(steps_b, "steps_b")
    nb = np.argmin(np.abs(a[:, None] - b[None, :]), axis=1)  # argmin: the first (earlier) of ties
    na = np.argmin(np.abs(b[:, None] - a[None, :]), axis=1)
    ia = np.flatnonzero(na[nb] == np.arange(len(a)))
    return ia, nb[ia]


def matched_grid(steps_a, steps_b, /, *, horizon: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """A common checkpoint grid of two runs up to a common horizon.

    Both runs are cut at ``horizon`` (default: the shorter run's last step), then
    paired by :func:`mutual_nearest`.

    Returns:
      ``(ia, ib, horizon)``: indices into ``steps_a`` and ``steps_b``.

    Raises:
      ValueError: a horizon before either run's first checkpoint.

    Examples:
      >>> ia, ib, h = matched_grid([0, 5, 10, 20, 40], [0, 4, 11, 42, 60, 90])   # 42 > 40: cut
      >>> ia.tolist(), ib.tolist(), h
      ([0, 1, 2], [0, 1, 2], 40)
      >>> matched_grid([0, 5, 10, 20, 40], [0, 4, 11, 42, 60, 90], horizon=45)[:2]   # 40 and 42 pair up
      (array([0, 1, 2, 4]), array([0, 1, 2, 3]))
    """
    a = _check_steps(steps_a, "steps_a")
    b = _check_steps(steps_b, "steps_b")
    h = int(min(a[-1], b[-1])) if horizon is None else int(horizon)
    if h < max(a[0], b[0]):
        raise ValueError(f"horizon {h} lies before a run's first checkpoint ({a[0]}, {b[0]}).")
    ka, kb = np.flatnonzero(a <= h), np.flatnonzero(b <= h)
    i, j = mutual_nearest(a[ka], b[kb])
    return ka[i], kb[j], h


def phase_starts(matrix, /, *, n_segments: int, cost: str = "pairwise") -> list[int]:
    """Segment starts (checkpoint indices) of a checkpoint-similarity matrix (``similarity.change_points``, float64)."""
    import jax

    from funsim import similarity
    with jax.enable_x64(True):  # costs of long segments nearly tie in float32
        seg = similarity.change_points(np.asarray(matrix, np.float64), n_segments=n_segments, cost=cost)
    return [int(i) for i in seg.starts]


def _first_at_one(val_accuracy, idx):
    """Position in ``idx`` of the first checkpoint with every held-out pair right (None if none)."""
    acc = np.asarray(val_accuracy, np.float64)[idx]
    hit = np.flatnonzero(acc >= 1.0)
    return int(hit[0]) if len(hit) else None


def compare_runs(ours: dict, theirs: dict, /, *, n_segments: int, cost: str = "pairwise", horizon: int | None = None,
                 tolerance: int = 2) -> dict:
    """Two runs' phases and post-generalisation similarity, like with like: on a common grid, to a common horizon.

    Each run is ``{"steps": (n,), "matrices": {measure: (n, n)}, "val_accuracy": (n,)}``;
    the measures both runs have are compared. The common grid is :func:`matched_grid`;
    each run's matrix is restricted to it and segmented into ``n_segments`` phases, and
    the k-th boundaries of the two runs are set side by side (their offset in grid
    checkpoints). Similarity to the final checkpoint is taken on the grid as well:
    from each run's first grid checkpoint with held-out accuracy 1 to the grid's last.

    Returns:
      ``{"horizon", "n_grid", "steps": {"ours", "theirs"} (grid steps), "max_relative_mismatch"
      (max |s_ours - s_theirs| / s_theirs over the grid, steps > 0), "phases": {measure: {"ours",
      "theirs": start steps; "offsets": grid checkpoints, ours minus theirs, per boundary;
      "within_tolerance": boundaries with |offset| <= tolerance}}, "to_final": {"ours", "theirs":
      {"from_step", "to_step", measure: similarity} or None}}``.
    """
    ia, ib, h = matched_grid(ours["steps"], theirs["steps"], horizon=horizon)
    if len(ia) < n_segments:
        raise ValueError(f"The common grid has {len(ia)} checkpoints, fewer than n_segments={n_segments}.")
    sa = np.asarray(ours["steps"], np.int64)[ia]
    sb = np.asarray(theirs["steps"], np.int64)[ib]
    pos = sb > 0
    out = {"horizon": h, "n_grid": int(len(ia)), "steps": {"ours": sa.tolist(), "theirs": sb.tolist()},
           "max_relative_mismatch": float(np.max(np.abs(sa[pos] - sb[pos]) / sb[pos])) if np.any(pos) else 0.0,
           "phases": {}, "to_final": {}}
    common = [m for m in ours["matrices"] if m in theirs["matrices"]]
    for m in common:
        pa = phase_starts(np.asarray(ours["matrices"][m])[np.ix_(ia, ia)], n_segments=n_segments, cost=cost)
        pb = phase_starts(np.asarray(theirs["matrices"][m])[np.ix_(ib, ib)], n_segments=n_segments, cost=cost)
        off = [x - y for x, y in zip(pa[1:], pb[1:])]
        out["phases"][m] = {"ours": [int(sa[i]) for i in pa], "theirs": [int(sb[i]) for i in pb], "offsets": off,
                            "within_tolerance": int(sum(abs(o) <= tolerance for o in off))}
    for name, run, idx, s in (("ours", ours, ia, sa), ("theirs", theirs, ib, sb)):
        k = _first_at_one(run["val_accuracy"], idx)
        if k is None:
            out["to_final"][name] = None
            continue
        row = {"from_step": int(s[k]), "to_step": int(s[-1])}
        row.update({m: float(np.asarray(run["matrices"][m])[idx[k], idx[-1]]) for m in common})
        out["to_final"][name] = row
    return out


def reference_protocols(ref: dict, our_steps, /, *, n_segments: int, cost: str = "pairwise") -> dict:
    """The authors' matrices segmented under four protocols: how far spacing and horizon move their phases.

    ``"as released"``: their grid, their horizon; ``"at our horizon"``: their grid cut at our
    last step; ``"on our grid"``: their nearest checkpoint to each of our steps (duplicates
    merged; the resampling the first comparison used); ``"common grid"``: :func:`matched_grid`
    of both runs up to the common horizon.

    Returns:
      ``{protocol: {"n": checkpoints, "horizon": last step, measure: start steps}}``.
    """
    st = np.asarray(ref["steps"], np.int64)
    ours = _check_steps(our_steps, "our_steps")
    near = np.unique(np.argmin(np.abs(ours[:, None] - st[None, :]), axis=1))
    _, ib, _ = matched_grid(ours, st)
    sets = {"as released": np.arange(len(st)), "at our horizon": np.flatnonzero(st <= ours[-1]),
            "on our grid": near, "common grid": ib}
    out = {}
    for name, idx in sets.items():
        row = {"n": int(len(idx)), "horizon": int(st[idx[-1]])}
        for m, mat in ref["matrices"].items():
            row[m] = [int(st[idx[i]]) for i in phase_starts(mat[np.ix_(idx, idx)], n_segments=n_segments, cost=cost)]
        out[name] = row
    return out


def _tensor_only(tensor_starts, other_starts, tolerance):
    return int(sum(all(abs(t - o) > tolerance for o in other_starts[1:]) for t in tensor_starts[1:]))


def verdict_statistics(cfg: GrokkingConfig, *, steps, starts: dict, boundaries: dict, after: dict,
                       comparison: dict | None) -> dict:
    """The numbers :data:`RULES` judge (:data:`STATISTICS`), each a value or ``{"value": None, "reason": ...}``.

    Args:
      cfg: the config (``landmark_tolerance``).
      steps: checkpoint steps.
      starts: ``{measure: phase starts (indices)}`` with the primary cost.
      boundaries: ``{measure: compare_boundaries(...)}``.
      after: :func:`_after_generalisation`'s result.
      comparison: :func:`compare_runs` (None: the authors' run was not available).
    """
    tol = cfg.landmark_tolerance
    sym, beh = "tensor (symmetric)", "behavioural"
    near = sum(1 for b in boundaries[sym] if b["checkpoints_apart"] is not None and abs(b["checkpoints_apart"]) <= tol)
    at_one = after.get("val accuracy = 1")
    never = {"value": None, "reason": "held-out accuracy never reached 1"}
    stats = {
        "boundaries_near_landmarks": int(near),
        "to_final_tensor": never if at_one is None else at_one["similarity_to_final"][sym],
        "to_final_behavioural": never if at_one is None else at_one["similarity_to_final"][beh],
        "tensor_only_boundaries": _tensor_only(starts[sym], starts[beh], tol),
    }
    if comparison is None:
        stats["boundaries_matching_authors"] = {"value": None, "reason": "the authors' run is not available"}
    else:
        stats["boundaries_matching_authors"] = comparison["phases"][sym]["within_tolerance"]
    return stats


def _authors_statistics(cfg: GrokkingConfig, ref: dict) -> dict:
    """The same statistics on the authors' run as released (those its data defines)."""
    st = [int(s) for s in ref["steps"]]
    starts = {m: phase_starts(mat, n_segments=cfg.n_segments, cost=cfg.segment_cost) for m, mat in ref["matrices"].items()}
    events = accuracy_events(st, ref["train_accuracy"], ref["val_accuracy"], ref["val_loss"])
    bounds = {m: compare_boundaries(s, st, events) for m, s in starts.items()}
    k = _first_at_one(ref["val_accuracy"], np.arange(len(st)))
    after = {"val accuracy = 1": None if k is None else
             {"similarity_to_final": {m: float(mat[k, -1]) for m, mat in ref["matrices"].items()}}}
    stats = verdict_statistics(cfg, steps=st, starts=starts, boundaries=bounds, after=after, comparison=None)
    stats["boundaries_matching_authors"] = {"value": None, "reason": "the reference itself"}
    return stats


# --------------------------------------------------------------------------- training


def make_model(cfg: GrokkingConfig, seed: int):
    """The grokking network of ``cfg``, initialised from ``seed``: a :class:`models.TokenPairs` around a
    one-layer :class:`models.BilinearMLP` (one-hot width ``2p``, ``cfg.d_hidden`` hidden units, ``p`` outputs)."""
    from flax import nnx

    from funsim import models
    return models.TokenPairs(models.BilinearMLP(2 * cfg.p, cfg.p, d_hidden=cfg.d_hidden, n_layers=1,
                                                residual=False, embed=False, head=False, rngs=nnx.Rngs(seed)), cfg.p)


def _train(cfg: GrokkingConfig, tokens, workdir: pathlib.Path, progress: bool, log):
    """Train (or resume); returns (TrainResult, checkpoint steps incl. 0, stacked networks, seconds)."""
    import jax
    import jax.numpy as jnp
    from tqdm.auto import tqdm

    from funsim.models.train import TrainConfig, list_checkpoints, load_checkpoint, train

    model = make_model(cfg, cfg.seed)
    init = model.model.to_network()  # the arrays stay those of step 0: training replaces, never mutates
    tcfg = TrainConfig(
        steps=cfg.steps, batch_size=cfg.batch_size or len(tokens.x_train), learning_rate=cfg.learning_rate,
        optimizer="adamw", weight_decay=cfg.weight_decay, seed=cfg.seed, eval_every=cfg.eval_every,
        eval_train_size=len(tokens.x_train), sampling=cfg.sampling,
        checkpoint_steps=checkpoint_schedule(cfg.steps, cfg.n_checkpoints, power=cfg.checkpoint_power,
                                             rule=cfg.checkpoint_rule),
    )
    t0 = time.time()
    result = train(model, tokens.x_train, tokens.y_train, tokens.x_test, tokens.y_test, config=tcfg,
                   workdir=workdir, progress=progress)
    seconds = time.time() - t0
    if result.resumed_from:
        log(f"      resumed from step {result.resumed_from}")
    steps = list_checkpoints(workdir)
    template = make_model(cfg, cfg.seed)
    nets = [init]
    for s in tqdm(steps, desc="loading checkpoints", disable=not progress, leave=False):
        nets.append(load_checkpoint(template, workdir, s, config=tcfg).model.to_network())
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *nets)
    return result, [0, *steps], stacked, seconds


# --------------------------------------------------------------------------- figures


def _log_steps(ax):
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)


def _phase_lines(ax, starts, steps, *, color="k"):
    for s in list(starts)[1:]:
        ax.axvline(steps[s], color=color, ls="--", lw=0.8, alpha=0.7)


def _figure_accuracy(steps, ev, history, starts, events, path, title):
    from funsim.experiments.plotting import save, subplots

    fig, (a1, a2) = subplots(1, 2, figsize=(11, 3.6))
    for split, color in (("train", "tab:blue"), ("val", "tab:orange")):
        a1.plot(steps, ev[split]["accuracy"], marker=".", ms=3, color=color, label=f"{split} (checkpoints)")
        a2.plot(steps, ev[split]["loss"], marker=".", ms=3, color=color, label=f"{split} (checkpoints)")
    hs = [h["step"] for h in history]
    a1.plot(hs, [h["test_accuracy"] for h in history], color="tab:orange", lw=0.6, alpha=0.5, label="val (history)")
    a2.plot(hs, [h["train_loss"] for h in history], color="tab:blue", lw=0.6, alpha=0.5, label="train (history)")
    for ax in (a1, a2):
        _log_steps(ax)
        _phase_lines(ax, starts, steps)
        ax.grid(alpha=0.3)
    for name, s in events.items():
        if s is not None and name.startswith("val accuracy"):
            a1.axvline(s, color="tab:green", lw=0.8, alpha=0.6)
    a1.set(ylabel="accuracy", ylim=(-0.02, 1.02))
    a1.set_title("accuracy (dashed: phase starts;\ngreen: val acc 0.5 / 0.99 / 1)", fontsize=9)
    a2.set(ylabel="cross-entropy (nats)", yscale="log")
    a2.set_title("loss", fontsize=9)
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel("training step (symlog)", fontsize=9)
    return save(fig, path)


def _step_ticks(ax, steps, axis="both"):
    n = len(steps)
    idx = sorted({int(round(i)) for i in np.linspace(0, n - 1, 7)})
    labels = [f"{steps[i]:,}" for i in idx]
    if axis in ("both", "x"):
        ax.set_xticks(idx, labels, rotation=45, ha="right", fontsize=6)
    if axis in ("both", "y"):
        ax.set_yticks(idx, labels, fontsize=6)


def _figure_matrices(matrices, segmentations, steps, path, title):
    from funsim.experiments.plotting import save, subplots

    fig, axes = subplots(1, len(matrices), figsize=(3.6 * len(matrices), 3.6), squeeze=False,
                         layout="compressed")  # square heatmaps
    for k, (ax, (name, m)) in enumerate(zip(axes[0], matrices.items())):
        im = ax.imshow(m, vmin=min(0.0, float(m.min())), vmax=1.0, cmap="viridis", interpolation="nearest")
        for s in list(segmentations[name])[1:]:
            ax.axhline(s - 0.5, color="w", lw=0.8)
            ax.axvline(s - 0.5, color="w", lw=0.8)
        _step_ticks(ax, steps)
        ax.tick_params(labelleft=k == 0)  # the same checkpoints in every panel: named once, on the left
        if k == 0:
            ax.set_ylabel("checkpoint (step)", fontsize=8)
        ax.set_xlabel("checkpoint (step)", fontsize=8)
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def _figure_to_final(matrices, steps, events, path, title):
    from funsim.experiments.plotting import save, subplots

    fig, ax = subplots(figsize=(6.5, 3.6))
    for name, m in matrices.items():
        ax.plot(steps, m[-1], marker=".", ms=3, label=name)
    for name in ("val accuracy >= 0.99", "val accuracy = 1"):
        if events.get(name) is not None:
            ax.axvline(events[name], color="gray", ls=":", lw=1)
            ax.text(events[name], 0.02, name, rotation=90, fontsize=6, va="bottom", transform=ax.get_xaxis_transform())
    _log_steps(ax)
    ax.set(xlabel="training step (symlog)", ylabel="similarity to the final checkpoint", title=title)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def _figure_fourier(spectra, summaries, steps, events, path, title):
    from funsim.experiments.plotting import save, subplots

    fig, axes = subplots(1, len(spectra) + 2, figsize=(4.0 * (len(spectra) + 2), 3.6))
    labels = {"a": "input weights, token a", "b": "input weights, token b", "out": "output weights (classes)"}
    for ax, (name, power) in zip(axes, spectra.items()):
        q = summaries[name]["distribution"]  # (n, K-1), frequencies 1..
        im = ax.imshow(q.T, aspect="auto", origin="lower", cmap="magma", interpolation="nearest",
                       extent=(-0.5, len(steps) - 0.5, 0.5, q.shape[1] + 0.5))
        _step_ticks(ax, steps, axis="x")
        ax.set(title=f"{labels[name]}: power share", xlabel="checkpoint (step)", ylabel="frequency k")
        ax.title.set_fontsize(9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    panels = (("effective_frequencies", "effective number of frequencies", "the layer's spectrum: concentration"),
              ("unit_purity", "power share of each unit's top frequency", "per unit: purity (1 = one wave)"))
    for ax, (key, ylabel, ptitle) in zip(axes[-2:], panels):
        for name in spectra:
            ax.plot(steps, summaries[name][key], marker=".", ms=3, label=labels[name])
        ax.set(xlabel="training step (symlog)", ylabel=ylabel, title=ptitle)
        ax.title.set_fontsize(9)
        for name in ("val accuracy >= 0.99", "val accuracy = 1"):
            if events.get(name) is not None:
                ax.axvline(events[name], color="gray", ls=":", lw=1)
        _log_steps(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


# --------------------------------------------------------------------------- driver


def _segment(matrices, n_segments: int) -> dict[str, dict[str, list[int]]]:
    import jax

    from funsim import similarity
    out = {}
    with jax.enable_x64(True):  # costs of long segments nearly tie in float32
        for cost in similarity.SEGMENT_COSTS:
            out[cost] = {
                name: [int(i) for i in similarity.change_points(np.asarray(m, np.float64), n_segments=n_segments, cost=cost).starts]
                for name, m in matrices.items()
            }
    return out


@releases_run_locks
def run(cfg: GrokkingConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log=print, authors_dir: str | pathlib.Path | None = None) -> dict:
    """Run the grokking experiment; returns the metrics (also written to metrics.json).

    ``authors_dir``: the folder of the authors' released run (:func:`authors_run`; None: the
    environment variable ``FUNSIM_GROKKING_AUTHORS``, else not compared). It is where data
    lives, not part of the protocol, so it is not a config field (a resumed run may read it
    from elsewhere). A directory given but unreadable is an error before any training.
    """
    from funsim.experiments import data as data_lib

    t0 = time.time()
    _log = log
    log = lambda msg: _log(f"{msg}  [{time.time() - t0:.0f} s]")
    ref = authors_run(authors_dir) if cfg.compare_authors else None  # a bad directory fails here, before training
    out = open_run("grokking", run_name, root=root, config=cfg)  # locked; a changed config is refused
    ds = data_lib.modular_addition(p=cfg.p, train_fraction=cfg.train_fraction, seed=cfg.data_seed, onehot=True)
    tokens = data_lib.modular_addition(p=cfg.p, train_fraction=cfg.train_fraction, seed=cfg.data_seed)  # same split
    log(f"[1/6] training: p={cfg.p}, {len(ds.x_train)} train / {len(ds.x_test)} held-out pairs, "
        f"{cfg.steps} steps, batch {cfg.batch_size or 'full'}")
    trained, steps, nets, train_seconds = _train(cfg, tokens, out / "model", progress, log)
    history = trained.history

    log(f"[2/6] evaluating {len(steps)} checkpoints (step 0 = initialisation)")
    ev = {"train": evaluate_checkpoints(nets, ds.x_train, ds.y_train),
          "val": evaluate_checkpoints(nets, ds.x_test, ds.y_test)}
    events = accuracy_events(steps, ev["train"]["accuracy"], ev["val"]["accuracy"], ev["val"]["loss"])

    log(f"[3/6] checkpoint x checkpoint similarity ({len(steps)} x {len(steps)}): tensor and baselines")
    pick = np.random.default_rng(cfg.data_seed).choice(len(ds.x_test), size=min(cfg.n_eval, len(ds.x_test)), replace=False)
    matrices = checkpoint_matrices(nets, ds.x_test[np.sort(pick)])
    write_atomic(out / "matrices.npz", lambda f: np.savez(f, steps=np.asarray(steps),
                                                           **{k.replace(" ", "_"): v for k, v in matrices.items()}))

    log(f"[4/6] phases: {cfg.n_segments} segments of every matrix (costs: pairwise, kernel)")
    segs = _segment(matrices, cfg.n_segments)
    primary = segs[cfg.segment_cost]
    boundaries = {name: compare_boundaries(st, steps, events) for name, st in primary.items()}

    log("[5/6] Fourier content of the weights over training")
    spectra = operand_spectra(nets, cfg.p)
    summaries = {k: spectrum_summary(v, n_top=cfg.n_top_frequencies) for k, v in spectra.items()}
    spectra = {k: v.sum(axis=-2) for k, v in spectra.items()}  # the layer's spectrum: (n, K)
    write_atomic(out / "spectra.npz", lambda f: np.savez(f, steps=np.asarray(steps), **spectra))

    after = _after_generalisation(cfg, steps, events, matrices, summaries)

    comparison = protocols = authors_verdicts = authors_stats = None
    if ref is not None:
        log("[6/6] the authors' run beside ours at a matched grid and horizon; verdicts")
        ours = {"steps": steps, "matrices": matrices, "val_accuracy": ev["val"]["accuracy"]}
        comparison = compare_runs(ours, ref, n_segments=cfg.n_segments, cost=cfg.segment_cost,
                                  horizon=cfg.compare_horizon, tolerance=cfg.landmark_tolerance)
        protocols = reference_protocols(ref, steps, n_segments=cfg.n_segments, cost=cfg.segment_cost)
        authors_stats = _authors_statistics(cfg, ref)
        authors_verdicts = verdict_lib.judge_all(cfg.verdict_rules, authors_stats)
    else:
        log("[6/6] verdicts (the authors' run is " + ("not given" if cfg.compare_authors else "not compared") + ")")
    stats = verdict_statistics(cfg, steps=steps, starts=primary, boundaries=boundaries, after=after,
                               comparison=comparison)
    verdicts = verdict_lib.judge_all(cfg.verdict_rules, stats)
    metrics = {
        "steps": steps,
        "train_seconds": round(train_seconds, 1),
        "resumed_from": trained.resumed_from,
        "checkpoints": {split: {k: v.tolist() for k, v in d.items()} for split, d in ev.items()},
        "final": {"train_accuracy": ev["train"]["accuracy"][-1], "val_accuracy": ev["val"]["accuracy"][-1]},
        "history": history,
        "events": events,
        "matrices_file": "matrices.npz",
        "matrix_checks": {k: {"max_asymmetry": float(np.abs(m - m.T).max()),
                              "max_diagonal_error": float(np.abs(np.diag(m) - 1).max())} for k, m in matrices.items()},
        "segmentation": {"n_segments": cfg.n_segments, "primary_cost": cfg.segment_cost,
                         "starts": segs, "start_steps": {c: {k: [steps[i] for i in v] for k, v in d.items()} for c, d in segs.items()},
                         "boundaries_vs_events": boundaries},
        "fourier": {k: {s: v.tolist() for s, v in d.items() if s != "distribution"} for k, d in summaries.items()},
        "after_generalisation": after,
        "authors": None if ref is None else {"source": ref["source"], "matched": comparison, "protocols": protocols},
        "authors_missing_reason": None if ref is not None else
        ("compare_authors is off" if not cfg.compare_authors else f"the authors' released run was not given; {AUTHORS_HOWTO}"),
        "verdict_statistics": stats,
        "verdicts": [v.to_json() for v in verdicts],
        "authors_verdict_statistics": authors_stats,
        "authors_verdicts": None if authors_verdicts is None else [v.to_json() for v in authors_verdicts],
        "paper": PAPER,
    }
    metrics["seconds"] = round(time.time() - t0, 1)
    title = f"grokking: (a + b) mod {cfg.p}, one bilinear layer (hidden {cfg.d_hidden}), {cfg.steps:,} steps"
    figures = [
        _figure_accuracy(steps, ev, history, primary["tensor (symmetric)"], events, out / "accuracy.png", title),
        _figure_matrices(matrices, primary, steps, out / "similarity_matrices.png",
                         f"{title}: checkpoint similarity; white lines: {cfg.n_segments} phases ({cfg.segment_cost} cost)"),
        _figure_to_final(matrices, steps, events, out / "similarity_to_final.png", "similarity of each checkpoint to the final one"),
        _figure_fourier(spectra, summaries, steps, events, out / "fourier.png", f"{title}: Fourier power of the weights"),
    ]
    metrics["figures"] = [f.name for f in figures]
    write_json_atomic(out / "metrics.json", metrics)
    text = summary(cfg, metrics)
    write_text_atomic(out / "summary.md", text)
    _log(text)
    log(f"done; results in {out}/")
    metrics["out"] = str(out)
    return metrics


def _after_generalisation(cfg, steps, events, matrices, summaries) -> dict:
    """How much the network still changes once held-out accuracy has reached 1 (or 0.99)."""
    out = {}
    for name in ("val accuracy = 1", "val accuracy >= 0.99"):
        s = events.get(name)
        if s is None:
            out[name] = None
            continue
        i = steps.index(s)
        tv = {k: float(0.5 * np.abs(v["distribution"][i] - v["distribution"][-1]).sum()) for k, v in summaries.items()}
        out[name] = {
            "step": s,
            "similarity_to_final": {k: float(m[i, -1]) for k, m in matrices.items()},
            "effective_frequencies": {k: [float(v["effective_frequencies"][i]), float(v["effective_frequencies"][-1])] for k, v in summaries.items()},
            "unit_purity": {k: [float(v["unit_purity"][i]), float(v["unit_purity"][-1])] for k, v in summaries.items()},
            "spectrum_total_variation_to_final": tv,
        }
    top = {k: [int(j) + 1 for j in np.argsort(v["distribution"][-1])[::-1][: cfg.n_top_frequencies]] for k, v in summaries.items()}
    out["final_top_frequencies"] = top
    return out


def _fmt(v, nd=3):
    return "n/a" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.{nd}f}")


def summary(cfg: GrokkingConfig, m: dict) -> str:
    """The markdown summary: our numbers beside those of the authors' run."""
    paper = m["paper"]
    ev = m["events"]
    resumed = f" (this invocation, resumed from step {m['resumed_from']:,})" if m["resumed_from"] else ""
    seg = m["segmentation"]
    lines = [
        f"# grokking: (a + b) mod {cfg.p} with one bilinear layer",
        "",
        f"One-hot (a, b) of width {2 * cfg.p} -> bilinear layer, {cfg.d_hidden} hidden units -> {cfg.p} logits; "
        f"AdamW lr {cfg.learning_rate:g}, weight decay {cfg.weight_decay:g}, {cfg.train_fraction:.0%} of pairs for "
        f"training, batch {cfg.batch_size or 'full'}, {cfg.steps:,} steps, {len(m['steps'])} checkpoints "
        f"(step 0 and {len(m['steps']) - 1} power-spaced). Training took {m['train_seconds']} s"
        f"{resumed}, the whole run "
        f"{m['seconds']} s. Final accuracy: train {m['final']['train_accuracy']:.4f}, held out "
        f"{m['final']['val_accuracy']:.4f}.",
        "",
        f"Paper's run, for comparison: the authors' released grokking run ({paper['steps']:,} steps, batch 512); "
        "numbers read off its data files (see `experiments.grokking.PAPER`).",
        "",
        "## Accuracy landmarks (first checkpoint meeting each)",
        "",
        "| event | ours (step) | paper's run (step) |",
        "|---|---:|---:|",
        *(f"| {k} | {_fmt(ev[k])} | {_fmt(paper['events'].get(k))} |" for k in ev),
        "",
        f"## Phases: {seg['n_segments']} contiguous segments of each checkpoint-similarity matrix",
        "",
        f"Dynamic-programming change points (`similarity.change_points`), {seg['primary_cost']} cost. Phase start steps:",
        "",
        "| matrix | ours | paper's run |",
        "|---|---|---|",
    ]
    for name, starts in seg["start_steps"][seg["primary_cost"]].items():
        ref = ", ".join(f"{s:,}" for s in paper["phase_starts"]) if name == "tensor (symmetric)" else ""
        lines.append(f"| {name} | {', '.join(f'{s:,}' for s in starts)} | {ref} |")
    other = [c for c in seg["start_steps"] if c != seg["primary_cost"]]
    for c in other:
        lines += ["", f"With the {c} cost instead:", "", "| matrix | phase starts |", "|---|---|"]
        lines += [f"| {n} | {', '.join(f'{s:,}' for s in st)} |" for n, st in seg["start_steps"][c].items()]
    lines += ["", "Each boundary of the symmetric tensor-similarity phases beside the nearest accuracy landmark "
              "(checkpoints apart: 0 = the landmark's checkpoint opens the new phase):", "",
              "| phase starts at | train / held-out accuracy there | nearest landmark | landmark step | checkpoints apart |",
              "|---:|---:|---|---:|---:|"]
    acc = {split: m["checkpoints"][split]["accuracy"] for split in ("train", "val")}
    for b in seg["boundaries_vs_events"]["tensor (symmetric)"]:
        i = m["steps"].index(b["start_step"])
        lines.append(f"| {b['start_step']:,} | {acc['train'][i]:.3f} / {acc['val'][i]:.3f} | {b['nearest_event']} | "
                     f"{_fmt(b['event_step'])} | {_fmt(b['checkpoints_apart'])} |")
    within = {name: sum(1 for b in rows if b["checkpoints_apart"] is not None and abs(b["checkpoints_apart"]) <= 2)
              for name, rows in seg["boundaries_vs_events"].items()}
    lines += ["", "Boundaries within 2 checkpoints of an accuracy landmark, per matrix: "
              + ", ".join(f"{k} {v}/{seg['n_segments'] - 1}" for k, v in within.items()) + "."]
    after = m["after_generalisation"]
    ref = after.get("val accuracy = 1") or after.get("val accuracy >= 0.99")
    lines += ["", "## After held-out accuracy reaches 1", ""]
    if ref is None:
        lines.append("Held-out accuracy never reached 0.99 in this run, so there is no post-generalisation phase to measure.")
    else:
        which = "val accuracy = 1" if after.get("val accuracy = 1") else "val accuracy >= 0.99"
        lines += [f"Similarity of the checkpoint where {which} (step {ref['step']:,}) to the final one:", "",
                  "| measure | ours | paper's run |", "|---|---:|---:|"]
        lines += [f"| {k} | {v:.3f} | {_fmt(paper['to_final'].get(k))} |" for k, v in ref["similarity_to_final"].items()]
        lines += ["", "Fourier power of the weights, at that checkpoint -> final: unit purity (share of each unit's "
                  "power in its own strongest frequency, power-weighted mean; 1 = every unit a single wave), effective "
                  "number of frequencies of the whole layer, and the total-variation distance between the two "
                  "normalised layer spectra:", ""]
        lines += [f"- {k}: purity {ref['unit_purity'][k][0]:.3f} -> {ref['unit_purity'][k][1]:.3f}; effective "
                  f"frequencies {a:.2f} -> {b:.2f}; TV {ref['spectrum_total_variation_to_final'][k]:.3f}"
                  for k, (a, b) in ref["effective_frequencies"].items()]
        lines += ["", "Strongest frequencies at the end: " + "; ".join(f"{k}: {v}" for k, v in after["final_top_frequencies"].items()) + "."]
    lines += _authors_section(cfg, m)
    verdicts = verdict_lib.judge_all(cfg.verdict_rules, m["verdict_statistics"])
    ref_stats = m.get("authors_verdict_statistics")
    ref = None if ref_stats is None else {v.rule.claim: v for v in verdict_lib.judge_all(cfg.verdict_rules, ref_stats)}
    lines += ["", "## Verdicts", "",
              f"Each label is computed by code from the rule in the run's config (`verdict_rules`; tolerances in "
              f"checkpoints: {cfg.landmark_tolerance}). The last column applies the same rule to the authors' "
              "released run, where its data defines the statistic.", ""]
    lines += verdict_lib.markdown_table(verdicts, reference=ref, reference_name="authors' run")
    lines += ["", "Figures: " + ", ".join(f"`{f}`" for f in m["figures"]) + "; matrices in `matrices.npz`, spectra in `spectra.npz`.", ""]
    return "\n".join(lines)


def _steps_text(v):
    return ", ".join(f"{x:,}" for x in v)


def _authors_section(cfg: GrokkingConfig, m: dict) -> list[str]:
    """The comparison with the authors' released run, at a matched grid and horizon."""
    a = m.get("authors")
    lines = ["", "## The authors' run, like with like", ""]
    if a is None:
        return lines + [f"Not compared: {m.get('authors_missing_reason') or 'no reference data'}."]
    c, prot = a["matched"], a["protocols"]
    lines += [f"Both runs cut at step {c['horizon']:,} and paired by mutually nearest checkpoints: {c['n_grid']} "
              f"common checkpoints (largest step mismatch {c['max_relative_mismatch']:.1%}). Phases "
              f"({cfg.n_segments} segments, {cfg.segment_cost} cost) of each run's matrix on that grid; offset = "
              "our boundary minus theirs, in grid checkpoints. Their behavioural similarity is on all p^2 pairs, "
              "ours on held-out pairs.", "",
              "| matrix | ours | authors' | offsets |", "|---|---|---|---|"]
    for name, ph in c["phases"].items():
        lines.append(f"| {name} | {_steps_text(ph['ours'])} | {_steps_text(ph['theirs'])} | "
                     f"{', '.join(f'{o:+d}' for o in ph['offsets'])} |")
    lines += ["", "Similarity of the first common-grid checkpoint with held-out accuracy 1 to the grid's last:", "",
              "| run | from step | to step | " + " | ".join(c["phases"]) + " |",
              "|---|---:|---:|" + "---:|" * len(c["phases"])]
    for who, label in (("ours", "ours"), ("theirs", "authors'")):
        r = c["to_final"].get(who)
        if r is None:
            lines.append(f"| {label} | n/a | n/a |" + " n/a |" * len(c["phases"]))
        else:
            lines.append(f"| {label} | {r['from_step']:,} | {r['to_step']:,} | "
                         + " | ".join(f"{r[k]:.3f}" for k in c["phases"]) + " |")
    lines += ["", "The authors' matrices alone under four protocols (phase starts): the spacing and the run "
              "length move them.", "", "| protocol | checkpoints | last step | tensor (symmetric) | behavioural |",
              "|---|---:|---:|---|---|"]
    for name, row in prot.items():
        lines.append(f"| {name} | {row['n']} | {row['horizon']:,} | {_steps_text(row['tensor (symmetric)'])} | "
                     f"{_steps_text(row['behavioural'])} |")
    src = a["source"]
    lines += ["", f"Source: the authors' files ({', '.join(f'`{f}`' for f in src['files'])}) of {src['repository']}, "
              f"`{src['path']}/`, read from `{src['directory']}`."]
    return lines


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, GrokkingConfig, CONFIGS)
    parser.add_argument("--run", default=None,
                        help="run name (default: the config's name and its --set overrides, so a rerun resumes)")
    parser.add_argument("--root", default="results", help="results root directory (default: results)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")
    parser.add_argument("--authors-run", default=None, metavar="DIR",
                        help=f"the authors' released run to compare with: a clone's {AUTHORS_BUNDLE}/ "
                             f"(default: ${AUTHORS_ENV}; unset: not compared)")


def main(args: argparse.Namespace) -> int:
    cfg, name = config_lib.from_args(args, GrokkingConfig, CONFIGS)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    run(cfg, root=args.root, run_name=args.run or name, progress=not args.no_progress,
        authors_dir=args.authors_run)
    return 0
