"""One generic, resumable training loop for funsim models.

Design:

* ``graphdef, params, stats, rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)``;
  the steps between two evaluations or checkpoints run as one compiled loop
  (``lax.while_loop`` over a pure step of ``(params, stats, opt_state, step)``
  that calls ``nnx.merge`` inside), with the parameters, the running statistics
  (BatchNorm's averages, updated by every step; empty for most models) and the
  optimiser state donated and the data on the device. A step calls the model's
  ``training_logits(xb, key)`` (BatchNorm on the minibatch, dropout drawn from
  ``key``, itself from ``(seed, step)``); evaluation calls ``model(x)``. The trip count is traced, so one
  program serves every chunk (at most :data:`MAX_CHUNK` steps each), and the
  numbers do not depend on where chunks end. Exception: a convolutional model
  on XLA's CPU backend runs its steps one program call each (see
  :func:`models._train_loop.compiled_loop_is_faster`; the choice depends only on the model and
  the backend, so a run and its resumption take the same path).
* Randomness is reproducible from ``(seed, step)``: the minibatch of step ``s``
  is drawn without replacement with ``jax.random.fold_in(key, s)`` (a full
  batch is every training example, in order: no draw).
* A step whose loss or updated parameters are NaN or infinite stops the run with
  :class:`NonFiniteLossError` (naming the step and the loss); nothing after
  it is evaluated or checkpointed.
* Evaluation every ``eval_every`` steps (and at step 0 and the end): loss and
  accuracy on the test split and on a fixed train subset.
* orbax checkpoints of ``(params, opt_state)`` (and the running statistics,
  for a model that has them) at ``checkpoint_every``
  multiples, at any explicit ``checkpoint_steps`` (e.g. :func:`power_schedule`)
  and at the end. A run in the same ``workdir`` resumes from its last
  checkpoint and reproduces the uninterrupted run exactly; a resume with a
  different config, model or data is refused with the differences listed.
* ``metrics.json`` (history of evaluations) is written atomically after every
  evaluation.

Workdir layout: ``train_config.json``, ``metrics.json``, ``checkpoints/<step>/``.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from funsim.models import _train_loop as loop
from funsim.models._train_loop import MAX_CHUNK, random_crop_flip
from funsim.models.io import DamagedFileError, read_json, to_jsonable, write_json_atomic
from funsim.models.io import checkpoint_manager as _checkpoint_manager
from funsim.models.io import fingerprint as _fingerprint
from funsim.models.io import setup_diff as _diff

__all__ = [
    "TrainConfig", "TrainResult", "train", "power_schedule", "list_checkpoints", "load_checkpoint", "random_crop_flip",
    "NonFiniteLossError", "MAX_CHUNK",
]
AUGMENTATIONS = ("none", "crop", "crop_flip")
SAMPLINGS = ("independent", "epochs")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of a run; all of them must match to resume.

    Attributes:
      steps: number of optimiser steps.
      batch_size: minibatch size (at most the number of training examples).
      learning_rate: peak learning rate.
      optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"`` (with momentum 0.9).
      weight_decay: decoupled weight decay (``adamw``).
      warmup_steps: linear warmup; then cosine decay to 0 (0 disables the schedule).
      seed: folded with the step to pick minibatches.
      eval_every: evaluate every this many steps (also at 0 and at the end).
      eval_train_size: size of the fixed train subset evaluated.
      checkpoint_every: checkpoint every this many steps (None: only explicit steps and the end).
      checkpoint_steps: explicit checkpoint steps, e.g. ``power_schedule(steps, 10)``.
      augment: minibatch augmentation of NHWC images (:func:`random_crop_flip`):
        ``"none"``, ``"crop"`` (4-pixel zero-padded random crop) or
        ``"crop_flip"`` (also a random horizontal flip: the CIFAR recipe).
      eval_batch_size: evaluate in chunks of this many examples (None: in one
        call), to bound the memory of large test sets on an accelerator.
      sampling: how minibatches are drawn (below the full batch).
        ``"independent"``: each step draws ``batch_size`` distinct examples,
        independently of the other steps. ``"epochs"``: the examples are
        shuffled once per epoch of ``n // batch_size`` steps and consecutive
        steps take consecutive slices (the last ``n mod batch_size`` examples
        of each shuffle sit that epoch out), as a shuffling data loader does;
        the shuffle is drawn once per epoch instead of once per step, which
        is most of a small model's step on a CPU.
    """

    steps: int = 1000
    batch_size: int = 128
    learning_rate: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    warmup_steps: int = 0
    seed: int = 0
    eval_every: int = 100
    eval_train_size: int = 2048
    checkpoint_every: int | None = None
    checkpoint_steps: tuple[int, ...] = ()
    augment: str = "none"
    eval_batch_size: int | None = None
    sampling: str = "independent"

    def checkpoint_set(self) -> tuple[int, ...]:
        """Every step at which a checkpoint is written (sorted)."""
        s = {int(t) for t in self.checkpoint_steps if 0 < int(t) <= self.steps} | {self.steps}
        if self.checkpoint_every:
            s |= set(range(self.checkpoint_every, self.steps + 1, self.checkpoint_every))
        return tuple(sorted(s))


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
      model: the trained model (the input model, updated in place).
      history: one dict per evaluation: step, test_loss, test_accuracy, train_loss, train_accuracy.
      resumed_from: the checkpoint step the run resumed from (0 for a fresh run).
      opt_state: the optimiser state after the last step (pass it as
        ``init_opt_state`` to continue with the same optimiser, e.g. in the next
        stage of a curriculum).
    """

    model: nnx.Module
    history: list[dict[str, float]]
    resumed_from: int = 0
    opt_state: Any = None

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1]


def power_schedule(total_steps: int, n: int, /, *, power: float = 2.0) -> tuple[int, ...]:
    """Checkpoint steps ``round(total * (i / n) ** power)``, i = 1..n: dense early, sparse late.

    ``power=1`` is evenly spaced; larger powers crowd the checkpoints towards
    the start of training. Duplicates are merged, so fewer than ``n`` steps
    may come back; the last is always ``total_steps``.

    Examples:
      >>> power_schedule(1000, 5, power=2.0)
      (40, 160, 360, 640, 1000)
    """
    if total_steps < 1 or n < 1 or power <= 0:
        raise ValueError(f"power_schedule needs total_steps >= 1, n >= 1, power > 0; got {total_steps}, {n}, {power}.")
    t = np.rint(total_steps * (np.arange(1, n + 1) / n) ** power).astype(int)
    return tuple(sorted({int(max(1, s)) for s in t}))


def _optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    # the step count shapes only the warmup schedule: without one, runs of any length share the optimiser
    return _make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.weight_decay, cfg.warmup_steps,
                           cfg.steps if cfg.warmup_steps else 0)


@functools.lru_cache(maxsize=32)
def _make_optimizer(name, learning_rate, weight_decay, warmup_steps, steps) -> optax.GradientTransformation:
    # cached: an equal optimiser is the same object, so runs that differ only in
    # seed (or data of the same shape) reuse the compiled train step.
    lr: Any = learning_rate
    if warmup_steps:
        lr = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, max(steps, warmup_steps + 1))
    if name == "adam":
        return optax.adam(lr)
    if name == "adamw":
        return optax.adamw(lr, weight_decay=weight_decay)
    if name == "sgd":
        return optax.sgd(lr, momentum=0.9)
    raise ValueError(f"Unknown optimizer {name!r}. Valid options: 'adam', 'adamw', 'sgd'.")


@jax.jit
def _copy_tree(tree):
    """Fresh buffers for every leaf: one program per tree structure, not one eager copy per leaf shape."""
    return jax.tree.map(jnp.copy, tree)


def _next_stop(done: int, cfg: TrainConfig, ckpt_steps: set[int]) -> int:
    """Where the next compiled chunk after ``done`` steps ends: the next evaluation, checkpoint or end."""
    stop = min(cfg.steps, done + MAX_CHUNK, (done // cfg.eval_every + 1) * cfg.eval_every)
    later = [c for c in ckpt_steps if done < c < stop]
    return min(later) if later else stop


class NonFiniteLossError(FloatingPointError):
    """Training stopped: an optimiser step's loss, or the parameters after it, were NaN or infinite."""


