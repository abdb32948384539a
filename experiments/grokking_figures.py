"""The figures of ``funsim grokking``: accuracy curves, similarity matrices, similarity to the final
checkpoint and the Fourier power of the weights, each with the phase starts or accuracy landmarks drawn.

Every function takes the run's arrays and a path, draws one PNG and returns its path
(:func:`experiments.plotting.save`). Steps are training steps; ``starts`` are checkpoint indices.
"""

from __future__ import annotations

import numpy as np

from funsim.experiments.plotting import save, subplots

__all__ = ["accuracy_figure", "matrices_figure", "to_final_figure", "fourier_figure", "log_steps", "phase_lines",
           "step_ticks", "generalisation_lines"]


def log_steps(ax):
    """A symlog step axis from 0 (step 0, the initialisation, stays on the axis)."""
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)


def phase_lines(ax, starts, steps, *, color="k"):
    """Dashed vertical lines at the steps where phases 2..K start."""
    for s in list(starts)[1:]:
        ax.axvline(steps[s], color=color, ls="--", lw=0.8, alpha=0.7)


def generalisation_lines(ax, events, *, named=False):
    """Dotted vertical lines where held-out accuracy reaches 0.99 and 1 (``events``: ``{name: step or None}``)."""
    for name in ("val accuracy >= 0.99", "val accuracy = 1"):
        if events.get(name) is not None:
            ax.axvline(events[name], color="gray", ls=":", lw=1)
            if named:
                ax.text(events[name], 0.02, name, rotation=90, fontsize=6, va="bottom", transform=ax.get_xaxis_transform())


def accuracy_figure(steps, ev, history, starts, events, path, title):
    """Accuracy and loss per checkpoint (``ev[split]``) and per history row, phase starts dashed."""
    fig, (a1, a2) = subplots(1, 2, figsize=(11, 3.6))
    for split, color in (("train", "tab:blue"), ("val", "tab:orange")):
        a1.plot(steps, ev[split]["accuracy"], marker=".", ms=3, color=color, label=f"{split} (checkpoints)")
        a2.plot(steps, ev[split]["loss"], marker=".", ms=3, color=color, label=f"{split} (checkpoints)")
    hs = [h["step"] for h in history]
    a1.plot(hs, [h["test_accuracy"] for h in history], color="tab:orange", lw=0.6, alpha=0.5, label="val (history)")
    a2.plot(hs, [h["train_loss"] for h in history], color="tab:blue", lw=0.6, alpha=0.5, label="train (history)")
    for ax in (a1, a2):
        log_steps(ax)
        phase_lines(ax, starts, steps)
        ax.grid(alpha=0.3)
    for name, s in events.items():
        if s is not None and name.startswith("val accuracy"):
            a1.axvline(s, color="tab:green", lw=0.8, alpha=0.6)
    a1.set(ylabel="accuracy", ylim=(-0.02, 1.02))
    a1.set_title("accuracy (dashed: phase starts;\ngreen: val acc 0.5 / 0.99 / 1)", fontsize=9)
    a2.set(ylabel="cross-entropy (nats)", yscale="log")
    a2.set_title("loss", fontsize=9)
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel("training step (symlog)", fontsize=9)
    return save(fig, path)


def step_ticks(ax, steps, axis="both"):
    """About 7 ticks on a checkpoint-index axis, labelled with their steps."""
    n = len(steps)
    idx = sorted({int(round(i)) for i in np.linspace(0, n - 1, 7)})
    labels = [f"{steps[i]:,}" for i in idx]
    if axis in ("both", "x"):
        ax.set_xticks(idx, labels, rotation=45, ha="right", fontsize=6)
    if axis in ("both", "y"):
        ax.set_yticks(idx, labels, fontsize=6)


def matrices_figure(matrices, segmentations, steps, path, title):
    """One heatmap per ``(n, n)`` matrix, its phases (``segmentations[name]``) as white lines."""
    fig, axes = subplots(1, len(matrices), figsize=(3.6 * len(matrices), 3.6), squeeze=False,
                         layout="compressed")  # square heatmaps
    for k, (ax, (name, m)) in enumerate(zip(axes[0], matrices.items())):
        im = ax.imshow(m, vmin=min(0.0, float(m.min())), vmax=1.0, cmap="viridis", interpolation="nearest")
        for s in list(segmentations[name])[1:]:
            ax.axhline(s - 0.5, color="w", lw=0.8)
            ax.axvline(s - 0.5, color="w", lw=0.8)
        step_ticks(ax, steps)
        ax.tick_params(labelleft=k == 0)  # the same checkpoints in every panel: named once, on the left
        if k == 0:
            ax.set_ylabel("checkpoint (step)", fontsize=8)
        ax.set_xlabel("checkpoint (step)", fontsize=8)
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def to_final_figure(matrices, steps, events, path, title):
    """Each measure's similarity of every checkpoint to the final one (the last row)."""
    fig, ax = subplots(figsize=(6.5, 3.6))
    for name, m in matrices.items():
        ax.plot(steps, m[-1], marker=".", ms=3, label=name)
    generalisation_lines(ax, events, named=True)
    log_steps(ax)
    ax.set(xlabel="training step (symlog)", ylabel="similarity to the final checkpoint", title=title)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def fourier_figure(spectra, summaries, steps, events, path, title):
    """Power share per frequency over training, per operand, and the concentration and purity curves."""
    fig, axes = subplots(1, len(spectra) + 2, figsize=(4.0 * (len(spectra) + 2), 3.6))
    labels = {"a": "input weights, token a", "b": "input weights, token b", "out": "output weights (classes)"}
    for ax, (name, power) in zip(axes, spectra.items()):
        q = summaries[name]["distribution"]  # (n, K-1), frequencies 1..
        im = ax.imshow(q.T, aspect="auto", origin="lower", cmap="magma", interpolation="nearest",
                       extent=(-0.5, len(steps) - 0.5, 0.5, q.shape[1] + 0.5))
        step_ticks(ax, steps, axis="x")
        ax.set(title=f"{labels[name]}: power share", xlabel="checkpoint (step)", ylabel="frequency k")
        ax.title.set_fontsize(9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    panels = (("effective_frequencies", "effective number of frequencies", "the layer's spectrum: concentration"),
              ("unit_purity", "power share of each unit's top frequency", "per unit: purity (1 = one wave)"))
    for ax, (key, ylabel, ptitle) in zip(axes[-2:], panels):
        for name in spectra:
            ax.plot(steps, summaries[name][key], marker=".", ms=3, label=labels[name])
        ax.set(xlabel="training step (symlog)", ylabel=ylabel, title=ptitle)
        ax.title.set_fontsize(9)
        generalisation_lines(ax, events)
        log_steps(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)
