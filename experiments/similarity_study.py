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
   (the paper's code's leaky figure). Each layer's statistics are computed once. With
   ``spatial_scores``: the paper code's conv score on the unreduced conv maps (:mod:`similarity.spatial`).
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
import hashlib
import io
import pathlib
import time
import warnings
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

import funsim.models as models_lib
from funsim import similarity
from funsim.experiments import config as config_lib
from funsim.experiments import jit_memory
from funsim.experiments import zoo as zoo_lib
from funsim.experiments.configs.similarity_study import (
    CONFIGS,
    RULES,
    STATISTICS,
    StudyConfig,
    add_arguments,
    config_from_dict,
)
from funsim.experiments.io import (
    DamagedFileError,
    open_run,
    read_json,
    releases_run_locks,
    verify_table,
    write_json_atomic,
    write_table_atomic,
    write_text_atomic,
)
from funsim.models import CoarseTail, coarsen_logits
from funsim.models.functional import stitch_into_targets
from funsim.models.io import SetupMismatchError, fingerprint, merge_units, source_version
from funsim.runtime import distributed

__all__ = [
    "StudyConfig", "CONFIGS", "COLUMNS", "STATISTICS", "RULES", "CoarseTail", "coarsen_logits", "config_from_dict",
    "run", "merge", "read_table", "add_arguments", "main",
]


COLUMNS = ("dataset", "model_a", "layer_a", "depth_a", "model_b", "layer_b", "depth_b",
           "measure", "direction", "split", "task", "value")
