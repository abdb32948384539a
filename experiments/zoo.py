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
* ``config.json``; ``zoo.json``, the manifest :func:`models.zoo.load_zoo` reads: per data
  set how to load it, its sizes, a fingerprint and its coarse groupings; per
  model its data set, architecture, seed, test accuracy, workdir, layer names,
  feature shapes and the :func:`models.get_model` call that rebuilds it;
* ``models/<data set>/<model>_s<seed>/``: ``checkpoints/``, ``metrics.json``
  (the training curve's numbers), ``train_config.json``, ``training.png``;
* ``training_<data set>.png`` (all curves), ``accuracy_<data set>.png``,
  ``metrics.json`` (atomic) and ``summary.md``.

The study (``funsim similarity-study``) reads the zoo with :func:`models.zoo.load_zoo`
(also importable from here) and the data with ``models.zoo.load_zoo_data`` (the same rows, plus coarse labels).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from funsim import data as data_lib
from funsim.experiments import config as config_lib
from funsim.experiments import plotting
from funsim.experiments.config import ConfigError, coerce_fields
from funsim.experiments.configs.zoo import (
    CONFIGS,
    REFERENCE_ACCURACY,
    DataSpec,
    ModelSpec,
    ZooConfig,
    add_arguments,
    config_from_dict,
)
from funsim.experiments.io import (
    open_run,
    read_json,
    releases_run_locks,
    to_jsonable,
    write_json_atomic,
    write_text_atomic,
)
from funsim.models import train as train_lib
from funsim.models.io import DamagedFileError, checkpoint_problem, setup_diff
from funsim.models.zoo import (
    MANIFEST,
    Zoo,
    ZooData,
    ZooModel,
    build_model,
    dataset_fingerprint,
    describe_model,
    load_zoo,
    load_zoo_data,
    read_manifest,
    zoo_dataset,
)
from funsim.runtime import distributed

__all__ = [
    "DataSpec", "ModelSpec", "ZooConfig", "CONFIGS", "REFERENCE_ACCURACY", "config_from_dict", "run",
    "ZooModel", "ZooData", "Zoo", "read_manifest", "load_zoo", "load_zoo_data", "add_arguments", "main",
]

# data sets read through tfds: they take the download / data_dir options
_TFDS = (*data_lib.TFDS_NAMES, "cifar100_coarse")


# ----------------------------------------------------------------------------- data


def _loader_options(spec: DataSpec, download: bool, data_dir: str | None) -> dict:
    opts = dict(spec.options)
    if spec.name in _TFDS and opts.get("source") != "idx":
        opts.setdefault("download", download)
        opts.setdefault("data_dir", data_dir)
    return opts


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
        "sha1": dataset_fingerprint(ds),
        # load_zoo_data(run, name).coarse[grouping] has the same rows with these labels
        "coarse": {g: ({"feature": "coarse_label"} if m is None else
                       {"n_classes": len(m[1]), "class_names": list(m[1]), "map": list(m[0])})
                   for g, m in groupings.items()},
    }


# ----------------------------------------------------------------------------- training


