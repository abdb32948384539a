"""A trained model zoo read back: its manifest (``zoo.json``) and its networks rebuilt from their checkpoints.

``funsim zoo`` (:mod:`funsim.experiments.zoo`) trains the zoo and writes the manifest: per data
set how to load it, its sizes, a fingerprint and its coarse groupings; per model its data set,
architecture, seed, test accuracy, workdir, layer names, relative depths, feature shapes and the
:func:`models.get_model` call that rebuilds it (``build``). :func:`load_zoo` rebuilds every
model from its checkpoint; :func:`describe_model` is what the manifest records of a network.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from funsim import data
from funsim.models import get_model
from funsim.models.base import FeatureModel
from funsim.models.io import DamagedFileError, fingerprint, read_json, read_npz, write_atomic, write_json_atomic
from funsim.models.train import load_checkpoint

__all__ = ["MANIFEST", "ZooModel", "Zoo", "ZooData", "read_manifest", "load_zoo", "load_zoo_data", "pack_zoo_data", "carry_zoo", "zoo_dataset",
           "dataset_fingerprint", "build_model", "describe_model"]

MANIFEST = "zoo.json"
"""The manifest's file name in a zoo run's folder."""


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
class Zoo:
    """A loaded zoo: ``models`` by id, in training order, and the manifest.

    Its data (the rows it was trained on, with coarse labels) is ``experiments.zoo.load_zoo_data(run_dir, name)``.
    """

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


def read_manifest(run_dir: str | pathlib.Path) -> dict:
    """A zoo run's manifest (``zoo.json``): its config, data sets and models (see the module docstring).

    Raises:
      FileNotFoundError: no manifest (the zoo was not trained there).
      DamagedFileError: (a ``ValueError``) the manifest is not valid JSON; the message says what to rerun.
    """
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
            model = load_checkpoint(nnx.eval_shape(lambda e=e: build_model(e["build"])), run_dir / e["workdir"], step)
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


def build_model(build: Mapping[str, Any]) -> FeatureModel:
    """The untrained network of a manifest entry's ``build``: ``{"arch", "input_shape", "n_classes", "seed",
    "kwargs"}``, the :func:`models.get_model` call (load its parameters with ``models.train.load_checkpoint``).

    Examples:
      >>> build_model({"arch": "mlp", "input_shape": [4], "n_classes": 3, "seed": 0,
      ...              "kwargs": {"widths": [8]}}).layer_names()
      ('fc0', 'logits')
    """
    return get_model(build["arch"], tuple(build["input_shape"]), int(build["n_classes"]),
                            seed=int(build["seed"]), **build["kwargs"])


def describe_model(model: FeatureModel) -> dict:
    """What a zoo's manifest records of a network: ``n_params``, ``layers`` (in order), ``relative_depth``
    (``(i + 1) / L`` for the i-th of L layers: matches layers of networks of different depths; the logits
    are 1) and ``feature_shapes`` (per-sample shape of each layer's output, as lists).

    Examples:
      >>> d = describe_model(get_model("mlp", 4, 3, widths=(8,)))
      >>> d["n_params"], d["relative_depth"], d["feature_shapes"]
      (67, {'fc0': 0.5, 'logits': 1.0}, {'fc0': [8], 'logits': [3]})
    """
    names, shapes = list(model.layer_names()), model.feature_shapes()
    return {
        "n_params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))),
        "layers": names,
        "relative_depth": {k: (i + 1) / len(names) for i, k in enumerate(names)},
        "feature_shapes": {k: list(shapes[k]) for k in names},
    }


def zoo_dataset(name: str, options: Mapping[str, Any], n_train: int | None, n_test: int | None,
                grouping: str | None = None) -> data.Dataset:
    """Data set ``name`` as the zoo trains on it: loaded with ``options``, cut to ``n_train``/``n_test`` rows;
    with ``grouping``, the same rows with coarse labels (``funsim.data.load_coarse``)."""
    ds = data.load(name, **options) if grouping is None else data.load_coarse(name, grouping, **options)
    return ds.subset(n_train, n_test)


def dataset_fingerprint(ds: data.Dataset) -> str:
    """The checksum of a data set's rows and labels, saved in the manifest and checked when it is reloaded."""
    return fingerprint(ds.x_train, ds.y_train, ds.x_test, ds.y_test)



@dataclasses.dataclass(frozen=True)
class ZooData:
    """The rows the zoo's models were trained and tested on.

    Attributes:
      dataset: the data set with its fine labels (as trained).
      coarse: grouping -> the same rows with coarse labels (see ``funsim.data.COARSE_GROUPINGS``).
    """

    dataset: data.Dataset
    coarse: dict[str, data.Dataset]


def _pack_path(run_dir: str | pathlib.Path, dataset: str) -> pathlib.Path:
    return pathlib.Path(run_dir) / "data" / f"{dataset}.npz"


def _as_u8(x: np.ndarray) -> np.ndarray:
    """``x`` as bytes when it is exactly ``u8 / 255`` in float32 (images), else ``x`` itself."""
    if x.dtype != np.float32 or x.size == 0 or x.min() < 0 or x.max() > 1:
        return x
    u = np.rint(x * 255).astype(np.uint8)
    return u if np.array_equal(u.astype(np.float32) / 255, x) else x


def pack_zoo_data(run_dir: str | pathlib.Path, datasets: tuple[str, ...] | None = None) -> list[pathlib.Path]:
    """Write each data set of a zoo, with its coarse labels, into ``run_dir/data/<data set>.npz`` (atomically).

    :func:`load_zoo_data` then reads the pack instead of the data set's source, so the zoo
    folder alone carries everything the similarity study needs to a machine without the
    sources (e.g. a GPU machine with no network: docs/gpu.md). Images that are bytes / 255
    are stored as bytes. The fingerprint saved at training time is checked on reading.

    Args:
      run_dir: the zoo's folder.
      datasets: which data sets (default: every trained one).

    Returns:
      the written files.
    """
    manifest = read_manifest(run_dir)
    names = [k for k, d in manifest["datasets"].items() if d["status"] == "ok"] if datasets is None else datasets
    paths = []
    for name in names:
        zdata = load_zoo_data(run_dir, name)
        ds = zdata.dataset
        arrays = {"x_train": _as_u8(ds.x_train), "x_test": _as_u8(ds.x_test), "y_train": ds.y_train,
                  "y_test": ds.y_test, "class_names": np.array(ds.class_names), "description": np.array(ds.description)}
        for g, c in zdata.coarse.items():
            arrays |= {f"{g}.y_train": c.y_train, f"{g}.y_test": c.y_test, f"{g}.class_names": np.array(c.class_names)}
        paths.append(write_atomic(_pack_path(run_dir, name), lambda f, a=arrays: np.savez_compressed(f, **a)))
    return paths


def carry_zoo(run_dir: str | pathlib.Path, dst: str | pathlib.Path,
              datasets: tuple[str, ...] | None = None) -> dict[str, int]:
    """Copy what the similarity study reads of a trained zoo into ``dst``: for a machine that takes a bounded
    folder (a lent GPU: docs/gpu.md).

    The copy holds the manifest (restricted to ``datasets``), each model's last checkpoint only (the trained
    model, with its checksums; the earlier power-spaced ones stay behind), its training config, and the data
    packed in (:func:`pack_zoo_data`). :func:`load_zoo` and :func:`load_zoo_data` read it as they read the zoo,
    to the same weights and rows. The earlier checkpoints are most of a zoo's size.

    Args:
      run_dir: the trained zoo's folder (complete).
      dst: the copy's folder; must not exist yet.
      datasets: which trained data sets (default: all of them).

    Returns:
      ``{"models": copied models, "bytes": the copy's size}``.

    Raises:
      FileExistsError: ``dst`` exists.
      ValueError: the zoo is incomplete, or a data set is not trained in it.
    """
    run_dir, dst = pathlib.Path(run_dir), pathlib.Path(dst)
    manifest = read_manifest(run_dir)
    if not manifest.get("complete"):
        raise ValueError(f"The zoo in {run_dir} is incomplete: finish it (rerun its `funsim zoo` command) first.")
    trained = [k for k, d in manifest["datasets"].items() if d["status"] == "ok"]
    names = trained if datasets is None else list(datasets)
    if missing := sorted(set(names) - set(trained)):
        raise ValueError(f"carry_zoo: data sets {missing} are not trained in the zoo {run_dir}; it has {trained}.")
    if dst.exists():
        raise FileExistsError(f"carry_zoo: {dst} exists; give a new folder.")
    import orbax.checkpoint as ocp
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    models = {k: e for k, e in manifest["models"].items() if e["dataset"] in names}
    for e in models.values():
        src = run_dir / e["workdir"]
        steps = ocp.utils.checkpoint_steps(src / "checkpoints")
        if not steps:
            raise FileNotFoundError(f"carry_zoo: no checkpoint in {src / 'checkpoints'}.")
        (tmp / e["workdir"]).mkdir(parents=True)
        for f in ("train_config.json", "metrics.json"):
            if (src / f).is_file():
                shutil.copy2(src / f, tmp / e["workdir"] / f)
        last = str(max(steps))
        shutil.copytree(src / "checkpoints" / last, tmp / e["workdir"] / "checkpoints" / last)
    for f in ("config.json",):
        if (run_dir / f).is_file():
            shutil.copy2(run_dir / f, tmp / f)
    write_json_atomic(tmp / MANIFEST, {**manifest, "models": models,
                                       "datasets": {k: d for k, d in manifest["datasets"].items() if k in names}})
    pack_zoo_data(tmp, tuple(names))
    tmp.rename(dst)
    return {"models": len(models), "bytes": sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())}


