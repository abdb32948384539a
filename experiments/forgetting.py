"""``funsim forgetting``: catastrophic forgetting, seen and localised by tensor similarity.

Run::

    funsim forgetting --config smoke      # seconds (tests)
    funsim forgetting                      # default: mnist5k, offline, minutes on 2 CPU cores
    funsim forgetting --config paper       # SVHN (tfds, grayscale), the paper's scale, for a GPU

What it does (the tensor-similarity paper's progressive-training experiment):

1. trains embedding -> one bilinear layer -> head (no residual, no biases;
   the paper: embed 128, hidden 256, AdamW with weight decay 0.5, batch 248)
   through the curriculum: digits 0-4, add 5, add 6, add 7, add 8, add 9,
   repeat, remove 9, re-add 9; ``stage_steps`` (1,500) steps per stage with a
   fresh AdamW and a cosine decay per stage, every stage from the same seed
   (the same minibatch key stream), as the paper's code did; checkpoints
   every ``checkpoint_every`` steps (each stage resumable). The paper ran 20
   epochs of SVHN per stage, 3,600-5,900 steps; 20 epochs of mnist5k's 4,000
   images would be 160-320, too few to forget a class (``paper`` keeps 20 epochs);
2. computes the checkpoint x checkpoint matrices of tensor similarity (Gaussian,
   the paper's metric, and symmetric), of its ten per-class slices, and of the
   baselines: linear CKA of the logits, behavioural similarity (mean per-sample
   cosine of the logits) on the test images, matrix cosine of the weights;
3. reads off the similarity of every checkpoint to the reference (the end of
   "add 9"): whole network and per class, next to the per-class test accuracy
   (class 9's accuracy at "remove 9" says whether it was forgotten at all);
4. trains a second model (another seed; with ``split_data``, as in the paper, on
   the other half of the training images, by default on the same images since
   mnist5k is small) on digits 0-8, fine-tunes it on 0-9, and compares the difference of the two
   (``similarity.difference``: fine-tuned minus base, exact) with every
   checkpoint of the first model;
5. the verdicts: ``verdict_rules`` applied to :func:`verdict_statistics`;
6. writes ``results/forgetting/<run>/``: config.json, metrics.json, similarity.npz,
   the stage checkpoints, PNG figures and summary.md with our numbers beside the
   paper's, and each rule with its number and computed label.

The paper's numbers (SVHN, end of each stage): at "remove 9" tensor similarity
to the reference 0.814 vs CKA 0.930, with the class-9 slice at -0.07; at
"re-add 9", 0.995.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import time

import numpy as np
from flax import nnx

from funsim import models, similarity
from funsim.experiments import curriculum as cur
from funsim.experiments import plotting
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.configs.forgetting import CONFIGS, CURRICULUM, PAPER, RULES, STATISTICS, ForgettingConfig  # noqa: F401
from funsim.experiments.io import open_run, releases_run_locks
from funsim.models import authors
from funsim.models.curriculum import Stage, load_stage_networks, train_stages
from funsim.models.train import TrainConfig
from funsim.similarity import checkpoints as cs


def _train_config(cfg: ForgettingConfig, n_smallest: int = 2048):
    """The AdamW config of every stage; the fixed train subset evaluated has the size of the
    smallest stage's training set (at most 2048), so one compiled evaluation serves every stage."""
    if cfg.lr_schedule not in ("cosine", "constant"):
        raise ValueError(f"lr_schedule must be 'cosine' or 'constant', got {cfg.lr_schedule!r}.")
    return TrainConfig(
        steps=1, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, optimizer="adamw",
        weight_decay=cfg.weight_decay,
        # optax's warmup-cosine schedule needs one warm-up step (at rate 0); then cosine decay to 0
        warmup_steps=1 if cfg.lr_schedule == "cosine" else 0,
        seed=cfg.seed, eval_every=cfg.checkpoint_every, checkpoint_every=cfg.checkpoint_every,
        eval_train_size=min(2048, n_smallest),
    )


