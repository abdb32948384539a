"""Figures: constrained layout everywhere, and no text drawn over other text (experiments.plotting)."""

import ast
import warnings
from pathlib import Path

import numpy as np
import pytest

from funsim.experiments import plotting

ROOT = Path(__file__).resolve().parent.parent


def test_text_overlaps_finds_colliding_texts_only():
    fig, axes = plotting.subplots(2, 1, figsize=(4, 4))
    axes[0].set_xlabel("x label of the top panel")
    axes[1].set_title("title of the bottom panel")
    assert plotting.text_overlaps(fig) == []  # the constrained layout keeps them apart
    axes[0].annotate("on the x label", xy=(0.5, 0.5), xycoords=axes[0].xaxis.label, ha="center", va="center")
    assert [sorted(p) for p in plotting.text_overlaps(fig)] == [["on the x label", "x label of the top panel"]]
    plotting.plt.close(fig)


def test_without_the_layout_the_old_panel_titles_collided():
    """What the usable-information report's R^2 grid did before: titles against the x labels above."""
    fig, axes = plotting.plt.subplots(3, 2, figsize=(6, 5))  # no layout engine
    for ax in axes.ravel():
        ax.set_title("R² = 0.123", fontsize=9)
        ax.set_xlabel("cka/linear")
    assert plotting.text_overlaps(fig)  # the detector sees it
    plotting.plt.close(fig)
    fig, axes = plotting.subplots(3, 2, figsize=(6, 5))
    for ax in axes.ravel():
        ax.set_title("R² = 0.123", fontsize=9)
        ax.set_xlabel("cka/linear")
    assert plotting.text_overlaps(fig) == []
    plotting.plt.close(fig)


def test_save_warns_on_overlapping_text_and_still_writes(tmp_path):
    fig, ax = plotting.subplots()
    ax.set_title("a title")
    ax.text(0.5, 1.0, "over the title", transform=ax.transAxes, ha="center", va="bottom")
    with pytest.warns(plotting.TextOverlapWarning, match=r"crowded\.png.*'a title' / 'over the title'"):
        path = plotting.save(fig, tmp_path / "crowded.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bar_chart_with_long_names_is_clear(tmp_path):
    """The backdoor's gaps.png: long, close names collided as rotated tick labels."""
    values = {"tensor (symmetric)": 0.5, "tensor (gaussian)": 0.4, "class-9 slice (symmetric)": 0.6,
              "class-9 slice (gaussian)": 0.55, "behavioural (clean)": 0.1, "behavioural (poisoned)": -0.2,
              "CKA (logits, clean)": 0.05, "matrix cosine": 0.15}
    with warnings.catch_warnings():
        warnings.simplefilter("error", plotting.TextOverlapWarning)
        plotting.bar_chart(values, tmp_path / "gaps.png", title="block gap", ylabel="gap")


def test_crowded_stage_names_are_thinned_not_overlapped(tmp_path):
    """The forgetting curriculum's short stages put their names on neighbouring checkpoints."""
    steps = np.arange(12) * 10
    spans = [(0, 50, "digits 0-4"), (50, 60, "add 5"), (60, 70, "add 6"), (70, 80, "repeat"), (80, 90, "remove 9"),
             (90, 110, "re-add 9")]
    mats = {f"matrix {k}": np.random.default_rng(k).random((12, 12)) for k in range(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", plotting.TextOverlapWarning)
        plotting.heatmap_panels(mats, steps, tmp_path / "h.png", spans=spans, suptitle="stages", ncols=3)


def test_every_figure_is_made_by_the_constrained_subplots():
    """No driver lays a figure out by hand: no tight_layout, no plt.subplots/plt.figure outside plotting.py."""
    bad = []
    for path in sorted((ROOT / "experiments").glob("*.py")):
        if path.name == "plotting.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("tight_layout", "subplots", "figure", "subplot_mosaic"):
                owner = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
                if not (node.attr == "subplots" and owner == "plotting") and owner != "self":
                    bad.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
    assert not bad, bad


def test_text_cut_by_the_figure_edge_is_reported():
    fig, ax = plotting.subplots(figsize=(3, 2))
    fig.text(-0.05, 0.5, "half outside", ha="left")
    assert ("half outside", "<the figure's edge>") in plotting.text_overlaps(fig)
    plotting.plt.close(fig)


def test_stage_figures_are_written(tmp_path):
    steps = np.array([0, 10, 20, 30, 40])
    spans = [(0, 20, "base"), (20, 40, "add 5")]
    mats = {"a": np.eye(5), "b": np.full((5, 5), 0.5)}
    p = plotting.heatmap_panels(mats, steps, tmp_path / "h.png", spans=spans, suptitle="test")
    q = plotting.curves_over_steps(steps, {"x": steps / 40.0}, tmp_path / "c.png", spans=spans, title="t", ylabel="y")
    for f in (p, q):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotting._stage_ticks(steps, spans) == ([(1, "base"), (3, "add 5")], [2])
