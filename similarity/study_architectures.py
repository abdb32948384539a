"""Claim 3 of the similarity study by architecture: R^2 of a measure against a score on subsets of model pairs.

The usable-information report (``funsim report usable-information``) asks how well a representational
measure (CKA, RSA, ...) predicts a stitching score over directed layer pairs. Pooled over a zoo, that R^2
mixes populations (MLP against conv architectures); these functions split it:

* :func:`architecture_pair_r2`: R^2 per unordered pair of architectures (same-architecture pairs included);
* :func:`leave_one_architecture_out`: R^2 over the pairs in which neither model is of architecture X, and
  its change from the R^2 over every pair (with a paired interval on the change);
* :func:`family_split_r2`: pairs of dense (all-dense-layer) architectures only against pairs with a conv one;
* :func:`r2_skipped_both_ways`: R^2 with cells a measure skipped (e.g. RSA on layers wider than the
  study's feature limit, :func:`rsa_skipped_mask`) left out, and set to 0 as the paper's code stores them.

Every interval resamples *models* (the two-way bootstrap of
:func:`funsim.similarity.statistics.bootstrap_distribution` with ``models=``): a model recurs in many
pairs. Every subset is bootstrapped with the same ``key``, so a result depends on the subset's rows and
model ids, not on the architectures' names or the order of the rows. A subset where R^2 is undefined
(too few pairs, a constant measure or score, every resample degenerate) gets ``{"value": None,
"reason": ...}``, never a silent NaN. Checked against float64 NumPy in ``tests/test_study_rules.py``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import statistics as st
from funsim.similarity._precision import full_precision

__all__ = ["architecture_of", "architecture_map", "dense_architectures", "subset_r2", "architecture_pair_r2",
           "pair_matrix", "leave_one_architecture_out", "family_split_r2", "rsa_skipped_mask",
           "r2_skipped_both_ways"]


def architecture_of(model_id: str) -> str:
    """A model's architecture from its id: the last ``/`` component without its ``_s<seed>`` suffix.

    Examples:
      >>> architecture_of("digits/mlp_wide_s0"), architecture_of("cnn_s12")
      ('mlp_wide', 'cnn')
    """
    return re.sub(r"_s\d+$", "", str(model_id).rsplit("/", 1)[-1])


def architecture_map(models: Mapping[str, Mapping]) -> dict[str, str]:
    """``{model id: architecture}`` from a zoo manifest's ``models``: each entry's ``name`` (its spec in the
    zoo config), else :func:`architecture_of` its id.

    Examples:
      >>> architecture_map({"d/a_s0": {"name": "mlp"}, "d/cnn_s1": {}})
      {'d/a_s0': 'mlp', 'd/cnn_s1': 'cnn'}
    """
    return {mid: str(e.get("name") or architecture_of(mid)) for mid, e in models.items()}


def dense_architectures(models: Mapping[str, Mapping], architectures: Mapping[str, str]) -> frozenset[str]:
    """The architectures every layer of every model of which has a 1-D feature shape (MLP-like).

    Args:
      models: a zoo manifest's ``models``: ``{model id: {"feature_shapes": {layer: shape}}}``.
      architectures: ``{model id: architecture}`` (:func:`architecture_map`).

    Examples:
      >>> sorted(dense_architectures({"a": {"feature_shapes": {"fc": [4]}}, "b": {"feature_shapes":
      ...     {"c0": [3, 3, 8], "fc": [4]}}}, {"a": "mlp", "b": "cnn"}))
      ['mlp']
    """
    conv = {architectures[mid] for mid, e in models.items()
            if any(len(s) != 1 for s in e["feature_shapes"].values())}
    return frozenset(architectures[mid] for mid in models) - conv


def _rows(x, y, model_a, model_b, **more) -> tuple[np.ndarray, ...]:
    """The arrays as NumPy, all 1-D of one length; the error names each argument and its shape."""
    arrays = {"x": x, "y": y, "model_a": model_a, "model_b": model_b, **more}
    out = {k: np.asarray(v) for k, v in arrays.items()}
    shapes = {k: v.shape for k, v in out.items()}
    if any(len(s) != 1 for s in shapes.values()) or len({s[0] for s in shapes.values()}) > 1:
        raise ValueError(f"the arrays must be 1-D, one value per directed layer pair, all of one length n; "
                         f"got shapes {shapes}.")
    return tuple(out.values())


def _finite(**arrays: np.ndarray) -> None:
    for name, v in arrays.items():
        bad = int(np.sum(~np.isfinite(v.astype(np.float64))))
        if bad:
            raise ValueError(f"{name} (shape {v.shape}) has {bad} non-finite values; leave undefined cells out "
                             "first (r2_skipped_both_ways handles skipped ones).")


def _labels(model_a, model_b, architectures: Mapping[str, str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's two architectures: ``architectures[id]``, or :func:`architecture_of` without a mapping."""
    if architectures is None:
        return (np.array([architecture_of(m) for m in model_a], dtype=object),
                np.array([architecture_of(m) for m in model_b], dtype=object))
    out = []
    for name, ids in (("model_a", model_a), ("model_b", model_b)):
        unknown = sorted({str(m) for m in ids} - set(map(str, architectures)))
        if unknown:
            raise ValueError(f"{name} (shape {ids.shape}) has model ids not in architectures ({len(architectures)} "
                             f"models): {unknown[:5]}{' ...' if len(unknown) > 5 else ''}.")
        out.append(np.array([architectures[str(m)] for m in ids], dtype=object))
    return out[0], out[1]