def _unpack(path: pathlib.Path, name: str, groupings) -> tuple[data.Dataset, dict[str, data.Dataset]]:
    a = read_npz(path, fix="Delete it and pack the zoo's data again (models.zoo.pack_zoo_data).")
    x = {k: a[k].astype(np.float32) / 255 if a[k].dtype == np.uint8 else a[k] for k in ("x_train", "x_test")}
    ds = data.Dataset(name, x["x_train"], a["y_train"], x["x_test"], a["y_test"], tuple(a["class_names"].tolist()),
                      str(a["description"]))
    return ds, {g: dataclasses.replace(ds, y_train=a[f"{g}.y_train"], y_test=a[f"{g}.y_test"],
                                       class_names=tuple(a[f"{g}.class_names"].tolist())) for g in groupings}


def load_zoo_data(run_dir: str | pathlib.Path, dataset: str) -> ZooData:
    """The rows a zoo was trained on, with every documented coarse grouping of them.

    The data set is read from the zoo's pack (:func:`pack_zoo_data`) if it has one, else
    reloaded as the manifest says, and checked against the fingerprint saved at training time.

    Raises:
      ValueError: the data set is not in the zoo, was skipped, or differs from the trained one.
    """
    manifest = read_manifest(run_dir)
    d = manifest["datasets"].get(dataset)
    if d is None or d["status"] != "ok":
        why = "was not in its config" if d is None else f"was skipped: {d['reason']}"
        raise ValueError(f"Data set {dataset!r} of the zoo in {run_dir} {why}.")
    load, pack = d["load"], _pack_path(run_dir, dataset)
    if pack.is_file():
        ds, coarse = _unpack(pack, d["name"], d["coarse"])
    else:
        ds = zoo_dataset(d["name"], load["options"], load["n_train"], load["n_test"])
        coarse = None
    if dataset_fingerprint(ds) != d["sha1"]:
        raise ValueError(
            f"Data set {dataset!r} now loads different rows from those the zoo in {run_dir} was trained on "
            "(a changed source or version); its models cannot be compared on it."
        )
    return ZooData(ds, coarse if coarse is not None else
                   {g: zoo_dataset(d["name"], load["options"], load["n_train"], load["n_test"], g) for g in d["coarse"]})