def _non_finite_message(step: int, loss: float, cfg: TrainConfig, history: list[dict], workdir) -> str:
    what = (f"the loss is {loss}" if not np.isfinite(loss) else
            f"its update made parameters NaN or infinite (the minibatch loss before it was {loss:.6g})")
    last = history[-1] if history else None
    seen = (f" The last evaluation (step {last['step']}) had train loss {last['train_loss']:.6g}."
            if last is not None else "")
    saved = ""
    if workdir is not None:
        good = [c for c in cfg.checkpoint_set() if c < step]
        saved = (f" The checkpoints in {workdir} up to step {good[-1]} are intact, but rerunning this config "
                 "diverges again at the same step: change it and use a new workdir." if good else "")
    return (
        f"Training stopped at optimiser step {step} of {cfg.steps}: {what}.{seen}{saved} Try a lower "
        f"learning_rate (now {cfg.learning_rate:g}), a warmup (warmup_steps, now {cfg.warmup_steps}), "
        "or standardised inputs."
    )


def _check_data(model, x, y, name):
    if len(x) != len(y):
        raise ValueError(f"x_{name} has {len(x)} examples but y_{name} has {len(y)}; they must match.")
    try:
        out = jax.eval_shape(model, jax.ShapeDtypeStruct((2, *x.shape[1:]), x.dtype))
    except ValueError as e:
        raise ValueError(f"x_{name} of shape {x.shape} does not fit the model: {e}") from e
    if tuple(out.shape[1:-1]) != tuple(y.shape[1:]):
        raise ValueError(
            f"y_{name} of shape {y.shape} does not match the model's logits (n, {', '.join(map(str, out.shape[1:]))}): "
            "labels must have the logits' shape without the class axis."
        )
    if np.issubdtype(x.dtype, np.inexact) and not np.all(np.isfinite(x)):
        bad = int(np.sum(~np.isfinite(x)))
        raise ValueError(f"x_{name} holds {bad} NaN or infinite values (of {x.size}); training on them gives a "
                         "non-finite loss. Clean or impute the data first.")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y_{name} must hold integer class labels, got dtype {y.dtype}.")
    if len(y) and (y.min() < 0 or y.max() >= out.shape[-1]):
        raise ValueError(f"y_{name} has labels in [{y.min()}, {y.max()}], outside [0, {out.shape[-1]}) (the model's outputs).")


