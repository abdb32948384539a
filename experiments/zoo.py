"""``funsim zoo``: train a model zoo for the usable-information study.

Run::

    funsim zoo --config smoke                 # seconds: the smoke test's zoo (digits)
    funsim zoo --config default               # offline, about 25 min on 2 quiet CPU cores
    funsim zoo --config paper --download      # a GPU/TPU: CIFAR-10/100 (fine, coarse) and SVHN via tfds
    funsim zoo --config my.json --run NAME    # a JSON config: every field, or {"base": "default", ...overrides}

Every data set x model x seed is trained with :func:`models.train.train` in its
own workdir (power-spaced checkpoints, resumable mid-run). The zoo is resumable
per model: ``zoo.json`` is rewritten (atomically) after each model, and a rerun
skips every model it already lists with the same setup (a changed setup is
refused, with the differences listed). The run name defaults to the config's
name, so ``funsim zoo --config default`` always continues ``results/zoo/default/``.

Writes ``results/zoo/<run>/``:

* ``units/<data set>/<model>_s<seed>.json``: each finished model's manifest entry
  (written by the process that trained it; see :func:`run` for N processes);
* ``config.json``; ``zoo.json``, the manifest :func:`load_zoo` reads: per data
  set how to load it, its sizes, a fingerprint and its coarse groupings; per
  model its data set, architecture, seed, test accuracy, workdir, layer names,
  feature shapes and the :func:`models.get_model` call that rebuilds it;
* ``models/<data set>/<model>_s<seed>/``: ``checkpoints/``, ``metrics.json``
  (the training curve's numbers), ``train_config.json``, ``training.png``;
* ``training_<data set>.png`` (all curves), ``accuracy_<data set>.png``,
  ``metrics.json`` (atomic) and ``summary.md``.

The study (``funsim similarity-study``) reads the zoo with :func:`load_zoo` and
the data with :func:`load_zoo_data` (the same rows, plus coarse labels).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from funsim.experiments import config as config_lib
from funsim.experiments import data as data_lib
from funsim.experiments.config import ConfigError, coerce_fields
from funsim.experiments.io import (
    open_run,
    read_json,
    releases_run_locks,
    to_jsonable,
    write_json_atomic,
    write_text_atomic,
)

__all__ = [
    "DataSpec", "ModelSpec", "ZooConfig", "CONFIGS", "config_from_dict", "run",
    "ZooModel", "ZooData", "Zoo", "read_manifest", "load_zoo", "load_zoo_data", "add_arguments", "main",
]

MANIFEST = "zoo.json"
SUPPORTS_MULTIPROCESS = True  # `funsim launch -n N zoo`: models are split over the processes (see run)
# Each process trains its own models, with no collective: the processes do not join JAX's multi-process
# runtime (whose orbax checkpointing would make every save a joint one), only split the list.
JOINS_JAX_RUNTIME = False
# data sets read through tfds: they take the download / data_dir options
_TFDS = (*data_lib.TFDS_NAMES, "cifar100_coarse")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """One data set of the zoo.

    Attributes:
      name: a :func:`experiments.data.load` name (``cifar100_coarse`` trains on the 20 superclasses).
      n_train: keep the first ``n_train`` training examples (None: all).
      n_test: keep the first ``n_test`` test examples (None: all).
      optional: if the data is absent, skip it with the reason in the manifest instead of failing.
      options: extra loader options, e.g. ``{"source": "idx"}`` for Fashion-MNIST.
      train: :class:`models.train.TrainConfig` overrides for this data set (e.g. ``augment``).
    """

    name: str
    n_train: int | None = None
    n_test: int | None = None
    optional: bool = False
    options: dict = dataclasses.field(default_factory=dict)
    train: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One architecture of the zoo.

    Attributes:
      name: the model's name in the zoo, e.g. ``"mlp_wide"``.
      arch: a :func:`models.get_model` name.
      kwargs: the model's keyword options (sizes).
      train: :class:`models.train.TrainConfig` overrides for this model.
    """

    name: str
    arch: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    train: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ZooConfig:
    """A zoo: every data set x model x seed.

    Attributes:
      name: the config's name (the default run name).
      datasets: the data sets.
      models: the architectures.
      seeds: one model per seed (initialisation and minibatch order).
      train: base :class:`models.train.TrainConfig` fields (then the data set's, then the model's overrides).
      n_checkpoints: power-spaced checkpoints per model (``power_schedule(steps, n, power=2)``).
      download: let tfds download missing data (needs internet).
      data_dir: the tfds data directory (None: tfds's default).
    """

    name: str
    datasets: tuple[DataSpec, ...]
    models: tuple[ModelSpec, ...]
    seeds: tuple[int, ...] = (0, 1)
    train: dict = dataclasses.field(default_factory=dict)
    n_checkpoints: int = 8
    download: bool = False
    data_dir: str | None = None