def _cell(stat, arrays, model_a, model_b, key, n_resamples: int, level: float, min_n: int) -> dict:
    """``{"value", "interval" (models resampled), "n", "models"}``, or value None with the reason."""
    n, models = len(model_a), len(set(model_a.tolist()) | set(model_b.tolist()))
    if n < min_n:
        return {"value": None, "reason": f"{n} directed pairs (fewer than {min_n})", "n": n, "models": models}
    if st.one_model_pair(model_a.astype(str), model_b.astype(str)):  # the interval would be a point
        value = float(stat(*(np.asarray(a, np.float64) for a in arrays)))
        return ({"value": value, "interval": None, "interval_reason": st.ONE_MODEL_PAIR, "n": n, "models": models}
                if np.isfinite(value) else
                {"value": None, "reason": f"{getattr(stat, '__name__', 'the statistic')} is {value} on the data "
                 "(e.g. a constant array)", "n": n, "models": models})
    try:
        est, samples = st.bootstrap_distribution(stat, tuple(np.asarray(a, np.float64) for a in arrays), key=key,
                                                 n_resamples=n_resamples, models=(model_a.astype(str),
                                                                                  model_b.astype(str)))
    except ValueError as e:  # undefined on the data itself (a constant measure or score)
        return {"value": None, "reason": str(e).split(";")[0], "n": n, "models": models}
    if not np.any(np.isfinite(samples)):
        return {"value": None, "reason": "undefined on every model resample", "n": n, "models": models}
    q = [(1 - level) / 2, (1 + level) / 2]
    return {"value": float(est), "interval": [float(v) for v in np.nanquantile(samples, q)], "n": n,
            "models": models}


@full_precision
def subset_r2(x: ArrayLike, y: ArrayLike, model_a: ArrayLike, model_b: ArrayLike, masks: Mapping[str, ArrayLike],
              /, *, key: jax.Array, n_resamples: int = 2000, level: float = 0.95, min_n: int = 4) -> dict:
    """R^2 of ``y ~ x`` on each subset of rows, with its model-resampled interval.

    Args:
      x: ``(n,)`` the measure per directed layer pair (finite).
      y: ``(n,)`` the score per directed layer pair (finite).
      model_a, model_b: ``(n,)`` the two models' ids per row (unique across data sets).
      masks: ``{name: (n,) bool}``, the rows of each subset.
      key, n_resamples, level: the model bootstrap (the same key for every subset).
      min_n: fewer rows in a subset: undefined.

    Returns:
      ``{name: {"value", "interval", "n", "models"}}``; ``{"value": None, "reason", "n", "models"}`` where
      undefined; with fewer than 3 models (one model pair) ``interval`` is None and ``interval_reason`` says why.

    Raises:
      ValueError: arrays not 1-D of one length, or non-finite ``x`` / ``y``.

    Examples:
      >>> r = subset_r2([0., 1., 2., 3.], [0., 1., 2., 3.5], ["a", "a", "b", "b"], ["b", "c", "c", "c"],
      ...               {"all": [True] * 4}, key=jax.random.key(0), n_resamples=20)
      >>> round(r["all"]["value"], 2), r["all"]["n"], r["all"]["models"]
      (0.99, 4, 3)
    """
    x, y, model_a, model_b = _rows(x, y, model_a, model_b)
    _finite(x=x, y=y)
    out = {}
    for name, mask in masks.items():
        mask = np.asarray(mask, bool)
        if mask.shape != x.shape:
            raise ValueError(f"masks[{name!r}] has shape {mask.shape}; the arrays have shape {x.shape}.")
        out[name] = _cell(st.r2, (x[mask], y[mask]), model_a[mask], model_b[mask], key, n_resamples, level, min_n)
    return out


