"""Figures people can look at: matplotlib, Agg backend, labelled axes and titles."""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["heatmap", "heatmap_grid", "training_curves", "curve_panels", "bar_chart", "lines", "save"]


def save(fig, path: str | os.PathLike) -> pathlib.Path:
    """Save a figure atomically as PNG and close it."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def heatmap(
    ax,
    matrix,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    annotate: bool = True,
):
    """Draw ``matrix (rows, cols)`` on ``ax`` with tick labels, a colorbar and values."""
    m = np.asarray(matrix, dtype=float)
    im = ax.imshow(m, vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    ax.set_xticks(range(m.shape[1]), col_labels, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(m.shape[0]), row_labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    if annotate and m.size <= 100:
        lo, hi = np.nanmin(m) if vmin is None else vmin, np.nanmax(m) if vmax is None else vmax
        for (i, j), v in np.ndenumerate(m):
            if not np.isfinite(v):
                ax.text(j, i, "undef.", ha="center", va="center", fontsize=6, color="gray")
                continue
            light = (v - lo) / (hi - lo + 1e-12) < 0.5
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if light else "black")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return im


def heatmap_grid(
    matrices: Mapping[str, np.ndarray],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    path: str | os.PathLike,
    *,
    suptitle: str,
    xlabel: str,
    ylabel: str,
    ncols: int = 4,
    ranges: Mapping[str, tuple[float | None, float | None]] | None = None,
    cmaps: Mapping[str, str] | None = None,
) -> pathlib.Path:
    """One heatmap per entry of ``matrices`` (title -> ``(rows, cols)``), in a grid, saved to ``path``."""
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.1 * nrows), squeeze=False)
    for ax, (title, m) in zip(axes.ravel(), matrices.items()):
        vmin, vmax = (ranges or {}).get(title, (None, None))
        heatmap(ax, m, row_labels, col_labels, title=title, xlabel=xlabel, ylabel=ylabel,
                vmin=vmin, vmax=vmax, cmap=(cmaps or {}).get(title, "viridis"))
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def training_curves(histories: Mapping[str, Sequence[Mapping[str, float]]], path: str | os.PathLike, *, title: str) -> pathlib.Path:
    """Train loss and test accuracy against step, one line per run."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, h in histories.items():
        steps = [r["step"] for r in h]
        a1.plot(steps, [r["train_loss"] for r in h], marker=".", label=name)
        a2.plot(steps, [r["test_accuracy"] for r in h], marker=".", label=name)
    a1.set(xlabel="step", ylabel="train cross-entropy", title="training loss", yscale="log")
    a2.set(xlabel="step", ylabel="test accuracy", title="held-out accuracy", ylim=(0, 1.02))
    a2.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def curve_panels(
    panels: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]],
    path: str | os.PathLike,
    *,
    title: str,
    metrics: Sequence[tuple[str, str]] = (("test_accuracy", "-"), ("train_accuracy", "--")),
    ylabel: str = "accuracy",
    ylim: tuple[float, float] | None = (0, 1.02),
    ncols: int = 4,
) -> pathlib.Path:
    """Small multiples: one panel per group (e.g. architecture), one colour per run in it (e.g. seed).

    ``panels`` maps a panel title to ``{run label: history}``, a history being
    the list of logged dicts (``step`` plus the ``metrics`` keys); each metric
    is drawn with its line style (default: test accuracy solid, train dashed).
    """
    n = len(panels)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 2.7 * nrows), squeeze=False, sharex=True, sharey=True)
    for ax, (name, runs) in zip(axes.ravel(), panels.items()):
        for i, (label, h) in enumerate(runs.items()):
            steps = [r["step"] for r in h]
            for key, style in metrics:
                ax.plot(steps, [r[key] for r in h], style, color=f"C{i}", marker=".",
                        label=f"{label}: {key.replace('_', ' ')}")
        ax.set(title=name, xlabel="step", ylabel=ylabel)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def bar_chart(values: Mapping[str, float], path: str | os.PathLike, *, title: str, ylabel: str, ylim=None) -> pathlib.Path:
    """A labelled bar chart of named values."""
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(values) + 1.5), 3.4))
    names, vals = list(values), [float(v) for v in values.values()]
    ax.bar(range(len(vals)), vals, color="tab:blue")
    ax.set_xticks(range(len(vals)), names, rotation=30, ha="right", fontsize=8)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set(title=title, ylabel=ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    fig.tight_layout()
    return save(fig, path)


def lines(xs: Sequence[float], series: Mapping[str, Sequence[float]], path: str | os.PathLike, *,
          title: str, xlabel: str, ylabel: str) -> pathlib.Path:
    """One line per named series against ``xs``, with markers and a legend."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, path)
