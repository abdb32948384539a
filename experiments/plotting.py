"""Figures people can look at: matplotlib, Agg backend, labelled axes and titles.

Every figure is laid out by matplotlib's constrained layout (:func:`subplots`), which
keeps titles, labels, colour bars and the figure title clear of each other; panels that
share an axis label it once (the outer row or column, or ``fig.supxlabel``). :func:`save`
checks each figure for text that overlaps other text (:func:`text_overlaps`, on the Agg
renderer's text extents) and warns with :class:`TextOverlapWarning` naming the texts; the
test suite turns that warning into an error, so every figure a smoke run draws is checked.
"""

from __future__ import annotations

import math
import os
import pathlib
import textwrap
import warnings
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from numpy.typing import ArrayLike  # noqa: E402

__all__ = ["heatmap", "heatmap_grid", "label_shared_axes", "training_curves", "curve_panels", "bar_chart", "lines", "save", "subplots", "title_figure",
           "text_overlaps", "drop_crowded_ticklabels", "TextOverlapWarning", "heatmap_panels", "curves_over_steps"]


#: Resolution of the saved figures.
DPI = 110


class TextOverlapWarning(UserWarning):
    """A saved figure has text drawn over other text (the message names the figure and the texts)."""


def subplots(nrows: int = 1, ncols: int = 1, **kwargs):
    """``plt.subplots`` with matplotlib's constrained layout (the layout every funsim figure uses).

    Grids of square heatmaps pass ``layout="compressed"``, the constrained layout for
    fixed-aspect axes (the plain one does not settle for them: labels drift off the edge).

    The figure is made at the resolution it is saved at (:data:`DPI`): the constrained layout
    is solved for text sizes in figure units, and a figure drawn at one resolution and saved
    at another can keep a stale layout.
    """
    kwargs.setdefault("layout", "constrained")
    kwargs.setdefault("dpi", DPI)
    return plt.subplots(nrows, ncols, **kwargs)


def title_figure(fig, text: str, *, fontsize: float = 11):
    """``fig.suptitle``, wrapped to the figure's width (a narrow figure cuts a long title otherwise)."""
    chars = max(20, int(fig.get_size_inches()[0] * 72 / (fontsize * 0.6)))
    return fig.suptitle(textwrap.fill(text, width=chars), fontsize=fontsize)


def _drawn_texts(fig) -> list:
    """Every non-empty text artist the figure draws: titles, labels, tick labels in view, legends, annotations."""
    texts = list(fig.texts)
    for leg in fig.legends:
        texts += [*leg.get_texts(), leg.get_title()]
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.texts and not ax.get_title():
            continue
        texts += [ax.title, *ax.texts]
        texts += [t for t in ax.get_children() if isinstance(t, matplotlib.text.Text) and t not in texts
                  and t is not ax.title]  # the left and right titles
        if ax.axison:
            for axis in (ax.xaxis, ax.yaxis):
                texts += [axis.label, axis.get_offset_text()]
                lo, hi = sorted(axis.get_view_interval())
                pad = 1e-9 * max(1.0, abs(lo), abs(hi))
                for locs, labels in ((axis.get_majorticklocs(), axis.get_majorticklabels()),
                                     (axis.get_minorticklocs(), axis.get_minorticklabels())):
                    texts += [lab for loc, lab in zip(locs, labels) if lo - pad <= loc <= hi + pad]
        leg = ax.get_legend()
        if leg is not None:
            texts += [*leg.get_texts(), leg.get_title()]
    seen, out = set(), []
    for t in texts:
        if id(t) not in seen and t.get_visible() and t.get_text().strip():
            seen.add(id(t))
            out.append(t)
    return out


