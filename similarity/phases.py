"""Phases of training, read off checkpoint x checkpoint similarity matrices and accuracy curves.

A training run's checkpoints are an ordered sequence; a similarity matrix over them splits into
contiguous phases (:func:`phase_starts`, the change points of :mod:`similarity.segmentation` in
float64). The phases are set beside the accuracy landmarks of the run (:func:`accuracy_events`,
:func:`compare_boundaries`), and two runs saved at different steps are compared like with like on a
common checkpoint grid up to a common horizon (:func:`mutual_nearest`, :func:`matched_grid`,
:func:`compare_runs`, :func:`reference_protocols`). :func:`transition_ratio` measures how sharp the
largest change between adjacent checkpoints is. Steps are integers; matrices ``(n, n)``; NumPy out.
"""

from __future__ import annotations

import jax
import numpy as np

from funsim.similarity.segmentation import change_points

__all__ = [
    "phase_starts",
    "accuracy_events",
    "compare_boundaries",
    "mutual_nearest",
    "matched_grid",
    "compare_runs",
    "reference_protocols",
    "first_at_one",
    "transition_ratio",
]


def phase_starts(matrix, /, *, n_segments: int, cost: str = "pairwise") -> list[int]:
    """Segment starts (checkpoint indices) of a checkpoint-similarity matrix (:func:`change_points`, float64).

    Args:
      matrix: ``(n, n)`` similarity of ``n`` checkpoints in training order.
      n_segments: the number of phases ``K``.
      cost: ``"pairwise"`` (the tensor-similarity authors' choice) or ``"kernel"``.

    Returns:
      ``K`` increasing checkpoint indices, the first 0.
    """
    with jax.enable_x64(True):  # costs of long segments nearly tie in float32
        seg = change_points(np.asarray(matrix, np.float64), n_segments=n_segments, cost=cost)
    return [int(i) for i in seg.starts]


def first_at_one(val_accuracy, idx, /) -> int | None:
    """Position in ``idx`` of the first checkpoint whose held-out accuracy is 1 (None if none).

    Args:
      val_accuracy: ``(n,)`` held-out accuracy per checkpoint.
      idx: indices into it (a checkpoint grid), in order.
    """
    acc = np.asarray(val_accuracy, np.float64)[idx]
    hit = np.flatnonzero(acc >= 1.0)
    return int(hit[0]) if len(hit) else None


def accuracy_events(steps, train_acc, val_acc, val_loss, /) -> dict[str, int | None]:
    """Steps of the landmarks of grokking, read off per-checkpoint curves.

    Each is the first checkpoint at which the condition holds (None if never):
    train accuracy >= 0.5 and >= 0.99 (memorisation), the peak of the held-out
    loss, held-out accuracy >= 0.5, >= 0.99 and = 1 (generalisation).

    Args:
      steps: ``(n,)`` checkpoint steps, increasing.
      train_acc, val_acc, val_loss: ``(n,)`` per checkpoint.

    Returns:
      ``{event name: step or None}``, in the order above (``"train accuracy >= 0.5"``,
      ``"train accuracy >= 0.99"``, ``"val loss peak"``, ``"val accuracy >= 0.5"``,
      ``"val accuracy >= 0.99"``, ``"val accuracy = 1"``).
    """
    steps = [int(s) for s in steps]
    train_acc, val_acc, val_loss = (np.asarray(v, np.float64) for v in (train_acc, val_acc, val_loss))

    def first(mask):
        return steps[int(np.argmax(mask))] if np.any(mask) else None

    return {
        "train accuracy >= 0.5": first(train_acc >= 0.5),
        "train accuracy >= 0.99": first(train_acc >= 0.99),
        "val loss peak": steps[int(np.argmax(val_loss))],
        "val accuracy >= 0.5": first(val_acc >= 0.5),
        "val accuracy >= 0.99": first(val_acc >= 0.99),
        "val accuracy = 1": first(val_acc >= 1.0),
    }