@full_precision
def architecture_pair_r2(x: ArrayLike, y: ArrayLike, model_a: ArrayLike, model_b: ArrayLike, /, *,
                         architectures: Mapping[str, str] | None = None, key: jax.Array, n_resamples: int = 2000,
                         level: float = 0.95, min_n: int = 4) -> dict[tuple[str, str], dict]:
    """R^2 of ``y ~ x`` per unordered pair of architectures (a row belongs to the pair of its two models').

    Args:
      x, y, model_a, model_b: ``(n,)`` as :func:`subset_r2`.
      architectures: ``{model id: architecture}`` (:func:`architecture_map`); None: :func:`architecture_of`.
      key, n_resamples, level, min_n: as :func:`subset_r2`.

    Returns:
      ``{(arch_1, arch_2): cell}`` with ``arch_1 <= arch_2``, for every pair that has rows (cells as
      :func:`subset_r2`).

    Raises:
      ValueError: arrays not 1-D of one length, non-finite values, or a model id not in ``architectures``.
    """
    x, y, model_a, model_b = _rows(x, y, model_a, model_b)
    la, lb = _labels(model_a, model_b, architectures)
    lo, hi = np.where(la <= lb, la, lb), np.where(la <= lb, lb, la)
    masks = {p: (lo == p[0]) & (hi == p[1]) for p in sorted(set(zip(lo.tolist(), hi.tolist())))}
    return subset_r2(x, y, model_a, model_b, masks, key=key, n_resamples=n_resamples, level=level, min_n=min_n)


def pair_matrix(cells: Mapping[tuple[str, str], Mapping], names: list[str] | None = None
                ) -> tuple[list[str], np.ndarray]:
    """:func:`architecture_pair_r2`'s cells as a symmetric ``(k, k)`` matrix of values over ``names`` (None:
    the sorted architectures of the cells); NaN where undefined or absent. For a heatmap.

    Examples:
      >>> pair_matrix({("a", "a"): {"value": 0.5}, ("a", "b"): {"value": None}})
      (['a', 'b'], array([[0.5, nan],
             [nan, nan]]))
    """
    names = sorted({a for p in cells for a in p}) if names is None else list(names)
    pos = {a: i for i, a in enumerate(names)}
    m = np.full((len(names), len(names)), np.nan)
    for (a, b), c in cells.items():
        if c.get("value") is not None and a in pos and b in pos:
            m[pos[a], pos[b]] = m[pos[b], pos[a]] = c["value"]
    return names, m


def _r2_change(x, y, keep, *, weights=None):
    """R^2 on the kept rows minus R^2 on every row (a statistic for the bootstrap)."""
    w = jnp.ones_like(x) if weights is None else weights
    return st.r2(x, y, weights=w * keep) - st.r2(x, y, weights=w)


@full_precision
def leave_one_architecture_out(x: ArrayLike, y: ArrayLike, model_a: ArrayLike, model_b: ArrayLike, /, *,
                               architectures: Mapping[str, str] | None = None, key: jax.Array,
                               n_resamples: int = 2000, level: float = 0.95, min_n: int = 4) -> dict:
    """R^2 of ``y ~ x`` over the rows in which neither model is of architecture X, for each X.

    Args:
      x, y, model_a, model_b, architectures, key, n_resamples, level, min_n: as :func:`architecture_pair_r2`.

    Returns:
      ``{"all": cell, "without": {X: {**cell, "change", "change_interval"}}}``: ``change`` is R^2 without X
      minus R^2 over every row (None where either is undefined); ``change_interval`` resamples the models of
      every row once for both (paired), None where undefined.

    Raises:
      ValueError: as :func:`architecture_pair_r2`.
    """
    x, y, model_a, model_b = _rows(x, y, model_a, model_b)
    la, lb = _labels(model_a, model_b, architectures)
    names = sorted(set(la) | set(lb))
    masks = {"all": np.ones(x.shape, bool), **{a: (la != a) & (lb != a) for a in names}}
    cells = subset_r2(x, y, model_a, model_b, masks, key=key, n_resamples=n_resamples, level=level, min_n=min_n)
    base = cells.pop("all")
    for a, c in cells.items():
        c["change"] = c["change_interval"] = None
        if c["value"] is not None and base["value"] is not None:
            c["change"] = c["value"] - base["value"]
            d = _cell(_r2_change, (x, y, masks[a] * 1.0), model_a, model_b, key, n_resamples, level, min_n)
            c["change_interval"] = d.get("interval")
    return {"all": base, "without": cells}