def text_overlaps(fig, *, tolerance: float = 1.0, renderer=None) -> list[tuple[str, str]]:
    """Pairs of texts of ``fig`` whose drawn extents overlap, by more than ``tolerance`` pixels each way.

    A text cut by the figure's edge is reported too, paired with ``"<the figure's edge>"``.

    The figure is drawn once with the Agg renderer (so its layout is final) and each text's
    window extent is taken from it; pass the ``renderer`` of a draw already made to measure
    that draw instead. Empty and invisible texts, and tick labels outside the axis's view,
    do not count.

    Returns:
      ``[(text_a, text_b), ...]``, each text shown as its string.

    Examples:
      >>> fig, ax = subplots()
      >>> _ = ax.set_title("a title"), ax.set_xlabel("x label")
      >>> text_overlaps(fig)
      []
      >>> _ = ax.text(0.5, 1.0, "on the title", transform=ax.transAxes, va="bottom", ha="center")
      >>> [sorted(pair) for pair in text_overlaps(fig)]
      [['a title', 'on the title']]
      >>> plt.close(fig)
    """
    if renderer is None:
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _drawn_texts(fig)]
    found = []
    width, height = fig.bbox.width, fig.bbox.height
    for ta, a in boxes:
        if a.x0 < -tolerance or a.y0 < -tolerance or a.x1 > width + tolerance or a.y1 > height + tolerance:
            found.append((ta, "<the figure's edge>"))
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            w = min(a.x1, b.x1) - max(a.x0, b.x0)
            h = min(a.y1, b.y1) - max(a.y0, b.y0)
            if w > tolerance and h > tolerance:
                found.append((ta, tb))
    return found