def _stage_steps(cfg: ForgettingConfig, n_examples: int) -> int:
    if cfg.stage_epochs is None:
        return cfg.stage_steps
    return max(1, math.floor(cfg.stage_epochs * (n_examples // cfg.batch_size)))


def _stages(cfg, x, y, curriculum):
    stages = []
    for name, digits in curriculum:
        xs, ys = cur.select_classes(x, y, digits)
        if len(ys) < cfg.batch_size:
            raise ValueError(
                f"Stage {name!r} has {len(ys)} training images, fewer than batch_size={cfg.batch_size}; "
                "use more training data (n_train) or a smaller batch."
            )
        stages.append(Stage(name, _stage_steps(cfg, len(ys)), xs, ys))
    return stages


def _make_model(cfg, input_shape, n_classes, seed):
    return models.BilinearMLP(input_shape, n_classes, d_model=cfg.d_model, d_hidden=cfg.d_hidden, n_layers=1,
                              residual=False, bias=False, rngs=nnx.Rngs(seed))


def _as_one_layer(net):
    """A one-bilinear-layer network (embedding and head folded in) as one :class:`similarity.BilinearLayer`.

    Exact: the folded node's lifted factors give the biases, and its constant
    hidden unit the output bias (see ``similarity.fold_network``).
    """
    (node,) = similarity.fold_network(similarity.validate_network(net))
    left, right, down = node
    return similarity.BilinearLayer(left[:, 1:], right[:, 1:], down[1:], left[:, 0], right[:, 0])


def _difference_network(cfg, ds_b, out, progress, log):
    """Second model: every digit but the target, then fine-tuned on all; returns the difference network."""
    digits = tuple(range(10))
    base = tuple(d for d in digits if d != cfg.target)
    model = _make_model(cfg, ds_b.input_shape, 10, cfg.seed + 1)
    stages = _stages(cfg, ds_b.x_train, ds_b.y_train, (("base without target", base), ("fine-tune all", digits)))
    tcfg = _train_config(cfg, min(len(s.y_train) for s in stages))
    res = train_stages(model, stages, ds_b.x_test, ds_b.y_test, config=tcfg, workdir=out / "model_b",
                       carry_optimizer=cfg.carry_optimizer, same_seed=cfg.same_seed, progress=progress, log=log)
    nets = load_stage_networks(lambda: _make_model(cfg, ds_b.input_shape, 10, cfg.seed + 1), res)
    ends = [int(np.flatnonzero(res.stage_index == k)[-1]) for k in range(2)]
    base_net, ft_net = nets[ends[0]], nets[ends[1]]
    return (similarity.difference(_as_one_layer(ft_net), _as_one_layer(base_net)),)


def _per_class_accuracy(logits, y, n_classes):
    pred = np.asarray(logits).argmax(-1)  # (n_ckpt, m)
    return np.stack([(pred[:, y == c] == c).mean(1) if np.any(y == c) else np.full(len(pred), np.nan)
                     for c in range(n_classes)], 1)


@releases_run_locks
def run(cfg: ForgettingConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log=print, authors_dir=None) -> dict:
    """Run the experiment; returns the metrics (also written to metrics.json). ``authors_dir``: ``--authors-data``."""
    t0 = time.time()
    stamp = lambda msg: log(f"{msg}  [{time.time() - t0:.0f} s]")
    calibration = authors.calibration("forgetting", authors.read_forgetting(authors_dir), lambda d: verdict_statistics(
        cfg, authors.stage_ends(d, cfg.target)))  # a bad clone fails before training
    names = [n for n, _ in cfg.curriculum]
    if cfg.reference_stage not in names:
        raise ValueError(f"reference_stage {cfg.reference_stage!r} is not a stage of the curriculum {names}.")
    out = open_run("forgetting", run_name, root=root, config=cfg)
    ds = cur.load_images(cfg.dataset, grayscale=cfg.grayscale, n_train=cfg.n_train)
    n_classes = ds.n_classes
    if n_classes != 10:
        raise ValueError(f"{ds.name} has {n_classes} classes; the curriculum needs the 10 classes 0-9.")
    half = len(ds.y_train) // 2 if cfg.difference and cfg.split_data else len(ds.y_train)
    ds_a = ds.subset(half)
    x_eval = ds.x_test[: cfg.n_eval].reshape(min(cfg.n_eval, len(ds.x_test)), -1)
    y_eval = ds.y_test[: cfg.n_eval]

    stamp(f"[1/5] training through {len(names)} stages on {ds.name} ({len(ds_a.y_train)} training images"
          + (", the other half for the second model)" if half < len(ds.y_train) else ")"))
    stages = _stages(cfg, ds_a.x_train, ds_a.y_train, cfg.curriculum)
    tcfg = _train_config(cfg, min(len(s.y_train) for s in stages))
    model = _make_model(cfg, ds.input_shape, n_classes, cfg.seed)
    res = train_stages(model, stages, ds.x_test, ds.y_test,
                       config=tcfg, workdir=out / "model_a", carry_optimizer=cfg.carry_optimizer,
                       same_seed=cfg.same_seed, progress=progress, log=log)
    steps = res.steps
    nets = load_stage_networks(lambda: _make_model(cfg, ds.input_shape, n_classes, cfg.seed), res)

    stamp(f"[2/5] checkpoint x checkpoint matrices over {len(nets)} checkpoints (tensor similarity, 10 slices, baselines)")

    def compute():
        m = cs.tensor_matrices(nets, metrics=("gaussian", "symmetric"))
        m["weight_cosine"] = cs.weight_cosine_matrix(nets)
        logits = cs.network_outputs(nets, x_eval)
        m["behavioral"] = cs.behavioural_matrix(logits)
        m["cka"] = cs.cka_matrix(logits)
        m["class_accuracy"] = _per_class_accuracy(logits, y_eval, n_classes)
        return m

    mats = cur.cached_arrays(out / "similarity.npz", steps, compute)

    stamp("[3/5] similarity of every checkpoint to the reference")
    ends = {name: int(np.flatnonzero(res.stage_index == k)[-1]) for k, name in enumerate(names)}
    ref = ends[cfg.reference_stage]
    curves = {
        "tensor (gaussian)": mats["tensor/gaussian"][ref],
        "tensor (symmetric)": mats["tensor/symmetric"][ref],
        "CKA (logits)": mats["cka"][ref],
        "behavioural (test logits)": mats["behavioral"][ref],
        "matrix cosine (weights)": mats["weight_cosine"][ref],
    }
    slices = mats["tensor/gaussian/outputs"][:, ref]  # (10, n)
    others = [c for c in range(n_classes) if c != cfg.target]
    at_stage = {
        name: {
            "step": int(steps[i]),
            **{k: float(v[i]) for k, v in curves.items()},
            "slices": [float(v) for v in slices[:, i]],
            "slice_target": float(slices[cfg.target, i]),
            "slice_others_mean": float(slices[others, i].mean()),
            "slice_others_min": float(slices[others, i].min()),
            "class_accuracy": [float(a) for a in mats["class_accuracy"][i]],
        }
        for name, i in ends.items()
    }

    difference = None
    if cfg.difference:
        stamp("[4/5] second model: digits without the target, fine-tuned on all; difference vs every checkpoint")
        first_b = half if cfg.split_data else 0
        ds_b = dataclasses.replace(ds, x_train=ds.x_train[first_b:], y_train=ds.y_train[first_b:])
        diff_net = _difference_network(cfg, ds_b, out, progress, log)
        d = cur.cached_arrays(out / "difference.npz", steps,
                              lambda: cs.tensor_similarity_to(nets, diff_net, metrics=("gaussian", "symmetric")))
        difference = {
            "tensor (gaussian)": d["tensor/gaussian"],
            f"class-{cfg.target} slice (gaussian)": d["tensor/gaussian/outputs"][cfg.target],
            "mean of the other slices (gaussian)": d["tensor/gaussian/outputs"][others].mean(0),
        }
        for name, i in ends.items():
            at_stage[name]["difference"] = {k: float(v[i]) for k, v in difference.items()}
    else:
        stamp("[4/5] difference model skipped (difference=False)")

    stamp("[5/5] verdicts, figures and summary")
    stats = verdict_statistics(cfg, at_stage)
    figures = _figures(cfg, out, res, steps, mats, curves, slices, difference, names)
    metrics = {
        "dataset": ds.name,
        "n_checkpoints": int(len(steps)),
        "steps": steps,
        "stage_spans": res.spans,
        "reference": {"stage": cfg.reference_stage, "step": int(steps[ref])},
        "at_stage_end": at_stage,
        "to_reference": {k: v for k, v in curves.items()},
        "difference": difference,
        "verdict_statistics": stats,
        "authors": calibration,
        "paper": PAPER,
        "history": res.history,
        "seconds": round(time.time() - t0, 1),
    }
    metrics["verdicts"] = [v.to_json() for v in verdict_lib.calibrate(cfg.verdict_rules, metrics)[0]]
    return cur.finish_run(out, metrics, summary(cfg, metrics, ds.name), figures, log)


def verdict_statistics(cfg: ForgettingConfig, at_stage: dict) -> dict:
    """The numbers :data:`RULES` judge (:data:`STATISTICS`), from the end-of-stage values.

    Each is a number or ``{"value": None, "reason": ...}`` when the run has no such stage
    (a custom curriculum) or no difference model.
    """
    t = cfg.target
    remove, readd, add = f"remove {t}", f"re-add {t}", f"add {t}"
    g = "tensor (gaussian)"
    missing = lambda stage: {"value": None, "reason": f"no stage {stage!r}"}
    no_diff = {"value": None, "reason": "no difference model (difference=False)"}
    rm, ra, ad, rp = (at_stage.get(k) for k in (remove, readd, add, "repeat"))
    stats = {
        "cka_minus_tensor_at_remove": missing(remove) if rm is None else rm["CKA (logits)"] - rm[g],
        "target_slice_margin": missing(remove) if rm is None else rm["slice_others_min"] - rm["slice_target"],
        "target_slice_at_remove": missing(remove) if rm is None else rm["slice_target"],
        "target_accuracy_at_remove": missing(remove) if rm is None else rm["class_accuracy"][t],
        "tensor_at_readd": missing(readd) if ra is None else ra[g],
        "tensor_at_repeat": missing("repeat") if rp is None else rp[g],
    }
    dk = f"class-{t} slice (gaussian)"
    for name, stage, v in (("difference_slice_at_add9", add, ad), ("difference_slice_at_remove", remove, rm)):
        stats[name] = missing(stage) if v is None else no_diff if "difference" not in v else v["difference"][dk]
    return stats


def _figures(cfg, out, res, steps, mats, curves, slices, difference, names):
    figs = []
    figs.append(plotting.heatmap_panels(
        {"tensor similarity (gaussian)": mats["tensor/gaussian"],
         "tensor similarity (symmetric)": mats["tensor/symmetric"],
         "CKA of the logits (test images)": mats["cka"],
         "behavioural similarity (test images)": mats["behavioral"],
         "matrix cosine of the weights": mats["weight_cosine"]},
        steps, out / "heatmaps.png", spans=res.spans,
        suptitle="Checkpoint x checkpoint similarity through the curriculum"))
    figs.append(plotting.heatmap_panels(
        {f"class {c} slice": mats["tensor/gaussian/outputs"][c] for c in range(slices.shape[0])},
        steps, out / "slice_heatmaps.png", spans=res.spans, ncols=5,
        suptitle="Tensor similarity (gaussian) of each output class's slice, checkpoint x checkpoint"))
    figs.append(plotting.curves_over_steps(
        steps, curves, out / "to_reference.png", spans=res.spans, ylabel="similarity to the reference",
        title=f"Similarity of every checkpoint to the end of {cfg.reference_stage!r}"))
    series = {f"class {c}": slices[c] for c in range(slices.shape[0])}
    styles = {f"class {c}": ({"color": "red", "lw": 2.5} if c == cfg.target else {"lw": 1, "alpha": 0.7})
              for c in range(slices.shape[0])}
    figs.append(plotting.curves_over_steps(
        steps, series, out / "slices_to_reference.png", spans=res.spans, styles=styles,
        ylabel="slice similarity to the reference",
        title=f"Per-class tensor-similarity slices (gaussian) vs the end of {cfg.reference_stage!r}"))
    acc = mats["class_accuracy"]
    figs.append(plotting.curves_over_steps(
        steps, {f"class {c}": acc[:, c] for c in range(acc.shape[1])}, out / "class_accuracy.png",
        spans=res.spans, styles=styles, ylabel="test accuracy of the class", ylim=(-0.02, 1.02),
        title="Per-class test accuracy through the curriculum"))
    if difference is not None:
        figs.append(plotting.curves_over_steps(
            steps, difference, out / "difference.png", spans=res.spans, ylabel="similarity to the difference",
            title=f"Every checkpoint vs (second model fine-tuned on {cfg.target}) - (its base)"))
    return figs


def summary(cfg: ForgettingConfig, m: dict, dataset: str) -> str:
    """summary.md: our numbers beside the paper's, and the verdicts of the config's rules."""
    st = m["at_stage_end"]
    rm, ra = st.get("remove 9"), st.get("re-add 9")
    lines = [f"# forgetting: catastrophic forgetting through a curriculum ({dataset})", ""]
    lines.append(f"{m['n_checkpoints']} checkpoints; reference = end of {m['reference']['stage']!r} "
                 f"(step {m['reference']['step']}). Values are at the end of each stage. This invocation took {m['seconds']} s (a rerun reuses the trained stages and the cached matrices).")
    lines.append("")
    if rm and ra:
        g = "tensor (gaussian)"
        rows = [
            ["tensor similarity at 'repeat'", PAPER["repeat"]["tensor"], st["repeat"][g] if "repeat" in st else None],
            ["tensor similarity at 'remove 9'", PAPER["remove 9"]["tensor"], rm[g]],
            ["CKA (logits) at 'remove 9'", PAPER["remove 9"]["cka"], rm["CKA (logits)"]],
            [f"class-{cfg.target} slice at 'remove 9'", PAPER["remove 9"]["slice_target"], rm["slice_target"]],
            ["other slices at 'remove 9' (mean / min)", None, f"{rm['slice_others_mean']:.3f} / {rm['slice_others_min']:.3f}"],
            ["tensor similarity at 're-add 9'", PAPER["re-add 9"]["tensor"], ra[g]],
            ["behavioural (test) at 'remove 9'", None, rm["behavioural (test logits)"]],
            ["matrix cosine at 'remove 9'", None, rm["matrix cosine (weights)"]],
        ]
        if m["difference"] is not None:
            dk = f"class-{cfg.target} slice (gaussian)"
            rows += [[f"difference vs checkpoint, class-{cfg.target} slice, at {s!r}", PAPER[s]["difference_slice_target"],
                      st[s]["difference"][dk]] for s in ("add 8", "add 9", "remove 9", "re-add 9") if s in st]
        lines += [cur.markdown_table(["quantity", "paper (SVHN)", f"ours ({dataset})"], rows), ""]
        lines += [f"Class-{cfg.target} test accuracy at the end of 'remove {cfg.target}': "
                  f"{rm['class_accuracy'][cfg.target]:.3f} (paper: 0.00); at 're-add {cfg.target}': "
                  f"{ra['class_accuracy'][cfg.target]:.3f}.", ""]
    lines += ["## Verdicts", "",
              "Each label is computed by code from the rule in the run's config (`verdict_rules`); the number is "
              "the statistic the rule names (`experiments.forgetting.STATISTICS`).", ""]
    lines += verdict_lib.calibrate(cfg.verdict_rules, m)[1]
    rep = m["verdict_statistics"]["tensor_at_repeat"]
    lines += ["", "Drift baseline (no rule): tensor similarity to the reference at the end of 'repeat' "
              + ("n/a" if isinstance(rep, dict) else f"{rep:.3f}") + " (paper 0.995).", ""]
    lines.append("Similarity to the reference at the end of every stage:")
    lines.append("")
    keys = ["tensor (gaussian)", "tensor (symmetric)", "CKA (logits)", "behavioural (test logits)", "matrix cosine (weights)"]
    rows = [[name, *[v[k] for k in keys], v["slice_target"], v["slice_others_mean"], v["class_accuracy"][cfg.target]]
            for name, v in st.items()]
    lines += [cur.markdown_table(["stage", *keys, f"slice {cfg.target}", "other slices (mean)",
                                  f"class-{cfg.target} accuracy"], rows), ""]
    if m["difference"] is not None:
        dk = list(m["difference"])
        rows = [[name, *[v["difference"][k] for k in dk]] for name, v in st.items()]
        lines += ["Similarity to the second model's fine-tuning difference (fine-tuned minus base), end of every stage:", "",
                  cur.markdown_table(["stage", *dk], rows), ""]
    lines.append("Per-class test accuracy at the end of every stage (class 0 ... 9): " + "; ".join(
        f"{name}: " + " ".join(f"{a:.2f}" for a in v["class_accuracy"]) for name, v in st.items()))
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    return cur.driver_main(args, "forgetting", ForgettingConfig, CONFIGS, run)