@full_precision
def family_split_r2(x: ArrayLike, y: ArrayLike, model_a: ArrayLike, model_b: ArrayLike, dense: Collection[str], /,
                    *, architectures: Mapping[str, str] | None = None, key: jax.Array, n_resamples: int = 2000,
                    level: float = 0.95, min_n: int = 4) -> dict:
    """R^2 of ``y ~ x`` on the rows whose two models are of dense architectures, and on the others.

    Args:
      x, y, model_a, model_b, architectures, key, n_resamples, level, min_n: as :func:`architecture_pair_r2`.
      dense: the dense architectures (:func:`dense_architectures`).

    Returns:
      ``{"dense_only": cell, "with_conv": cell}`` (``with_conv``: a pair with at least one model of an
      architecture not in ``dense``).
    """
    x, y, model_a, model_b = _rows(x, y, model_a, model_b)
    la, lb = _labels(model_a, model_b, architectures)
    both = np.array([a in dense and b in dense for a, b in zip(la, lb)], bool)
    return subset_r2(x, y, model_a, model_b, {"dense_only": both, "with_conv": ~both}, key=key,
                     n_resamples=n_resamples, level=level, min_n=min_n)


def rsa_skipped_mask(x: ArrayLike, width_a: ArrayLike, width_b: ArrayLike, /, *, limit: int | None) -> np.ndarray:
    """``(n,)`` bool: the cells the study skipped for width: ``x`` NaN where either layer has more than
    ``limit`` features (the study records a skipped cell as NaN, like any undefined one, so the widths
    tell them apart; ``limit`` None: nothing skipped).

    Examples:
      >>> rsa_skipped_mask([float("nan"), float("nan"), 0.3], [4096, 10, 4096], [10, 10, 10], limit=2048)
      array([ True, False, False])
    """
    x, wa, wb = (np.asarray(v) for v in (x, width_a, width_b))
    if not (x.ndim == 1 and x.shape == wa.shape == wb.shape):
        raise ValueError(f"x, width_a and width_b must be 1-D of one length, got shapes {x.shape}, {wa.shape}, "
                         f"{wb.shape}.")
    if limit is None:
        return np.zeros(x.shape, bool)
    return np.isnan(x.astype(np.float64)) & (np.maximum(wa, wb) > limit)


@full_precision
def r2_skipped_both_ways(x: ArrayLike, y: ArrayLike, model_a: ArrayLike, model_b: ArrayLike, skipped: ArrayLike,
                         /, *, key: jax.Array, n_resamples: int = 2000, level: float = 0.95, min_n: int = 4) -> dict:
    """R^2 of ``y ~ x`` with the skipped cells left out, and with them set to 0 (the paper code's 0.0).

    Args:
      x: ``(n,)`` the measure; NaN at the skipped cells and at any other undefined cell.
      y: ``(n,)`` the score (finite).
      model_a, model_b: ``(n,)`` model ids.
      skipped: ``(n,)`` bool, the skipped cells (:func:`rsa_skipped_mask`); each must be NaN in ``x``.
      key, n_resamples, level, min_n: as :func:`subset_r2`.

    Returns:
      ``{"excluded": cell, "as_zero": cell, "skipped_cells", "other_undefined_cells"}``: the other undefined
      cells (NaN, not skipped) are left out both ways.

    Raises:
      ValueError: arrays not 1-D of one length, non-finite ``y``, or a skipped cell that is not NaN.
    """
    x, y, model_a, model_b, skipped = _rows(x, y, model_a, model_b, skipped=skipped)
    x, skipped = x.astype(np.float64), skipped.astype(bool)
    _finite(y=y)
    if np.any(skipped & ~np.isnan(x)):
        raise ValueError(f"skipped (shape {skipped.shape}) marks {int(np.sum(skipped & ~np.isnan(x)))} cells where x "
                         "is defined; a skipped cell is NaN.")
    other = np.isnan(x) & ~skipped
    filled = np.where(skipped, 0.0, x)
    keep = ~other
    cells = subset_r2(filled[keep], y[keep], model_a[keep], model_b[keep],
                      {"excluded": ~skipped[keep], "as_zero": np.ones(int(keep.sum()), bool)}, key=key,
                      n_resamples=n_resamples, level=level, min_n=min_n)
    return {**cells, "skipped_cells": int(skipped.sum()), "other_undefined_cells": int(other.sum())}
