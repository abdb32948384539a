"""``funsim report usable-information --run DIR``: the five claims of the usable-information paper, from a study.

Reads ``comparisons.csv`` of a ``funsim similarity-study`` run and writes
``DIR/usable_information/``: one figure per claim, the held-out versus
in-sample gap, ``metrics.json`` (atomic) and ``summary.md`` with every number
beside the paper's (Almudévar et al., "Bridging representational and functional
similarity"; numbers it does not state are marked so).

1. **Asymmetry**: forward minus reverse task-loss stitching (relative accuracy)
   per layer pair, and the same for the closed-form held-out affine score; tail
   statistics against a normal distribution, with bootstrap intervals (resampling
   models; model pairs beside) on the excess kurtosis and the mean absolute asymmetry.
2. **Family monotonicity**: violations of orthogonal <= scaled_orthogonal <=
   affine per directed layer pair, in sample (a theorem: the families are
   nested and the in-sample score is one minus the best residual in the family;
   with the affine ridge ``r`` the bound is ``affine >= scaled_orthogonal - r *
   min(d_src, d_tgt)``, see :func:`ridge_slack`) and held out (no theorem:
   the richer family can overfit).
3. **Measures as usable-information estimators**: R^2 of each measure against
   each family's reconstruction score over directed layer pairs (bootstrap over
   model pairs, permutation null); by layer population; by architecture pair and
   leaving each architecture out (models resampled); RSA's skipped cells both ways.
4. **Granularity**: task-loss relative accuracy on the coarse task against the
   fine task (fraction above the diagonal), and the coarsened fine predictions
   (accuracy can only rise: checked, must be 0 violations).
5. **Sufficiency**: ``P(relative accuracy >= threshold | similarity bin)``
   against CKA and the held-out scaled-orthogonal score, and how often high
   functional similarity comes with low representational similarity.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

import jax
import numpy as np

from funsim.experiments import plotting  # its subplots lay out every figure (constrained)
from funsim.experiments import verdict as verdict_lib
from funsim.experiments.configs import similarity_study as study_cfg
from funsim.experiments.io import acquire_run_lock, read_json, releases_run_locks, write_json_atomic, write_text_atomic
from funsim.experiments.similarity_study import read_table
from funsim.similarity import statistics as st
from funsim.similarity import study_architectures as sa
from funsim.similarity import study_rules

__all__ = ["PAPER", "ReportOptions", "report", "ridge_slack", "verdict_statistics"]

# The paper's numbers. The released code (antonioalmudevar/bridging_similarities)
# computes the matrices, not these statistics; where the paper gives no number, None.
PAPER = {
    "r2_cka_scaled_orthogonal": (0.937, "paper, claim 3 (CKA vs the scaled-orthogonal score)"),
    "r2_rsa_scaled_orthogonal": (0.912, "paper, claim 3 (RSA vs the scaled-orthogonal score)"),
    "scale": ("58 models, 14 architectures, 6 data sets, 12,459 layer-pair comparisons", "paper"),
}
FAMILIES = ("orthogonal", "scaled_orthogonal", "affine")


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """Options of the report.

    Attributes:
      thresholds: relative accuracies counted as high functional similarity (claim 5);
        each gets its curve (high is relative to how hard stitching is, so no one value is right).
      n_resamples: bootstrap resamples.
      n_permutations: permutations of the claim-3 null.
      seed: seed of the resamples and permutations.
      bins: bins of the sufficiency curve over [0, 1].
    """

    thresholds: tuple[float, ...] = (0.9, 0.95, 0.99)
    n_resamples: int = 2000
    n_permutations: int = 2000
    seed: int = 0
    bins: int = 10


# ----------------------------------------------------------------------------- the table as dicts


class _Table:
    """``comparisons.csv`` indexed by measure: ``get(...) -> {(dataset, a, la, b, lb, direction): value}``."""

    def __init__(self, cols: dict[str, np.ndarray]):
        self.cols = cols
        self._by: dict[tuple, dict] = {}
        keys = zip(cols["measure"], cols["split"], cols["task"], cols["dataset"], cols["model_a"], cols["layer_a"],
                   cols["model_b"], cols["layer_b"], cols["direction"], cols["value"])
        for m, sp, task, ds, a, la, b, lb, d, v in keys:
            self._by.setdefault((m, sp, task), {})[(ds, a, la, b, lb, d)] = float(v)

    def measures(self) -> list[str]:
        return sorted({k[0] for k in self._by})

    def get(self, measure: str, split: str, task: str = "-") -> dict:
        return self._by.get((measure, split, task), {})

    def tasks(self, prefix: str) -> list[str]:
        return sorted({k[2] for k in self._by if k[2].startswith(prefix)})


def _directed(values: dict) -> dict:
    """A symmetric measure's ``sym`` entries as both directions."""
    out = {}
    for (ds, a, la, b, lb, d), v in values.items():
        if d == "sym":
            out[ds, a, la, b, lb, "a->b"] = v
            out[ds, a, la, b, lb, "b->a"] = v
        else:
            out[ds, a, la, b, lb, d] = v
    return out


def _join(*dicts: dict) -> tuple[list, list[np.ndarray]]:
    keys = sorted(set(dicts[0]).intersection(*dicts[1:]))
    return keys, [np.array([d[k] for k in keys]) for d in dicts]


def _clusters(keys: list) -> np.ndarray:
    """One cluster per model pair (its layer pairs and directions are not independent)."""
    return np.array([f"{k[0]}|{k[1]}|{k[3]}" for k in keys])


def ridge_slack(ridge: float, d_src: int, d_tgt: int) -> float:
    """How far the in-sample ridge-affine score may fall below the scaled-orthogonal one.

    With both sides centred and of unit Frobenius norm, the ridge solution ``W_r``
    minimises ``||Y - X W||^2 + r ||W||^2``, so its residual is at most that of the
    scaled-orthogonal map ``s Q`` restricted to the target's ``d_tgt`` coordinates
    plus ``r ||s Q||^2 <= r s^2 min(d_src, d_tgt)``, and ``s`` (the nuclear norm of
    the normalised cross-covariance) is at most 1. The restriction's residual is at
    most the padded one that the scaled-orthogonal score counts.

    Examples:
      >>> ridge_slack(1e-4, 64, 10)
      0.001
    """
    return float(ridge) * min(int(d_src), int(d_tgt))


