"""``funsim quickstart``: train small models offline and compare them end to end (``make demo``).

Run::

    funsim quickstart                  # digits (README.md gives its measured time)
    funsim quickstart --dataset mnist5k --steps 600
    funsim quickstart --tiny           # a smoke run: tiny models, about 13 s on 2 cores, mostly compilation

Steps:

1. train two seeds of an MLP and two seeds of a bilinear MLP (power-spaced
   checkpoints for the bilinear ones);
2. the grid of representational measures (registry names), layer x layer,
   between the two MLP seeds and between an MLP and a bilinear MLP, on
   held-out inputs;
3. closed-form stitching in the three families (affine, scaled orthogonal,
   orthogonal), both directions, scored on held-out rows;
4. the tensor similarity of the two bilinear networks from their weights
   (frobenius, symmetric, gaussian), and across one run's checkpoints;
5. writes ``results/quickstart/<run>/``: config.json, metrics.json (atomic),
   PNG heatmaps and training curves, model checkpoints;
6. prints a short summary and where the files are.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
import warnings

import jax
import numpy as np
from flax import nnx

from funsim import data as data_lib
from funsim import models, similarity
from funsim.experiments import config as config_lib
from funsim.experiments import plotting
from funsim.experiments.configs.quickstart import DEFAULT_MEASURES, TENSOR_METRICS, TINY, QuickstartConfig
from funsim.experiments.io import open_run, releases_run_locks, write_json_atomic
from funsim.models.train import TrainConfig, list_checkpoints, load_checkpoint, power_schedule, train
from funsim.runtime.xla_flags import compile_fast

__all__ = ["DEFAULT_MEASURES", "TENSOR_METRICS", "QuickstartConfig", "TINY", "run", "summary", "main"]


def _train_models(cfg: QuickstartConfig, ds, out: pathlib.Path, progress: bool):
    trained, histories = {}, {}
    for kind in ("mlp", "bilinear"):
        for seed in cfg.seeds:
            name = f"{kind}_s{seed}"
            if kind == "mlp":
                model = models.MLP(ds.input_shape, ds.n_classes, widths=cfg.mlp_widths, rngs=nnx.Rngs(seed))
                ckpts = ()
            else:
                model = models.BilinearMLP(ds.input_shape, ds.n_classes, d_model=cfg.bilinear_d_model,
                                           d_hidden=cfg.bilinear_d_hidden, n_layers=1, rngs=nnx.Rngs(seed))
                ckpts = power_schedule(cfg.steps, cfg.n_checkpoints, power=2.0)
            tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                               seed=seed, eval_every=max(1, cfg.steps // cfg.n_evals), checkpoint_steps=ckpts)
            r = train(model, ds.x_train, ds.y_train, ds.x_test, ds.y_test, config=tcfg,
                      workdir=out / "models" / name, progress=progress)
            trained[name], histories[name] = model, r.history
    return trained, histories


def _stitch_names(cfg) -> dict:
    """{family: registry name} of the held-out stitching scores. The affine stitcher has a small
    ridge: dead ReLU units make its fit singular."""
    ridge = f"/ridge={cfg.stitch_ridge:g}" if cfg.stitch_ridge else ""
    return {fam: f"stitch/{fam}" + (ridge if fam == "affine" else "") for fam in similarity.FAMILIES}


def _grid(cfg, feats_a, feats_b) -> similarity.GridResult:
    """One :func:`similarity.compare_grid` call per model pair: ``cfg.measures`` and the three
    stitching families (both directions, ``reverse=True``) share its per-layer work and compilation.

    A cell where a measure is undefined (e.g. CCA on a ReLU layer with a dead unit) is NaN, with
    the pairwise call's reason in ``GridResult.undefined``; the run logs them instead of warning.
    """
    names = list(dict.fromkeys([*cfg.measures, *_stitch_names(cfg).values()]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", similarity.UndefinedCellWarning)
        return similarity.compare_grid(feats_a, feats_b, measures=names, reverse=True, split=cfg.stitch_split,
                                       key=jax.random.key(0))


def _undefined(g: similarity.GridResult, names) -> list[str]:
    """``"measure(layer_a, layer_b): reason"`` for every undefined cell of ``names`` (first sentence)."""
    return [f"{name}({g.rows[i]}, {g.cols[j]}): {why.split('. ')[0]}"
            for name in names for (i, j), why in g.undefined[name].items()]


def _stitch_grid(cfg, g: similarity.GridResult):
    """{family: {"a->b": matrix, "b->a": matrix, "undefined": [reasons]}} of held-out reconstruction scores.

    ``[i, j]`` is ``A_i -> B_j`` in "a->b" and ``B_j -> A_i`` in "b->a" (from :func:`_grid`). A NaN cell
    is a score the data do not determine (e.g. a ReLU unit dead on the fitting rows but alive on the
    held-out ones leaves an orthogonal map free there); ``undefined`` says which and why.
    """
    out = {}
    for fam, m in _stitch_names(cfg).items():
        why = [f"{m}({g.rows[i]} -> {g.cols[j]}): {r.split('. ')[0]}" for (i, j), r in g.undefined[m].items()]
        why += [f"{m}({g.cols[j]} -> {g.rows[i]}): {r.split('. ')[0]}" for (i, j), r in g.reverse_undefined[m].items()]
        out[fam] = {"a->b": np.asarray(g.tables[m]), "b->a": np.asarray(g.reverse[m]), "undefined": why}
    return out


def _tensor_step(cfg, trained, out):
    ts = similarity.tensor_similarity
    a, b = (trained[f"bilinear_s{s}"] for s in cfg.seeds[:2])
    net_a, net_b = a.to_network(), b.to_network()
    res = {"seeds": {m: float(ts(net_a, net_b, metric=m)) for m in TENSOR_METRICS}}
    res["seeds"]["weight cosine (baseline)"] = float(similarity.weight_cosine(net_a, net_b))
    # similarity of each checkpoint of one run to its final network
    wd = out / "models" / f"bilinear_s{cfg.seeds[0]}"
    steps = list_checkpoints(wd)
    template = models.BilinearMLP(a.input_shape, a.head.weight.shape[0], d_model=cfg.bilinear_d_model,
                                  d_hidden=cfg.bilinear_d_hidden, n_layers=1, rngs=nnx.Rngs(0))
    res["checkpoints"] = {
        "steps": list(steps),
        **{m: [float(ts(load_checkpoint(template, wd, s).to_network(), net_a, metric=m)) for s in steps] for m in ("symmetric", "gaussian")},
    }
    return res


@releases_run_locks
def run(cfg: QuickstartConfig, *, root: str | pathlib.Path = "results", run_name: str | None = None,
        progress: bool = True, log=print) -> dict:
    """Run the quickstart; returns the metrics dict (also written to metrics.json)."""
    t0 = time.time()
    _log = log
    log = lambda msg: _log(f"{msg}  [{time.time() - t0:.0f} s]" if msg.startswith("[") else msg)
    # locked (a second run into it is refused); config.json written, or a changed config refused, before any work
    out = open_run("quickstart", run_name, root=root, config=cfg)
    ds = data_lib.load(cfg.dataset)
    if cfg.n_train is not None:
        ds = ds.subset(cfg.n_train)
    log(f"[1/5] training {2 * len(cfg.seeds)} models on {ds.name} ({len(ds.x_train)} train, {len(ds.x_test)} test)")
    trained, histories = _train_models(cfg, ds, out, progress)
    figures = [plotting.training_curves(histories, out / "training.png", title=f"Training on {ds.name}")]
    metrics: dict = {"accuracy": {k: h[-1]["test_accuracy"] for k, h in histories.items()}, "histories": histories}

    x = ds.x_test[: cfg.n_compare]
    feats = {k: models.flatten_features(models.compiled(m).features(x)) for k, m in trained.items()}
    names = {k: list(m.layer_names()) for k, m in trained.items()}
    s0, s1 = cfg.seeds[:2]
    pairs = {"mlp_seeds": (f"mlp_s{s0}", f"mlp_s{s1}"), "mlp_vs_bilinear": (f"mlp_s{s0}", f"bilinear_s{s0}")}

    log(f"[2/5] {len(cfg.measures)} representational measures, layer x layer, on {len(x)} held-out inputs")
    metrics["representational"] = {}
    tables: dict = {}
    for pair, (a, b) in pairs.items():
        tables[pair] = _grid(cfg, feats[a], feats[b])
        grid = {name: np.asarray(tables[pair].tables[name]) for name in cfg.measures}
        undefined = _undefined(tables[pair], cfg.measures)
        metrics["representational"][pair] = {"rows": f"{a}: {names[a]}", "cols": f"{b}: {names[b]}",
                                             **grid, "undefined": undefined}
        if undefined:
            log(f"      {pair}: {len(undefined)} cells undefined (NaN, blank in the figure), e.g. {undefined[0]}")
        titled = {f"{n} ({similarity.measure(n).kind})": g for n, g in grid.items()}
        figures.append(plotting.heatmap_grid(
            titled, names[a], names[b], out / f"representational_{pair}.png",
            suptitle=f"Representational similarity: {a} (rows) vs {b} (columns)", xlabel=b, ylabel=a,
            cmaps={t: ("viridis_r" if t.endswith("(distance)") else "viridis") for t in titled},
        ))

    log("[3/5] closed-form stitching: 3 families x both directions, held-out scores")
    metrics["stitching"] = {}
    for pair, (a, b) in pairs.items():
        st = _stitch_grid(cfg, tables[pair])
        metrics["stitching"][pair] = {"rows": f"{a}: {names[a]}", "cols": f"{b}: {names[b]}", **st}
        undefined = [w for d in st.values() for w in d["undefined"]]
        if undefined:
            log(f"      {pair}: {len(undefined)} stitching cells undefined (NaN, blank in the figure), e.g. {undefined[0]}")
        mats = {}
        for fam, d in st.items():
            mats[f"{fam}: {a} -> {b}"] = d["a->b"]
            mats[f"{fam}: {b} -> {a}"] = d["b->a"]
        figures.append(plotting.heatmap_grid(
            mats, names[a], names[b], out / f"stitching_{pair}.png", ncols=2,
            suptitle=f"Held-out reconstruction score (1 = perfect), rows: {a} layers, columns: {b} layers",
            xlabel=b, ylabel=a,
        ))

    log("[4/5] tensor similarity of the two bilinear networks (weights only)")
    tensor = metrics["tensor_similarity"] = _tensor_step(cfg, trained, out)
    figures.append(plotting.bar_chart(
        tensor["seeds"], out / "tensor_similarity.png", ylabel="similarity",
        title=f"bilinear_s{s0} vs bilinear_s{s1}: weight-based similarity", ylim=(min(0.0, *tensor["seeds"].values()), 1.05),
    ))
    ck = tensor["checkpoints"]
    figures.append(plotting.lines(
        ck["steps"], {m: ck[m] for m in ck if m != "steps"}, out / "tensor_checkpoints.png",
        title=f"bilinear_s{s0}: tensor similarity of each checkpoint to the final network",
        xlabel="checkpoint step (power-spaced)", ylabel="similarity to final",
    ))

    figures.insert(0, _overview_figure(cfg, metrics, names, pairs, out / "overview.png"))
    metrics["seconds"] = round(time.time() - t0, 1)
    write_json_atomic(out / "metrics.json", metrics)
    log("[5/5] " + summary(metrics, out, figures))
    metrics["figures"] = [str(f) for f in figures]
    metrics["out"] = str(out)
    return metrics


def _overview_figure(cfg, metrics: dict, names: dict, pairs: dict, path: pathlib.Path) -> pathlib.Path:
    """The three families in one row: linear CKA between the MLP seeds, layer x layer; the affine
    stitching score from the MLP into the bilinear network, held out; each bilinear checkpoint's
    tensor similarity to the final network."""
    fig, axes = plotting.subplots(1, 3, figsize=(12.5, 3.7))
    a, b = pairs["mlp_seeds"]
    cka = np.asarray(metrics["representational"]["mlp_seeds"]["cka/linear"], float) if "cka/linear" in cfg.measures else None
    if cka is not None:
        plotting.heatmap(axes[0], cka, names[a], names[b], title="Representational: linear CKA, MLP seed 0 vs 1",
                         xlabel=b, ylabel=a, vmin=0.0, vmax=1.0)
    else:
        axes[0].axis("off")
    a, b = pairs["mlp_vs_bilinear"]
    st = metrics["stitching"]["mlp_vs_bilinear"]["affine"]["a->b"]
    plotting.heatmap(axes[1], np.asarray(st, float), names[a], names[b], xlabel=b, ylabel=a,
                     title="Functional: affine stitching MLP -> bilinear (held out)", vmax=1.0)
    ck = metrics["tensor_similarity"]["checkpoints"]
    for m in ("symmetric", "gaussian"):
        axes[2].plot(ck["steps"], ck[m], marker="o", label=m)
    axes[2].set(xlabel="checkpoint step", ylabel="similarity to the final network")
    axes[2].set_title("Weight-based: tensor similarity over training", fontsize=9)
    axes[2].legend(fontsize=8)
    axes[2].grid(alpha=0.3)
    return plotting.save(fig, path)


def _score(v: float) -> str:
    return f"{v:.3f}" if np.isfinite(v) else "undefined (see metrics.json)"


def summary(metrics: dict, out: pathlib.Path, figures) -> str:
    """A short, readable summary of a quickstart run."""
    lines = ["summary"]
    lines.append("  test accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics["accuracy"].items()))
    rep = metrics["representational"]["mlp_seeds"]
    if "cka/linear" in rep:
        diag = np.diag(np.asarray(rep["cka/linear"]))
        lines.append("  linear CKA between MLP seeds, same layer: " + ", ".join(f"{v:.3f}" for v in diag))
    st = metrics["stitching"]["mlp_vs_bilinear"]
    for fam in st:
        if fam in ("rows", "cols"):
            continue
        f, b = (_score(np.asarray(st[fam][d], dtype=float)[-1, -1]) for d in ("a->b", "b->a"))
        lines.append(f"  stitching logits, {fam:18s} mlp->bilinear {f}  bilinear->mlp {b} (held out)")
    ts = metrics["tensor_similarity"]
    lines.append("  tensor similarity of the bilinear seeds: " + ", ".join(f"{k} {v:.3f}" for k, v in ts["seeds"].items()))
    lines.append(f"  took {metrics['seconds']} s; results in {out}/")
    lines += [f"    {pathlib.Path(f).name}" for f in ["config.json", "metrics.json", *figures]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.tiny:
        compile_fast()
    cfg = TINY if args.tiny else QuickstartConfig()
    cfg = dataclasses.replace(
        cfg, dataset=args.dataset,
        **({"steps": args.steps} if args.steps else {}),
        **({"n_compare": args.n_compare} if args.n_compare else {}),
    )
    if args.measures:
        names = similarity.list_measures() if args.measures == "all" else [m.strip() for m in args.measures.split(",")]
        for n in names:
            similarity.measure(n)  # unknown names fail here, with suggestions
        cfg = dataclasses.replace(cfg, measures=tuple(names))
    cfg = config_lib.apply_overrides(cfg, args.overrides)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        run(cfg, root=args.root, run_name=args.run, progress=not args.no_progress)
    except data_lib.DataNotFoundError as e:
        print(f"funsim quickstart: {e}")
        return 1
    return 0
