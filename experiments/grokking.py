"""``funsim grokking``: modular addition with one bilinear layer, and the phases of training it.

Run::

    funsim grokking --config default      # 50k full-batch steps, 90 checkpoints spaced by the 5th power
    funsim grokking --config smoke        # seconds (the test suite runs it)
    funsim grokking --config paper        # the authors' 100k steps at batch 512 (about 5 min here)
    funsim grokking --config my.json      # any GrokkingConfig fields
    funsim grokking --authors-run DIR     # beside the authors' released run (see below)

Rerunning the same command resumes: the run directory defaults to the config's
name, training continues from its last checkpoint and the analysis is redone.

Steps (the library does the work: :mod:`models.modular`, :mod:`similarity.phases`, :mod:`similarity.fourier`):

1. train :func:`models.modular.modular_addition_model`: one-hot ``(a, b)`` of width ``2p`` -> one bilinear
   layer with ``d_hidden`` hidden units whose ``down`` projection is the head to the ``p`` classes; AdamW,
   full batch by default, checkpoints by :func:`models.modular.checkpoint_schedule` (``models.train``);
2. evaluate every checkpoint (and the initial network) on the train and the held-out pairs;
3. checkpoint x checkpoint similarity matrices (:func:`checkpoint_matrices`): tensor similarity under the
   symmetric and the Gaussian metric, from the weights alone, beside weight cosine, behavioural similarity
   and linear CKA of the logits on held-out pairs;
4. split each matrix into ``n_segments`` contiguous phases (:func:`similarity.phases.phase_starts`) and set
   the boundaries beside the accuracy events (:func:`similarity.phases.accuracy_events`);
5. Fourier power of the bilinear layer's input weights for token a and for token b, and of its output
   weights, along the token axis, per checkpoint (:func:`similarity.fourier.operand_spectra`);
6. the authors' released run (:func:`models.modular.authors_run`) beside ours at a matched checkpoint grid and horizon
   (:func:`similarity.phases.compare_runs`): phase starts and similarity to the final checkpoint, like with like; their
   matrix alone under each protocol (:func:`similarity.phases.reference_protocols`) shows how much the phase starts move
   with the spacing and the run length. The project ships none of their files: clone
   https://github.com/tdooms/tensor-similarity and point ``--authors-run`` (or ``FUNSIM_GROKKING_AUTHORS``)
   at its ``workspaces/logan/grokking_summary_bundle/results_grokking_summary/`` (checked at commit
   bc914a4babc943541d414b4239b1df7f032d115b). Without it the summary says how to get them and the
   comparison's verdict is inconclusive;
7. the verdicts: every rule of ``GrokkingConfig.verdict_rules`` applied to the statistics of
   :func:`verdict_statistics` (:mod:`experiments.verdict`);
8. write ``results/grokking/<run>/``: ``config.json``, ``metrics.json`` (atomic), ``matrices.npz``,
   ``spectra.npz``, ``model/`` (checkpoints), the figures of :mod:`experiments.grokking_figures` and
   ``summary.md`` (our numbers beside the paper's, and the verdicts).

**Checkpoint spacing.** The phase starts depend on where the checkpoints lie (the pairwise cost counts
checkpoint pairs, so a densely sampled stretch weighs more) and on how long the run is. Every config
therefore uses the authors' rule, ``floor(T (i / (n - 1))^5)`` for ``i = 0..n-1``, and the comparison with
their run is made on a common grid up to a common horizon.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from funsim import data as data_lib
from funsim.experiments import config as config_lib
from funsim.experiments import grokking_figures as figures
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.configs.grokking import CONFIGS, PAPER, RULES, STATISTICS, GrokkingConfig, add_arguments
from funsim.experiments.io import open_run, releases_run_locks, write_atomic, write_json_atomic, write_text_atomic
from funsim.models import modular
from funsim.models.train import TrainConfig, list_checkpoints, train
from funsim.models.trajectory import checkpoint_networks
from funsim.similarity import checkpoints as cs
from funsim.similarity import phases
from funsim.similarity.fourier import operand_spectra, spectrum_summary
from funsim.similarity.segmentation import SEGMENT_COSTS

__all__ = ["GrokkingConfig", "CONFIGS", "PAPER", "RULES", "STATISTICS", "MEASURES", "make_model", "checkpoint_matrices",
           "verdict_statistics", "run", "summary", "add_arguments", "main"]

MEASURES = ("tensor (symmetric)", "tensor (gaussian)", "weight cosine", "behavioural", "CKA (logits)")


# --------------------------------------------------------------------------- analysis


def checkpoint_matrices(nets, x_eval, /) -> dict[str, np.ndarray]:
    """Checkpoint x checkpoint similarity: tensor similarity beside three baselines.

    A thin naming layer over :func:`funsim.similarity.checkpoints.checkpoint_matrices`.

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
    mats = cs.checkpoint_matrices(nets, data={"eval": x_eval}, metrics=("symmetric", "gaussian"), per_output=False)
    keys = ("tensor/symmetric", "tensor/gaussian", "weight_cosine", "behavioral/eval", "cka/eval")
    out = {name: np.asarray(mats[k], np.float64) for name, k in zip(MEASURES, keys)}
    for k, v in out.items():
        if not np.all(np.isfinite(v)):
            raise ValueError(f"The {k} matrix has non-finite entries: a checkpoint's logits are zero "
                             "or constant on x_eval, where the measure is undefined.")
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
      boundaries: ``{measure: phases.compare_boundaries(...)}``.
      after: :func:`_after_generalisation`'s result.
      comparison: :func:`similarity.phases.compare_runs` (None: the authors' run was not available).
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
    starts = {m: phases.phase_starts(mat, n_segments=cfg.n_segments, cost=cfg.segment_cost)
              for m, mat in ref["matrices"].items()}
    events = phases.accuracy_events(st, ref["train_accuracy"], ref["val_accuracy"], ref["val_loss"])
    bounds = {m: phases.compare_boundaries(s, st, events) for m, s in starts.items()}
    k = phases.first_at_one(ref["val_accuracy"], np.arange(len(st)))
    after = {"val accuracy = 1": None if k is None else
             {"similarity_to_final": {m: float(mat[k, -1]) for m, mat in ref["matrices"].items()}}}
    stats = verdict_statistics(cfg, steps=st, starts=starts, boundaries=bounds, after=after, comparison=None)
    stats["boundaries_matching_authors"] = {"value": None, "reason": "the reference itself"}
    return stats


# --------------------------------------------------------------------------- training


def make_model(cfg: GrokkingConfig, seed: int):
    """The grokking network of ``cfg`` initialised from ``seed`` (:func:`models.modular.modular_addition_model`)."""
    return modular.modular_addition_model(cfg.p, d_hidden=cfg.d_hidden, seed=seed)


def _train(cfg: GrokkingConfig, tokens, workdir: pathlib.Path, progress: bool, log):
    """Train (or resume); returns (TrainResult, checkpoint steps incl. 0, stacked networks, seconds)."""
    tcfg = TrainConfig(
        steps=cfg.steps, batch_size=cfg.batch_size or len(tokens.x_train), learning_rate=cfg.learning_rate,
        optimizer="adamw", weight_decay=cfg.weight_decay, seed=cfg.seed, eval_every=cfg.eval_every,
        eval_train_size=len(tokens.x_train), sampling=cfg.sampling,
        checkpoint_steps=modular.checkpoint_schedule(cfg.steps, cfg.n_checkpoints, power=cfg.checkpoint_power,
                                                     rule=cfg.checkpoint_rule),
    )
    t0 = time.time()
    result = train(make_model(cfg, cfg.seed), tokens.x_train, tokens.y_train, tokens.x_test, tokens.y_test,
                   config=tcfg, workdir=workdir, progress=progress)
    seconds = time.time() - t0
    if result.resumed_from:
        log(f"      resumed from step {result.resumed_from}")
    steps = [0, *list_checkpoints(workdir)]  # step 0: the initialisation, make_model as built
    nets = checkpoint_networks(lambda: make_model(cfg, cfg.seed), workdir, steps, config=tcfg,
                               to_network=lambda m: m.model.to_network(), progress=progress)
    return result, steps, cs.stack_networks(nets), seconds


# --------------------------------------------------------------------------- driver


@releases_run_locks
def run(cfg: GrokkingConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log=print, authors_dir: str | pathlib.Path | None = None) -> dict:
    """Run the grokking experiment; returns the metrics (also written to metrics.json).

    ``authors_dir``: the folder of the authors' released run (:func:`models.modular.authors_run`; None: the
    environment variable ``FUNSIM_GROKKING_AUTHORS``, else not compared). It is where data
    lives, not part of the protocol, so it is not a config field (a resumed run may read it
    from elsewhere). A directory given but unreadable is an error before any training.
    """
    t0 = time.time()
    _log = log
    log = lambda msg: _log(f"{msg}  [{time.time() - t0:.0f} s]")
    ref = modular.authors_run(authors_dir) if cfg.compare_authors else None  # a bad directory fails before training
    out = open_run("grokking", run_name, root=root, config=cfg)  # locked; a changed config is refused
    ds = data_lib.modular_addition(p=cfg.p, train_fraction=cfg.train_fraction, seed=cfg.data_seed, onehot=True)
    tokens = data_lib.modular_addition(p=cfg.p, train_fraction=cfg.train_fraction, seed=cfg.data_seed)  # same split
    log(f"[1/6] training: p={cfg.p}, {len(ds.x_train)} train / {len(ds.x_test)} held-out pairs, "
        f"{cfg.steps} steps, batch {cfg.batch_size or 'full'}")
    trained, steps, nets, train_seconds = _train(cfg, tokens, out / "model", progress, log)
    history = trained.history

    log(f"[2/6] evaluating {len(steps)} checkpoints (step 0 = initialisation)")
    ev = {"train": modular.evaluate_checkpoints(nets, ds.x_train, ds.y_train),
          "val": modular.evaluate_checkpoints(nets, ds.x_test, ds.y_test)}
    events = phases.accuracy_events(steps, ev["train"]["accuracy"], ev["val"]["accuracy"], ev["val"]["loss"])

    log(f"[3/6] checkpoint x checkpoint similarity ({len(steps)} x {len(steps)}): tensor and baselines")
    pick = np.random.default_rng(cfg.data_seed).choice(len(ds.x_test), size=min(cfg.n_eval, len(ds.x_test)), replace=False)
    matrices = checkpoint_matrices(nets, ds.x_test[np.sort(pick)])
    write_atomic(out / "matrices.npz", lambda f: np.savez(f, steps=np.asarray(steps),
                                                           **{k.replace(" ", "_"): v for k, v in matrices.items()}))

    log(f"[4/6] phases: {cfg.n_segments} segments of every matrix (costs: pairwise, kernel)")
    segs = {cost: {name: phases.phase_starts(m, n_segments=cfg.n_segments, cost=cost) for name, m in matrices.items()}
            for cost in SEGMENT_COSTS}
    primary = segs[cfg.segment_cost]
    boundaries = {name: phases.compare_boundaries(st, steps, events) for name, st in primary.items()}

    log("[5/6] Fourier content of the weights over training")
    spectra = operand_spectra(nets, cfg.p)
    summaries = {k: spectrum_summary(v, n_top=cfg.n_top_frequencies) for k, v in spectra.items()}
    spectra = {k: v.sum(axis=-2) for k, v in spectra.items()}  # the layer's spectrum: (n, K)
    write_atomic(out / "spectra.npz", lambda f: np.savez(f, steps=np.asarray(steps), **spectra))

    after = _after_generalisation(cfg, steps, events, matrices, summaries)

    if ref is not None:
        log("[6/6] the authors' run beside ours at a matched grid and horizon; verdicts")
    else:
        log("[6/6] verdicts (the authors' run is " + ("not given" if cfg.compare_authors else "not compared") + ")")
    comparison, protocols, authors_stats = _authors_comparison(cfg, ref, steps, matrices, ev["val"]["accuracy"])
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
        ("compare_authors is off" if not cfg.compare_authors
         else f"the authors' released run was not given; {modular.AUTHORS_HOWTO}"),
        "verdict_statistics": stats,
        "verdicts": [v.to_json() for v in verdicts],
        "authors_verdict_statistics": authors_stats,
        "authors_verdicts": None if authors_stats is None else
        [v.to_json() for v in verdict_lib.judge_all(cfg.verdict_rules, authors_stats)],
        "paper": PAPER,
    }
    metrics["seconds"] = round(time.time() - t0, 1)
    metrics["figures"] = [f.name for f in _figures(cfg, out, steps, ev, history, matrices, primary, events, spectra,
                                                   summaries)]
    write_json_atomic(out / "metrics.json", metrics)
    text = summary(cfg, metrics)
    write_text_atomic(out / "summary.md", text)
    _log(text)
    log(f"done; results in {out}/")
    metrics["out"] = str(out)
    return metrics


