"""The tensor-similarity authors' released matrices (tdooms/tensor-similarity), read and checked from a clone.

The authors released, under ``artifacts/cache/`` of their repository, the checkpoint x checkpoint
matrices and training curves behind the paper's backdoor, forgetting and language figures, as
Arrow IPC (``.feather``) files in long format plus a ``metadata.json`` per bundle. The project
ships none of them: the readers here take the path of a clone the user gives (``--authors-data
CLONE`` on the drivers, or the environment variable :data:`AUTHORS_ENV`), check every file they
read (a missing, damaged or malformed file is an error naming it) and return arrays:

* :func:`read_backdoor`: ``svhn_backdoor/`` (41 checkpoints, clean phase then poisoned phase);
* :func:`read_forgetting`: ``svhn_forgetting/`` and the second model's difference trace in
  ``svhn_diffing/``, at the end of every curriculum stage;
* :func:`read_language`: ``language_similarity/`` (102 checkpoints of their d_model-256 model).

The drivers run their verdict rules on these arrays first (the rules' calibration), see
``experiments/README.md``. Reading ``.feather`` needs pyarrow (``pip install 'funsim[authors]'``).
:func:`block_gaps` computes the backdoor's block gaps on the authors' matrices, also with the
in-run placebo that stands in for the clean control they did not release.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from funsim.similarity.checkpoints import block_gap, block_summary

__all__ = [
    "AUTHORS_REPOSITORY",
    "AUTHORS_COMMIT",
    "AUTHORS_ENV",
    "AUTHORS_CACHE",
    "AUTHORS_FILES",
    "AUTHORS_HOWTO",
    "BACKDOOR_METRICS",
    "LANGUAGE_MATRICES",
    "clone_path",
    "read_backdoor",
    "read_forgetting",
    "read_language",
    "block_gaps",
    "RECORDED",
    "calibration",
    "stage_ends",
    "language_metrics",
]

AUTHORS_REPOSITORY = "https://github.com/tdooms/tensor-similarity"
#: The commit the readers were checked against (and the drivers' recorded calibration computed from).
AUTHORS_COMMIT = "bc914a4babc9"
#: The environment variable naming a clone of :data:`AUTHORS_REPOSITORY` (its root folder).
AUTHORS_ENV = "FUNSIM_TENSOR_AUTHORS"
#: Where the bundles are inside the clone.
AUTHORS_CACHE = "artifacts/cache"
#: ``{experiment: {bundle folder: files read}}``.
AUTHORS_FILES = {
    "backdoor": {"svhn_backdoor": ("metadata.json", "similarity.feather", "slice_similarity.feather",
                                   "history.feather")},
    "forgetting": {"svhn_forgetting": ("metadata.json", "progress.feather", "per_class.feather"),
                   "svhn_diffing": ("progress.feather",)},
    "language": {"language_similarity": ("metadata.json", "matrix.feather", "empirical_pile_matrix.feather",
                                         "weight_cosine_matrix.feather", "behavior.feather")},
}
AUTHORS_HOWTO = (f"clone {AUTHORS_REPOSITORY} (checked against commit {AUTHORS_COMMIT}; the .feather files are "
                 f"plain git objects) and pass `--authors-data <clone>` (or set {AUTHORS_ENV} to the clone)")

#: The backdoor matrices: our name (as ``funsim backdoor`` names its block gaps) -> the authors' ``metric``.
BACKDOOR_METRICS = {
    "tensor (symmetric)": "tn_sim",
    "behavioural (clean)": "act_clean_full",
    "behavioural (poisoned)": "act_poisoned_full",
    "matrix cosine": "matrix_cosine",
}
#: The language matrices: our name -> the authors' file. ``matrix.feather`` is their tensor similarity
#: (Gaussian, ``n_ctx`` positions), ``empirical_pile_matrix.feather`` the cosine of the logits on Pile text
#: (behavioural similarity), ``weight_cosine_matrix.feather`` the matrix cosine of the weights.
LANGUAGE_MATRICES = {
    "tensor": "matrix.feather",
    "behavioural": "empirical_pile_matrix.feather",
    "weight_cosine": "weight_cosine_matrix.feather",
}

_KINDS = {"int": "integers", "float": "floating-point numbers", "str": "strings"}


def clone_path(directory: str | os.PathLike | None = None) -> pathlib.Path | None:
    """The clone of the authors' repository: ``directory``, else :data:`AUTHORS_ENV`; None when neither is set.

    Raises:
      ValueError: a path that is not a folder, or a folder without ``artifacts/cache/``.
    """
    if directory is None or str(directory) == "":
        directory = os.environ.get(AUTHORS_ENV) or None
        if directory is None:
            return None
    d = pathlib.Path(directory).expanduser()
    if not d.is_dir():
        raise ValueError(f"The authors' data: {d} is not a directory; {AUTHORS_HOWTO}.")
    if not (d / AUTHORS_CACHE).is_dir():
        raise ValueError(f"The authors' data: {d / AUTHORS_CACHE} is missing ({d} is not a clone of "
                         f"{AUTHORS_REPOSITORY}); {AUTHORS_HOWTO}.")
    return d


#: Every verdict statistic of ``funsim backdoor``, ``forgetting`` and ``language`` (their ``STATISTICS``) on the
#: authors' files at :data:`AUTHORS_COMMIT`, as the drivers compute them (default configs; the backdoor's
#: ``_did`` ones against the in-run placebo of :func:`block_gaps`). The drivers calibrate their rules on these
#: when no clone is given; ``tests/test_authors.py`` recomputes them from a clone (:data:`AUTHORS_ENV`).
RECORDED = {
    "backdoor": {"tensor_gap_ratio": 2.451, "target_slice_excess": 0.193, "behavioural_gap_clean": 0.097,
                 "tensor_minus_weight_cosine_gap": 0.087, "behavioural_gap_poisoned": 0.622, "attack_success": 0.957,
                 "tensor_gap_did": 0.010, "target_slice_excess_did": 0.212},
    "forgetting": {"cka_minus_tensor_at_remove": 0.116, "target_slice_margin": 1.050, "target_slice_at_remove": -0.072,
                   "target_accuracy_at_remove": 0.0, "tensor_at_readd": 0.995, "tensor_at_repeat": 0.995,
                   "difference_slice_at_add9": 0.382, "difference_slice_at_remove": -0.863},
    "language": {"explained_margin": -0.350, "block_contrast_margin": 0.208, "primary_transition_ratio": 8.332,
                 "transition_ratio_margin": -12.550, "late_range_margin": 0.698, "primary_max_similarity_se": 0.0},
}


def calibration(experiment: str, data: dict | None, statistics) -> dict:
    """A driver's calibration: ``{"statistics": statistics(data), "source": the folder read}`` from a reader's
    ``data``; without a clone (``data`` None), ``{"statistics": RECORDED[experiment], "source": ...}``."""
    if data is None:
        return {"statistics": dict(RECORDED[experiment]), "source": f"the statistics recorded from the authors' "
                f"released data ({AUTHORS_REPOSITORY} at {AUTHORS_COMMIT}; to recompute them, {AUTHORS_HOWTO})"}
    return {"statistics": statistics(data), "source": f"the authors' released data, read from {data['source']['directory']}"}


def _bundle(clone, experiment: str) -> dict[str, pathlib.Path] | None:
    """``{bundle: folder}`` of an experiment, every file it reads checked to exist; None without a clone."""
    d = clone_path(clone)
    if d is None:
        return None
    out = {}
    for bundle, files in AUTHORS_FILES[experiment].items():
        folder = d / AUTHORS_CACHE / bundle
        for name in files:
            if not (folder / name).is_file():
                raise ValueError(f"The authors' {experiment} data: {folder / name} is missing (expected "
                                 f"{', '.join(files)} in {AUTHORS_CACHE}/{bundle}/); {AUTHORS_HOWTO}.")
            if (folder / name).stat().st_size == 0:
                raise ValueError(f"{folder / name}: the file is empty (a git object that was not checked out?); "
                                 f"{AUTHORS_HOWTO}.")
        out[bundle] = folder
    return out


def _json(path: pathlib.Path) -> dict:
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({type(e).__name__}: {e}).") from None
    if not isinstance(out, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(out).__name__}.")
    return out


def _table(path: pathlib.Path, columns: dict[str, str]) -> dict[str, np.ndarray]:
    """The named columns of an Arrow IPC (feather) file, each checked to be of its kind (:data:`_KINDS`)."""
    try:
        import pyarrow as pa
        import pyarrow.feather as feather
    except ImportError:
        raise ImportError(f"Reading {path} needs pyarrow: pip install 'funsim[authors]' (or pyarrow>=14).") from None
    try:
        table = feather.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable feather (Arrow IPC) file ({type(e).__name__}: {e}).") from None
    out = {}
    for name, kind in columns.items():
        if name not in table.column_names:
            raise ValueError(f"{path}: no column {name!r} (columns: {', '.join(table.column_names)}; expected "
                             f"{', '.join(columns)}).")
        t = table.schema.field(name).type
        ok = {"int": pa.types.is_integer(t), "float": pa.types.is_floating(t) or pa.types.is_integer(t),
              "str": str(t) in ("string", "large_string", "string_view")}[kind]
        if not ok:
            raise ValueError(f"{path}: column {name!r} must hold {_KINDS[kind]}, got {t}.")
        col = table.column(name)
        if col.null_count:
            raise ValueError(f"{path}: column {name!r} has {col.null_count} missing values.")
        out[name] = (np.asarray(col.to_pylist(), dtype=object) if kind == "str"
                     else np.asarray(col.to_numpy(), np.int64 if kind == "int" else np.float64))
        if kind == "float" and not np.all(np.isfinite(out[name])):
            raise ValueError(f"{path}: column {name!r} has {int(np.sum(~np.isfinite(out[name])))} non-finite values.")
    return out


def _steps(path: pathlib.Path, meta: dict, key: str = "steps") -> np.ndarray:
    raw = meta.get(key)
    try:
        steps = np.asarray(raw, np.int64)
    except (TypeError, ValueError):
        steps = np.zeros(0, np.int64)
    if not isinstance(raw, list) or steps.ndim != 1 or len(steps) < 2 or np.any(np.diff(steps) <= 0):
        raise ValueError(f"{path}: {key!r} must be a list of at least 2 increasing integer steps.")
    return steps


def _square(path, cols, steps, *, value="value", where=None) -> np.ndarray:
    """The ``(n, n)`` matrix of the rows ``where`` selects: every pair of ``steps`` exactly once, symmetric."""
    keep = np.ones(len(cols["step_i"]), bool) if where is None else where
    what = "" if where is None else " (those of one matrix)"
    i, j, v = cols["step_i"][keep], cols["step_j"][keep], cols[value][keep]
    n = len(steps)
    ii, jj = np.searchsorted(steps, i), np.searchsorted(steps, j)
    for k, idx in ((i, ii), (j, jj)):
        bad = (idx >= n) | (steps[np.minimum(idx, n - 1)] != k)
        if bad.any():
            raise ValueError(f"{path}: step {int(k[bad][0])} is not a checkpoint step of metadata.json.")
    count = np.zeros((n, n), np.int64)
    np.add.at(count, (ii, jj), 1)
    if np.any(count != 1):
        a, b = np.argwhere(count != 1)[0]
        raise ValueError(f"{path}: expected each pair of the {n} checkpoints once{what}; the pair "
                         f"({int(steps[a])}, {int(steps[b])}) occurs {int(count[a, b])} times.")
    m = np.zeros((n, n))
    m[ii, jj] = v
    if not np.allclose(m, m.T, atol=1e-5):
        raise ValueError(f"{path}: the matrix{what} is not symmetric (largest |S - S^T| = "
                         f"{np.abs(m - m.T).max():.3g}).")
    return m


def _series(path, cols, steps, metric, *, index="step", value="value", select=None) -> np.ndarray:
    """The values of ``metric`` (the rows ``select`` picks, if given) at ``steps``; where a step occurs
    twice (the last batch of one stage and the first of the next), its first row."""
    mask = cols["metric"] == metric if select is None else select
    what = f"metric {metric!r}" if select is None else metric
    rows = np.flatnonzero(mask)
    if not len(rows):
        raise ValueError(f"{path}: no rows of {what} (metrics: {', '.join(sorted(set(cols['metric'])))}).")
    out = []
    for s in steps:
        at = rows[cols[index][rows] == s]
        if not len(at):
            raise ValueError(f"{path}: no {what} at {index} {int(s)}.")
        out.append(cols[value][at[0]])
    return np.asarray(out, np.float64)


def read_backdoor(clone: str | os.PathLike | None = None) -> dict | None:
    """The authors' SVHN backdoor run (``artifacts/cache/svhn_backdoor/``), from a clone.

    Their run: Bilinear(1024 -> 64) -> Linear(64 -> 10) on grayscale SVHN, 8,000 clean steps then 2,000 with
    10% of every batch stamped and relabelled 9, a checkpoint every 250 steps (41 with step 0).

    Args:
      clone: the clone's root; None: :data:`AUTHORS_ENV` (unset: None comes back).

    Returns:
      ``{"steps": (n,), "phase_a_steps": int, "in_b": (n,) bool (step > phase_a_steps, as ``funsim
      backdoor``), "matrices": {name: (n, n)} (:data:`BACKDOOR_METRICS`), "slices": (classes, n, n)
      (tensor similarity's class slices), "attack_success", "clean_accuracy": (n,), "source": dict}``.

    Raises:
      ValueError: a missing, empty or unreadable file, a missing column, metric or checkpoint, a pair
        given twice or not at all, a non-finite number; the message names the file.
      ImportError: pyarrow is not installed.
    """
    b = _bundle(clone, "backdoor")
    if b is None:
        return None
    d = b["svhn_backdoor"]
    meta = _json(d / "metadata.json")
    steps = _steps(d / "metadata.json", meta)
    phase_a = (meta.get("config") or {}).get("phase_a_steps")
    if not isinstance(phase_a, int) or not steps[0] <= phase_a < steps[-1]:
        raise ValueError(f"{d / 'metadata.json'}: config.phase_a_steps must be an integer step inside the run, "
                         f"got {phase_a!r}.")
    path = d / "similarity.feather"
    sim = _table(path, {"step_i": "int", "step_j": "int", "metric": "str", "value": "float"})
    mats = {}
    for ours, theirs in BACKDOOR_METRICS.items():
        if not np.any(sim["metric"] == theirs):
            raise ValueError(f"{path}: no rows of metric {theirs!r} ({ours}; metrics: "
                             f"{', '.join(sorted(set(sim['metric'])))}).")
        mats[ours] = _square(path, sim, steps, where=sim["metric"] == theirs)
    path = d / "slice_similarity.feather"
    sl = _table(path, {"step_i": "int", "step_j": "int", "class_idx": "int", "value": "float"})
    classes = np.unique(sl["class_idx"])
    if len(classes) < 2 or not np.array_equal(classes, np.arange(len(classes))):
        raise ValueError(f"{path}: class_idx must run 0..C-1 (C >= 2), got {classes.tolist()}.")
    slices = np.stack([_square(path, sl, steps, where=sl["class_idx"] == c) for c in classes])
    path = d / "history.feather"
    hist = _table(path, {"step": "int", "metric": "str", "value": "float"})
    return {
        "steps": steps, "phase_a_steps": phase_a, "in_b": steps > phase_a, "matrices": mats, "slices": slices,
        "attack_success": _series(path, hist, steps, "attack_success_rate"),
        "clean_accuracy": _series(path, hist, steps, "test_acc"),
        "source": {"repository": AUTHORS_REPOSITORY, "directory": str(d.resolve()),
                   "files": list(AUTHORS_FILES["backdoor"]["svhn_backdoor"])},
    }


def block_gaps(data: dict, target: int, *, placebo: bool = False) -> tuple[dict, list, float]:
    """``(block gaps, class-slice gaps, final attack success)`` of :func:`read_backdoor`'s run.

    The gaps are :func:`similarity.checkpoints.block_gap` of every matrix, keyed as ``funsim backdoor`` keys
    them. ``placebo``: the authors released no clean control, so the placebo stands in for one: the clean
    phase alone, its last checkpoints (as many as phase B has) as the pseudo phase B; the attack
    success is then the one at the end of the clean phase.
    """
    in_b = np.asarray(data["in_b"], bool)
    keep = np.arange(len(in_b))
    if placebo:
        keep = np.flatnonzero(~in_b)
        if len(keep) <= in_b.sum():
            raise ValueError("The placebo needs more clean checkpoints than poisoned ones.")
        in_b = np.arange(len(keep)) >= len(keep) - int(np.asarray(data["in_b"]).sum())
    sub = lambda m: np.asarray(m)[np.ix_(keep, keep)]
    gaps = {k: block_gap(sub(m), in_b) for k, m in data["matrices"].items()}
    slices = [block_gap(sub(m), in_b) for m in data["slices"]]
    if not 0 <= target < len(slices):
        raise ValueError(f"target {target} is not a class of the authors' slices (0..{len(slices) - 1}).")
    return gaps, slices, float(np.asarray(data["attack_success"])[keep][-1])


def read_forgetting(clone: str | os.PathLike | None = None) -> dict | None:
    """The authors' SVHN forgetting curriculum (``svhn_forgetting/``, ``svhn_diffing/``) at the end of every stage.

    Their run: embedding 128 -> one bilinear layer (256) -> head on grayscale SVHN, 20 epochs per stage of
    base (0-4), add 5 ... add 9, repeat, remove 9, re-add 9; similarity to the end of "add 9" every 50
    batches. Where a stage's last batch is also the next stage's first, the first row (the stage's end) is read.

    Returns:
      ``{"stages": (names), "end_batch": (S,), "target": int, "tensor", "cka", "weight": (S,)`` (tensor
      similarity, CKA of the logits and matrix cosine to the reference), ``"slices": (S, 10)`` (the class
      slices of tensor similarity to the reference), ``"class_accuracy": (S, 10)``, ``"difference_slice":
      (S,)`` (the target's slice of the second model's fine-tuning difference vs each checkpoint),
      ``"source": dict}``; None without a clone.

    Raises:
      ValueError: as :func:`read_backdoor`, naming the file. ImportError: no pyarrow.
    """
    b = _bundle(clone, "forgetting")
    if b is None:
        return None
    d = b["svhn_forgetting"]
    meta = _json(d / "metadata.json")
    spans, target = meta.get("spans"), meta.get("target_digit")
    if (not isinstance(spans, list) or not spans or not all(isinstance(s, list) and len(s) == 3 for s in spans)
            or not isinstance(target, int)):
        raise ValueError(f"{d / 'metadata.json'}: expected 'spans' as [[first batch, last batch, stage], ...] and an "
                         f"integer 'target_digit'.")
    names = tuple(str(s[2]) for s in spans)
    ends = np.asarray([int(s[1]) for s in spans], np.int64)
    path = d / "progress.feather"
    prog = _table(path, {"batch": "int", "metric": "str", "value": "float"})
    out = {"stages": names, "end_batch": ends, "target": target}
    for ours, theirs in (("tensor", "tn"), ("cka", "cka"), ("weight", "weight")):
        out[ours] = _series(path, prog, ends, theirs, index="batch")
    path = d / "per_class.feather"
    pc = _table(path, {"batch": "int", "class_idx": "int", "kind": "str", "value": "float"})
    classes = np.unique(pc["class_idx"])
    if not np.array_equal(classes, np.arange(10)) or target not in classes:
        raise ValueError(f"{path}: class_idx must run 0..9 (and hold target_digit {target}), got {classes.tolist()}.")
    for ours, kind in (("slices", "tensor"), ("class_accuracy", "acc")):
        out[ours] = np.stack([_series(path, pc, ends, f"kind {kind!r} of class {c}", index="batch",
                                      select=(pc["kind"] == kind) & (pc["class_idx"] == c)) for c in classes], 1)
    path = b["svhn_diffing"] / "progress.feather"
    out["difference_slice"] = _series(path, _table(path, {"batch": "int", "metric": "str", "value": "float"}), ends,
                                      "slice", index="batch")
    out["source"] = {"repository": AUTHORS_REPOSITORY, "directory": str(d.parent.resolve()),
                     "files": [f"{k}/{f}" for k, fs in AUTHORS_FILES["forgetting"].items() for f in fs]}
    return out


def stage_ends(data: dict, target: int) -> dict:
    """:func:`read_forgetting`'s values at the end of every stage, keyed as ``funsim forgetting``'s ``at_stage_end``."""
    if data["target"] != target:
        raise ValueError(f"The authors' curriculum removes digit {data['target']}, not {target}.")
    others = [c for c in range(data["slices"].shape[1]) if c != target]
    return {name: {"tensor (gaussian)": float(data["tensor"][k]), "CKA (logits)": float(data["cka"][k]),
                   "slice_target": float(data["slices"][k, target]),
                   "slice_others_min": float(data["slices"][k, others].min()),
                   "class_accuracy": data["class_accuracy"][k].tolist(),
                   "difference": {f"class-{target} slice (gaussian)": float(data["difference_slice"][k])}}
            for k, name in enumerate(data["stages"])}


def language_metrics(data: dict, segments, *, keys, ngram_key: str) -> dict:
    """:func:`read_language`'s matrices as ``funsim language``'s metrics: ``{"matrices", "blocks", "ngrams"}``.

    ``keys``: our names of :data:`LANGUAGE_MATRICES`, in its order; ``blocks``: :func:`similarity.checkpoints.block_summary`
    at ``segments``; ``ngrams``: ``{ngram_key: their 2gram_score}`` (test loss over the bigram model's; it peaks,
    as our bigram agreement does, where the model is most bigram-like).
    """
    mats = {ours: data["matrices"][k] for ours, k in zip(keys, LANGUAGE_MATRICES, strict=True)}
    return {"matrices": mats, "blocks": {k: block_summary(m, data["steps"], segments) for k, m in mats.items()},
            "ngrams": {ngram_key: data["ngram_score"][2].tolist()}}


def read_language(clone: str | os.PathLike | None = None) -> dict | None:
    """The authors' language-model checkpoints (``language_similarity/``): three matrices and the n-gram scores.

    Their model: a 2-layer bilinear-attention transformer, d_model 256, 20,000 steps; 102 log-spaced
    checkpoints (step 0 included); tensor similarity on ``n_ctx`` (4) positions.

    Returns:
      ``{"steps": (n,), "n_ctx": int, "matrices": {name: (n, n)}`` (:data:`LANGUAGE_MATRICES`),
      ``"ngram_score": {order: (n,)}`` (their ``<order>gram_score``: test loss over the n-gram model's loss,
      which peaks where the model is most n-gram-like), ``"source": dict}``; None without a clone.

    Raises:
      ValueError: as :func:`read_backdoor`, naming the file. ImportError: no pyarrow.
    """
    b = _bundle(clone, "language")
    if b is None:
        return None
    d = b["language_similarity"]
    meta = _json(d / "metadata.json")
    steps = _steps(d / "metadata.json", meta)
    mats = {}
    for ours, name in LANGUAGE_MATRICES.items():
        cols = _table(d / name, {"step_i": "int", "step_j": "int", "similarity": "float"})
        mats[ours] = _square(d / name, cols, steps, value="similarity")
    path = d / "behavior.feather"
    beh = _table(path, {"step": "int", "metric": "str", "value": "float"})
    return {"steps": steps, "n_ctx": int(meta.get("n_ctx", 0)), "matrices": mats,
            "ngram_score": {n: _series(path, beh, steps, f"{n}gram_score") for n in (2, 3, 4)},
            "source": {"repository": AUTHORS_REPOSITORY, "directory": str(d.resolve()),
                       "files": list(AUTHORS_FILES["language"]["language_similarity"])}}
