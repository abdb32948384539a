"""Undefined cells: the reasons, read from the flags the compiled programs return.

A cell is undefined where the pairwise call ``measure(name)(A_i, B_j)`` raises a
``ValueError`` for valid layers. The grid does not call it: every measure's core
returns flags beside its value, the batched programs return them for every cell,
and the measure's ``core.reason`` turns a cell's flags (and the layers' real
shapes) into the pairwise call's message. What the shapes alone decide (e.g. a
fit needs more rows than source features) is asked of ``core.reason`` without flags.
A cell that comes out NaN with no reason is an error in the measure, never a
silent NaN.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from funsim.similarity import _validate as V
from funsim.similarity.grid import layers as L


class Table(NamedTuple):
    """One measure's cells in one direction: ``values (La, Lb)`` and ``flags`` (a pytree of ``(La, Lb)``
    host arrays: each cell's pair flags), or ``flags=None`` where no cell was evaluated."""

    values: np.ndarray
    flags: Any


def transposed(table: Table) -> Table:
    """``table`` with its cells transposed, flags too: the reverse table of a side with itself
    (``measure(B_j, A_i)`` is the forward cell ``(j, i)``, flags and all)."""
    flags = None if table.flags is None else jax.tree.map(lambda a: np.asarray(a).T, table.flags)
    return Table(np.asarray(table.values).T, flags)


class UndefinedCellWarning(UserWarning):
    """:func:`compare_grid` left cells undefined (NaN); the reasons are in ``GridResult.undefined``."""


def where(lay: L.Layers, i: int, j: int, reverse: bool) -> str:
    if reverse:
        return f"(cols[{j}] = {lay.cols[j]!r}, rows[{i}] = {lay.rows[i]!r})"
    return f"(rows[{i}] = {lay.rows[i]!r}, cols[{j}] = {lay.cols[j]!r})"


_RIDGE_HINT = " In compare_grid the ridge is part of the name: 'stitch/affine/ridge=0.001'."


def _hint(name: str, reason: str) -> str:
    fit = "normal equations" in reason or "ridge > 0" in reason
    return _RIDGE_HINT if fit and name.startswith("stitch/affine") else ""


def undefined_error(name: str, lay: L.Layers, i: int, j: int, reverse: bool, reason: str) -> ValueError:
    return ValueError(f"{name}{' (reverse)' if reverse else ''}: the entry for {where(lay, i, j, reverse)} is "
                      f"not finite (undefined; on_undefined='raise'): {reason}{_hint(name, reason)}")


def source_error(name: str, side: str, k: int, reason: str) -> ValueError:
    """``on_undefined="raise"``: a source the measure refuses by its width alone, named as a source."""
    return ValueError(f"{name} with source {L.SIDE_NAMES[side]}[{k}]: {reason}{_hint(name, reason)}")


def silent_non_finite(name: str, lay: L.Layers, i: int, j: int, reverse: bool, value: float) -> ValueError:
    return ValueError(
        f"{name}{' (reverse)' if reverse else ''}: the entry for {where(lay, i, j, reverse)} is not finite: "
        f"the measure returns {value} for that pair without a reason in its flags. A measure must say where it "
        "is undefined (its core's reason); fix the measure, or drop it or the layer."
    )


def _order(cells, lay: L.Layers, reverse: bool) -> list:
    """Cells in the order they are reported: by the pair's widths (narrowest first), then by position."""
    wa = [z.shape[1] for z in lay.va]
    wb = [z.shape[1] for z in lay.vb]
    return sorted(cells, key=lambda ij: (wa[ij[0]], wb[ij[1]], ij[0], ij[1]))


def _cell(flags, i: int, j: int):
    return jax.tree.map(lambda a: a[i, j], flags)


def settle(name: str, measure, table: Table, lay: L.Layers, *, reverse: bool, strict: bool,
           reason, opts, extra: dict | None = None) -> tuple[np.ndarray, dict]:
    """``(values, {(i, j): reason})`` of one direction's table: NaN where undefined, with the reason.

    ``reason``: the measure's ``core.reason``; ``extra``: flags the caller adds to every cell
    (e.g. the row counts of a split). ``reverse``: ``table[i, j]`` is ``measure(B_j, A_i)``.
    """
    values = np.array(table.values, copy=True)
    undefined = {}
    shapes_a = [lay.shape("a", i) for i in range(len(lay.va))]
    shapes_b = [lay.shape("b", j) for j in range(len(lay.vb))]
    static: dict[tuple, str | None] = {}
    cells = []
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            sx, sy = (shapes_b[j], shapes_a[i]) if reverse else (shapes_a[i], shapes_b[j])
            if (sx, sy) not in static:
                static[sx, sy] = reason(None, sx, sy, opts)
            if static[sx, sy] is not None or not np.isfinite(values[i, j]):
                cells.append((i, j))
    for i, j in _order(cells, lay, reverse):
        sx, sy = (shapes_b[j], shapes_a[i]) if reverse else (shapes_a[i], shapes_b[j])
        why = static[sx, sy]
        if why is None and table.flags is not None:
            flags = _cell(table.flags, i, j)
            if extra:
                flags = {**flags, **extra}
            why = reason(flags, sx, sy, opts)
        if why is None:
            raise silent_non_finite(name, lay, i, j, reverse, float(values[i, j]))
        if strict:
            raise undefined_error(name, lay, i, j, reverse, why)
        values[i, j] = np.nan
        undefined[i, j] = why
    return values, undefined


def raise_static_sources(name: str, reason, opts, lay: L.Layers, *, reverse: bool) -> None:
    """``on_undefined="raise"``: the first source layer (a, then b with ``reverse``) the measure refuses by
    its shape alone, whatever the target, raised as a source (before anything is computed)."""
    sides = ("a", "b") if reverse else ("a",)
    for side in sides:
        other = "b" if side == "a" else "a"
        vs = lay.side(side)
        for k in range(len(vs)):
            refused = [reason(None, lay.shape(side, k), lay.shape(other, j), opts)
                       for j in range(len(lay.side(other)))]
            if all(r is not None for r in refused):
                raise source_error(name, side, k, refused[0])


def warn_undefined(undefined: dict, rev_undefined: dict, lay: L.Layers) -> None:
    counts = {k: len(v) + len(rev_undefined.get(k, {})) for k, v in undefined.items()}
    counts = {k: c for k, c in counts.items() if c}
    if not counts:
        return
    name = next(iter(counts))
    first = undefined[name] or rev_undefined[name]
    (i, j), why = next(iter(first.items()))
    direction = "" if undefined[name] else " (reverse)"
    per = ", ".join(f"{k}: {c}" for k, c in counts.items())
    V.warn_at_caller(
        f"compare_grid: {sum(counts.values())} cell(s) are undefined and set to NaN ({per}), e.g. "
        f"{name}{direction} {where(lay, i, j, bool(direction))}: {why.split('. ')[0]}. Each reason is in "
        "GridResult.undefined (and reverse_undefined); on_undefined='raise' stops at the first instead.",
        UndefinedCellWarning,
    )