def compare_boundaries(starts, steps, events, /) -> list[dict]:
    """Each phase boundary beside its nearest accuracy event, in checkpoints.

    Args:
      starts: ``(K,)`` segment starts (checkpoint indices, ``starts[0] == 0``).
      steps: ``(n,)`` checkpoint steps.
      events: ``{name: step or None}`` (:func:`accuracy_events`); every step is one of ``steps``.

    Returns:
      one dict per boundary ``k = 1..K-1``: ``start_step`` (first step of the new
      phase), ``after_step`` (last step of the previous one), ``nearest_event``,
      ``event_step`` and ``checkpoints_apart`` (boundary index minus event index:
      0 when the event's checkpoint opens the new phase, negative when the
      boundary comes first).
    """
    steps = [int(s) for s in steps]
    located = {name: steps.index(int(s)) for name, s in events.items() if s is not None}
    rows = []
    for s in (int(v) for v in list(starts)[1:]):
        row = {"start_step": steps[s], "after_step": steps[s - 1], "nearest_event": None,
               "event_step": None, "checkpoints_apart": None}
        if located:
            name = min(located, key=lambda e: (abs(s - located[e]), located[e]))
            row.update(nearest_event=name, event_step=steps[located[name]], checkpoints_apart=s - located[name])
        rows.append(row)
    return rows


def _check_steps(steps, name):
    s = np.asarray(steps)
    if s.ndim != 1 or len(s) == 0 or not np.issubdtype(s.dtype, np.integer) and not np.all(s == np.round(s)):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integer steps, got shape {s.shape}.")
    s = s.astype(np.int64)
    if np.any(np.diff(s) <= 0) or s[0] < 0:
        raise ValueError(f"{name} must be strictly increasing and non-negative, got {s[:5].tolist()}...")
    return s