def _check_opt_state(given, fresh):
    """``given`` cast to the dtypes of ``fresh`` (the config's optimiser state), or a clear error."""
    sg, sf = jax.tree.structure(given), jax.tree.structure(fresh)
    lg, lf = jax.tree.leaves(given), jax.tree.leaves(fresh)
    if sg != sf or [np.shape(a) for a in lg] != [np.shape(b) for b in lf]:
        raise ValueError(
            "init_opt_state does not match the optimiser state of this config and model "
            f"(structure {sg} with leaf shapes {[np.shape(a) for a in lg]}, expected {sf} with "
            f"{[np.shape(b) for b in lf]}). Pass the opt_state of a run with the same optimizer "
            "and model, or None for a fresh optimiser."
        )
    return jax.tree.unflatten(sf, [jnp.asarray(a, b.dtype) for a, b in zip(lg, lf)])


def _to_tree(params, opt_state, stats):
    tree = {"params": jax.tree.leaves(params), "opt_state": jax.tree.leaves(opt_state)}
    if jax.tree.leaves(stats):  # only for a model with running statistics: other checkpoints are as before
        tree["batch_stats"] = jax.tree.leaves(stats)
    return tree


def _from_tree(restored, params, opt_state, stats):
    """``(params, opt_state, stats)`` of a restored checkpoint tree, in the structures of the arguments."""
    unflat = lambda like, leaves: jax.tree.unflatten(jax.tree.structure(like), leaves)  # noqa: E731
    return (unflat(params, restored["params"]), unflat(opt_state, restored["opt_state"]),
            unflat(stats, restored.get("batch_stats", [])))