def save(fig, path: str | os.PathLike) -> pathlib.Path:
    """Save a figure atomically as PNG and close it; warn (:class:`TextOverlapWarning`) if text overlaps text.

    The figure is drawn once, and that one drawing is both checked and written, so the check
    sees exactly the layout in the file (a second draw may lay it out slightly differently).
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.set_dpi(DPI)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        overlaps = text_overlaps(fig, renderer=canvas.get_renderer())
        matplotlib.image.imsave(tmp, np.asarray(canvas.buffer_rgba()), format="png")
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    if overlaps:
        shown = "; ".join(f"{a!r} / {b!r}" for a, b in overlaps[:6]) + (" ..." if len(overlaps) > 6 else "")
        warnings.warn(f"Text overlaps in figure {path.name}: {len(overlaps)} pair(s): {shown}", TextOverlapWarning,
                      stacklevel=2)
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
    long = max((len(str(c)) for c in col_labels), default=0) > 12  # slanted long labels overlap their neighbours
    ax.set_xticks(range(m.shape[1]), col_labels, rotation=90 if long else 30, ha="center" if long else "right",
                  fontsize=8)
    ax.set_yticks(range(m.shape[0]), row_labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=8)
    if ylabel:
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


def label_shared_axes(ax, k: int, ncols: int, n: int, *, xlabel: str = "", ylabel: str = "") -> tuple[bool, bool]:
    """Panel ``k`` of ``n`` in a grid of ``ncols`` columns that share their axes: tick labels and
    ``ylabel`` on the left column only, tick labels and ``xlabel`` on the lowest panel of each
    column only. Returns ``(left, bottom)``."""
    left, bottom = k % ncols == 0, k + ncols >= n
    ax.tick_params(labelleft=left, labelbottom=bottom)
    if left and ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    if bottom and xlabel:
        ax.set_xlabel(xlabel, fontsize=8)
    return left, bottom


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
    panel_size: tuple[float, float] = (3.6, 3.1),
) -> pathlib.Path:
    """One heatmap per entry of ``matrices`` (title -> ``(rows, cols)``), in a grid of ``panel_size`` inches
    (width, height) per panel, saved to ``path``.

    Every panel shares the rows and columns, so they are labelled once: tick labels and
    ``ylabel`` on the left column, tick labels and ``xlabel`` on the lowest panel of each column.
    """
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False)
    for k, (ax, (title, m)) in enumerate(zip(axes.ravel(), matrices.items())):
        vmin, vmax = (ranges or {}).get(title, (None, None))
        heatmap(ax, m, row_labels, col_labels, title=title, vmin=vmin, vmax=vmax, cmap=(cmaps or {}).get(title, "viridis"))
        label_shared_axes(ax, k, ncols, n, xlabel=xlabel, ylabel=ylabel)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    title_figure(fig, suptitle, fontsize=11)
    return save(fig, path)


def training_curves(histories: Mapping[str, Sequence[Mapping[str, float]]], path: str | os.PathLike, *, title: str) -> pathlib.Path:
    """Train loss and test accuracy against step, one line per run."""
    fig, (a1, a2) = subplots(1, 2, figsize=(9, 3.2))
    for name, h in histories.items():
        steps = [r["step"] for r in h]
        a1.plot(steps, [r["train_loss"] for r in h], marker=".", label=name)
        a2.plot(steps, [r["test_accuracy"] for r in h], marker=".", label=name)
    a1.set(xlabel="step", ylabel="train cross-entropy", title="training loss", yscale="log")
    a2.set(xlabel="step", ylabel="test accuracy", title="held-out accuracy", ylim=(0, 1.02))
    a2.legend(fontsize=8)
    title_figure(fig, title, fontsize=11)
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
    fig, axes = subplots(nrows, ncols, figsize=(3.3 * ncols, 2.7 * nrows), squeeze=False, sharex=True, sharey=True)
    for k, (ax, (name, runs)) in enumerate(zip(axes.ravel(), panels.items())):
        for i, (label, h) in enumerate(runs.items()):
            steps = [r["step"] for r in h]
            for key, style in metrics:
                ax.plot(steps, [r[key] for r in h], style, color=f"C{i}", marker=".",
                        label=f"{label}: {key.replace('_', ' ')}")
        ax.set_title(name, fontsize=9)
        if ylim is not None:
            ax.set_ylim(*ylim)
        label_shared_axes(ax, k, ncols, n)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    title_figure(fig, title, fontsize=11)
    fig.supxlabel("step", fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    return save(fig, path)


def bar_chart(values: Mapping[str, float], path: str | os.PathLike, *, title: str, ylabel: str, ylim=None) -> pathlib.Path:
    """A labelled bar chart of named values, drawn horizontally so that long names never collide.

    ``ylabel`` names the values (the horizontal axis) and ``ylim`` their range.
    """
    names, vals = list(values), [float(v) for v in values.values()]
    fig, ax = subplots(figsize=(6.4, 1.2 + 0.38 * len(vals)))
    pos = np.arange(len(vals))[::-1]  # the first name on top
    ax.barh(pos, vals, color="tab:blue")
    ax.set_yticks(pos, names, fontsize=8)
    for y, v in zip(pos, vals):
        ax.text(v, y, f" {v:.3f}" if v >= 0 else f"{v:.3f} ", ha="left" if v >= 0 else "right", va="center", fontsize=8)
    title_figure(fig, title, fontsize=10)
    ax.set_xlabel(ylabel)
    if ylim is not None:
        ax.set_xlim(*ylim)
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo - 0.12 * (hi - lo) * (min(vals) < 0), hi + 0.12 * (hi - lo))  # room for the value labels
    ax.axvline(0, color="0.3", lw=0.8)
    return save(fig, path)


def drop_crowded_ticklabels(fig) -> int:
    """Hide each tick label that would overlap the previous shown label of its axis; return how many.

    For categorical ticks placed by data (e.g. the first checkpoint of each training stage),
    which can crowd where stages are short: the first label of a crowded run is kept.
    """
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    hidden = 0
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept = None
            for lab in axis.get_majorticklabels():
                if not (lab.get_visible() and lab.get_text().strip()):
                    continue
                box = lab.get_window_extent(renderer)
                if kept is not None and min(box.x1, kept.x1) - max(box.x0, kept.x0) > 0 \
                        and min(box.y1, kept.y1) - max(box.y0, kept.y0) > 0:
                    lab.set_visible(False)
                    hidden += 1
                else:
                    kept = box
    return hidden


def lines(xs: Sequence[float], series: Mapping[str, Sequence[float]], path: str | os.PathLike, *,
          title: str, xlabel: str, ylabel: str) -> pathlib.Path:
    """One line per named series against ``xs``, with markers and a legend."""
    fig, ax = subplots(figsize=(5.5, 3.4))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


# --------------------------------------------------------------------------- checkpoints through training stages


def _stage_ticks(steps, spans):
    """Checkpoint indices where each stage starts (for tick labels) and ends (for lines)."""
    steps = np.asarray(steps)
    starts, ends = [], []
    for first, last, name in spans or ():
        inside = np.flatnonzero((steps > first) & (steps <= last))
        if inside.size:
            starts.append((inside[0], name))
            ends.append(inside[-1])
    return starts, ends[:-1]


def heatmap_panels(
    matrices: Mapping[str, ArrayLike],
    steps: Sequence[int],
    path: str | os.PathLike,
    *,
    spans: Sequence[tuple[int, int, str]] | None = None,
    suptitle: str,
    ncols: int = 3,
    cmap: str = "viridis",
) -> pathlib.Path:
    """One heatmap per checkpoint x checkpoint matrix, with the stages marked.

    Args:
      matrices: ``{title: (n, n)}``.
      steps: ``(n,)`` global step of each checkpoint (tick labels).
      path: where the PNG goes.
      spans: ``[(first_step, last_step, name)]`` stages; their boundaries are
        drawn as white lines and their names label the ticks.
      suptitle: the figure title.
      ncols: panels per row.
      cmap: colour map; each panel has its own colour scale and colour bar.

    Returns:
      The path written.
    """
    n = len(matrices)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    # square heatmaps: the compressed layout is the constrained one for fixed-aspect axes
    fig, axes = subplots(nrows, ncols, figsize=(4.2 * ncols, 3.9 * nrows), squeeze=False, layout="compressed")
    starts, ends = _stage_ticks(steps, spans)
    for k, (ax, (title, m)) in enumerate(zip(axes.ravel(), matrices.items())):
        m = np.asarray(m, float)
        im = ax.imshow(m, cmap=cmap, interpolation="nearest", vmax=1.0 if np.nanmax(m) <= 1 + 1e-9 else None)
        for e in ends:
            ax.axhline(e + 0.5, color="white", lw=0.7)
            ax.axvline(e + 0.5, color="white", lw=0.7)
        if starts:
            idx, names = zip(*starts)
            ax.set_xticks(idx, names, rotation=60, ha="right", fontsize=7)
            ax.set_yticks(idx, [f"{nm} ({steps[i]})" for i, nm in starts], fontsize=7)
        label_shared_axes(ax, k, ncols, n, xlabel="checkpoint (stage start)",
                                   ylabel="checkpoint (stage, global step)")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    title_figure(fig, suptitle, fontsize=11)
    drop_crowded_ticklabels(fig)  # short stages crowd their names
    return save(fig, path)


def curves_over_steps(
    steps: Sequence[int],
    series: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    spans: Sequence[tuple[int, int, str]] | None = None,
    title: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    styles: Mapping[str, dict] | None = None,
) -> pathlib.Path:
    """Curves against the global training step, with the stages shaded and named.

    Args:
      steps: ``(n,)`` x values.
      series: ``{label: (n,)}``.
      path: where the PNG goes.
      spans: ``[(first_step, last_step, name)]`` stages, shaded alternately.
      title: axes title.
      ylabel: y-axis label.
      ylim: y range.
      styles: per-label matplotlib keyword arguments (colour, width, ...).

    Returns:
      The path written.
    """
    fig, ax = subplots(figsize=(8.5, 3.8))
    for k, (first, last, name) in enumerate(spans or ()):
        if k % 2:
            ax.axvspan(first, last, color="0.92", lw=0)
        ax.text((first + last) / 2, 1.01, name, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=7, rotation=0)
    for label, ys in series.items():
        ax.plot(steps, np.asarray(ys, float), label=label, marker=".", ms=3, **(styles or {}).get(label, {}))
    ax.set_xlabel("global training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, pad=16)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(series) > 5 else 1, loc="best")
    return save(fig, path)
