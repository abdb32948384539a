"""Training through a curriculum: a sequence of stages, each one resumable run of :func:`models.train.train`.

A *curriculum* is a list of :class:`Stage`: each stage trains the same model
for a number of steps on its own training set (a subset of classes, say) and
with its own minibatch transform (data poisoning, input noise). One call of
:func:`models.train.train` per stage, each in its own work directory, so every
stage is resumable and a rerun skips the stages that are done. Steps are
counted globally: stage ``k`` covers global steps ``offset_k + 1 .. offset_k +
steps_k``, and the checkpoint at local step ``s`` is global step ``offset_k + s``.

The optimiser either starts afresh in every stage (``carry_optimizer=False``:
a new AdamW and, with a schedule, a new cosine decay, as in the
tensor-similarity paper's progressive training) or carries its state across
stages (``carry_optimizer=True``; use a constant learning rate then, since a
schedule's step count would carry too).

Work directory layout: ``<workdir>/<k>-<stage name>/`` per stage, as written
by :func:`models.train.train`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funsim.models.train import load_checkpoint, train

__all__ = ["Stage", "CurriculumResult", "train_stages", "load_stage_networks"]


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
    """One stage of a curriculum.

    Attributes:
      name: a label, e.g. ``"add 5"``.
      steps: optimiser steps in this stage.
      x_train: ``(n, ...)`` training inputs of this stage.
      y_train: ``(n,)`` int labels.
      batch_transform: optional hashable ``transform(key, xb, yb) -> (xb, yb)``
        applied to every minibatch (see :func:`models.train.train`).
    """

    name: str
    steps: int
    x_train: Any
    y_train: Any
    batch_transform: Callable | None = None


@dataclasses.dataclass
class CurriculumResult:
    """What :func:`train_stages` returns.

    Attributes:
      steps: ``(n_checkpoints,)`` global step of every checkpoint, in order,
        starting with 0 (the initial model).
      stage_index: ``(n_checkpoints,)`` index of the stage each checkpoint
        belongs to (the initial model counts as stage 0).
      spans: ``[(first_step, last_step, name)]`` global step range of each stage.
      history: one dict per evaluation, with the global ``step`` and ``stage``.
      workdirs: the work directory of each stage.
      local: ``[(stage, local_step)]`` per checkpoint (``(0, 0)`` for the initial model).
    """

    steps: np.ndarray
    stage_index: np.ndarray
    spans: list[tuple[int, int, str]]
    history: list[dict]
    workdirs: list[pathlib.Path]
    local: list[tuple[int, int]]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "stage"


def train_stages(
    model,
    stages: Sequence[Stage],
    x_test: Any,
    y_test: Any,
    /,
    *,
    config,
    workdir: str | pathlib.Path,
    carry_optimizer: bool = False,
    same_seed: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> CurriculumResult:
    """Train ``model`` (in place) through ``stages``, one resumable run per stage.

    Args:
      model: a funsim model.
      stages: the curriculum.
      x_test: ``(m, ...)`` evaluation inputs, shared by every stage.
      y_test: ``(m,)`` int labels.
      config: a :class:`models.train.TrainConfig` template; each stage uses it
        with ``steps`` set to the stage's and ``seed`` to ``config.seed + k``
        (so the minibatches of global step ``offset_k + s`` come from
        ``fold_in(key(seed + k), s)``), or to ``config.seed`` with ``same_seed``.
      workdir: the curriculum's directory; stage ``k`` trains in ``<k>-<name>/``.
      carry_optimizer: hand each stage the previous stage's optimiser state
        (``init_opt_state``) instead of a fresh one.
      same_seed: every stage trains with ``config.seed`` (the same minibatch key
        stream, as the tensor-similarity authors' ``fit`` reseeds each stage).
      progress: tqdm bars.
      log: where a one-line report per stage goes.

    Returns:
      :class:`CurriculumResult` (global checkpoint steps, stage spans, history).

    Raises:
      ValueError: for an empty curriculum or a stage with fewer than one step,
        and (from :func:`models.train.train`) for a resume whose setup differs.
    """
    if not stages:
        raise ValueError("stages is empty; pass at least one Stage.")
    bad = [s.name for s in stages if int(s.steps) < 1]
    if bad:
        raise ValueError(f"Stages {bad} have steps < 1; every stage needs at least one step.")
    if carry_optimizer and config.warmup_steps:
        raise ValueError(
            "carry_optimizer=True with a learning-rate schedule (warmup_steps > 0) would carry the "
            "schedule's step count into the next stage and run it past its end (learning rate 0). "
            "Use warmup_steps=0 (constant rate) or carry_optimizer=False."
        )
    workdir = pathlib.Path(workdir)
    steps, stage_index, local, spans, history, dirs = [0], [0], [(0, 0)], [], [], []
    offset = 0
    opt_state = None
    for k, stage in enumerate(stages):
        cfg = dataclasses.replace(config, steps=int(stage.steps), seed=config.seed if same_seed else config.seed + k)
        wd = workdir / f"{k}-{_slug(stage.name)}"
        res = train(
            model, stage.x_train, stage.y_train, x_test, y_test,
            config=cfg, workdir=wd, progress=progress,
            batch_transform=stage.batch_transform,
            init_opt_state=opt_state if carry_optimizer else None,
        )
        opt_state = res.opt_state
        for s in cfg.checkpoint_set():
            steps.append(offset + s)
            stage_index.append(k)
            local.append((k, s))
        history += [{**h, "step": offset + h["step"], "stage": k} for h in res.history if h["step"] > 0 or k == 0]
        spans.append((offset, offset + cfg.steps, stage.name))
        dirs.append(wd)
        f = res.final
        note = f" (resumed at step {res.resumed_from})" if res.resumed_from else ""
        log(f"      stage {k} {stage.name!r}: {cfg.steps} steps on {len(stage.y_train)} examples, "
            f"test accuracy {f['test_accuracy']:.3f}{note}")
        offset += cfg.steps
    return CurriculumResult(np.asarray(steps), np.asarray(stage_index), spans, history, dirs, local)


def load_stage_networks(make_model: Callable[[], Any], result: CurriculumResult) -> list:
    """The pure network (``model.to_network()``) of every checkpoint of a curriculum.

    Args:
      make_model: builds the model as it was before training (the same seed),
        which is also the checkpoint at global step 0.
      result: what :func:`train_stages` returned.

    Returns:
      A list of networks, one per ``result.steps``.
    """
    nets = []
    template = make_model()
    for k, s in result.local:
        if s == 0:
            nets.append(make_model().to_network())
            continue
        nets.append(load_checkpoint(template, result.workdirs[k], s).to_network())
    return nets