# ----------------------------------------------------------------------------- configs

_SMOKE = ZooConfig(
    name="smoke",
    datasets=(DataSpec("digits", n_train=256, n_test=96),),
    models=(
        ModelSpec("linear", "linear"),
        ModelSpec("mlp", "mlp", {"widths": (16,)}),
        ModelSpec("cnn", "cnn", {"channels": (4,)}),
    ),
    seeds=(0, 1),
    train={"steps": 16, "batch_size": 32, "learning_rate": 1e-2, "eval_every": 8, "eval_train_size": 128},
    n_checkpoints=2,
)

# The offline zoo: 8 architectures x 2 seeds on each data set. Sizes keep the
# run near 25 minutes on 2 quiet CPU cores (README: measured time and load).
_CPU_MODELS = (
    ModelSpec("linear", "linear"),
    ModelSpec("mlp_narrow", "mlp", {"widths": (64, 64)}),
    ModelSpec("mlp_wide", "mlp", {"widths": (256, 256, 256)}),
    ModelSpec("cnn", "cnn", {"channels": (16, 32, 64)}),
    ModelSpec("resnet8", "resnet", {"depth": 8, "width": 8}),
    ModelSpec("densenet_lite", "densenet", {"depth": 10, "growth": 8}),
    # depthwise convolutions are slow on XLA's CPU backend: downsample from the first block
    ModelSpec("mobilenet_lite", "mobilenet", {"channels": (16, 32, 64), "stem_channels": 8, "strides": (2, 2, 2)}),
    ModelSpec("shufflenet_lite", "shufflenet",
              {"channels": (24, 48, 96), "repeats": (1, 1, 1), "stem_channels": 8, "final_channels": 128}),
)

_DEFAULT = ZooConfig(
    name="default",
    datasets=(
        DataSpec("mnist5k"),
        DataSpec("digits"),
        # only from the Debian package's IDX files (`make data`); never tfds here
        DataSpec("fashion_mnist", n_train=6000, n_test=1000, optional=True, options={"source": "idx"}),
    ),
    models=_CPU_MODELS,
    seeds=(0, 1),
    train={"steps": 600, "batch_size": 64, "learning_rate": 3e-3, "eval_every": 150, "eval_train_size": 1000,
           "eval_batch_size": 500},
    n_checkpoints=8,
)

# The paper-scale zoo (Almudevar et al.'s CIFAR/SVHN setting); for a GPU or TPU.
_PAPER = ZooConfig(
    name="paper",
    datasets=(
        DataSpec("cifar10", train={"augment": "crop_flip"}),
        DataSpec("cifar100", train={"augment": "crop_flip"}),
        DataSpec("cifar100_coarse", train={"augment": "crop_flip"}),
        DataSpec("svhn_cropped", train={"augment": "crop"}),  # digits: no mirror images
    ),
    models=(
        ModelSpec("linear", "linear"),
        ModelSpec("mlp_narrow", "mlp", {"widths": (512, 512)}),
        ModelSpec("mlp_wide", "mlp", {"widths": (2048, 2048, 2048)}),
        ModelSpec("cnn", "cnn", {"channels": (32, 64, 128)}),
        ModelSpec("resnet20", "resnet", {"depth": 20, "width": 16}),
        ModelSpec("resnet56", "resnet", {"depth": 56, "width": 16}),
        ModelSpec("densenet40", "densenet", {"depth": 40, "growth": 12}),
        # the 13-block CIFAR MobileNet (Howard et al. 2017 with a stride-1 stem)
        ModelSpec("mobilenet", "mobilenet", {
            "stem_channels": 32,
            "channels": (64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024),
            "strides": (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1),
        }),
        ModelSpec("shufflenet", "shufflenet", {
            "channels": (116, 232, 464), "repeats": (4, 8, 4), "stem_channels": 24, "final_channels": 1024,
        }),
    ),
    seeds=(0, 1),
    train={"steps": 40_000, "batch_size": 128, "learning_rate": 2e-3, "optimizer": "adamw", "weight_decay": 5e-2,
           "warmup_steps": 1000, "eval_every": 2000, "eval_train_size": 5000, "eval_batch_size": 1000},
    n_checkpoints=10,
)

CONFIGS: dict[str, ZooConfig] = {"smoke": _SMOKE, "default": _DEFAULT, "paper": _PAPER}