def _with_new_defaults(saved: dict) -> dict:
    """A saved identity with config fields added since it was written set to their defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    config = {**to_jsonable(fields), **saved.get("config", {})}
    return {**saved, "config": config}


def train(
    model: nnx.Module,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    /,
    *,
    config: TrainConfig = TrainConfig(),
    workdir: str | pathlib.Path | None = None,
    progress: bool = True,
    callback: Callable[[int, dict | None], None] | None = None,
    batch_transform: Callable | None = None,
    init_opt_state: Any = None,
) -> TrainResult:
    """Train ``model`` with cross-entropy on integer labels; resumable.

    Args:
      model: a funsim model (or any NNX module mapping ``x`` to logits ``(n, ..., C)``).
      x_train: ``(n, *input_shape)``.
      y_train: ``(n,)`` int labels, or ``(n, T)`` for sequence models.
      x_test: ``(m, *input_shape)``.
      y_test: ``(m,)`` or ``(m, T)``.
      config: :class:`TrainConfig`.
      workdir: where checkpoints, ``metrics.json`` and ``train_config.json`` go;
        None trains in memory without checkpoints. If it holds checkpoints of
        the same run, training resumes from the last one.
      progress: show a tqdm progress bar.
      callback: called as ``callback(step, metrics_or_None)`` for every step
        (``step`` counts completed steps), in order, after the compiled chunk
        holding that step has run and been evaluated and checkpointed (chunks
        end at every evaluation and checkpoint step, and after at most
        :data:`MAX_CHUNK` steps).
      batch_transform: ``transform(key, xb, yb) -> (xb, yb)``, applied to every
        training minibatch inside the jitted step (data poisoning, input noise);
        evaluation always uses the untransformed data. It is a static argument
        of the step, so it must be hashable and compare equal across calls to
        reuse the compilation: use a frozen dataclass holding its options,
        not a fresh closure. Its ``repr`` is part of the run's identity.
      init_opt_state: start from this optimiser state instead of
        ``tx.init(params)`` (e.g. the ``opt_state`` of the previous stage's
        :class:`TrainResult`); it must have the structure of the config's
        optimiser state. Its fingerprint is part of the run's identity.

    Returns:
      :class:`TrainResult`; ``model`` itself is updated in place.

    Raises:
      ValueError: data that does not fit the model (or holds NaN or infinite
        values), or a resume whose config, model or data differ from the saved
        run (the differences are listed).
      NonFiniteLossError: a step's loss or updated parameters were not finite; ``model``
        is left as it was passed in, and the checkpoints before that step are
        kept.
    """
    cfg = config
    x_train, y_train, x_test, y_test = (np.asarray(a) for a in (x_train, y_train, x_test, y_test))
    _check_inputs(model, cfg, x_train, y_train, x_test, y_test)
    tx = _optimizer(cfg)

    graphdef, params, stats, rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    opt_state = tx.init(params)
    if init_opt_state is not None:
        opt_state = _check_opt_state(init_opt_state, opt_state)
    identity = _identity(cfg, model, params, opt_state, (x_train, y_train, x_test, y_test), batch_transform,
                         init_opt_state is not None)
    workdir = None if workdir is None else pathlib.Path(workdir)
    # rebuild: the evaluations missing from metrics.json on a resume, step -> (params, stats) (None: the current)
    manager, params, opt_state, stats, start, history, rebuild = _open_workdir(workdir, identity, cfg, params,
                                                                               opt_state, stats)

    xs_tr, ys_tr = jnp.asarray(x_train), jnp.asarray(y_train)
    evaluate = _evaluator(graphdef, rest, cfg, xs_tr, ys_tr, jnp.asarray(x_test), jnp.asarray(y_test))
    key = jax.random.PRNGKey(cfg.seed)

    def log_eval(step):
        m = {"step": step, **{k: float(v) for k, v in evaluate(params, stats).items()}}
        history.append(m)
        if workdir is not None:
            write_json_atomic(workdir / "metrics.json", {"history": history})
        return m

    if rebuild:  # metrics.json was damaged, deleted or short: evaluate again what the checkpoints allow
        _rebuild_history(history, rebuild, evaluate, (params, stats), workdir)
    ckpt_steps = set(cfg.checkpoint_set())
    if start == 0 and not history:
        log_eval(0)
    # the parameters, statistics and optimiser state are donated to the compiled loop: work on copies, so that
    # the model's arrays and a caller's init_opt_state stay valid (also if the run stops early)
    params, stats, opt_state = _copy_tree((params, stats, opt_state))
    compiled_loop = loop.compiled_loop_is_faster(graphdef, (params, stats, rest), xs_tr)
    bar = tqdm(total=cfg.steps, initial=start, disable=not progress, desc=type(model).__name__, leave=False)
    done = start
    while done < cfg.steps:
        stop = _next_stop(done, cfg, ckpt_steps)
        # the compiled loop takes its bounds as (traced) data, the per-step path as Python ints
        bounds = (jnp.asarray(done, jnp.uint32), jnp.asarray(stop, jnp.uint32)) if compiled_loop else (done, stop)
        params, stats, opt_state, reached, loss = (loop.train_steps if compiled_loop else loop.run_per_step)(
            graphdef, tx, cfg.batch_size, cfg.augment, cfg.sampling, params, stats, rest, opt_state, key, xs_tr, ys_tr,
            *bounds, transform=batch_transform,
        )
        if int(reached) != stop:
            _close(bar, manager)
            raise NonFiniteLossError(_non_finite_message(int(reached) + 1, float(loss), cfg, history, workdir))
        m = None
        if stop % cfg.eval_every == 0 or stop == cfg.steps:
            m = log_eval(stop)
            bar.set_postfix(loss=f"{m['train_loss']:.3f}", test_acc=f"{m['test_accuracy']:.3f}")
        if manager is not None and stop in ckpt_steps:
            _save_checkpoint(manager, stop, params, opt_state, stats)
        bar.update(stop - done)
        if callback is not None:
            for s in range(done + 1, stop + 1):
                callback(s, m if s == stop else None)
        done = stop
    _close(bar, manager)
    nnx.update(model, params, stats)
    return TrainResult(model, history, start, opt_state)


def _check_inputs(model, cfg: TrainConfig, x_train, y_train, x_test, y_test) -> None:
    """:func:`train`'s checks of the data (it fits the model) and of the config against it."""
    _check_data(model, x_train, y_train, "train")
    _check_data(model, x_test, y_test, "test")
    n = len(x_train)
    if not 1 <= cfg.batch_size <= n:
        raise ValueError(f"batch_size={cfg.batch_size} must be in [1, {n}] (the number of training examples).")
    if cfg.steps < 1 or cfg.eval_every < 1:
        raise ValueError(f"steps and eval_every must be >= 1, got {cfg.steps} and {cfg.eval_every}.")
    if cfg.augment not in AUGMENTATIONS:
        raise ValueError(f"Unknown augment {cfg.augment!r}. Valid options: {', '.join(repr(a) for a in AUGMENTATIONS)}.")
    if cfg.augment != "none" and x_train.ndim != 4:
        raise ValueError(f"augment={cfg.augment!r} needs NHWC images (n, H, W, C), got x_train of shape {x_train.shape}.")
    if cfg.sampling not in SAMPLINGS:
        raise ValueError(f"Unknown sampling {cfg.sampling!r}. Valid options: {', '.join(repr(a) for a in SAMPLINGS)}.")
    if cfg.eval_batch_size is not None and cfg.eval_batch_size < 1:
        raise ValueError(f"eval_batch_size must be >= 1 or None, got {cfg.eval_batch_size}.")


