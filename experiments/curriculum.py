"""Shared helpers of the training-dynamics drivers (``forgetting``, ``backdoor``).

Training through a sequence of stages, the image data the stages draw from,
run directories that refuse a changed config,
cached result arrays and markdown tables.

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

from funsim.experiments import config as config_lib

__all__ = [
    "Stage",
    "CurriculumResult",
    "train_stages",
    "load_stage_networks",
    "to_grayscale",
    "select_classes",
    "load_images",
    "prepare_run",
    "cached_arrays",
    "markdown_table",
    "finish_run",
    "add_driver_arguments",
    "driver_main",
]


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
    from funsim.models.train import train

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
    from funsim.models.train import load_checkpoint

    nets = []
    template = make_model()
    for k, s in result.local:
        if s == 0:
            nets.append(make_model().to_network())
            continue
        nets.append(load_checkpoint(template, result.workdirs[k], s).to_network())
    return nets


# --------------------------------------------------------------------------- data


def to_grayscale(x: np.ndarray, /) -> np.ndarray:
    """RGB images ``(n, H, W, 3)`` to luminance ``(n, H, W, 1)`` (ITU-R BT.601 weights).

    ``0.2989 R + 0.5870 G + 0.1140 B``, the weights the tensor-similarity
    paper's SVHN experiments used; one-channel input is returned unchanged.

    Examples:
      >>> to_grayscale(np.ones((2, 4, 4, 3), np.float32)).shape
      (2, 4, 4, 1)
    """
    x = np.asarray(x)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"x must be images (n, H, W, 1 or 3), got shape {x.shape}.")
    if x.shape[-1] == 1:
        return x
    w = np.asarray([0.2989, 0.5870, 0.1140], x.dtype)
    return np.einsum("nhwc,c->nhw", x, w)[..., None].astype(x.dtype)


def select_classes(x: np.ndarray, y: np.ndarray, classes: Sequence[int], /) -> tuple[np.ndarray, np.ndarray]:
    """The examples of ``(x, y)`` whose label is in ``classes``, in their original order.

    Examples:
      >>> x, y = select_classes(np.arange(6), np.array([0, 1, 2, 0, 1, 2]), [0, 2])
      >>> x.tolist(), y.tolist()
      ([0, 2, 3, 5], [0, 2, 0, 2])
    """
    y = np.asarray(y)
    keep = np.isin(y, np.asarray(list(classes)))
    return np.asarray(x)[keep], y[keep]


def load_images(name: str, *, grayscale: bool = False, n_train: int | None = None, **kwargs):
    """An image data set from :mod:`experiments.data`, optionally in grayscale and cut to ``n_train``.

    Args:
      name: ``"mnist5k"``, ``"fashion_mnist"``, ``"svhn_cropped"``, ... (any image set of
        :func:`experiments.data.load`).
      grayscale: convert RGB to luminance with :func:`to_grayscale`.
      n_train: keep the first ``n_train`` training examples (None: all).
      **kwargs: passed to the loader (e.g. ``download=False``).

    Returns:
      :class:`experiments.data.Dataset`.
    """
    from funsim.experiments import data

    ds = data.load(name, **kwargs)
    if n_train is not None:
        ds = ds.subset(n_train)
    if grayscale:
        ds = dataclasses.replace(ds, x_train=to_grayscale(ds.x_train), x_test=to_grayscale(ds.x_test),
                                 description=ds.description + "; grayscale (BT.601 luminance)")
    return ds


# --------------------------------------------------------------------------- runs and reports


def prepare_run(experiment: str, cfg, *, root, run_name: str | None) -> pathlib.Path:
    """Create and lock ``root/experiment/run``, and write ``config.json`` or check it against the saved one.

    :func:`experiments.io.open_run`: a second run into the same folder is refused
    before it writes anything; a rerun with the same run name resumes (each stage
    of training resumes from its last checkpoint, finished steps are skipped); a
    rerun with a different config is refused, listing the differences. Decorate
    the driver's ``run`` with :func:`experiments.io.releases_run_locks`.

    Raises:
      RunLockedError: another live run writes into the folder.
      ValueError: when the run directory holds a different config.
    """
    from funsim.experiments.io import open_run

    return open_run(experiment, run_name, root=root, config=cfg)


def cached_arrays(path: str | pathlib.Path, key: np.ndarray, compute: Callable[[], dict], /) -> dict:
    """``compute()`` (a dict of arrays), saved to ``path`` (.npz, atomically) and reused while ``key`` matches.

    ``key`` identifies the inputs (e.g. the checkpoint steps); a file saved for
    another key is recomputed and replaced, and so is a damaged file (truncated, or
    bytes changed), with a warning naming it.
    """
    import warnings

    from funsim.experiments.io import DamagedFileError, read_npz, write_atomic

    path = pathlib.Path(path)
    key = np.asarray(key)
    if path.exists():
        try:
            f = read_npz(path, fix="Recomputing it.")
        except DamagedFileError as e:
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)
        else:
            if "_key" in f and np.array_equal(f["_key"], key):
                return {k: v for k, v in f.items() if k != "_key"}
    arrays = {k: np.asarray(v) for k, v in compute().items()}
    write_atomic(path, lambda f: np.savez(f, _key=key, **arrays))  # a file object: no ".npz" appended
    return arrays


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], /) -> str:
    """A GitHub markdown table; floats are written with 3 decimals, None as "n/a".

    Examples:
      >>> print(markdown_table(["a", "b"], [["x", 0.12345], ["y", None]]))
      | a | b |
      |---|---|
      | x | 0.123 |
      | y | n/a |
    """
    def cell(v):
        if v is None:
            return "n/a"
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.3f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def finish_run(out: pathlib.Path, metrics: dict, summary: str, figures: Sequence, log: Callable[[str], None]) -> dict:
    """Write ``metrics.json`` (atomically) and ``summary.md``, print the summary and where the files are.

    Returns ``metrics`` with ``out`` and ``figures`` (paths) added.
    """
    from funsim.experiments.io import write_json_atomic, write_text_atomic

    write_json_atomic(out / "metrics.json", metrics)
    write_text_atomic(out / "summary.md", summary)
    log(summary)
    log(f"results in {out}/: summary.md, metrics.json, " + ", ".join(pathlib.Path(f).name for f in figures))
    return {**metrics, "out": str(out), "figures": [str(f) for f in figures]}


# --------------------------------------------------------------------------- command line


def add_driver_arguments(parser, cls, configs: dict) -> None:
    """The options every driver takes: ``--config``, ``--set``, ``--print-config`` (:mod:`experiments.config`),
    ``--run``, ``--root``, ``--no-progress``."""
    config_lib.add_arguments(parser, cls, configs)
    parser.add_argument("--run", default=None,
                        help="run name (default: the config's name and its --set overrides); rerun it to resume")
    parser.add_argument("--root", default="results", help="results root directory (default: results)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")


def driver_main(args, name: str, cls, configs: dict, run: Callable) -> int:
    """Resolve the config and the run name and call ``run``; a missing data set is reported, exit status 1."""
    from funsim.experiments.data import DataNotFoundError

    cfg, run_name = config_lib.from_args(args, cls, configs)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        run(cfg, root=args.root, run_name=args.run or run_name, progress=not args.no_progress)
    except DataNotFoundError as e:
        print(f"funsim {name}: {e}")
        return 1
    return 0