# Published test accuracies of the paper-scale architectures (as published: BatchNorm,
# standard augmentation), for the summary. Ours use GroupNorm, and the paper's DenseNet
# compresses at transitions: close relatives, not the same networks.
REFERENCE_ACCURACY = {
    ("cifar10", "resnet20"): (0.9125, "He et al. 2016, Table 6"),
    ("cifar10", "resnet56"): (0.9303, "He et al. 2016, Table 6"),
    ("cifar10", "densenet40"): (0.9476, "Huang et al. 2017, Table 2 (C10+, no compression)"),
    ("cifar100", "densenet40"): (0.7558, "Huang et al. 2017, Table 2 (C100+, no compression)"),
    ("svhn_cropped", "densenet40"): (0.9821, "Huang et al. 2017, Table 2 (SVHN, no compression)"),
}


def config_from_dict(d: Mapping[str, Any]) -> ZooConfig:
    """A :class:`ZooConfig` from its JSON form (``config.json``), or ``{"base": name, **overrides}``.

    Examples:
      >>> config_from_dict({"base": "smoke", "seeds": [0]}).seeds
      (0,)
    """
    return config_lib.from_dict(ZooConfig, CONFIGS, d)  # typed: data sets and models become DataSpec / ModelSpec


# ----------------------------------------------------------------------------- data


def _loader_options(spec: DataSpec, download: bool, data_dir: str | None) -> dict:
    opts = dict(spec.options)
    if spec.name in _TFDS and opts.get("source") != "idx":
        opts.setdefault("download", download)
        opts.setdefault("data_dir", data_dir)
    return opts


def _load(spec: DataSpec, options: dict, grouping: str | None = None) -> data_lib.Dataset:
    ds = data_lib.load(spec.name, **options) if grouping is None else data_lib.load_coarse(spec.name, grouping, **options)
    return ds.subset(spec.n_train, spec.n_test)


def _fingerprint(ds: data_lib.Dataset) -> str:
    from funsim.models.io import fingerprint

    return fingerprint(ds.x_train, ds.y_train, ds.x_test, ds.y_test)


def _dataset_entry(spec: DataSpec, options: dict, ds: data_lib.Dataset) -> dict:
    groupings = data_lib.COARSE_GROUPINGS.get(spec.name, {})
    return {
        "status": "ok",
        "name": spec.name,
        "load": {"name": spec.name, "options": options, "n_train": spec.n_train, "n_test": spec.n_test},
        "n_train": len(ds.x_train),
        "n_test": len(ds.x_test),
        "input_shape": list(ds.input_shape),
        "n_classes": ds.n_classes,
        "class_names": list(ds.class_names),
        "description": ds.description,
        "sha1": _fingerprint(ds),
        # load_zoo_data(run, name).coarse[grouping] has the same rows with these labels
        "coarse": {g: ({"feature": "coarse_label"} if m is None else
                       {"n_classes": len(m[1]), "class_names": list(m[1]), "map": list(m[0])})
                   for g, m in groupings.items()},
    }


# ----------------------------------------------------------------------------- training


def _train_config(cfg: ZooConfig, dspec: DataSpec, mspec: ModelSpec, seed: int):
    from funsim.models.train import TrainConfig, power_schedule

    fields = {**cfg.train, **dspec.train, **mspec.train, "seed": seed}
    valid = {f.name for f in dataclasses.fields(TrainConfig)}
    if set(fields) - valid:
        raise ValueError(
            f"Unknown training options {sorted(set(fields) - valid)} in the zoo config (train of the config, of "
            f"{dspec.name!r} or of {mspec.name!r}); valid: {sorted(valid - {'seed'})}."
        )
    try:
        fields = coerce_fields(TrainConfig, fields)
    except ConfigError as e:
        raise ConfigError(f"Training options of the zoo config (train of the config, of {dspec.name!r} or of "
                          f"{mspec.name!r}): {e}") from None
    steps = int(fields.get("steps", TrainConfig.steps))
    fields.setdefault("checkpoint_steps", power_schedule(steps, cfg.n_checkpoints, power=2.0))
    return TrainConfig(**fields)


def _build(build: Mapping[str, Any]):
    from funsim import models
    return models.get_model(build["arch"], tuple(build["input_shape"]), int(build["n_classes"]),
                            seed=int(build["seed"]), **build["kwargs"])


@dataclasses.dataclass(frozen=True)
class _Job:
    """One model to train: its id, workdir, train config, build call and the setup it is checked by."""

    id: str
    workdir: pathlib.Path
    config: Any  # models.train.TrainConfig
    build: dict
    spec: dict