"""Columns of ``comparisons.csv``, one row per comparison:

* ``dataset``; ``model_a``/``model_b``: zoo ids (``A`` before ``B`` in zoo order);
  ``layer_a``/``layer_b`` and their relative depths ``depth_a``/``depth_b`` (``(i + 1) / L``).
* ``measure``: a registry name (``cka/linear``, ``rsa/correlation/spearman``, ``svcca``,
  ``pwcca``, ``procrustes`` (a distance), ``stitch/<family>`` (closed-form reconstruction
  score)), ``stitch/spatial/<family>`` (the paper code's conv-to-conv score, conv pairs only: the
  config's ``spatial_scores``), or ``task/<family>/<quantity>`` for task-loss stitching, quantity one of
  ``relative_accuracy`` (stitched / target's own accuracy), ``accuracy``, ``own_accuracy``,
  ``ce_gap`` (stitched minus own cross-entropy, nats), ``relative_accuracy_half0`` / ``_half1``
  (on the even / odd test rows: claim 4 selects on one half, scores on the other; runs since 2026-12-06).
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


# ----------------------------------------------------------------------------- config


def _check_config(cfg: StudyConfig) -> None:
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
    for f in (*cfg.families, *cfg.stitch_families, *cfg.spatial_scores):
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
    return models_lib.compiled(model, chunk=batch).features(np.asarray(x), as_numpy=True, point=point)


def _row(ds, a, la, b, lb, measure, direction, split, task, value) -> dict:
    return {"dataset": ds, "model_a": a.id, "layer_a": la, "depth_a": round(a.relative_depth[la], 6),
            "model_b": b.id, "layer_b": lb, "depth_b": round(b.relative_depth[lb], 6), "measure": measure,
            "direction": direction, "split": split, "task": task, "value": float(value)}


# ----------------------------------------------------------------------------- stage 1: the grid


def _grid(reps: dict, measures: list[str], cfg: StudyConfig, progress: bool = False) -> dict[str, np.ndarray]:
    """One :func:`similarity.compare_grid` call over every layer of every model: ``{measure: (L, L)}``.

    The grid compiles a handful of programs (padded widths); the stitching stage after it compiles more
    per target. Each program holds about 55 memory mappings of JIT code on XLA:CPU, and a process past
    Linux's default limit of 65,530 mappings dies with a segmentation fault, so the study releases the
    compiled programs when the process is near that limit (:func:`jit_memory.release_if_near_limit`),
    and keeps them for the next grid or target of the same shapes otherwise.
    """
    if not measures:
        return {}
    with tqdm(desc="grid", unit="step", leave=False, disable=not progress) as bar:

        def on_step(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        g = similarity.compare_grid(reps, reps, measures=measures, split=cfg.split, key=jax.random.key(cfg.seed),
                                    on_step=on_step)
    tables = {name: np.asarray(t, np.float64) for name, t in g.tables.items()}
    jit_memory.release_if_near_limit()
    return tables


def _limited_grid(reps: dict, measures: list[str], cfg: StudyConfig, limit: int | None,
                  progress: bool = False) -> tuple[dict, int]:
    """:func:`_grid` on the layers of at most ``limit`` features; the other cells NaN. Returns the tables and
    the number of layers left out."""
    names = list(reps)
    keep = [k for k, n in enumerate(names) if limit is None or reps[n].shape[1] <= limit]
    sub = _grid({names[k]: reps[names[k]] for k in keep}, measures, cfg, progress) if keep else {}
    out = {}
    for m in measures:
        t = np.full((len(names), len(names)), np.nan)
        if m in sub:
            t[np.ix_(keep, keep)] = sub[m]
        out[m] = t
    return out, len(names) - len(keep)


def _spatial_scores(models: list, x: np.ndarray, cfg: StudyConfig) -> dict:
    """The paper code's conv-to-conv scores (:func:`similarity.spatial_score_table`, in sample) of every conv
    layer of ``models`` into every other: ``{(family, (model id, layer), (model id, layer)): score}``."""
    conv = [((m.id, la), z) for m in models if cfg.spatial_scores
            for la, z in _features(m.model, x, point=cfg.activation_point).items() if z.ndim == 4]
    zs = [z for _, z in conv]
    t = similarity.spatial_score_table(zs, zs, families=cfg.spatial_scores) if zs else {}
    return {(f, a, b): t[f][i, j] for f in t for i, (a, _) in enumerate(conv) for j, (b, _) in enumerate(conv)}


def _pair_rows(ds: str, a, b, index: dict, tables: dict, cfg: StudyConfig, spatial: dict) -> list[dict]:
    """Every layer pair of models a, b: all measures, both directions (from the full square)."""
    stitch = stitch_measure_names(cfg)
    rows = []
    for la in a.layers:
        for lb in b.layers:
            i, j = index[a.id, la], index[b.id, lb]
            for d, src, tgt in (("a->b", (a.id, la), (b.id, lb)), ("b->a", (b.id, lb), (a.id, la))):
                rows += [_row(ds, a, la, b, lb, f"stitch/spatial/{f}", d, "in_sample", "-", spatial[f, src, tgt])
                         for f in cfg.spatial_scores if (f, src, tgt) in spatial]
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


def _grid_stage(ds: str, models: list, x: np.ndarray, cfg: StudyConfig, out: pathlib.Path, log,
                progress: bool, version: dict) -> dict:
    """Compare every model pair of ``ds`` (skipping the pairs already written); returns timings. Each unit
    records ``version`` (:func:`_version`)."""
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
    tables = _grid(reps, measures, cfg, progress)
    rsa_tables, skipped = _limited_grid(reps, rsa, cfg, cfg.rsa_max_features, progress)
    tables.update(rsa_tables)
    undefined = {"rsa_layers_over_max_features": skipped if rsa else 0}
    for conv in cfg.conventions:
        point, _, flat = conv.partition("/")
        creps, cindex = representations(point, flat)
        assert cindex == index  # the same layers in the same order
        ctables, cskipped = _limited_grid(creps, list(cfg.convention_measures), cfg, cfg.rsa_max_features,
                                          progress)
        log(f"      {ds}: convention {conv}: {len(creps) - cskipped} layers of <= {cfg.rsa_max_features} features "
            f"({cskipped} left out, NaN)")
        tables.update({f"{m}@{conv}": t for m, t in ctables.items()})
        undefined[f"layers_over_max_features@{conv}"] = cskipped
    mine = {(a.id, b.id) for a, b in distributed.my_units(pairs)} & {(a.id, b.id) for a, b in todo}
    spatial = _spatial_scores([m for m in models if any(m.id in ab for ab in mine)], x, cfg)
    for a, b in todo:
        if (a.id, b.id) not in mine:
            continue
        write_json_atomic(pdir / f"{_slug(a.id)}__{_slug(b.id)}.json",
                          {"model_a": a.id, "model_b": b.id, **version,
                           "rows": _pair_rows(ds, a, b, index, tables, cfg, spatial)})
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


def _train_heads(models: list, ds_obj, zdata, groupings: dict, cfg: StudyConfig) -> dict:
    """``{model id: {grouping: head}}``: each model's new coarse head on its frozen penultimate features,
    trained on every training row of the data set with the coarse labels."""
    heads = {}
    for m in models:
        pen = models_lib.penultimate(m.model)
        if pen is None:
            continue
        z = _features(m.model, ds_obj.x_train)[pen].reshape(len(ds_obj.x_train), -1)
        heads[m.id] = {g: models_lib.train_head(z, zdata.coarse[g].y_train, max(mp) + 1, steps=cfg.coarse_head_steps)
                       for g, mp in groupings.items()}
    return heads


def _stitch_target(ds: str, lt: str, srcs: list, targets: list, order: dict, feats: dict, ys: dict, tasks: dict,
                   families: dict, cfg: StudyConfig, heads: dict | None = None) -> dict[str, dict[str, list[dict]]]:
    """Train every source into layer ``lt`` of every target model (the seeds of one architecture):
    :func:`models.functional.stitch_into_targets`, one compiled training and evaluation program per tail.

    ``families`` maps each family to train to its job index, which seeds its keys
    (``fold_in(key(cfg.seed), index)``, split over the sources). Returns ``{family: {task: rows}}``,
    each row in zoo order (A before B; the direction names the source), a model stitched into itself
    left out.
    """
    groupings = {t.split(":", 1)[1] for t in tasks if t.startswith("coarse_head:")}
    scores = stitch_into_targets(
        [t.model for t in targets], lt, [(feats[m.id]["train"][ls], feats[m.id]["test"][ls]) for m, ls in srcs],
        [(feats[t.id]["train"][lt], feats[t.id]["test"][lt]) for t in targets], ys, tasks, families,
        heads={g: [(heads or {}).get(t.id, {}).get(g) for t in targets] for g in groupings}, seed=cfg.seed,
        steps=cfg.stitch_steps, learning_rate=cfg.stitch_learning_rate, batch_size=cfg.stitch_batch_size)
    out = {}
    for family, by_task in scores.items():
        out[family] = {}
        for task, results in by_task.items():
            rows = out[family][task] = []
            for r in results:
                (src, ls), tgt = srcs[r.source], targets[r.target]
                if src.id == tgt.id:
                    continue  # a model stitched into itself
                a, la, b, lb, direction = (src, ls, tgt, lt, "a->b") if order[src.id] < order[tgt.id] else \
                    (tgt, lt, src, ls, "b->a")
                rows += [_row(ds, a, la, b, lb, f"task/{family}/{q}", direction, "held_out", r.task, v)
                         for q, v in r.values.items()]
    return out


def _stitch_stage(ds: str, models: list, zdata, manifest_ds: dict, cfg: StudyConfig, out: pathlib.Path, log,
                  progress: bool, version: dict) -> dict:
    """Train every stitching target of ``ds`` (skipping the units already written); returns timings. Each unit
    records ``version`` (:func:`_version`)."""
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
                                                              **version, "rows": rows[fam].get(task, [])})
    bar.close()
    return {"targets": len(jobs), "computed": n_todo, "seconds": round(time.time() - t0, 1),
            "source_target_pairs": n_pairs, "units": units}


# ----------------------------------------------------------------------------- the table


def _unit_done(path: pathlib.Path) -> bool:
    """Whether the unit file ``path`` is written and reads back; a damaged one is removed, with a warning
    naming it, so that the rerun recomputes it."""
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


UNIT_GLOBS = ("pairs/*/*.json", "stitch/**/*.json")


def _zoo_version(models: list) -> str:
    """SHA-256 (16 hex digits) of a data set's trained models: their ids and every parameter and statistic, in
    zoo order. Two zoos trained by the same command on different machines may differ in the last bits, and then
    differ here."""
    h = hashlib.sha256()
    for m in models:
        leaves = [np.asarray(v) for v in jax.tree.leaves(nnx.state(m.model, nnx.Param, nnx.BatchStat))]
        h.update(m.id.encode() + b"\0" + fingerprint(*leaves).encode() + b"\0")
    return h.hexdigest()[:16]


def _version(models: list) -> dict[str, str]:
    """What every unit records of how it was computed: ``code`` (:func:`models.io.source_version`) and ``zoo``
    (:func:`_zoo_version` of its data set's models). A resumed or merged run refuses units of another version."""
    return {"code": source_version(), "zoo": _zoo_version(models)}


def _dataset_units(out: pathlib.Path, ds: str) -> list[pathlib.Path]:
    return sorted((out / "pairs" / ds).glob("*.json")) + sorted((out / "stitch" / ds).rglob("*.json"))


def _stale(unit: dict, version: dict) -> str | None:
    """How ``unit`` (a read unit file) differs from ``version``, or None."""
    diff = [f"{k} {unit.get(k, '<absent>')!r} (now {v!r})" for k, v in version.items() if unit.get(k) != v]
    return ", ".join(diff) or None


def _check_units(out: pathlib.Path, ds: str, version: dict) -> None:
    """Refuse to resume the run ``out`` if any finished unit of ``ds`` was computed by other code or from
    another zoo: mixing them would give a table no single computation produced. Damaged units are left to
    :func:`_unit_done` (recomputed)."""
    stale = []
    for f in _dataset_units(out, ds):
        try:
            unit = read_json(f)
        except DamagedFileError:
            continue
        if isinstance(unit, dict) and (why := _stale(unit, version)):
            stale.append(f"{f}: {why}")
    if stale:
        raise SetupMismatchError(
            f"Refusing to resume {out}: {len(stale)} of its {ds} units were computed by other code or from other "
            f"trained models than this run has now (code: models.io.source_version(); zoo: the models' weights):\n  "
            + "\n  ".join(stale[:10]) + ("\n  ..." if len(stale) > 10 else "")
            + "\nFinish the run with the tree and the zoo that computed them, or start a new run (--run NEW_NAME), "
            "or delete those units to recompute them.")


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
      SetupMismatchError: (a ``ValueError``) the run holds units computed by other code or from another zoo.
    """
    _check_config(cfg)
    t0 = time.time()
    source_version()  # the tree on disk now, after the imports: its units record it even if files change later
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
        zdata = zoo_lib.load_zoo_data(zoo_dir, ds)
        models = zoo.by_dataset(ds)
        log(f"[{ds}] {len(models)} models, {sum(len(m.layers) for m in models)} layers")
        version = _version(models)
        _check_units(out, ds, version)
        grid = _grid_stage(ds, models, _rows(zdata.dataset, cfg.n_rows), cfg, out, log,
                           distributed.show_progress(progress), version)
        stitch = (_stitch_stage(ds, models, zdata, manifest["datasets"][ds], cfg, out, log, progress, version)
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
        "layer_pair_comparisons": sum(_layer_pairs(zoo_dir, ds) for ds in ds_list),
        "seconds_this_invocation": seconds,
    }
    write_json_atomic(out / "metrics.json", metrics)
    write_text_atomic(out / "summary.md", summary(cfg, metrics))
    log(f"[done] {n_rows} comparisons in {out}/comparisons.csv; {seconds:.0f} s this invocation")
    distributed.barrier("similarity study: merged")
    return {**metrics, "out": str(out)}


def _layer_pairs(zoo_dir, ds) -> int:
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


@releases_run_locks
def merge(src: str | pathlib.Path, cfg: StudyConfig, *, root: str | pathlib.Path = "results",
          run_name: str | None = None) -> dict[str, int]:
    """Copy the finished units of the study run ``src`` (e.g. computed on a GPU machine) into this run; a rerun
    then computes only what is missing. Refused for another config or code version (:func:`models.io.merge_units`), or
    for units computed from another zoo than the one this run reads (its weights' hash)."""
    out = open_run("similarity_study", run_name or cfg.name, root=root, config=cfg)
    versions: dict[str, dict] = {}

    def check(unit_path: pathlib.Path, unit: dict) -> str | None:
        ds = unit_path.relative_to(src).parts[1]  # pairs/<ds>/... or stitch/<ds>/...
        if ds not in versions:
            zoo_dir = _zoo_dir(cfg, root)
            versions[ds] = _version(zoo_lib.load_zoo(zoo_dir, datasets=(ds,)).by_dataset(ds))
        return _stale(unit, versions[ds])

    return merge_units(src, out, globs=UNIT_GLOBS, check=check)


# ----------------------------------------------------------------------------- CLI


def main(args: argparse.Namespace) -> int:
    cfg, name = config_lib.from_args(args, StudyConfig, CONFIGS)
    cfg = cfg if args.zoo is None else dataclasses.replace(cfg, zoo=args.zoo)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        if args.merge_units:
            print(f"merged {args.merge_units}: {merge(args.merge_units, cfg, root=args.root, run_name=args.run or name)}")
            return 0
        run(cfg, root=args.root, run_name=args.run or name, progress=not args.no_progress)
    except FileNotFoundError as e:
        print(f"funsim similarity-study: {e}")
        return 1
    return 0