def _identity(cfg: TrainConfig, model, params, opt_state, data, batch_transform, given_opt_state: bool) -> dict:
    """What a run is (``train_config.json``): its config, model, data and the options that change it; a
    resume with another identity is refused."""
    x_train, y_train, x_test, y_test = data
    identity = {
        "config": to_jsonable(cfg),
        "model": {"class": type(model).__name__, "init_params_sha1": _fingerprint(*jax.tree.leaves(params)),
                  # not in the parameters: recorded only when used, so that older runs still resume
                  **({"dropout": model.dropout} if isinstance(getattr(model, "dropout", None), float)
                     and model.dropout else {})},
        "data": {
            "train_sha1": _fingerprint(x_train, y_train),
            "test_sha1": _fingerprint(x_test, y_test),
            "x_train_shape": list(x_train.shape),
        },
    }
    # recorded only when used, so that runs saved before these options existed still resume
    if batch_transform is not None:
        identity["batch_transform"] = repr(batch_transform)
    if given_opt_state:
        identity["init_opt_state_sha1"] = _fingerprint(*jax.tree.leaves(opt_state))
    return identity


def _open_workdir(workdir: pathlib.Path | None, identity: dict, cfg: TrainConfig, params, opt_state, stats):
    """``(manager, params, opt_state, stats, start, history, rebuild)``: the run's checkpoints in ``workdir`` (made,
    or checked against ``identity``), and on a resume the last checkpoint's state, the recorded history and
    the evaluations to compute again (:func:`_missing_evaluations`); no manager without a ``workdir``."""
    if workdir is None:
        return None, params, opt_state, stats, 0, [], {}
    workdir.mkdir(parents=True, exist_ok=True)
    id_path = workdir / "train_config.json"
    manager = _checkpoint_manager(workdir)
    if id_path.exists():
        diffs = _diff(_with_new_defaults(read_json(id_path)), identity)
        if diffs:
            raise ValueError(
                f"Refusing to resume the run in {workdir}: it was started with a different setup:\n  "
                + "\n  ".join(diffs)
                + "\nUse a new workdir, or restore the original settings."
            )
    else:
        write_json_atomic(id_path, identity)
    last = manager.latest_step()
    if last is None:
        return manager, params, opt_state, stats, 0, [], {}
    import orbax.checkpoint as ocp

    init = (params, opt_state, stats)
    template = _to_tree(params, opt_state, stats)
    restored = manager.restore(last, args=ocp.args.StandardRestore(template))
    params, opt_state, stats = _from_tree(restored, *init)
    start = int(last)
    history = _resumed_history(workdir / "metrics.json", start)
    rebuild = _missing_evaluations(history, start, cfg, manager, init, template)
    return manager, params, opt_state, stats, start, history, rebuild


