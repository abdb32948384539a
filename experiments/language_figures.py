"""The figures of ``funsim language``: checkpoint x checkpoint heatmaps with their K-block boundaries,
similarity to the final checkpoint and n-gram agreement over training.

Each function draws PNGs and returns their paths (:func:`experiments.plotting.save`).
"""

from __future__ import annotations

import math

import numpy as np

from funsim.experiments import plotting
from funsim.experiments.configs.language import MATRICES

__all__ = ["matrix_figure", "curves_figure", "run_figures"]


def matrix_figure(panels, steps, path, *, suptitle):
    """Heatmaps (title -> (matrix, boundary indices)) with the K-block boundaries drawn."""
    n = len(panels)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plotting.subplots(nrows, ncols, figsize=(4.3 * ncols, 3.8 * nrows), squeeze=False,
                                  layout="compressed")  # square heatmaps
    ticks = np.unique(np.linspace(0, len(steps) - 1, min(6, len(steps))).round().astype(int))
    for k, (ax, (title, (mat, starts))) in enumerate(zip(axes.ravel(), panels.items())):
        m = np.asarray(mat, float)
        off = m[~np.eye(len(m), dtype=bool)] if len(m) > 1 else m.ravel()
        lo = float(np.nanmin(off)) if off.size else 0.0
        im = ax.imshow(m, vmin=min(lo, 0.99), vmax=1.0, cmap="viridis", interpolation="nearest")
        for b in starts:
            ax.axhline(b - 0.5, color="red", lw=1.2)
            ax.axvline(b - 0.5, color="red", lw=1.2)
        ax.set_xticks(ticks, [str(steps[i]) for i in ticks], rotation=45, fontsize=7)
        ax.set_yticks(ticks, [str(steps[i]) for i in ticks], fontsize=7)
        plotting.label_shared_axes(ax, k, ncols, n, xlabel="checkpoint (training step)",
                                   ylabel="checkpoint (training step)")
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(suptitle, fontsize=10)
    return plotting.save(fig, path)


def curves_figure(steps, series, path, *, title, ylabel):
    """Curves over training steps (log axis; step 0 drawn at 1), one per ``series`` entry."""
    fig, ax = plotting.subplots(figsize=(6, 3.6))
    x = np.maximum(np.asarray(steps), 1)
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", ms=3, label=name)
    ax.set_xscale("log")
    ax.set(title=title, xlabel="training step (log; step 0 drawn at 1)", ylabel=ylabel)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return plotting.save(fig, path)


def run_figures(cfg, out, steps, matrices, blocks, closure_sim, closure_idx, ngram, history) -> list:
    """The run's figures in ``out``: training curves, every matrix with its K-block segmentation (K = the largest
    of ``cfg.segments``), closure beside Monte Carlo (if computed), similarity to the final checkpoint, n-grams."""
    k = max(cfg.segments)
    panels = {f"{MATRICES[key]}\nK={k} blocks, explained {blocks[key].get(k, {}).get('explained', float('nan')):.2f}":
              (m, [steps.index(s) for s in blocks[key].get(k, {}).get("boundaries_steps", [])])
              for key, m in matrices.items()}
    figs = [plotting.training_curves({"transformer": history}, out / "training.png",
                                     title="2-layer bilinear-attention transformer, Shakespeare characters")]
    figs.append(matrix_figure(panels, steps, out / "similarity_matrices.png",
                               suptitle=f"checkpoint x checkpoint similarity (context {cfg.context}); red: K-block segmentation"))
    if closure_sim is not None:
        sub_steps = [steps[i] for i in closure_idx]
        mc = matrices["tensor/gaussian/monte_carlo"][np.ix_(closure_idx, closure_idx)]
        figs.append(matrix_figure({"2 layers, closure": (closure_sim, []), "2 layers, Monte Carlo": (mc, [])},
                                   sub_steps, out / "closure_vs_monte_carlo.png",
                                   suptitle="two-layer tensor similarity on a checkpoint subset"))
    final = {MATRICES[key]: np.asarray(m)[:, -1] for key, m in matrices.items()}
    figs.append(curves_figure(steps, final, out / "similarity_to_final.png",
                               title="similarity of each checkpoint to the final one", ylabel="similarity"))
    agree = {f"{n}-gram agreement": ngram[f"{n}gram_agreement"] for n in cfg.ngram_orders}
    figs.append(curves_figure(steps, agree, out / "ngrams.png",
                               title="model vs corpus n-gram next-character distributions (held-out)",
                               ylabel="1 - total variation"))
    return figs