def mutual_nearest(steps_a, steps_b, /) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(i, j)`` whose steps are each other's nearest checkpoint (ties: the earlier one).

    The pairs are one-to-one and increasing in both ``i`` and ``j``: a common grid at
    the locally sparser spacing of the two runs.

    Args:
      steps_a, steps_b: strictly increasing checkpoint steps.

    Returns:
      ``(ia, ib)``, int arrays of equal length.

    Examples:
      >>> ia, ib = mutual_nearest([0, 10, 20, 30, 40], [0, 19, 41])
      >>> ia.tolist(), ib.tolist()
      ([0, 2, 4], [0, 1, 2])
    """
    a = _check_steps(steps_a, "steps_a")
    b = _check_steps(steps_b, "steps_b")
    nb = np.argmin(np.abs(a[:, None] - b[None, :]), axis=1)  # argmin: the first (earlier) of ties
    na = np.argmin(np.abs(b[:, None] - a[None, :]), axis=1)
    ia = np.flatnonzero(na[nb] == np.arange(len(a)))
    return ia, nb[ia]


def matched_grid(steps_a, steps_b, /, *, horizon: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """A common checkpoint grid of two runs up to a common horizon.

    Both runs are cut at ``horizon`` (default: the shorter run's last step), then
    paired by :func:`mutual_nearest`.

    Returns:
      ``(ia, ib, horizon)``: indices into ``steps_a`` and ``steps_b``.

    Raises:
      ValueError: a horizon before either run's first checkpoint.

    Examples:
      >>> ia, ib, h = matched_grid([0, 5, 10, 20, 40], [0, 4, 11, 42, 60, 90])   # 42 > 40: cut
      >>> ia.tolist(), ib.tolist(), h
      ([0, 1, 2], [0, 1, 2], 40)
      >>> matched_grid([0, 5, 10, 20, 40], [0, 4, 11, 42, 60, 90], horizon=45)[:2]   # 40 and 42 pair up
      (array([0, 1, 2, 4]), array([0, 1, 2, 3]))
    """
    a = _check_steps(steps_a, "steps_a")
    b = _check_steps(steps_b, "steps_b")
    h = int(min(a[-1], b[-1])) if horizon is None else int(horizon)
    if h < max(a[0], b[0]):
        raise ValueError(f"horizon {h} lies before a run's first checkpoint ({a[0]}, {b[0]}).")
    ka, kb = np.flatnonzero(a <= h), np.flatnonzero(b <= h)
    i, j = mutual_nearest(a[ka], b[kb])
    return ka[i], kb[j], h


def compare_runs(ours: dict, theirs: dict, /, *, n_segments: int, cost: str = "pairwise", horizon: int | None = None,
                 tolerance: int = 2) -> dict:
    """Two runs' phases and post-generalisation similarity, like with like: on a common grid, to a common horizon.

    Each run is ``{"steps": (n,), "matrices": {measure: (n, n)}, "val_accuracy": (n,)}``;
    the measures both runs have are compared. The common grid is :func:`matched_grid`;
    each run's matrix is restricted to it and segmented into ``n_segments`` phases, and
    the k-th boundaries of the two runs are set side by side (their offset in grid
    checkpoints). Similarity to the final checkpoint is taken on the grid as well:
    from each run's first grid checkpoint with held-out accuracy 1 to the grid's last.

    Returns:
      ``{"horizon", "n_grid", "steps": {"ours", "theirs"} (grid steps), "max_relative_mismatch"
      (max |s_ours - s_theirs| / s_theirs over the grid, steps > 0), "phases": {measure: {"ours",
      "theirs": start steps; "offsets": grid checkpoints, ours minus theirs, per boundary;
      "within_tolerance": boundaries with |offset| <= tolerance}}, "to_final": {"ours", "theirs":
      {"from_step", "to_step", measure: similarity} or None}}``.
    """
    ia, ib, h = matched_grid(ours["steps"], theirs["steps"], horizon=horizon)
    if len(ia) < n_segments:
        raise ValueError(f"The common grid has {len(ia)} checkpoints, fewer than n_segments={n_segments}.")
    sa = np.asarray(ours["steps"], np.int64)[ia]
    sb = np.asarray(theirs["steps"], np.int64)[ib]
    pos = sb > 0
    out = {"horizon": h, "n_grid": int(len(ia)), "steps": {"ours": sa.tolist(), "theirs": sb.tolist()},
           "max_relative_mismatch": float(np.max(np.abs(sa[pos] - sb[pos]) / sb[pos])) if np.any(pos) else 0.0,
           "phases": {}, "to_final": {}}
    common = [m for m in ours["matrices"] if m in theirs["matrices"]]
    for m in common:
        pa = phase_starts(np.asarray(ours["matrices"][m])[np.ix_(ia, ia)], n_segments=n_segments, cost=cost)
        pb = phase_starts(np.asarray(theirs["matrices"][m])[np.ix_(ib, ib)], n_segments=n_segments, cost=cost)
        off = [x - y for x, y in zip(pa[1:], pb[1:])]
        out["phases"][m] = {"ours": [int(sa[i]) for i in pa], "theirs": [int(sb[i]) for i in pb], "offsets": off,
                            "within_tolerance": int(sum(abs(o) <= tolerance for o in off))}
    for name, run, idx, s in (("ours", ours, ia, sa), ("theirs", theirs, ib, sb)):
        k = first_at_one(run["val_accuracy"], idx)
        if k is None:
            out["to_final"][name] = None
            continue
        row = {"from_step": int(s[k]), "to_step": int(s[-1])}
        row.update({m: float(np.asarray(run["matrices"][m])[idx[k], idx[-1]]) for m in common})
        out["to_final"][name] = row
    return out


def reference_protocols(ref: dict, our_steps, /, *, n_segments: int, cost: str = "pairwise") -> dict:
    """The authors' matrices segmented under four protocols: how far spacing and horizon move their phases.

    ``"as released"``: their grid, their horizon; ``"at our horizon"``: their grid cut at our
    last step; ``"on our grid"``: their nearest checkpoint to each of our steps (duplicates
    merged; the resampling the first comparison used); ``"common grid"``: :func:`matched_grid`
    of both runs up to the common horizon.

    Returns:
      ``{protocol: {"n": checkpoints, "horizon": last step, measure: start steps}}``.
    """
    st = np.asarray(ref["steps"], np.int64)
    ours = _check_steps(our_steps, "our_steps")
    near = np.unique(np.argmin(np.abs(ours[:, None] - st[None, :]), axis=1))
    _, ib, _ = matched_grid(ours, st)
    sets = {"as released": np.arange(len(st)), "at our horizon": np.flatnonzero(st <= ours[-1]),
            "on our grid": near, "common grid": ib}
    out = {}
    for name, idx in sets.items():
        row = {"n": int(len(idx)), "horizon": int(st[idx[-1]])}
        for m, mat in ref["matrices"].items():
            row[m] = [int(st[idx[i]]) for i in phase_starts(mat[np.ix_(idx, idx)], n_segments=n_segments, cost=cost)]
        out[name] = row
    return out


def transition_ratio(matrix, /) -> float | None:
    """``max / median`` over adjacent checkpoints of ``1 - S[i, i+1]``: one step far larger than the typical one.

    None when fewer than two adjacent pairs or the median change is 0.

    Examples:
      >>> s = np.array([[1, .9, .8, .1], [.9, 1, .9, .2], [.8, .9, 1, .3], [.1, .2, .3, 1]])
      >>> round(transition_ratio(s), 6)   # adjacent changes 0.1, 0.1, 0.7
      7.0
    """
    m = np.asarray(matrix, np.float64)
    d = 1.0 - np.diagonal(m, 1)
    if len(d) < 2 or np.median(d) <= 0:
        return None
    return float(d.max() / np.median(d))
