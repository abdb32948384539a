"""The options and the results of task-loss stitching (:mod:`similarity.task_stitching`).

:class:`StitchTraining` (how stitchers train, every field checked when made),
:func:`training_options` (it, with keyword arguments replacing its fields), and the records a
training returns: :class:`TrainHistory` and :class:`TrainedStitcher`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from funsim.similarity._stitch_fit import Stitcher
from funsim.similarity._stitch_param import INITS
from funsim.similarity._stitch_train import LOSSES, OPTIMIZERS
from funsim.similarity._validate import check_choice

# ---------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------


class TrainHistory(NamedTuple):
    """What happened while a stitcher trained (a leading ``M`` axis on every field for stacked tails).

    Attributes:
      train_loss: ``(steps,)`` the (minibatch) training loss before each step;
        NaN after an early stop.
      constraint_error: ``(steps,)`` ``max |U^T U - I|`` of the weight's
        orthonormal frame ``U`` (its columns, or its rows when the source is
        narrower than the target), at each step (0 for affine); NaN after an
        early stop.
      eval_steps: ``(n_evals,)`` step counts at which the held-out loss was
        measured: 0, ``eval_every``, ... and ``steps`` (empty without ``eval_data``).
      eval_loss: ``(n_evals,)`` the held-out loss there; NaN after an early stop.
      best_step: ``()`` the step count of the returned parameters.
      steps_run: ``()`` the steps actually run (``< steps`` after an early stop).
    """

    train_loss: np.ndarray
    constraint_error: np.ndarray
    eval_steps: np.ndarray
    eval_loss: np.ndarray
    best_step: np.ndarray
    steps_run: np.ndarray

    @property
    def stopped_early(self) -> np.ndarray:
        """Whether early stopping ended training before ``steps``."""
        return np.asarray(self.steps_run) < np.shape(self.train_loss)[-1]


class TrainedStitcher(NamedTuple):
    """A trained stitcher and its :class:`TrainHistory`.

    Attributes:
      stitcher: a :class:`~similarity.Stitcher`, ``weight (d_src, d_tgt)``
        (``(M, d_src, d_tgt)`` for stacked tails, and likewise ``bias``, ``scale``).
      history: a :class:`TrainHistory`.
    """

    stitcher: Stitcher
    history: TrainHistory


# ---------------------------------------------------------------------------
# Training options
# ---------------------------------------------------------------------------


def _positive_int(value, name: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {value!r}.")


def _non_negative(value, name: str) -> None:
    if not isinstance(value, (int, float, np.number)) or isinstance(value, (bool, np.bool_)) \
            or not 0 <= value < np.inf:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}.")


def _option_pairs(options) -> tuple[tuple[str, Any], ...]:
    """``optimizer_options`` as sorted ``(name, value)`` pairs (hashable), checked."""
    if options is None:
        return ()
    if isinstance(options, Mapping):
        pairs = list(options.items())
    else:
        try:
            pairs = [tuple(p) for p in options]
        except TypeError:
            pairs = None
        if pairs is None or any(len(p) != 2 for p in pairs):
            raise TypeError(f"optimizer_options must be a mapping of keyword arguments of the optax optimiser, "
                            f"e.g. {{'momentum': 0.9}}, got {options!r:.200}.")
    for k, v in pairs:
        if not isinstance(k, str):
            raise TypeError(f"optimizer_options keys must be argument names (strings), got {k!r}.")
        if k == "learning_rate":
            raise ValueError("Pass learning_rate as its own argument, not in optimizer_options.")
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"optimizer_options values must be numbers or hashable, got {k}={v!r}.") from None
    return tuple(sorted(pairs))


@dataclasses.dataclass(frozen=True)
class StitchTraining:
    """How stitchers train with the task loss: the options of :func:`train_stitchers` and :func:`train_stitcher`.

    Pass one as ``options=``, or give any field as a keyword argument of those functions
    (``train_stitchers(..., steps=100)`` is ``train_stitchers(..., options=StitchTraining(steps=100))``;
    with both, the keyword replaces the field of ``options``). Every field is checked when
    the options are made; a bad value raises ``ValueError`` naming the field.

    Attributes:
      init: ``"closed_form"`` (start at :func:`~similarity.fit_stitcher`'s least-squares
        reconstruction of ``z_tgt``: ``normalise=False`` for the orthogonal families, so
        that ``orthogonal`` has scale 1; ``normalise=True`` with ``ridge`` for ``affine``),
        ``"identity"`` (the padded identity block) or ``"random"`` (Haar-random rotation;
        Gaussian ``N(0, 1/d_src)`` affine weight).
      steps: optimiser steps, a positive int.
      optimizer: an optax optimiser name, one of ``OPTIMIZERS``.
      learning_rate: its learning rate, a non-negative number (traced data: changing it
        does not recompile).
      optimizer_options: more keyword arguments of the optax optimiser, e.g.
        ``{"momentum": 0.9}`` for ``"sgd"`` (a mapping, kept as sorted ``(name, value)``
        pairs); numbers are traced data, other values (e.g. ``nesterov=True``) are static.
      loss: ``"ce"`` (task cross-entropy) or ``"kl"`` (to the teacher's logits).
      batch_size: minibatch size (indices drawn uniformly, with replacement, each step), or
        ``None`` for full-batch steps (also when it is at least the number of rows).
      early_stopping: patience in evaluations: stop a stitcher when its held-out loss has
        not improved for that many evaluations and return its best parameters (``None``:
        train every step). Needs held-out data (``eval_data``).
      eval_every: steps per ``lax.scan`` chunk and between evaluations.
      ridge: ridge of the closed-form affine init, in the scale-free units of
        :func:`~similarity.fit_stitcher`, non-negative. The small default keeps dead or
        collinear units (common in ReLU layers) from making it singular.

    Examples:
      >>> StitchTraining(steps=200, optimizer="sgd", optimizer_options={"momentum": 0.9}).optimizer_options
      (('momentum', 0.9),)
      >>> StitchTraining(steps=0)
      Traceback (most recent call last):
        ...
      ValueError: steps must be a positive int, got 0.
    """

    init: str = "closed_form"
    steps: int = 500
    optimizer: str = "adam"
    learning_rate: float = 1e-2
    optimizer_options: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    loss: str = "ce"
    batch_size: int | None = None
    early_stopping: int | None = None
    eval_every: int = 50
    ridge: float = 1e-6

    def __post_init__(self):
        check_choice(self.init, "init", INITS)
        _positive_int(self.steps, "steps")
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        _non_negative(self.learning_rate, "learning_rate")
        object.__setattr__(self, "optimizer_options", _option_pairs(self.optimizer_options))
        check_choice(self.loss, "loss", LOSSES)
        _positive_int(self.batch_size, "batch_size", allow_none=True)
        _positive_int(self.early_stopping, "early_stopping", allow_none=True)
        _positive_int(self.eval_every, "eval_every")
        _non_negative(self.ridge, "ridge")


_TRAIN_KEYWORDS = ("family", "z_tgt", "target_shape", "stacked_tails", "key", "teacher_logits", "eval_data",
                   "label_groups", "options")


def training_options(options: StitchTraining | None, overrides: Mapping[str, Any]) -> StitchTraining:
    """``options`` (default ``StitchTraining()``) with the keyword arguments ``overrides`` replacing its fields."""
    if options is None:
        options = StitchTraining()
    elif not isinstance(options, StitchTraining):
        raise TypeError(f"options must be a StitchTraining, got {type(options).__name__}; pass "
                        "options=StitchTraining(steps=..., ...) or the fields as keyword arguments.")
    fields = [f.name for f in dataclasses.fields(StitchTraining)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        near = difflib.get_close_matches(unknown[0], [*fields, *_TRAIN_KEYWORDS], n=1)
        raise TypeError(f"unexpected keyword arguments {unknown}"
                        + (f" (did you mean {near[0]!r}?)" if near else "")
                        + f"; the training options are StitchTraining's fields: {', '.join(fields)}.")
    return dataclasses.replace(options, **overrides) if overrides else options