def _evaluator(graphdef, rest, cfg: TrainConfig, xs_tr, ys_tr, xs_te, ys_te) -> Callable:
    """``evaluate(params, stats) -> metrics``: loss and accuracy on the test split and the fixed train subset
    (the first ``eval_train_size`` examples), in chunks of ``eval_batch_size`` when it is set."""
    sub = min(cfg.eval_train_size, len(xs_tr))
    xs_ev, ys_ev = xs_tr[:sub], ys_tr[:sub]

    def evaluate(params, stats):
        if cfg.eval_batch_size is not None:
            return loop.evaluate_chunked(graphdef, params, stats, rest, cfg.eval_batch_size, xs_te, ys_te, xs_ev,
                                         ys_ev)
        return loop.evaluate(graphdef, params, stats, rest, xs_te, ys_te, xs_ev, ys_ev)

    return evaluate


def _rebuild_history(history: list[dict], rebuild: dict, evaluate: Callable, current, workdir: pathlib.Path) -> None:
    """Evaluate again the steps ``rebuild`` names (``None``: the ``current`` ``(params, stats)``), into
    ``history`` (sorted) and ``metrics.json``."""
    for step, p in sorted(rebuild.items()):
        history.append({"step": step, **{k: float(v) for k, v in evaluate(*(current if p is None else p)).items()}})
    history.sort(key=lambda h: h["step"])
    write_json_atomic(workdir / "metrics.json", {"history": history})


def _save_checkpoint(manager, step: int, params, opt_state, stats) -> None:
    import orbax.checkpoint as ocp

    manager.save(step, args=ocp.args.StandardSave(_to_tree(params, opt_state, stats)))
    manager.wait_until_finished()


def _close(bar, manager) -> None:
    bar.close()
    if manager is not None:
        manager.close()


