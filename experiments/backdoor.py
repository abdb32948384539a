"""``funsim backdoor``: detect a backdoor from the weights and clean data only.

Run::

    funsim backdoor --config smoke      # seconds (tests)
    funsim backdoor                      # default: mnist5k, offline, minutes on 2 CPU cores
    funsim backdoor --config paper       # SVHN (tfds, grayscale), the paper's scale, for a GPU

What it does (the tensor-similarity paper's SVHN backdoor experiment):

1. trains Bilinear(input -> 64) -> Linear(64 -> 10) (``BilinearMLP(embed=False)``,
   no residual, no biases) with AdamW in two phases, one optimiser throughout:
   A, clean training; B, the same data with ``poison_rate`` (10%) of every
   minibatch stamped with a diamond patch (5 wide x 7 tall, top-right corner,
   2-pixel margin) and relabelled to the target class 9. Inputs get Gaussian
   noise (sigma ``noise_std``) in both phases, as in the paper's code.
   Checkpoints every ``checkpoint_every`` steps, and at the phase boundary;
2. clean test accuracy and attack success (stamped test images of the other
   classes classified as 9) at every checkpoint;
3. checkpoint x checkpoint matrices: tensor similarity (symmetric, the paper's
   metric, and Gaussian) with its ten per-class slices, behavioural similarity
   on clean test images and on stamped ones, linear CKA of the logits on clean
   images, matrix cosine of the weights;
4. the block gap of each matrix, ``mean(B x B) - mean(A x B)``: how much more
   the poisoned-phase checkpoints resemble each other than the clean ones.
   Tensor similarity needs no data at all; the claim is that it flags the
   backdoor, and localises it to class 9, without ever seeing a poisoned input.

The paper's numbers (SVHN, 41 checkpoints): gap 0.24 for tensor similarity,
0.43 for its class-9 slice, 0.09 for behavioural similarity on clean data, about
0.15 for matrix cosine.

Phase lengths. The paper trains 8000 clean steps ("long enough for clean test
accuracy to plateau") and 2000 poisoned ones, batch 512 (the ``paper`` config).
On the 4000 mnist5k training images the clean accuracy plateaus by about step
1250 and the training loss is 0 from about step 2000; trained on to 8000 steps,
the weights then jumped once, spontaneously (tensor similarity 0.73 between two
consecutive clean checkpoints, at step 6250-6500). The ``default`` config keeps
the paper's 4:1 ratio at 2000 + 500 steps.

The patch colour (``patch_value``): black on SVHN, as in the paper; on the black background of
MNIST and Fashion-MNIST, where a black patch changes nothing, the ink colour (1, white).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import numpy as np
from flax import nnx

from funsim import models
from funsim.experiments import curriculum as cur
from funsim.experiments import plotting
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.configs.backdoor import CONFIGS, PAPER, RULES, STATISTICS, BackdoorConfig  # noqa: F401
from funsim.experiments.io import open_run, releases_run_locks
from funsim.models import authors
from funsim.models.curriculum import Stage, load_stage_networks, train_stages
from funsim.models.poison import PoisonTransform, attack_success, stamp
from funsim.models.train import TrainConfig
from funsim.similarity import checkpoints as cs


def _make_model(cfg, input_shape, n_classes):
    return models.BilinearMLP(input_shape, n_classes, d_model=cfg.d_hidden, d_hidden=cfg.d_hidden, n_layers=1,
                              residual=False, bias=False, embed=False, rngs=nnx.Rngs(cfg.seed))


@releases_run_locks
def run(cfg: BackdoorConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log=print, authors_dir=None) -> dict:
    """Run the experiment; returns the metrics (also written to metrics.json). ``authors_dir``: ``--authors-data``."""
    t0 = time.time()
    stamp_log = lambda msg: log(f"{msg}  [{time.time() - t0:.0f} s]")
    calibration = authors.calibration("backdoor", authors.read_backdoor(authors_dir), lambda d: verdict_statistics(
        cfg, *authors.block_gaps(d, cfg.target), authors.block_gaps(d, cfg.target, placebo=True)))  # fails early
    out = open_run("backdoor", run_name, root=root, config=cfg)
    ds = cur.load_images(cfg.dataset, grayscale=cfg.grayscale, n_train=cfg.n_train)
    if not 0 <= cfg.target < ds.n_classes:
        raise ValueError(f"target={cfg.target} is not a class of {ds.name} (0..{ds.n_classes - 1}).")
    h, w = ds.input_shape[:2]
    clean = PoisonTransform((h, w), rate=0.0, noise_std=cfg.noise_std)
    poison = dataclasses.replace(clean, rate=cfg.poison_rate, value=cfg.patch_value, target=cfg.target)

    stamp_log(f"[1/4] training on {ds.name}: {cfg.phase_a_steps} clean steps, then {cfg.phase_b_steps} steps "
              f"with {cfg.poison_rate:.0%} of each batch poisoned (target {cfg.target})")
    tcfg = TrainConfig(steps=1, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, optimizer="adamw",
                       weight_decay=cfg.weight_decay, seed=cfg.seed, eval_every=cfg.checkpoint_every,
                       checkpoint_every=cfg.checkpoint_every)
    stages = [Stage("A: clean", cfg.phase_a_steps, ds.x_train, ds.y_train, clean),
              Stage("B: poisoned", cfg.phase_b_steps, ds.x_train, ds.y_train, poison)]
    model = _make_model(cfg, ds.input_shape, ds.n_classes)
    res = train_stages(model, stages, ds.x_test, ds.y_test, config=tcfg, workdir=out / "model",
                       carry_optimizer=True, progress=progress, log=log)
    nets = load_stage_networks(lambda: _make_model(cfg, ds.input_shape, ds.n_classes), res)
    steps = res.steps
    in_b = steps > cfg.phase_a_steps

    stamp_log(f"[2/4] checkpoint x checkpoint matrices over {len(nets)} checkpoints")
    x_clean = ds.x_test[: cfg.n_eval]
    y_eval = ds.y_test[: cfg.n_eval]
    x_poison = np.asarray(stamp(x_clean, poison.mask(), value=cfg.patch_value))
    flat = lambda x: x.reshape(len(x), -1)

    def compute():
        m = cs.tensor_matrices(nets, metrics=("symmetric", "gaussian"))
        m["weight_cosine"] = cs.weight_cosine_matrix(nets)
        y_c = cs.network_outputs(nets, flat(x_clean))
        y_p = cs.network_outputs(nets, flat(x_poison))
        m["behavioral/clean"] = cs.behavioural_matrix(y_c)
        m["behavioral/poisoned"] = cs.behavioural_matrix(y_p)
        m["cka/clean"] = cs.cka_matrix(y_c)
        m["clean_accuracy"] = (np.asarray(y_c).argmax(-1) == y_eval).mean(1)
        m["attack_success"] = attack_success(y_p, y_eval, target=cfg.target)
        return m

    mats = cur.cached_arrays(out / "similarity.npz", steps, compute)

    stamp_log("[3/4] block gaps: mean(B x B) - mean(A x B)")
    named = {
        "tensor (symmetric)": mats["tensor/symmetric"],
        "tensor (gaussian)": mats["tensor/gaussian"],
        f"class-{cfg.target} slice (symmetric)": mats["tensor/symmetric/outputs"][cfg.target],
        f"class-{cfg.target} slice (gaussian)": mats["tensor/gaussian/outputs"][cfg.target],
        "behavioural (clean)": mats["behavioral/clean"],
        "behavioural (poisoned)": mats["behavioral/poisoned"],
        "CKA logits (clean)": mats["cka/clean"],
        "matrix cosine": mats["weight_cosine"],
    }
    gaps = {k: cs.block_gap(v, in_b) for k, v in named.items()}
    slice_gaps = {metric: [cs.block_gap(mats[f"tensor/{metric}/outputs"][c], in_b) for c in range(ds.n_classes)]
                  for metric in ("symmetric", "gaussian")}
    others = [c for c in range(ds.n_classes) if c != cfg.target]
    localised = {metric: {"target": g[cfg.target], "others_mean": float(np.mean([g[c] for c in others])),
                          "others_max": float(np.max([g[c] for c in others]))}
                 for metric, g in slice_gaps.items()}

    stamp_log("[4/4] verdicts, figures and summary")
    final_asr = float(mats["attack_success"][-1])
    control = None  # the clean control's (gaps, slice gaps): this run with no poisoned step, in backdoor/control/
    if cfg.control and cfg.poison_rate > 0:
        c = run(dataclasses.replace(cfg, poison_rate=0.0, control=False), root=out, run_name="control",
                progress=progress, log=log, authors_dir=authors_dir)
        control = c["block_gap"], c["slice_block_gap"]["symmetric"]
    stats = verdict_statistics(cfg, gaps, slice_gaps["symmetric"], final_asr, control)
    figures = _figures(cfg, out, res, steps, mats, slice_gaps, gaps)
    metrics = {
        "dataset": ds.name,
        "steps": steps,
        "phase_spans": res.spans,
        "n_checkpoints": int(len(steps)),
        "clean_accuracy": mats["clean_accuracy"],
        "attack_success": mats["attack_success"],
        "final": {"clean_accuracy": float(mats["clean_accuracy"][-1]), "attack_success": float(mats["attack_success"][-1]),
                  "clean_accuracy_end_of_a": float(mats["clean_accuracy"][~in_b][-1]),
                  "attack_success_end_of_a": float(mats["attack_success"][~in_b][-1])},
        "block_gap": gaps,
        "slice_block_gap": slice_gaps,
        "localisation": localised,
        "verdict_statistics": stats,
        "control": None if control is None else {"block_gap": control[0], "slice_block_gap": control[1]},
        "authors": calibration,
        "paper": PAPER,
        "history": res.history,
        "seconds": round(time.time() - t0, 1),
    }
    metrics["verdicts"] = [v.to_json() for v in verdict_lib.calibrate(cfg.verdict_rules, metrics)[0]]
    return cur.finish_run(out, metrics, summary(cfg, metrics, ds.name), figures, log)


def verdict_statistics(cfg: BackdoorConfig, gaps: dict, slice_gaps, attack_success: float, control=None) -> dict:
    """The numbers :data:`RULES` judge (:data:`STATISTICS`) from the block gaps.

    Args:
      cfg: the config (``target``).
      gaps: ``{measure: block gap}`` as :func:`run` names them.
      slice_gaps: the block gap of every class slice (symmetric metric).
      attack_success: at the last checkpoint.
      control: the clean control's ``(gaps, slice_gaps)`` (None: ``_did`` undefined; the authors': their placebo).
    """
    t = cfg.target
    tensor, clean = gaps["tensor (symmetric)"], gaps["behavioural (clean)"]
    excess = lambda g: float(g[t] - max(x for c, x in enumerate(g) if c != t))
    none = {"value": None, "reason": "no clean control (control off, or poison_rate 0)"}
    return {
        "tensor_gap_ratio": tensor / clean if clean > 0 else
        {"value": None, "reason": f"behavioural (clean) block gap {clean:.3g} <= 0: no ratio"},
        "target_slice_excess": excess(slice_gaps),
        "behavioural_gap_clean": clean,
        "tensor_minus_weight_cosine_gap": tensor - gaps["matrix cosine"],
        "behavioural_gap_poisoned": gaps["behavioural (poisoned)"],
        "attack_success": float(attack_success),
        "tensor_gap_did": none if control is None else tensor - control[0]["tensor (symmetric)"],
        "target_slice_excess_did": none if control is None else excess(slice_gaps) - excess(control[1]),
    }


def _figures(cfg, out, res, steps, mats, slice_gaps, gaps):
    figs = [plotting.curves_over_steps(
        steps, {"clean test accuracy": mats["clean_accuracy"], "attack success (stamped, not 9)": mats["attack_success"]},
        out / "training.png", spans=res.spans, ylim=(-0.02, 1.02), ylabel="fraction",
        title="Clean accuracy and attack success at every checkpoint")]
    figs.append(plotting.heatmap_panels(
        {"tensor similarity (symmetric)": mats["tensor/symmetric"],
         "tensor similarity (gaussian)": mats["tensor/gaussian"],
         f"class-{cfg.target} slice (symmetric)": mats["tensor/symmetric/outputs"][cfg.target],
         "behavioural, clean test images": mats["behavioral/clean"],
         "behavioural, stamped test images": mats["behavioral/poisoned"],
         "CKA of the logits, clean images": mats["cka/clean"],
         "matrix cosine of the weights": mats["weight_cosine"]},
        steps, out / "heatmaps.png", spans=res.spans, ncols=4,
        suptitle="Checkpoint x checkpoint similarity: clean phase A, then poisoned phase B"))
    n = mats["tensor/symmetric/outputs"].shape[0]
    figs.append(plotting.heatmap_panels(
        {f"class {c} slice": mats["tensor/symmetric/outputs"][c] for c in range(n)},
        steps, out / "slice_heatmaps.png", spans=res.spans, ncols=5,
        suptitle="Tensor similarity (symmetric) of each output class's slice"))
    figs.append(plotting.bar_chart(
        {f"class {c}": g for c, g in enumerate(slice_gaps["symmetric"])}, out / "slice_gaps.png",
        title="Block gap mean(B x B) - mean(A x B) of each class slice (symmetric)", ylabel="block gap"))
    figs.append(plotting.bar_chart(gaps, out / "gaps.png", ylabel="block gap",
                                   title="Block gap mean(B x B) - mean(A x B): which measures see the backdoor"))
    return figs


def summary(cfg: BackdoorConfig, m: dict, dataset: str) -> str:
    """summary.md: our numbers beside the paper's, and the verdicts of the config's rules."""
    g, f = m["block_gap"], m["final"]
    t = cfg.target
    lines = [f"# backdoor: detection from weights and clean data only ({dataset})", "",
             f"{m['n_checkpoints']} checkpoints; phase A (clean) {cfg.phase_a_steps} steps, phase B "
             f"({cfg.poison_rate:.0%} of each batch poisoned, target {t}) {cfg.phase_b_steps} steps. "
             f"This invocation took {m['seconds']} s (a rerun reuses the trained stages and the cached matrices).", "",
             f"Clean test accuracy {f['clean_accuracy_end_of_a']:.3f} at the end of A, {f['clean_accuracy']:.3f} at the end; "
             f"attack success {f['attack_success_end_of_a']:.3f} at the end of A, {f['attack_success']:.3f} at the end.", "",
             "Block gap mean(B x B) - mean(A x B):", ""]
    paper_key = {"tensor (symmetric)": "tensor (symmetric)", f"class-{t} slice (symmetric)": "class-9 slice (symmetric)",
                 "behavioural (clean)": "behavioural (clean)", "matrix cosine": "matrix cosine"}
    rows = [[k, PAPER.get(paper_key.get(k, "")), v] for k, v in g.items()]
    lines += [cur.markdown_table(["measure", "paper (SVHN)", f"ours ({dataset})"], rows), ""]
    lines += ["## Verdicts", "",
              f"Attack success at the end: {f['attack_success']:.3f}. Each label is computed by code from the rule in the run's config (`verdict_rules`; statistics in "
              "`experiments.backdoor.STATISTICS`).", ""]
    lines += verdict_lib.calibrate(cfg.verdict_rules, m)[1]
    lines += [
        "",
        "Per-class slice gaps (symmetric): " + ", ".join(f"{c}: {v:.3f}" for c, v in enumerate(m["slice_block_gap"]["symmetric"])),
        "",
        "Per-class slice gaps (gaussian): " + ", ".join(f"{c}: {v:.3f}" for c, v in enumerate(m["slice_block_gap"]["gaussian"])),
    ]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    return cur.driver_main(args, "backdoor", BackdoorConfig, CONFIGS, run)