def _train_config(cfg: ZooConfig, dspec: DataSpec, mspec: ModelSpec, seed: int):
    fields = {**cfg.train, **dspec.train, **mspec.train, "seed": seed}
    valid = {f.name for f in dataclasses.fields(train_lib.TrainConfig)}
    if set(fields) - valid:
        raise ValueError(
            f"Unknown training options {sorted(set(fields) - valid)} in the zoo config (train of the config, of "
            f"{dspec.name!r} or of {mspec.name!r}); valid: {sorted(valid - {'seed'})}."
        )
    try:
        fields = coerce_fields(train_lib.TrainConfig, fields)
    except ConfigError as e:
        raise ConfigError(f"Training options of the zoo config (train of the config, of {dspec.name!r} or of "
                          f"{mspec.name!r}): {e}") from None
    steps = int(fields.get("steps", train_lib.TrainConfig.steps))
    fields.setdefault("checkpoint_steps", train_lib.power_schedule(steps, cfg.n_checkpoints, power=2.0))
    return train_lib.TrainConfig(**fields)


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
    t0 = time.time()
    model = build_model(job.build)
    res = train_lib.train(model, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=job.config,
                          workdir=job.workdir, progress=progress)
    plotting.training_curves({job.id: res.history}, job.workdir / "training.png", title=f"{job.id}: training")
    final = res.final
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
        **describe_model(model),  # n_params, layers, relative_depth, feature_shapes
        "workdir": str(job.workdir.relative_to(out)),
        "checkpoint_steps": list(job.config.checkpoint_set()),
        "build": job.build,
        "spec": job.spec,
        "resumed_from": res.resumed_from,
        "seconds": round(time.time() - t0, 1),
    }


def _load_datasets(cfg: ZooConfig, manifest: dict, say: Callable[[str], None]) -> dict:
    """``{name: (spec, data set)}`` of the config's data sets that load; each one's entry goes into
    ``manifest["datasets"]`` (an ``optional`` one that is absent: skipped, with the reason)."""
    loaded = {}
    for spec in cfg.datasets:
        options = _loader_options(spec, cfg.download, cfg.data_dir)
        try:
            ds = zoo_dataset(spec.name, options, spec.n_train, spec.n_test)
        except data_lib.DataNotFoundError as e:
            if not spec.optional:
                raise
            manifest["datasets"][spec.name] = {"status": "skipped", "name": spec.name, "reason": str(e)}
            say(f"[data] {spec.name}: skipped (optional, not available): {str(e).split('. ')[0]}.")
            continue
        manifest["datasets"][spec.name] = _dataset_entry(spec, options, ds)
        loaded[spec.name] = (spec, ds)
        say(f"[data] {spec.name}: {len(ds.x_train)} train, {len(ds.x_test)} test, input {ds.input_shape}, "
            f"{ds.n_classes} classes")
    return loaded


def _figures(out: pathlib.Path, manifest: dict, loaded: dict) -> list[pathlib.Path]:
    """Per data set: every model's training curves, and the test accuracies."""
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
    return figures


@releases_run_locks
def run(cfg: ZooConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Train the zoo (resuming a previous run of the same name); returns the metrics dict.

    In a run of N processes (``funsim launch -n N zoo ...``; elsewhere, set
    ``FUNSIM_PROCESS_ID`` and ``FUNSIM_NUM_PROCESSES`` yourself) model ``k`` of
    the zoo's list (config order) is trained by process ``k mod N``
    (:func:`runtime.distributed.my_units`), each on its own devices; the
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
    t0 = time.time()
    main_process = distributed.is_main_process()
    say = (lambda msg: log(distributed.log_prefix() + msg)) if distributed.process_count() > 1 else log
    say_main = say if main_process else (lambda msg: None)
    out = open_run("zoo", run_name or cfg.name, root=root)  # locked (by process 0): a second run into it is refused
    path = out / MANIFEST
    previous = _previous_manifest(path, say_main)
    # the manifest lists the current config's data sets and models, in config order
    manifest = {"experiment": "zoo", "config": to_jsonable(cfg), "complete": False, "datasets": {}, "models": {}}
    loaded = _load_datasets(cfg, manifest, say_main)
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
    figures = _figures(out, manifest, loaded)
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
    entry = _read_unit(out, job)
    if entry is None or setup_diff(entry["spec"], job.spec):
        return None
    return None if checkpoint_problem(job.workdir) else entry


def _finished_entry(out: pathlib.Path, job: _Job, entry: dict | None, log: Callable[[str], None]) -> dict | None:
    """``entry`` if the model is finished and its final checkpoint is sound; else None (removing a stale unit file)."""
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


# ----------------------------------------------------------------------------- CLI


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