def _jobs(cfg: ZooConfig, loaded: dict, sha1: dict, out: pathlib.Path) -> list[_Job]:
    jobs = []
    for dspec, ds in loaded.values():
        for mspec in cfg.models:
            for seed in cfg.seeds:
                tcfg = _train_config(cfg, dspec, mspec, seed)
                build = {"arch": mspec.arch, "input_shape": list(ds.input_shape), "n_classes": ds.n_classes,
                         "seed": seed, "kwargs": mspec.kwargs}
                jobs.append(_Job(
                    f"{dspec.name}/{mspec.name}_s{seed}", out / "models" / dspec.name / f"{mspec.name}_s{seed}", tcfg,
                    build, to_jsonable({"build": build, "train_config": tcfg, "data_sha1": sha1[dspec.name]}),
                ))
    return jobs


def _check_resumable(jobs: list[_Job], previous: dict, out: pathlib.Path) -> None:
    """Refuse, before anything is written, a rerun whose finished models had another setup."""
    from funsim.models.io import setup_diff

    for job in jobs:
        old = previous.get(job.id)
        diffs = [] if old is None else setup_diff(old["spec"], job.spec)
        if diffs:
            raise ValueError(
                f"Refusing to continue zoo run {out}: model {job.id} was trained with a different setup:\n  "
                + "\n  ".join(diffs) + "\nUse a new --run name, or restore the original config."
            )


def _train_one(job: _Job, ds: data_lib.Dataset, out: pathlib.Path, progress: bool) -> dict:
    """Train (or resume mid-run) one model; returns its manifest entry."""
    import jax
    from flax import nnx

    from funsim.experiments import plotting
    from funsim.models import train as train_lib

    t0 = time.time()
    model = _build(job.build)
    res = train_lib.train(model, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=job.config,
                          workdir=job.workdir, progress=progress)
    plotting.training_curves({job.id: res.history}, job.workdir / "training.png", title=f"{job.id}: training")
    final, shapes = res.final, model.feature_shapes()
    dataset, rest = job.id.split("/", 1)
    return {
        "id": job.id,
        "dataset": dataset,
        "name": rest.rsplit("_s", 1)[0],
        "arch": job.build["arch"],
        "seed": job.build["seed"],
        "test_accuracy": final["test_accuracy"],
        "test_loss": final["test_loss"],
        "train_accuracy": final["train_accuracy"],
        "train_loss": final["train_loss"],
        "steps": job.config.steps,
        "n_params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))),
        "layers": list(model.layer_names()),
        # (i + 1) / L for the i-th of L layers: matches layers of different depths (logits = 1)
        "relative_depth": {k: (i + 1) / len(model.layer_names()) for i, k in enumerate(model.layer_names())},
        "feature_shapes": {k: list(shapes[k]) for k in model.layer_names()},
        "workdir": str(job.workdir.relative_to(out)),
        "checkpoint_steps": list(job.config.checkpoint_set()),
        "build": job.build,
        "spec": job.spec,
        "resumed_from": res.resumed_from,
        "seconds": round(time.time() - t0, 1),
    }