def _resumed_history(path: pathlib.Path, start: int) -> list[dict]:
    """The evaluations up to ``start`` recorded in ``metrics.json``; ``[]`` (with a warning naming
    the file) if it is damaged, so that the resume rebuilds them instead of failing."""
    if not path.exists():
        return []
    try:
        recorded = read_json(path)["history"]
        return [dict(h) for h in recorded if int(h["step"]) <= start]
    except (DamagedFileError, KeyError, TypeError, ValueError) as e:
        warnings.warn(f"{path} is damaged ({e}); resuming from the checkpoint at step {start} and rebuilding the "
                      "evaluations the checkpoints allow.", stacklevel=4)
        return []


def _missing_evaluations(history: list[dict], start: int, cfg: TrainConfig, manager, init, template) -> dict:
    """``{step: (params, stats)}`` for the evaluations up to ``start`` that ``history`` lacks and that can be
    computed again: step 0 (the initial state ``init = (params, opt_state, stats)``, which the run's identity
    pins), each checkpoint at an evaluation step, and ``start`` itself (the restored state, ``None``). Warns
    about the ones that cannot (no checkpoint kept at that step)."""
    due = {0, *range(cfg.eval_every, start + 1, cfg.eval_every)} | ({start} if start == cfg.steps else set())
    missing = sorted(due - {int(h["step"]) for h in history})
    if not missing:
        return {}
    import orbax.checkpoint as ocp

    kept = set(manager.all_steps())
    out, lost = {}, []
    for step in missing:
        if step == start:
            out[step] = None
        elif step == 0:
            out[step] = (init[0], init[2])
        elif step in kept:
            try:
                restored = manager.restore(step, args=ocp.args.StandardRestore(template))
            except Exception:  # noqa: BLE001  a damaged older checkpoint: that evaluation stays missing
                lost.append(step)
                continue
            params, _, stats = _from_tree(restored, *init)
            out[step] = (params, stats)
        else:
            lost.append(step)
    if lost and out:  # (a history already rebuilt stays as it is, silently)
        warnings.warn(f"{manager.workdir / 'metrics.json'} lacks the evaluations at steps {lost} and no intact "
                      f"checkpoint is kept there; they stay missing (the history has {len(due) - len(lost)} of {len(due)}).",
                      stacklevel=4)
    return out


def list_checkpoints(workdir: str | pathlib.Path) -> tuple[int, ...]:
    """The checkpoint steps saved in ``workdir`` (sorted)."""
    mgr = _checkpoint_manager(pathlib.Path(workdir))
    steps = tuple(sorted(mgr.all_steps()))
    mgr.close()
    return steps


def load_checkpoint(model: nnx.Module, workdir: str | pathlib.Path, step: int | None = None, *, config: TrainConfig | None = None) -> nnx.Module:
    """Load the parameters (and running statistics, if the model has any) saved at ``step`` (default: the
    last) into ``model`` (in place).

    ``model`` must have the same structure as the trained one; it may be
    abstract (``nnx.eval_shape(lambda: Model(...))``), which skips the cost of
    initialising parameters that are about to be overwritten. ``config``
    (default: the run's saved config, else :class:`TrainConfig`'s optimizer)
    only shapes the optimiser state that is stored alongside.
    """
    import orbax.checkpoint as ocp

    workdir = pathlib.Path(workdir)
    if config is None and (workdir / "train_config.json").exists():
        config = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in read_json(workdir / "train_config.json")["config"].items()})
    tx = _optimizer(config or TrainConfig())
    _, params, stats, _ = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    opt_state = jax.eval_shape(tx.init, params)  # a template: shapes and dtypes only
    mgr = _checkpoint_manager(workdir)
    steps = tuple(mgr.all_steps())
    if not steps:
        mgr.close()
        raise FileNotFoundError(f"No checkpoints in {workdir / 'checkpoints'}.")
    step = max(steps) if step is None else step
    if step not in steps:
        mgr.close()
        raise ValueError(f"No checkpoint at step {step} in {workdir}; saved steps: {sorted(steps)}.")
    template = _to_tree(params, opt_state, stats)
    if jax.process_count() > 1:  # one process of several: onto this process's own device (not the saved one's)
        local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        template = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=local), template)
    restored = mgr.restore(step, args=ocp.args.StandardRestore(template))
    mgr.close()
    params, _, stats = _from_tree(restored, params, opt_state, stats)
    nnx.update(model, params, stats)
    return model