def _authors_comparison(cfg: GrokkingConfig, ref: dict | None, steps, matrices, val_accuracy):
    """``(compare_runs, reference_protocols, the authors' statistics)``, or three Nones without their run."""
    if ref is None:
        return None, None, None
    ours = {"steps": steps, "matrices": matrices, "val_accuracy": val_accuracy}
    comparison = phases.compare_runs(ours, ref, n_segments=cfg.n_segments, cost=cfg.segment_cost,
                                     horizon=cfg.compare_horizon, tolerance=cfg.landmark_tolerance)
    protocols = phases.reference_protocols(ref, steps, n_segments=cfg.n_segments, cost=cfg.segment_cost)
    return comparison, protocols, _authors_statistics(cfg, ref)


def _figures(cfg: GrokkingConfig, out, steps, ev, history, matrices, primary, events, spectra, summaries) -> list:
    """Draw the run's four figures (:mod:`experiments.grokking_figures`); returns their paths."""
    title = f"grokking: (a + b) mod {cfg.p}, one bilinear layer (hidden {cfg.d_hidden}), {cfg.steps:,} steps"
    return [
        figures.accuracy_figure(steps, ev, history, primary["tensor (symmetric)"], events, out / "accuracy.png", title),
        figures.matrices_figure(matrices, primary, steps, out / "similarity_matrices.png",
                                f"{title}: checkpoint similarity; white lines: {cfg.n_segments} phases "
                                f"({cfg.segment_cost} cost)"),
        figures.to_final_figure(matrices, steps, events, out / "similarity_to_final.png",
                                "similarity of each checkpoint to the final one"),
        figures.fourier_figure(spectra, summaries, steps, events, out / "fourier.png",
                               f"{title}: Fourier power of the weights"),
    ]


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


def main(args: argparse.Namespace) -> int:
    cfg, name = config_lib.from_args(args, GrokkingConfig, CONFIGS)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    run(cfg, root=args.root, run_name=args.run or name, progress=not args.no_progress,
        authors_dir=args.authors_run)
    return 0