@releases_run_locks
def run(cfg: ZooConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Train the zoo (resuming a previous run of the same name); returns the metrics dict.

    In a run of N processes (``funsim launch -n N zoo ...``; elsewhere, set
    ``FUNSIM_PROCESS_ID`` and ``FUNSIM_NUM_PROCESSES`` yourself) model ``k`` of
    the zoo's list (config order) is trained by process ``k mod N``
    (:func:`experiments.distributed.my_units`), each on its own devices; the
    processes share no computation, so they do not join JAX's multi-process
    runtime. Process 0 holds the run's lock. Each finished model is written
    atomically as ``units/<data set>/<model>_s<seed>.json``; every process waits
    until all models are written (``FUNSIM_WAIT_TIMEOUT`` bounds a wait without
    progress), then process 0 writes ``zoo.json``, the figures, ``metrics.json``
    and ``summary.md`` once. A rerun, with any number of processes, trains only
    the models that have no unit file; the others' returns name their models.

    Raises:
      DataNotFoundError: a data set that is not ``optional`` is absent.
      ValueError: the run holds models trained with a different setup, or on other data.
      TimeoutError: (N processes) no other process finished a model for ``FUNSIM_WAIT_TIMEOUT`` seconds.
    """
    from tqdm.auto import tqdm

    from funsim.experiments import distributed, plotting

    t0 = time.time()
    main_process = distributed.is_main_process()
    say = (lambda msg: log(distributed.log_prefix() + msg)) if distributed.process_count() > 1 else log
    say_main = say if main_process else (lambda msg: None)
    out = open_run("zoo", run_name or cfg.name, root=root)  # locked (by process 0): a second run into it is refused
    path = out / MANIFEST
    previous = _previous_manifest(path, say_main)
    # the manifest lists the current config's data sets and models, in config order
    manifest = {"experiment": "zoo", "config": to_jsonable(cfg), "complete": False, "datasets": {}, "models": {}}

    loaded = {}
    for spec in cfg.datasets:
        options = _loader_options(spec, cfg.download, cfg.data_dir)
        try:
            ds = _load(spec, options)
        except data_lib.DataNotFoundError as e:
            if not spec.optional:
                raise
            manifest["datasets"][spec.name] = {"status": "skipped", "name": spec.name, "reason": str(e)}
            say_main(f"[data] {spec.name}: skipped (optional, not available): {str(e).split('. ')[0]}.")
            continue
        manifest["datasets"][spec.name] = _dataset_entry(spec, options, ds)
        loaded[spec.name] = (spec, ds)
        say_main(f"[data] {spec.name}: {len(ds.x_train)} train, {len(ds.x_test)} test, input {ds.input_shape}, "
                 f"{ds.n_classes} classes")
    jobs = _jobs(cfg, loaded, {k: d["sha1"] for k, d in manifest["datasets"].items() if d["status"] == "ok"}, out)
    _check_resumable(jobs, {**previous["models"], **{j.id: e for j in jobs if (e := _read_unit(out, j))}}, out)
    finished = {job.id: e for job in jobs if (e := _unit_entry(out, job)) is not None}
    known = dict(finished)  # finished models with sound checkpoints, in config order
    if main_process:
        write_json_atomic(out / "config.json", cfg)
        manifest["models"] = known
        write_json_atomic(path, manifest)

    mine = distributed.my_units(jobs)
    n_proc = distributed.process_count()
    say_main(f"[zoo] {len(jobs)} models: {len(loaded)} data sets x {len(cfg.models)} architectures x "
             f"{len(cfg.seeds)} seeds" + (f"; {n_proc} processes, model k trained by process k mod {n_proc}"
                                          if n_proc > 1 else ""))
    bar = tqdm(mine, desc="zoo", disable=not distributed.show_progress(progress))
    for job in bar:
        bar.set_postfix_str(job.id)
        entry = _finished_entry(out, job, finished.get(job.id) or previous["models"].get(job.id), say)
        if entry is not None:
            say(f"      {job.id}: done before (test accuracy {entry['test_accuracy']:.3f}), not retrained")
        else:
            entry = _train_one(job, loaded[job.id.split("/")[0]][1], out, distributed.show_progress(progress))
            say(f"      {job.id}: test accuracy {entry['test_accuracy']:.3f} ({entry['seconds']:.0f} s)")
        if job.id not in finished:  # this model's unit: written once, by its process
            write_json_atomic(_unit_path(out, job), entry)
        known[job.id] = entry
        if main_process:  # zoo.json, rewritten as models finish: what an interrupted run has so far
            manifest["models"] = {j.id: known[j.id] for j in jobs if j.id in known}
            write_json_atomic(path, manifest)
    bar.close()
    if n_proc > 1:  # the other processes' models
        by_path = {_unit_path(out, j): j for j in jobs}
        distributed.wait_for_files(list(by_path), what="zoo models",
                                   done=lambda p: _unit_entry(out, by_path[p]) is not None, log=say)
    if not main_process:  # process 0 writes the shared files
        return {"out": str(out), "trained_here": [j.id for j in mine], "figures": []}

    manifest["models"] = {}
    for job in jobs:
        entry = _unit_entry(out, job)
        if entry is None:
            raise RuntimeError(f"{_unit_path(out, job)} is missing or damaged after every process finished: rerun "
                               "the same command to train that model again.")
        manifest["models"][job.id] = entry
    figures = []
    for name in loaded:
        entries = [e for e in manifest["models"].values() if e["dataset"] == name]
        panels: dict[str, dict] = {}
        for e in entries:
            history = read_json(out / e["workdir"] / "metrics.json")["history"]
            panels.setdefault(f"{e['name']} ({e['arch']})", {})[f"seed {e['seed']}"] = history
        figures.append(plotting.curve_panels(panels, out / f"training_{name}.png",
                                             title=f"Zoo on {name}: accuracy while training (solid: test, dashed: train)"))
        figures.append(plotting.bar_chart({e["id"].split("/", 1)[1]: e["test_accuracy"] for e in entries},
                                          out / f"accuracy_{name}.png", title=f"Zoo on {name}: test accuracy",
                                          ylabel="test accuracy", ylim=(0, 1.08)))
    seconds = round(time.time() - t0, 1)
    manifest["complete"] = True
    write_json_atomic(path, manifest)
    metrics = {
        "accuracy": {k: e["test_accuracy"] for k, e in manifest["models"].items()},
        "datasets": {k: d["status"] for k, d in manifest["datasets"].items()},
        "n_models": len(manifest["models"]),
        "architectures": sorted({e["arch"] for e in manifest["models"].values()}),
        "seconds_this_invocation": seconds,
        "seconds_training": round(sum(e["seconds"] for e in manifest["models"].values()), 1),
        "processes": n_proc,
    }
    write_json_atomic(out / "metrics.json", metrics)
    write_text_atomic(out / "summary.md", summary(cfg, manifest, metrics))
    say(f"[done] {metrics['n_models']} models in {out}/ (zoo.json, summary.md, {len(figures)} figures); "
        f"{seconds:.0f} s this invocation")
    return {**metrics, "out": str(out), "figures": [str(f) for f in figures]}


UNITS = "units"
"""The folder of a zoo run's per-model unit files (one JSON manifest entry per finished model)."""


def _unit_path(out: pathlib.Path, job: _Job) -> pathlib.Path:
    return out / UNITS / f"{job.id}.json"


def _read_unit(out: pathlib.Path, job: _Job) -> dict | None:
    """The model's unit file as written, or None (absent, or damaged: then it is trained again)."""
    from funsim.models.io import DamagedFileError

    p = _unit_path(out, job)
    if not p.is_file():
        return None
    try:
        entry = read_json(p)
    except DamagedFileError:
        return None
    return entry if isinstance(entry, dict) and "spec" in entry else None


def _unit_entry(out: pathlib.Path, job: _Job) -> dict | None:
    """The finished model's manifest entry from its unit file, or None (absent, damaged, or for another setup)."""
    from funsim.models.io import checkpoint_problem, setup_diff

    entry = _read_unit(out, job)
    if entry is None or setup_diff(entry["spec"], job.spec):
        return None
    return None if checkpoint_problem(job.workdir) else entry


def _finished_entry(out: pathlib.Path, job: _Job, entry: dict | None, log: Callable[[str], None]) -> dict | None:
    """``entry`` if the model is finished and its final checkpoint is sound; else None (removing a stale unit file)."""
    from funsim.models.io import checkpoint_problem

    if entry is None:
        _unit_path(out, job).unlink(missing_ok=True)
        return None
    damaged = checkpoint_problem(job.workdir)
    if damaged:  # training sets the damaged checkpoint aside and resumes from the last good one
        log(f"      {job.id}: its final checkpoint is damaged ({damaged}); retraining it from its last good one")
        _unit_path(out, job).unlink(missing_ok=True)
        return None
    return entry


def _previous_manifest(path: pathlib.Path, log: Callable[[str], None]) -> dict:
    """The manifest of the run being resumed; a damaged one is rebuilt (its models' trainings resume at their end)."""
    from funsim.models.io import DamagedFileError

    empty = {"datasets": {}, "models": {}}
    if not path.exists():
        return empty
    try:
        return read_json(path)
    except DamagedFileError as e:
        log(f"[zoo] {e.args[0].split(': it is')[0]}: rebuilding it; finished models are loaded from their last "
            "checkpoints, not retrained")
        return empty


def summary(cfg: ZooConfig, manifest: dict, metrics: dict) -> str:
    """The run's summary.md: what ran, accuracies per model and seed, published references."""
    lines = [f"# Model zoo `{cfg.name}`", ""]
    lines.append(f"{metrics['n_models']} models: {len(cfg.models)} model types ({', '.join(m.name for m in cfg.models)}) "
                 f"of {len(metrics['architectures'])} architecture families ({', '.join(metrics['architectures'])}), "
                 f"seeds {list(cfg.seeds)}; training time {metrics['seconds_training']:.0f} s in total (the sum "
                 "over models of each one's wall time, compilation included).")
    lines.append("")
    lines.append("| data set | status | train / test rows | coarse groupings (for the granularity claim) |")
    lines.append("|---|---|---|---|")
    for name, d in manifest["datasets"].items():
        if d["status"] == "ok":
            lines.append(f"| {name} | trained | {d['n_train']} / {d['n_test']} | {', '.join(d['coarse']) or '-'} |")
        else:
            lines.append(f"| {name} | skipped | - | {d['reason'].split('. ')[0]} |")
    for name, d in manifest["datasets"].items():
        entries = [e for e in manifest["models"].values() if e["dataset"] == name]
        if not entries:
            continue
        lines += ["", f"## Test accuracy on {name}", "",
                  "| model | architecture | " + " | ".join(f"seed {s}" for s in cfg.seeds) + " | published (reference) |",
                  "|---|---|" + "---:|" * len(cfg.seeds) + "---|"]
        for m in cfg.models:
            accs = {e["seed"]: e["test_accuracy"] for e in entries if e["name"] == m.name}
            ref = REFERENCE_ACCURACY.get((name, m.name))
            ref_s = f"{ref[0]:.4f} ({ref[1]})" if ref else "none at this scale"
            lines.append(f"| {m.name} | {m.arch} | " + " | ".join(
                f"{accs[s]:.4f}" if s in accs else "-" for s in cfg.seeds) + f" | {ref_s} |")
    lines += ["", "The paper's zoo (Almudévar et al.) has 58 models of 14 architectures on 6 data sets; "
              "this run's models, data sets and training budget are listed above.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- loading


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One trained model of a zoo, rebuilt from its checkpoint.

    Attributes:
      id: ``"<data set>/<name>_s<seed>"``.
      dataset: the data set it was trained on.
      name: its name in the zoo config (e.g. ``"mlp_wide"``).
      arch: its :func:`models.get_model` name.
      seed: its seed.
      test_accuracy: the final test accuracy.
      layers: its layer names, in order (the last is ``"logits"``).
      relative_depth: layer -> ``(i + 1) / L`` (the i-th of L layers; ``"logits"`` is 1).
      feature_shapes: per-sample shape of every layer's output.
      workdir: the training workdir (checkpoints, metrics.json).
      model: the network with the loaded parameters.
    """

    id: str
    dataset: str
    name: str
    arch: str
    seed: int
    test_accuracy: float
    layers: tuple[str, ...]
    relative_depth: dict[str, float]
    feature_shapes: dict[str, tuple[int, ...]]
    workdir: pathlib.Path
    model: Any


@dataclasses.dataclass(frozen=True)
class ZooData:
    """The rows the zoo's models were trained and tested on.

    Attributes:
      dataset: the data set with its fine labels (as trained).
      coarse: grouping -> the same rows with coarse labels (see ``experiments.data.COARSE_GROUPINGS``).
    """

    dataset: data_lib.Dataset
    coarse: dict[str, data_lib.Dataset]


@dataclasses.dataclass(frozen=True)
class Zoo:
    """A loaded zoo: ``models`` by id, in training order, and the manifest."""

    run_dir: pathlib.Path
    manifest: dict
    models: dict[str, ZooModel]

    @property
    def datasets(self) -> tuple[str, ...]:
        """The data sets that were trained (skipped ones are left out)."""
        return tuple(k for k, d in self.manifest["datasets"].items() if d["status"] == "ok")

    def by_dataset(self, name: str) -> list[ZooModel]:
        """The models trained on ``name``, in training order."""
        return [m for m in self.models.values() if m.dataset == name]

    def data(self, name: str) -> ZooData:
        """The data set ``name`` as trained on, with coarse labels (:func:`load_zoo_data`)."""
        return load_zoo_data(self.run_dir, name)


def read_manifest(run_dir: str | pathlib.Path) -> dict:
    """A zoo run's manifest (``zoo.json``): its config, data sets and models (see the module docstring).

    Raises:
      FileNotFoundError: no manifest (the zoo was not trained there).
      DamagedFileError: (a ``ValueError``) the manifest is not valid JSON; the message says what to rerun.
    """
    from funsim.models.io import DamagedFileError

    run_dir = pathlib.Path(run_dir)
    path = run_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"No zoo manifest {path}: train the zoo first (funsim zoo --config ... --run ...).")
    try:
        return read_json(path)
    except DamagedFileError as e:
        raise DamagedFileError(
            f"{e.args[0].split(' Delete it')[0]} Rerun `funsim zoo --config {run_dir / 'config.json'} --run "
            f"{run_dir.name} --root {run_dir.parent.parent}` (or the command you ran): it rebuilds the manifest "
            "without retraining the finished models."
        ) from None


def load_zoo(run_dir: str | pathlib.Path, *, datasets: tuple[str, ...] | None = None, step: int | None = None,
             allow_incomplete: bool = False) -> Zoo:
    """Rebuild a trained zoo's models from their checkpoints.

    Args:
      run_dir: ``results/zoo/<run>``.
      datasets: only the models of these data sets (None: all).
      step: the checkpoint step to load (None: the last, the trained model).
      allow_incomplete: load what an interrupted run has finished; otherwise
        an incomplete zoo is an error.

    Returns:
      a :class:`Zoo`.
    """
    import jax
    from flax import nnx

    from funsim.models.io import DamagedFileError
    from funsim.models.train import load_checkpoint

    run_dir = pathlib.Path(run_dir)
    manifest = read_manifest(run_dir)
    if not manifest.get("complete") and not allow_incomplete:
        raise ValueError(
            f"The zoo in {run_dir} is incomplete ({len(manifest['models'])} models so far): rerun the same "
            "`funsim zoo` command to finish it, or pass allow_incomplete=True."
        )
    if datasets is not None:
        unknown = sorted(set(datasets) - set(manifest["datasets"]))
        if unknown:
            raise ValueError(f"Data sets {unknown} are not in the zoo {run_dir}; it has {list(manifest['datasets'])}.")
    out = {}
    for mid, e in manifest["models"].items():
        if datasets is not None and e["dataset"] not in datasets:
            continue
        # abstract first: the checkpoint overwrites every parameter
        try:
            model = load_checkpoint(nnx.eval_shape(lambda e=e: _build(e["build"])), run_dir / e["workdir"], step)
        except DamagedFileError as err:
            rerun = (f"`funsim zoo --config {run_dir / 'config.json'} --run {run_dir.name} --root "
                     f"{run_dir.parent.parent}` (or the command you ran)")
            fix = (f"For this zoo, rerun {rerun}: it sets the damaged checkpoint aside and retrains {mid} from its last "
                   "good one." if step is None else
                   f"For this zoo, delete {run_dir / e['workdir']} and rerun {rerun} to retrain {mid}.")
            raise DamagedFileError(f"Model {mid} of the zoo in {run_dir}: {err} {fix}") from None
        if any(isinstance(v, jax.ShapeDtypeStruct) for v in jax.tree.leaves(nnx.state(model))):
            raise ValueError(f"{mid}: its checkpoint does not hold every variable of the rebuilt model.")
        out[mid] = ZooModel(
            id=mid, dataset=e["dataset"], name=e["name"], arch=e["arch"], seed=e["seed"],
            test_accuracy=e["test_accuracy"], layers=tuple(e["layers"]), relative_depth=e["relative_depth"],
            feature_shapes={k: tuple(v) for k, v in e["feature_shapes"].items()},
            workdir=run_dir / e["workdir"], model=model,
        )
    return Zoo(run_dir, manifest, out)


def load_zoo_data(run_dir: str | pathlib.Path, dataset: str) -> ZooData:
    """The rows a zoo was trained on, with every documented coarse grouping of them.

    The data set is reloaded as the manifest says and checked against the
    fingerprint saved at training time.

    Raises:
      ValueError: the data set is not in the zoo, was skipped, or differs from the trained one.
    """
    manifest = read_manifest(run_dir)
    d = manifest["datasets"].get(dataset)
    if d is None or d["status"] != "ok":
        why = "was not in its config" if d is None else f"was skipped: {d['reason']}"
        raise ValueError(f"Data set {dataset!r} of the zoo in {run_dir} {why}.")
    spec = DataSpec(d["name"], n_train=d["load"]["n_train"], n_test=d["load"]["n_test"])
    ds = _load(spec, d["load"]["options"])
    if _fingerprint(ds) != d["sha1"]:
        raise ValueError(
            f"Data set {dataset!r} now loads different rows from those the zoo in {run_dir} was trained on "
            "(a changed source or version); its models cannot be compared on it."
        )
    return ZooData(ds, {g: _load(spec, d["load"]["options"], g) for g in d["coarse"]})


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, ZooConfig, CONFIGS)
    parser.add_argument("--run", default=None,
                        help="run name (default: the config's name and its --set overrides; reruns resume it)")
    parser.add_argument("--root", default="results", help="results root directory (default: results)")
    parser.add_argument("--download", action="store_true", help="let tfds download missing data sets (internet)")
    parser.add_argument("--data-dir", default=None, help="the tfds data directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")


def main(args: argparse.Namespace) -> int:
    cfg, name = config_lib.from_args(args, ZooConfig, CONFIGS)
    if args.download or args.data_dir:
        cfg = dataclasses.replace(cfg, download=cfg.download or args.download, data_dir=args.data_dir or cfg.data_dir)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        run(cfg, root=args.root, run_name=args.run or name, progress=not args.no_progress)
    except data_lib.DataNotFoundError as e:
        print(f"funsim zoo: {e}")
        return 1
    return 0