def _widths(zoo_dir: pathlib.Path, flatten: str) -> dict:
    """``(model id, layer) -> width`` of the representations the grid compared."""
    manifest = read_json(zoo_dir / "zoo.json")
    out = {}
    for mid, e in manifest["models"].items():
        for layer, shape in e["feature_shapes"].items():
            out[mid, layer] = int(shape[-1]) if flatten == "spatial_mean" else int(np.prod(shape))
    return out


# ----------------------------------------------------------------------------- claims


def _claim1(t: _Table, opts: ReportOptions, key, out: pathlib.Path) -> dict:
    res = {}
    panels = []
    fams = [m.split("/")[1] for m in t.measures() if m.startswith("task/") and m.endswith("/relative_accuracy")]
    for label, values in [(f"task-loss stitching ({f}): relative accuracy", t.get(f"task/{f}/relative_accuracy",
                           "held_out", "fine")) for f in fams] + [("closed-form affine score, held out",
                                                                   t.get("stitch/affine", "held_out"))]:
        keys, d = study_rules.directed_asymmetry(values)
        if len(d) >= 4:
            panels.append((label, keys, d))
    for k, (label, keys, d) in enumerate(panels):
        res[label] = study_rules.asymmetry_statistics(keys, d, key=jax.random.fold_in(key, k),
                                                      n_resamples=opts.n_resamples)
    fig, axes = plotting.subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 4), squeeze=False)
    for k, (ax, (label, _, d)) in enumerate(zip(axes[0], panels)):
        ax.hist(d, bins=60, density=True, color="C0", alpha=0.8, label="layer pairs")
        sd = d.std()
        xs = np.linspace(d.min(), d.max(), 200)
        ax.plot(xs, np.exp(-0.5 * ((xs - d.mean()) / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), "k--",
                label="normal, same mean and sd")
        ax.set_yscale("log")
        if k == 0:
            ax.set_ylabel("density (log scale)")
        r = res[label]
        ax.set_title(f"{label}\nexcess kurtosis {r['excess_kurtosis']:.1f}, n = {r['n']}", fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle("Claim 1: stitching is asymmetric (heavy tails)")
    fig.supxlabel("forward - reverse score of a layer pair", fontsize=9)
    _save(fig, out / "claim1_asymmetry.png")
    return res


def _claim2(t: _Table, ridge: float, widths: dict, out: pathlib.Path) -> dict:
    res = {}
    fig, axes = plotting.subplots(1, 2, figsize=(11, 4))
    for ax, split in zip(axes, ("in_sample", "held_out")):
        keys, (o, s, a) = _join(*(t.get(f"stitch/{f}", split) for f in FAMILIES))
        slack = np.array([ridge_slack(ridge, widths[k[1], k[2]], widths[k[3], k[4]]) if k[5] == "a->b" else
                          ridge_slack(ridge, widths[k[3], k[4]], widths[k[1], k[2]]) for k in keys]) if widths else 0.0
        res[split] = {
            "directed_pairs": len(keys),
            "orthogonal_gt_scaled": st.count_violations(o, s, tol=1e-5),
            "scaled_gt_affine": st.count_violations(s, a, tol=1e-5),
            "scaled_gt_affine_beyond_ridge_bound": int(np.sum(s > a + slack + 1e-5)),
            "mean": {f: float(np.mean(v)) for f, v in zip(FAMILIES, (o, s, a))},
        }
        ax.boxplot([o, s, a], showfliers=False)
        ax.set_xticks([1, 2, 3], ["orthogonal", "scaled\northogonal", "affine"])
        r = res[split]
        ax.set_title(f"{split.replace('_', ' ')}: violations orthogonal > scaled {r['orthogonal_gt_scaled']},\n"
                     f"scaled > affine {r['scaled_gt_affine']} ({r['scaled_gt_affine_beyond_ridge_bound']} beyond "
                     "the ridge bound)", fontsize=9)
    task = {}
    fams = [f for f in FAMILIES if t.get(f"task/{f}/relative_accuracy", "held_out", "fine")]
    if len(fams) > 1:
        keys, vals = _join(*(t.get(f"task/{f}/relative_accuracy", "held_out", "fine") for f in fams))
        task = {"families": fams, "pairs": len(keys), "violations": st.count_violations(*vals, tol=1e-6),
                "mean": {f: float(np.mean(v)) for f, v in zip(fams, vals)}}
    res["task_loss"] = task
    fig.suptitle("Claim 2: similarity rises with the family's expressiveness (closed-form scores)")
    fig.supxlabel("stitcher family", fontsize=9)
    fig.supylabel("reconstruction score", fontsize=9)
    _save(fig, out / "claim2_monotonicity.png")
    return res


def _claim3(t: _Table, opts: ReportOptions, key, out: pathlib.Path) -> dict:
    measures = [m for m in t.measures() if not m.startswith(("stitch/", "task/"))]
    res: dict = {}
    k = 0
    for split in ("held_out", "in_sample"):
        for fam in FAMILIES:
            score = t.get(f"stitch/{fam}", split)
            for m in measures:
                all_keys, _ = _join(_directed(t.get(m, "all")), score)
                keys, (x, y) = _join_finite(_directed(t.get(m, "all")), score)
                if len(all_keys) > len(keys):
                    res.setdefault("undefined_cells", {})[f"{split}/{fam}/{m}"] = len(all_keys) - len(keys)
                if len(keys) < 4:
                    continue
                k += 1
                try:
                    ci = st.bootstrap(st.r2, (x, y), key=jax.random.fold_in(key, 2 * k), n_resamples=opts.n_resamples,
                                      clusters=_clusters(keys))
                    perm = st.permutation_test(x, y, key=jax.random.fold_in(key, 2 * k + 1),
                                               n_permutations=opts.n_permutations)
                except ValueError as e:  # a constant measure or score: R^2 undefined, shown as "-"
                    res.setdefault("undefined", {})[f"{split}/{fam}/{m}"] = str(e)
                    continue
                res.setdefault(split, {}).setdefault(fam, {})[m] = {
                    "r2": ci.estimate, "ci95": [ci.low, ci.high], "null_mean": perm.null_mean,
                    "null_q95": perm.null_q95, "p_value": perm.p_value, "n": len(keys)}
    measures = [m for m in measures if "@" not in m]  # the figure: the main convention (the others: tables)
    # rows: measures (the x axis of their panels, named once on the right); columns: families (the y
    # axis, named once at the top); each panel's title is its R^2
    fig, axes = plotting.subplots(len(measures), len(FAMILIES), figsize=(3.6 * len(FAMILIES) + 1.2, 2.6 * len(measures) + 0.8),
                             squeeze=False)
    for i, m in enumerate(measures):
        for j, fam in enumerate(FAMILIES):
            ax = axes[i, j]
            keys, (x, y) = _join_finite(_directed(t.get(m, "all")), t.get(f"stitch/{fam}", "held_out"))
            ax.scatter(x, y, s=3, alpha=0.3)
            r = res.get("held_out", {}).get(fam, {}).get(m)
            r2 = f"R² = {r['r2']:.3f}" if r else "R² undefined"
            ax.set_title(f"{fam}\n{r2}" if i == 0 else r2, fontsize=9)
            if j == len(FAMILIES) - 1:
                ax.yaxis.set_label_position("right")
                ax.set_ylabel(m, rotation=270, labelpad=14, fontsize=9)
    fig.suptitle("Claim 3: each measure (row; x axis) against each family's held-out reconstruction score "
                 "(column; y axis)", fontsize=10)
    fig.supxlabel("the row's measure", fontsize=9)
    fig.supylabel("the column's reconstruction score (held out)", fontsize=9)
    _save(fig, out / "claim3_r2.png")
    return res


POPULATIONS = ("all", "same kind", "dense", "conv", "narrow")
"""Layer populations of the claim-3 table: a directed pair belongs to ``dense`` / ``conv`` / ``narrow``
(at most 32 channels or features) when both its layers do; ``same kind``: dense-dense and conv-conv
pairs (the paper's code compares conv layers only with conv layers)."""


def _layer_kinds(zoo_dir: pathlib.Path) -> dict:
    """``(model id, layer) -> (kind, channels)``, kind ``"dense"`` or ``"conv"``, from the zoo's manifest."""
    manifest = read_json(zoo_dir / "zoo.json")
    return {(mid, layer): ("dense" if len(shape) == 1 else "conv", int(shape[-1]))
            for mid, e in manifest["models"].items() for layer, shape in e["feature_shapes"].items()}


def _in_population(pop: str, ka, kb) -> bool:
    if pop == "all":
        return True
    if pop == "same kind":
        return ka[0] == kb[0]
    if pop == "narrow":
        return ka[1] <= 32 and kb[1] <= 32
    return ka[0] == pop and kb[0] == pop


def _claim3_populations(t: _Table, kinds: dict, opts: ReportOptions, key) -> dict:
    """R^2 [interval] of every representational measure (each convention the run computed) against the
    in-sample scaled-orthogonal score (the paper code's protocol), per layer population."""
    if not kinds:
        return {}
    score = t.get("stitch/scaled_orthogonal", "in_sample")
    res: dict = {}
    k = 0
    for m in (m for m in t.measures() if not m.startswith(("stitch/", "task/"))):
        keys, (x, y) = _join_finite(_directed(t.get(m, "all")), score)
        for pop in POPULATIONS:
            sel = np.array([_in_population(pop, kinds[kk[1], kk[2]], kinds[kk[3], kk[4]])
                            if (kk[1], kk[2]) in kinds and (kk[3], kk[4]) in kinds else False for kk in keys], bool)
            k += 1
            pk = [kk for kk, s_ in zip(keys, sel) if s_]
            r = _interval_stat(st.r2, (x[sel], y[sel]), pk, jax.random.fold_in(key, k), opts) if sel.size else \
                _undefined("no pairs")
            res.setdefault(m, {})[pop] = {**r, "n": int(sel.sum()), "models": len({(kk[1], kk[3]) for kk in pk})}
    return res


def _claim3_architectures(t: _Table, zoo_dir: pathlib.Path, cfg: dict, opts: ReportOptions, key, out) -> dict:
    """Claim 3 by architecture, and RSA's cells skipped for width both ways (:mod:`similarity.study_architectures`)."""
    manifest = read_json(zoo_dir / "zoo.json")["models"]
    kw = {"architectures": sa.architecture_map(manifest), "key": key, "n_resamples": opts.n_resamples}
    dense, score = sa.dense_architectures(manifest, kw["architectures"]), t.get("stitch/scaled_orthogonal", "in_sample")
    res, mats = {k: {} for k in ("architectures", "leave_one_out", "families", "rsa_skipped")}, {}
    for m in (m for m in t.measures() if not m.startswith(("stitch/", "task/"))):
        keys, (x, y) = _join(_directed(t.get(m, "all")), score)
        keys, x, y = [k for k, v in zip(keys, y) if np.isfinite(v)], x[np.isfinite(y)], y[np.isfinite(y)]
        ma, mb, ok = np.array([k[1] for k in keys], str), np.array([k[3] for k in keys], str), np.isfinite(x)
        pairs = sa.architecture_pair_r2(x[ok], y[ok], ma[ok], mb[ok], **kw)
        res["architectures"][m] = {" x ".join(p): c for p, c in pairs.items()}
        res["leave_one_out"][m] = sa.leave_one_architecture_out(x[ok], y[ok], ma[ok], mb[ok], **kw)
        res["families"][m] = sa.family_split_r2(x[ok], y[ok], ma[ok], mb[ok], dense, **kw)
        mats.update({m: pairs} if m in ("cka/linear", "rsa/correlation/spearman") else {})
        if m.startswith("rsa/"):
            w = _widths(zoo_dir, m.split("@")[1].split("/")[1] if "@" in m else cfg["flatten"])
            sk = sa.rsa_skipped_mask(x, [w.get(k[1:3], 0) for k in keys], [w.get(k[3:5], 0) for k in keys],
                                     limit=cfg.get("rsa_max_features"))
            res["rsa_skipped"][m] = sa.r2_skipped_both_ways(x, y, ma, mb, sk, key=key, n_resamples=opts.n_resamples)
    names = sorted({a for cells in mats.values() for p in cells for a in p})
    mats = {f"{m}: R² per architecture pair": sa.pair_matrix(c, names)[1] for m, c in mats.items()}
    if mats:
        plotting.heatmap_grid(mats, names, names, out / "claim3_architectures.png", xlabel="architecture",
                              suptitle="Claim 3 by architecture pair: R² against the in-sample scaled-orthogonal score",
                              ylabel="architecture", ncols=1, ranges=dict.fromkeys(mats, (0, 1)), panel_size=(8.5, 5))
    return {f"claim3_{k}": v for k, v in res.items()}


def _claim3_spatial(t: _Table, opts: ReportOptions, key) -> dict:
    """R^2 [interval] of every measure (and of ours) against the paper code's conv score (in-sample scaled-orthogonal
    1x1 map over spatial positions), beside R^2 against ours (the pooled in-sample scaled-orthogonal score)."""
    spatial, ours = t.get("stitch/spatial/scaled_orthogonal", "in_sample"), t.get("stitch/scaled_orthogonal", "in_sample")
    rows = {m: _directed(t.get(m, "all")) for m in t.measures() if spatial and not m.startswith(("stitch/", "task/"))}
    res: dict = {}
    for k, (m, v) in enumerate({**rows, "ours (stitch/scaled_orthogonal, in sample)": ours}.items() if rows else ()):
        keys, (x, s, o) = _join_finite(v, spatial, ours)
        res[m] = {"n": len(keys), **{name: _interval_stat(st.r2, (x, y), keys, jax.random.fold_in(key, 2 * k + i), opts)
                                     for i, (name, y) in enumerate((("spatial", s), ("ours", o))) if v is not ours or i == 0}}
    return res


def _claim3_spatial_lines(res: dict) -> list[str]:
    cell = lambda c: "-" if c is None or c.get("value") is None else \
        f"{c['value']:.3f} {_ci(c['interval'])}"
    return ["**Against the paper code's conv score** (conv-conv pairs; R^2 [95% CI] against "
            "`stitch/spatial/scaled_orthogonal`: the source map pooled to the target's size, a closed-form 1x1 map over "
            "positions, uncentred, in sample; beside R^2 against ours, the pooled in-sample scaled-orthogonal score; "
            "\"-\": no interval, the pairs hold fewer than 3 models):", "",
            "| measure | paper code's conv score | ours (pooled) | n |", "|---|---|---|---:|",
            *[f"| {k} | {cell(r.get('spatial'))} | {cell(r.get('ours'))} | {r['n']} |" for k, r in res.items()],
            ""] if res else []


def _claim4(t: _Table, out: pathlib.Path) -> dict:
    res = {}
    fig, axes = plotting.subplots(1, 2, figsize=(11, 4.5))
    fams = [m.split("/")[1] for m in t.measures() if m.startswith("task/") and m.endswith("/relative_accuracy")]
    for fam in fams:
        fine = t.get(f"task/{fam}/relative_accuracy", "held_out", "fine")
        fine_acc = t.get(f"task/{fam}/accuracy", "held_out", "fine")
        for task in t.tasks("coarse:") + t.tasks("coarse_head:"):
            g = task.split(":", 1)[1]
            label = f"{fam}/{g}" if task.startswith("coarse:") else f"{fam}/{g} (new head)"
            keys, (f, c) = _join(fine, t.get(f"task/{fam}/relative_accuracy", "held_out", task))
            if not keys:
                continue
            kc, (fa, ca) = _join(fine_acc, t.get(f"task/{fam}/accuracy", "held_out", f"coarsened:{g}"))
            dss = sorted({k[0] for k in keys})
            low = f < 0.95
            res[label] = {
                "pairs_below_095": int(low.sum()), "mean_coarse_minus_fine_below_095":
                    float(np.mean(c[low] - f[low])) if low.any() else None,
                "datasets": dss, "pairs": len(keys),
                "fraction_coarse_ge_fine": float(np.mean(c >= f)),
                "mean_fine": float(np.mean(f)), "mean_coarse": float(np.mean(c)),
                "coarsened_accuracy_below_fine": int(np.sum(ca < fa - 1e-12)), "coarsened_pairs": len(kc),
            }
            axes[0].scatter(f, c, s=6, alpha=0.5, label=f"{label} ({', '.join(dss)})")
            axes[1].scatter(fa, ca, s=6, alpha=0.5, label=f"{fam}, {g}")
    for ax, (xl, yl, title) in zip(axes, [
            ("relative accuracy, fine task", "relative accuracy, coarse task (stitcher retrained)",
             "stitchers trained on each task (empirical)"),
            ("stitched accuracy, fine", "same predictions, coarsened", "fine stitcher's predictions coarsened (a theorem)")]):
        ax.plot([0, 1.2], [0, 1.2], "k--", lw=1, label="diagonal")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Claim 4: coarse-task functional similarity against fine-task")
    _save(fig, out / "claim4_granularity.png")
    return res


def _claim5(t: _Table, opts: ReportOptions, out: pathlib.Path) -> dict:
    res = {}
    edges = np.linspace(0.0, 1.0, opts.bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    fams = [m.split("/")[1] for m in t.measures() if m.startswith("task/") and m.endswith("/relative_accuracy")]
    xs = {"cka/linear": _directed(t.get("cka/linear", "all")),
          "stitch/scaled_orthogonal (held out)": t.get("stitch/scaled_orthogonal", "held_out")}
    fig, axes = plotting.subplots(1, 2, figsize=(11, 4))
    for k, fam in enumerate(fams):
        func = t.get(f"task/{fam}/relative_accuracy", "held_out", "fine")
        for ax, (name, rep) in zip(axes, xs.items()):
            keys, (x, y) = _join(rep, func)
            if not keys:
                continue
            xc = np.clip(x, 0.0, 1.0)
            top, low = xc >= edges[-2], xc < 0.5
            for thr in opts.thresholds:
                hit = y >= thr
                counts, prob = st.binned_probability(xc, hit, edges=edges)
                res[f"{fam}/{name}/>={thr:g}"] = {
                    "pairs": len(keys), "threshold": thr, "edges": edges.tolist(), "counts": counts.tolist(),
                    "probability": [None if np.isnan(p) else float(p) for p in prob],
                    "p_high_given_top_bin": float(hit[top].mean()) if top.any() else None,
                    "p_high_given_below_0.5": float(hit[low].mean()) if low.any() else None,
                    "p_high_overall": float(hit.mean()),
                    "fraction_high_with_similarity_below_0.5": float(np.mean(low[hit])) if hit.any() else None,
                    "high_with_similarity_below_0.5": int(np.sum(low & hit)),
                }
                line, = ax.plot(centres, prob, "o-", ms=3, label=f"{fam}, relative accuracy >= {thr:g}")
            for cx, n in zip(centres, counts):  # one row of counts per family, in its colour
                ax.annotate(str(n), (cx, 0.02 + 0.05 * k), fontsize=6, ha="center", color=line.get_color())
            ax.set_xlabel(f"representational similarity: {name}")
            ax.set_ylim(0, 1.05)
            ax.legend(fontsize=7)
    axes[0].set_ylabel("P(high functional similarity | bin)")
    fig.suptitle("Claim 5: representational similarity is sufficient, not necessary\n"
                 "(binned; numbers: pairs per bin)")
    _save(fig, out / "claim5_sufficiency.png")
    return res


def _gap(t: _Table, out: pathlib.Path) -> dict:
    res = {}
    fig, ax = plotting.subplots(figsize=(6, 4))
    for fam in FAMILIES:
        keys, (ins, held) = _join(t.get(f"stitch/{fam}", "in_sample"), t.get(f"stitch/{fam}", "held_out"))
        if not keys:
            continue
        gap = ins - held
        res[fam] = {"pairs": len(keys), "mean_in_sample": float(ins.mean()), "mean_held_out": float(held.mean()),
                    "mean_gap": float(gap.mean()), "median_gap": float(np.median(gap)),
                    "q95_gap": float(np.quantile(gap, 0.95)), "fraction_gap_gt_0.1": float(np.mean(gap > 0.1))}
        ax.hist(gap, bins=60, alpha=0.5, label=fam)
    ax.set_xlabel("in-sample minus held-out reconstruction score")
    ax.set_ylabel("directed layer pairs")
    ax.set_title("Fitting and scoring on the same rows inflates the score")
    ax.legend()
    _save(fig, out / "held_out_gap.png")
    return res


def _save(fig, path):
    return plotting.save(fig, path)


# ----------------------------------------------------------------------------- verdict statistics


def _undefined(reason: str) -> dict:
    return {"value": None, "reason": reason}


def _interval_stat(stat, arrays, keys, key, opts: ReportOptions, *, min_n: int = 4) -> dict:
    """``{"value", "interval" (resampling models), "interval_pairs" (model pairs)}``, or undefined with the reason."""
    return study_rules.model_interval(stat, arrays, keys, key=key, n_resamples=opts.n_resamples, min_n=min_n)


def _order_share(chains: list[np.ndarray], tol: float = 0.01) -> float:
    bad = np.zeros(len(chains[0]), bool)
    for lo, hi in zip(chains[:-1], chains[1:]):
        bad |= lo > hi + tol
    return float(np.mean(bad))


def verdict_statistics(t: _Table, opts: ReportOptions, key, n_test: dict | None = None) -> dict:
    """The numbers the study's verdict rules judge (``similarity_study.STATISTICS``).

    Each is a number, ``{"value", "interval"}`` (95% bootstrap over model pairs; over models in
    ``similarity.study_rules.noise_statistics``, given ``n_test`` rows per data set), or undefined with a reason.
    """
    out: dict = {}
    task_fams = [f for f in FAMILIES if t.get(f"task/{f}/relative_accuracy", "held_out", "fine")]
    fine_all = np.array([v for f in task_fams for v in t.get(f"task/{f}/relative_accuracy", "held_out", "fine").values()])
    fine_all = fine_all[np.isfinite(fine_all)]
    if len(fine_all):
        out["share_below_095"] = float(np.mean(fine_all < 0.95))
        out["pairs_below_095"] = int(np.sum(fine_all < 0.95))
    else:
        out["share_below_095"] = out["pairs_below_095"] = _undefined("no task-loss stitching in this run")
    k = 0

    def nxt():
        nonlocal k
        k += 1
        return jax.random.fold_in(key, k)

    for fam in FAMILIES:
        keys, d = study_rules.directed_asymmetry(t.get(f"task/{fam}/relative_accuracy", "held_out", "fine"))
        name = f"asymmetry_kurtosis_task_{fam}"
        out[name] = (_undefined(f"no task-loss stitching of the {fam} family in this run") if not len(d) else
                     _interval_stat(st.excess_kurtosis, (d,), [(*kk, None) for kk in keys], nxt(), opts))
    keys, d = study_rules.directed_asymmetry(t.get("stitch/affine", "held_out"))
    out["asymmetry_kurtosis_closed_form"] = _interval_stat(st.excess_kurtosis, (d,), [(*kk, None) for kk in keys],
                                                           nxt(), opts)
    keys, chain = _join(*(t.get(f"stitch/{f}", "held_out") for f in FAMILIES))
    out["order_violations_held_out"] = _order_share(chain) if keys else _undefined("no closed-form scores")
    if len(task_fams) >= 2:
        keys, chain = _join(*(t.get(f"task/{f}/relative_accuracy", "held_out", "fine") for f in task_fams))
        out["order_violations_task"] = _order_share(chain) if keys else _undefined("no pair stitched by every family")
    else:
        out["order_violations_task"] = _undefined(f"task-loss families in this run: {', '.join(task_fams) or 'none'}")
    score = t.get("stitch/scaled_orthogonal", "in_sample")
    for name, m in (("r2_cka", "cka/linear"), ("r2_rsa", "rsa/correlation/spearman")):
        keys, (x, y) = _join_finite(_directed(t.get(m, "all")), score)
        out[name] = _interval_stat(st.r2, (x, y), keys, nxt(), opts)
    keys, (a, b, c, y) = _join_finite(*(_directed(t.get(m, "all")) for m in ("cka/linear", "rsa/correlation/spearman",
                                                                             "svcca")), score)
    out["r2_min_cka_rsa_minus_svcca"] = _interval_stat(st.r2_margin, (a, b, c, y), keys, nxt(), opts)
    for name, prefix in (("granularity_coarse_minus_fine_summed", "coarse:"),
                         ("granularity_coarse_minus_fine_head", "coarse_head:")):
        diffs, dkeys = [], []
        for fam in task_fams:
            fine = t.get(f"task/{fam}/relative_accuracy", "held_out", "fine")
            for task in t.tasks(prefix):
                keys, (f, c) = _join_finite(fine, t.get(f"task/{fam}/relative_accuracy", "held_out", task))
                low = f < 0.95
                diffs += list(c[low] - f[low])
                dkeys += [kk for kk, lo in zip(keys, low) if lo]
        out[name] = (_undefined(f"no {prefix[:-1].replace('_', ' ')} task stitched below the ceiling in this run")
                     if not diffs else _interval_stat(st.weighted_mean, (np.array(diffs),), dkeys, nxt(), opts,
                                                      min_n=2))
    func = {kk: v for f in task_fams for kk, v in
            ((kk + (f,), v) for kk, v in t.get(f"task/{f}/relative_accuracy", "held_out", "fine").items())}
    cka = _directed(t.get("cka/linear", "all"))
    pairs = [(cka[kk[:-1]], v) for kk, v in func.items() if kk[:-1] in cka and np.isfinite(v)]
    if pairs:
        x, y = np.array(pairs).T
        top, high = x >= 0.9, y >= 0.95
        out["sufficiency_p_high_given_cka_090"] = (float(high[top].mean()) if top.any() else
                                                   _undefined("no pair with linear CKA >= 0.9"))
        out["high_with_low_cka_share"] = (float(np.mean(x[high] < 0.5)) if high.any() else
                                          _undefined("no pair with relative accuracy >= 0.95"))
    else:
        out["sufficiency_p_high_given_cka_090"] = out["high_with_low_cka_share"] = _undefined(
            "no task-loss stitching with linear CKA in this run")
    return {**out, **study_rules.noise_statistics(t, n_test, key=nxt(), n_resamples=opts.n_resamples,
                                                  **study_cfg.NOISE_PARAMETERS)}


def _join_finite(*dicts: dict) -> tuple[list, list[np.ndarray]]:
    """:func:`_join` keeping only the keys where every value is finite (undefined cells are NaN)."""
    keys, vals = _join(*dicts)
    ok = np.ones(len(keys), bool)
    for v in vals:
        ok &= np.isfinite(v)
    return [k for k, o in zip(keys, ok) if o], [v[ok] for v in vals]


# ----------------------------------------------------------------------------- summary


def _added_rules(added: list, primary: list) -> list[str]:
    """The verdicts of the committed rules the run's config lacks, and the multiplicity of the primary rules."""
    L = ["", "Rules committed after this run's config was written (not in its `config.json`):", "",
         *verdict_lib.markdown_table(added)] if added else []
    L += ["", "Multiplicity: Holm-Bonferroni over the primary rules that tested something (one-sided bootstrap p; a "
          "label stands at Holm p <= 0.025); the other rules are secondary, each alone at its 95% interval.", "",
          "| primary rule | label | p | Holm p | stands |", "|---|---|---:|---:|---|"]
    return L + [f"| {r['claim']} | {r['label']} | {_fmt(r['p'], 4)} | {_fmt(r['p_holm'], 4)} | {r['stands']} |"
                for r in primary]


def _fmt(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _ci(iv):
    """``[low, high]``, or "-" where there is none (None, or NaN: e.g. one model pair)."""
    return "-" if iv is None or any(v != v for v in iv) else f"[{iv[0]:.3f}, {iv[1]:.3f}]"


def _claim1_lines(claim1: dict) -> list[str]:
    L = ["", "## Claim 1: stitching is asymmetric", "", "Forward minus reverse score per layer pair stitched both "
         "ways (A->B vs B->A); task-loss rows are the stitching accuracy itself, the closed form its proxy.", "",
         "| quantity | n | sd | excess kurtosis [95% CI models] (pairs) (normal: 0) | mean abs [CI models] (pairs) | "
         "beyond 3 sd (normal: 0.0027) | (q99-q01)/(q75-q25) (normal: 3.45) | max abs | paper |",
         "|---|---:|---:|---|---|---:|---:|---:|---|"]
    for label, r in claim1.items():
        L.append(f"| {label} | {r['n']} | {r['sd']:.3f} | {r['excess_kurtosis']:.2f} {_ci(r['excess_kurtosis_ci95'])} "
                 f"({_ci(r['excess_kurtosis_ci95_pairs'])}) | {r['mean_abs']:.3f} {_ci(r['mean_abs_ci95'])} "
                 f"({_ci(r['mean_abs_ci95_pairs'])}) | {r['beyond_3sd']:.4f} | {r['quantile_ratio']:.2f} | "
                 f"{r['max_abs']:.3f} | heavy-tailed (figure; no number given) |")
        L += [f"- {label}, {name}: undefined: {why}" for name, why in r.get("undefined", {}).items()]
    return L


def _architecture_lines(m: dict) -> list[str]:
    main = [k for k in ("cka/linear", "rsa/correlation/spearman") if k in m.get("claim3_architectures", {})]
    cell = lambda c: "-" if c is None else f"- (n {c['n']}: {c['reason']})" if c["value"] is None else (
        f"{c['value']:.3f} {_ci(c['interval'])} (n {c['n']}, {c['models']} models)"
        + ("" if c.get("change") is None else f", change {c['change']:+.3f} {_ci(c['change_interval'])}"))
    pops: dict = {}
    for k in main:
        lo = m["claim3_leave_one_out"][k]
        for p, c in [*m["claim3_architectures"][k].items(), ("all pairs", lo["all"]),
                     *((f"without {a}", c) for a, c in lo["without"].items()), *m["claim3_families"][k].items()]:
            pops.setdefault(p, {})[k] = c
    L = ["", "**By architecture** (R^2 [95% CI resampling models] (n directed pairs, models) against the in-sample "
         "scaled-orthogonal score; `a x b`: pairs of a model of a with one of b; `without a`: no model of a, change "
         "from all pairs with its paired interval; `dense_only`: both architectures all-dense, `with_conv` the "
         "others; figure claim3_architectures.png; every measure and convention in metrics.json).", "",
         "| pairs | " + " | ".join(main) + " |", "|---|" + "---|" * len(main)] if main else []
    L += [f"| {p} | " + " | ".join(cell(r.get(k)) for k in main) + " |" for p, r in pops.items()]
    L += ["", "**RSA's cells skipped for width** (NaN where either layer has more than `rsa_max_features` "
          "features in the row's convention: the table does not tell them from other undefined cells, so the "
          "widths do), left out and set to 0 (the paper code's 0.0):", "",
          "| measure | left out | set to 0 | skipped cells | other undefined cells |", "|---|---|---|---:|---:|"]
    return L + [f"| {k} | {cell(r['excluded'])} | {cell(r['as_zero'])} | {r['skipped_cells']} | "
                f"{r['other_undefined_cells']} |" for k, r in m.get("claim3_rsa_skipped", {}).items()] + [""]


def _summary(run_dir: pathlib.Path, cfg: dict, m: dict, opts: ReportOptions, verdicts: list, added: list) -> str:
    L = [f"# Usable information: the five claims on `{run_dir}`", "",
         f"Study config `{cfg['name']}` on zoo `{cfg['zoo']}`; {m['rows']} comparisons. The paper: "
         f"{PAPER['scale'][0]}. Intervals are 95% bootstrap intervals ({opts.n_resamples} resamples) resampling "
         "models, the intervals every rule reads (since 2026-12-06; before, the first 13 rules read intervals "
         "resampling model pairs, kept beside as `pairs`), except claim 3's main table (model pairs); R^2 is the "
         "squared Pearson correlation (the R^2 of a least-squares line).", ""]
    L += ["## Verdicts", ""]
    if verdicts:
        L += ["Each label is computed by code from the rule in the run's config (`verdict_rules`), applied to the "
              "statistic named in the rule.", ""]
        L += verdict_lib.markdown_table(verdicts)
    else:
        L.append("This run's config has no verdict rules (a run from before they were added): no labels.")
    L += ["", "| statistic | interval resampling models (the rules read it) | resampling model pairs |", "|---|---|---|"]
    L += [f"| {k} | {_ci(v['interval'])} | {_ci(v['interval_pairs'])} |" for k, v in m["verdict_statistics"].items()
          if isinstance(v, dict) and "interval_pairs" in v]
    L += _added_rules(added, m["primary"])
    L += _claim1_lines(m["claim1"])
    L += ["", "## Claim 2: orthogonal <= scaled orthogonal <= affine", "",
          "| split | directed layer pairs | orth > scaled | scaled > affine | beyond the ridge bound | mean orth / scaled / affine |",
          "|---|---:|---:|---:|---:|---|"]
    for split in ("in_sample", "held_out"):
        r = m["claim2"][split]
        L.append(f"| {split} | {r['directed_pairs']} | {r['orthogonal_gt_scaled']} | {r['scaled_gt_affine']} | "
                 f"{r['scaled_gt_affine_beyond_ridge_bound']} | " + " / ".join(f"{v:.3f}" for v in r["mean"].values()) + " |")
    tl = m["claim2"]["task_loss"]
    if tl:
        L.append(f"\nTask-loss stitching ({' <= '.join(tl['families'])}): {tl['violations']} violations in "
                 f"{tl['pairs']} directed pairs (held out, trained by gradient descent: no theorem).")
    L += ["", "In sample the order holds by construction, so it is no finding: a theorem (nested families; the "
          "in-sample score is one minus the smallest residual in the family); with the affine ridge r it holds up "
          "to r min(d_src, d_tgt) (the ridge bound). The empirical content is the held-out order and the "
          "task-loss order (rules 2a and 2b in the verdicts): there the richer family can overfit or optimise "
          "worse.", "",
          "## Claim 3: R^2 of each measure against each family's reconstruction score", ""]
    for split in ("in_sample", "held_out"):
        if split not in m["claim3"]:
            continue
        fams = list(m["claim3"][split])
        L += [f"**{split.replace('_', ' ')}** scores:", "",
              "| measure | " + " | ".join(f"{f} R^2 [95% CI] (null q95)" for f in fams) + " | paper (scaled orthogonal) |",
              "|---|" + "---|" * len(fams) + "---|"]
        for meas in m["claim3"][split][fams[0]]:
            paper = {"cka/linear": "0.937", "rsa/correlation/spearman": "0.912"}.get(meas, "not given")
            cells = []
            for f in fams:
                r = m["claim3"][split][f].get(meas)
                cells.append("-" if r is None else f"{r['r2']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
                             f"({r['null_q95']:.3f})")
            L.append(f"| {meas} | " + " | ".join(cells) + f" | {paper} |")
        L.append("")
    L += [f"- R^2 undefined for {cell}: {why}" for cell, why in m["claim3"].get("undefined", {}).items()]
    L += [f"- {cell}: {n} directed pairs undefined (NaN: a layer wider than the run's feature limit, or a cell the "
          "grid could not define), left out" for cell, n in m["claim3"].get("undefined_cells", {}).items()]
    pops = m.get("claim3_populations", {})
    if pops:
        L += ["", "**By layer population and feature convention** (R^2 [95% CI] against the in-sample "
              "scaled-orthogonal score, the paper code's protocol; `measure@point/flatten`: an extra convention, "
              "the main grid's otherwise; n: directed pairs; \"-\" for the interval: the pairs hold fewer than 3 "
              "models). The paper: CKA 0.937, RSA 0.912.", "",
              "| measure | " + " | ".join(POPULATIONS) + " |", "|---|" + "---|" * len(POPULATIONS)]
        for meas, r in pops.items():
            cells = []
            for pop in POPULATIONS:
                c = r[pop]
                cells.append(f"- (n {c['n']})" if c.get("value") is None else
                             f"{c['value']:.3f} {_ci(c['interval'])} (n {c['n']})")
            L.append(f"| {meas} | " + " | ".join(cells) + " |")
        L.append("")
        main = f"{cfg.get('activation_point', 'pre_activation')}/{cfg.get('flatten', 'flatten')}"
        if any("@" in meas for meas in pops):
            L += [f"Every row is scored against the main grid's score, on its own reading of the layers "
                  f"(`{main}`). A row of another convention is like for like only where both conventions read "
                  "a layer alike (conv maps: same `flatten`; dense layers that end in an activation: same point); "
                  "elsewhere it asks how well the measure on one reading predicts the score on the other (e.g. "
                  "flattened maps against pooled ones), which is not the paper code's protocol: that scores "
                  "conv pairs on the maps themselves, with a trained 1x1 convolution.", ""]
    L += _architecture_lines(m)
    L += _claim3_spatial_lines(m.get("claim3_spatial", {}))
    L += [f"The paper's R^2 against the scaled-orthogonal score: CKA {PAPER['r2_cka_scaled_orthogonal'][0]}, "
          f"RSA {PAPER['r2_rsa_scaled_orthogonal'][0]}. "
          "The paper's code scores in sample (its numbers compare with the in-sample rows); the null column is the "
          f"95th percentile of R^2 with the scores permuted ({opts.n_permutations} permutations).", "",
          "## Claim 4: granularity", "",
          "Readouts: `family/grouping`: the target's fine softmax summed within each group; `(new head)`: a new "
          "head trained on the target's frozen penultimate features (the paper code's). Pairs below the ceiling: "
          "fine relative accuracy < 0.95 (the verdict uses only these).", "",
          "| family / grouping | data sets | directed pairs | coarse >= fine (retrained) | mean fine | mean coarse | "
          "pairs below 0.95 | mean coarse - fine there | coarsened accuracy below fine (theorem: 0) | paper |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for k, r in m["claim4"].items():
        L.append(f"| {k} | {', '.join(r['datasets'])} | {r['pairs']} | {r['fraction_coarse_ge_fine']:.3f} | "
                 f"{r['mean_fine']:.3f} | {r['mean_coarse']:.3f} | {r['pairs_below_095']} | "
                 f"{_fmt(r['mean_coarse_minus_fine_below_095'])} | {r['coarsened_accuracy_below_fine']} of "
                 f"{r['coarsened_pairs']} | coarse upper-bounds fine on CIFAR-100 (figure; no number given) |")
    L += ["", "Coarsening the predictions of one stitched model can only raise its accuracy (a correct fine label "
          "has a correct group): a theorem, checked. The relative accuracy of a stitcher retrained on the coarse "
          "labels is a ratio of two accuracies that both rise, so coarse >= fine there is an empirical claim.", "",
          "## Claim 5: sufficiency (high functional similarity: relative accuracy >= threshold)", "",
          "| family / representational measure / threshold | pairs | P(high) overall | P(high \\| similarity >= 0.9) | "
          "P(high \\| similarity < 0.5) | high pairs with similarity < 0.5 | paper |",
          "|---|---:|---:|---:|---:|---:|---|"]
    for k, r in m["claim5"].items():
        frac = r["fraction_high_with_similarity_below_0.5"]
        L.append(f"| {k} | {r['pairs']} | {r['p_high_overall']:.3f} | {_fmt(r['p_high_given_top_bin'])} | "
                 f"{_fmt(r['p_high_given_below_0.5'])} | {r['high_with_similarity_below_0.5']} ({_fmt(frac)} of high) | "
                 "P(high) -> 1 as similarity -> 1 (figure; no number given) |")
    L += ["", "## Held out versus in sample (beyond the paper)", "",
          "| family | directed pairs | mean in sample | mean held out | mean gap | median gap | 95th pct gap | gap > 0.1 |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for f, r in m["gap"].items():
        L.append(f"| {f} | {r['pairs']} | {r['mean_in_sample']:.3f} | {r['mean_held_out']:.3f} | {r['mean_gap']:.3f} | "
                 f"{r['median_gap']:.3f} | {r['q95_gap']:.3f} | {r['fraction_gap_gt_0.1']:.3f} |")
    L += ["", "Figures: claim1_asymmetry.png, claim2_monotonicity.png, claim3_r2.png, claim3_architectures.png, "
          "claim4_granularity.png, claim5_sufficiency.png, held_out_gap.png.", ""]
    return "\n".join(L)


# ----------------------------------------------------------------------------- entry point


@releases_run_locks
def report(run_dir: str | pathlib.Path, /, *, options: ReportOptions = ReportOptions(),
           log: Callable[[str], None] = print) -> dict:
    """Write ``run_dir/usable_information/`` (figures, metrics.json, summary.md); returns the metrics.

    Raises:
      FileNotFoundError: ``run_dir`` has no ``comparisons.csv``.
    """
    run_dir = pathlib.Path(run_dir)
    path = run_dir / "comparisons.csv"
    if not path.is_file():
        raise FileNotFoundError(f"No {path}: run `funsim similarity-study` first (or pass its run directory).")
    acquire_run_lock(run_dir)  # the study must not be writing its table while we read it
    cfg = read_json(run_dir / "config.json")
    metrics_study = read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else {}
    zoo_dir = pathlib.Path(metrics_study.get("zoo", ""))
    widths = _widths(zoo_dir, cfg["flatten"]) if (zoo_dir / "zoo.json").is_file() else {}
    cols = read_table(path)
    t = _Table(cols)
    out = run_dir / "usable_information"
    key = jax.random.key(options.seed)
    m = {"rows": int(len(cols["value"])), "options": dataclasses.asdict(options)}
    m["claim1"] = _claim1(t, options, jax.random.fold_in(key, 1), out)
    m["claim2"] = _claim2(t, float(cfg["affine_ridge"]), widths, out)
    m["claim3"] = _claim3(t, options, jax.random.fold_in(key, 3), out)
    kinds = _layer_kinds(zoo_dir) if (zoo_dir / "zoo.json").is_file() else {}
    m["claim3_populations"] = _claim3_populations(t, kinds, options, jax.random.fold_in(key, 33))
    if kinds:
        m.update(_claim3_architectures(t, zoo_dir, cfg, options, jax.random.fold_in(key, 34), out))
    m["claim3_spatial"] = _claim3_spatial(t, options, jax.random.fold_in(key, 35))
    m["claim4"] = _claim4(t, out)
    m["claim5"] = _claim5(t, options, out)
    m["gap"] = _gap(t, out)
    m["paper"] = {k: list(v) for k, v in PAPER.items()}
    n_test = {k: d.get("n_test") for k, d in read_json(zoo_dir / "zoo.json")["datasets"].items()} if widths else None
    m["verdict_statistics"] = stats = verdict_statistics(t, options, jax.random.fold_in(key, 7), n_test)
    rules = verdict_lib.coerce_rules(cfg.get("verdict_rules", ()))
    added = tuple(r for r in study_cfg.RULES if r.claim not in {x.claim for x in rules})  # committed since the run
    verdicts = [verdict_lib.judge_all(r, stats) for r in (rules, added)]
    m["verdicts"], m["verdicts_added"] = ([v.to_json() for v in vs] for vs in verdicts)
    m["primary"] = study_rules.primary_holm(verdicts[0] + verdicts[1], stats["bootstrap_p"], study_cfg.PRIMARY)
    write_json_atomic(out / "metrics.json", m)
    write_text_atomic(out / "summary.md", _summary(run_dir, cfg, m, options, *verdicts))
    log(f"[report] {out}/summary.md and its figures")
    return m
