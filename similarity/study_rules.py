"""Controls and noise for the similarity study's claims: statistics of the noise-aware verdict rules.

The usable-information report (``funsim report usable-information``) judges the paper's claims
with rules; these statistics feed the rules added beside the first ones (the old labels stay):

* **intervals that respect shared models**: a model recurs in many model pairs, so every
  interval here resamples *models* (:func:`funsim.similarity.statistics.model_resample_weights`,
  the two-way "pigeonhole" bootstrap), not pairs;
* **claim 2b**, :func:`order_margin`: the paired difference of task-loss relative accuracy between
  nested families per directed layer pair, its mean, plus a tolerance from the sampling noise
  of the test rows (``z`` binomial standard errors of the accuracy difference,
  :func:`~funsim.similarity.statistics.accuracy_difference_se`), not a constant;
* **claim 4**, :func:`split_half_differences`: pairs selected on one half of the test rows
  (fine relative accuracy below the ceiling) and scored (coarse - fine) on the other half, both
  ways, so that selecting on a noisy fine score does not bias the difference upwards
  (regression to the mean);
* **claim 5a**, :func:`sufficiency_lift`: ``P(high | CKA >= 0.9) - P(high)``, beside
  ``P(high)`` itself, which the rule requires below a ceiling;
* **multiplicity**, :func:`primary_holm`: Holm-Bonferroni over the rules declared primary;
* **the older rules' intervals**, :func:`model_interval`: the model-resampled interval the rules
  read, with the pair-resampled one (model pairs, what they read before) beside it;
* **claim 1 on task-loss stitching**, :func:`asymmetry_statistics` of :func:`directed_asymmetry`:
  forward minus reverse relative accuracy per directed pair A->B vs B->A, the closed form's tail
  statistics, the mean absolute asymmetry (:func:`mean_abs`), model-resampled intervals.

:func:`noise_statistics` computes every one of them from the report's comparisons table.
Each statistic is checked against a float64 NumPy reference in ``tests/test_study_rules.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import statistics as st
from funsim.similarity._precision import full_precision

__all__ = ["order_margin", "sufficiency_lift", "split_half_differences", "noise_statistics", "primary_holm",
           "model_interval", "mean_abs", "directed_asymmetry", "asymmetry_statistics", "OPPOSITE"]

#: The direction a rule fails in: the p-value of a failed rule is that of the opposite claim.
OPPOSITE = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}


def _check_rows(weights: ArrayLike | None = None, **arrays: ArrayLike) -> None:
    """Every array (and ``weights``) ``(n,)`` with one ``n``; the error names each argument and its shape."""
    shapes = {k: tuple(np.shape(v)) for k, v in {**arrays, "weights": weights}.items() if v is not None}
    if any(len(sh) != 1 for sh in shapes.values()) or len({sh[0] for sh in shapes.values()}) > 1:
        raise ValueError(f"the arrays must be 1-D, one value per pair, all of one length n; got shapes {shapes}.")


@full_precision
def order_margin(*arrays: ArrayLike, weights: ArrayLike | None = None) -> jax.Array:
    """``min_k [mean(d_k) + mean(tol_k)]``: the worst link of a family chain, with its noise tolerance.

    Args:
      arrays: ``d_1, ..., d_K, tol_1, ..., tol_K``, each ``(n,)``: per pair the difference
        ``score(family k + 1) - score(family k)`` of each link of the chain, then each link's
        tolerance (e.g. ``z`` standard errors of that difference).
      weights: ``(n,)`` frequency weights (None: all 1).

    Returns:
      ``()``: negative when some link's mean difference falls below minus its mean tolerance (the
      order broken beyond the noise).

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(order_margin(jnp.array([0.1, -0.1]), jnp.array([-0.05, -0.03]),
      ...                          jnp.array([0.01, 0.01]), jnp.array([0.02, 0.02]))), 3)
      -0.02
    """
    if len(arrays) < 2 or len(arrays) % 2:
        raise ValueError(f"pass K differences then K tolerances (an even number >= 2), got {len(arrays)} arrays.")
    k = len(arrays) // 2
    _check_rows(weights, **{f"{'d' if i < k else 'tol'}_{i % k + 1}": a for i, a in enumerate(arrays)})
    x = jnp.stack([jnp.asarray(a) for a in arrays])
    w = jnp.ones(x.shape[1], x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    means = x @ w / jnp.sum(w)
    return jnp.min(means[:k] + means[k:])


@full_precision
def sufficiency_lift(top: ArrayLike, hit: ArrayLike, /, *, weights: ArrayLike | None = None) -> jax.Array:
    """``P(hit | top) - P(hit)`` with frequency weights: how much a high similarity raises the chance of a hit.

    Args:
      top: ``(n,)`` 0/1: the representational similarity is high (e.g. linear CKA >= 0.9).
      hit: ``(n,)`` 0/1: the functional similarity is high (e.g. relative accuracy >= 0.95).
      weights: ``(n,)`` frequency weights (None: all 1).

    Returns:
      ``()``; NaN when no weighted row is ``top``.

    Examples:
      >>> round(float(sufficiency_lift([1., 1., 0., 0.], [1., 1., 1., 0.])), 3)
      0.25
    """
    _check_rows(weights, top=top, hit=hit)
    top, hit = jnp.asarray(top) * 1.0, jnp.asarray(hit) * 1.0
    w = jnp.ones_like(top) if weights is None else jnp.asarray(weights, top.dtype)
    return jnp.sum(w * top * hit) / jnp.sum(w * top) - jnp.sum(w * hit) / jnp.sum(w)


@full_precision
def split_half_differences(fine_a: ArrayLike, coarse_a: ArrayLike, fine_b: ArrayLike, coarse_b: ArrayLike, /, *,
                           below: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """Claim 4 without regression to the mean: select on one half of the test rows, score on the other.

    A pair is selected on half A when its fine score there is below ``below`` and then contributes
    ``coarse_b - fine_b``; and the other way round (cross-fitting), so each pair gives up to two
    differences. The noise of half B is independent of the selection on half A, so an unbiased
    difference stays unbiased; selecting and scoring on the same rows biases ``coarse - fine``
    upwards, since a pair selected for a low fine score has a low fine noise draw.

    Args:
      fine_a, coarse_a, fine_b, coarse_b: ``(n,)`` per-pair scores (e.g. relative accuracy) on the
        two halves of the test rows.
      below: the selection threshold (the ceiling).

    Returns:
      ``(selected (2n,), differences (2n,))``: first the selections on A (scored on B), then on B
      (scored on A); the statistic is the mean of the selected differences.

    Examples:
      >>> sel, d = split_half_differences([0.9, 0.99], [0.95, 0.99], [0.99, 0.9], [1.0, 0.92])
      >>> sel.tolist(), [round(float(x), 2) for x in d]
      ([True, False, False, True], [0.01, 0.02, 0.05, 0.0])
    """
    _check_rows(fine_a=fine_a, coarse_a=coarse_a, fine_b=fine_b, coarse_b=coarse_b)
    fa, ca, fb, cb = (jnp.asarray(v) * 1.0 for v in (fine_a, coarse_a, fine_b, coarse_b))
    return jnp.concatenate([fa < below, fb < below]), jnp.concatenate([cb - fb, ca - fa])


# ----------------------------------------------------------------------------- from the comparisons table


def _undefined(reason: str) -> dict:
    return {"value": None, "reason": reason}


def _directed(values: Mapping) -> dict:
    out = {}
    for (ds, a, la, b, lb, d), v in values.items():
        for dd in (("a->b", "b->a") if d == "sym" else (d,)):
            out[ds, a, la, b, lb, dd] = v
    return out


def _join(dicts: Sequence[Mapping]) -> tuple[list, list[np.ndarray]]:
    """The keys every dict has, with finite values in all of them."""
    keys = sorted(set(dicts[0]).intersection(*dicts[1:]))
    keys = [k for k in keys if all(np.isfinite(d[k]) for d in dicts)]
    return keys, [np.array([d[k] for k in keys], np.float64) for d in dicts]


def _models(keys: Sequence[tuple]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([f"{k[0]}|{k[1]}" for k in keys]), np.array([f"{k[0]}|{k[3]}" for k in keys])


def _one_model_pair(stat, arrays, keys) -> dict | None:
    """The statistic without intervals (None) and with the reason, when ``keys`` hold fewer than 3 models
    (else None).

    With one model pair every model resample that keeps a pair keeps all of them, so a model (or model-pair)
    bootstrap interval would be a point: no interval, not a false one of width 0."""
    if not st.one_model_pair(*_models(keys)):
        return None
    try:
        value = float(stat(*(np.asarray(x, np.float64) for x in arrays)))
    except ValueError as e:  # undefined on the data itself (a constant array), as in the bootstrap below
        return _undefined(str(e).split(";")[0])
    if not np.isfinite(value):
        return _undefined(f"{getattr(stat, '__name__', 'the statistic')} is {value} on the data (e.g. a constant array)")
    return {"value": value, "interval": None, "interval_pairs": None, "reason": st.ONE_MODEL_PAIR}


def _model_interval(stat, arrays, keys, key, n_resamples: int, level: float, p_out: dict, name: str,
                    min_n: int = 4) -> dict:
    """``{"value", "interval"}`` of a model bootstrap, its one-sided p-values against 0 into ``p_out[name]``."""
    if len(keys) < min_n:
        return _undefined(f"{len(keys)} pairs (fewer than {min_n})")
    one = _one_model_pair(stat, arrays, keys)
    if one is not None:
        return {k: v for k, v in one.items() if k != "interval_pairs"}
    try:
        est, samples = st.bootstrap_distribution(stat, tuple(arrays), key=key, n_resamples=n_resamples,
                                                 models=_models(keys))
    except ValueError as e:
        return _undefined(str(e).split(";")[0])
    lo, hi = np.nanquantile(samples, [(1 - level) / 2, (1 + level) / 2])
    p_out[name] = {d: st.bootstrap_p_value(samples, 0.0, d) for d in OPPOSITE}
    return {"value": est, "interval": [float(lo), float(hi)]}


@full_precision
def noise_statistics(table: Any, n_test: Mapping[str, int] | None, /, *, key: jax.Array, n_resamples: int = 2000,
                     level: float = 0.95, high: float = 0.95, cka_high: float = 0.9, below: float = 0.95,
                     z: float = 1.96, families: Sequence[str] = ("orthogonal", "scaled_orthogonal", "affine")) -> dict:
    """The statistics of the noise-aware rules, from the report's comparisons table.

    Args:
      table: ``get(measure, split, task) -> {(dataset, model_a, layer_a, model_b, layer_b, direction): value}``
        and ``tasks(prefix) -> [task, ...]`` (the report's table of ``comparisons.csv``).
      n_test: test rows per data set (the zoo's manifest); None or missing: claim 2b is not computed.
      key, n_resamples, level: the model bootstrap.
      high: relative accuracy counted as high functional similarity (claim 5a).
      cka_high: linear CKA counted as high representational similarity (claim 5a).
      below: the ceiling: fine relative accuracy below it selects a pair (claim 4).
      z: standard errors of the test-row noise in claim 2b's tolerance.
      families: the nested families, in order.

    Returns:
      ``{name: {"value", "interval"} | number | {"value": None, "reason"}}`` for ``order_margin_task``,
      ``p_high_overall``, ``sufficiency_lift_cka_090``, ``split_model_pairs``,
      ``granularity_split_summed``, ``granularity_split_head``; and ``bootstrap_p``:
      ``{name: {direction: one-sided p-value of "statistic <direction> 0"}}`` for :func:`primary_holm`.
    """
    out: dict = {}
    p_out: dict = {}
    rel = {f: table.get(f"task/{f}/relative_accuracy", "held_out", "fine") for f in families}
    fams = [f for f in families if rel[f]]
    keys_ = iter(jax.random.split(key, 4))
    # claim 2b: paired differences of nested families, tolerance from the test rows' binomial noise
    if len(fams) < 2:
        out["order_margin_task"] = _undefined(f"task-loss families in this run: {', '.join(fams) or 'none'}")
    elif not n_test:
        out["order_margin_task"] = _undefined("not computed: no zoo manifest, so the test-set size is unknown")
    else:
        acc = [table.get(f"task/{f}/accuracy", "held_out", "fine") for f in fams]
        own = table.get(f"task/{fams[0]}/own_accuracy", "held_out", "fine")
        keys, vals = _join([rel[f] for f in fams] + acc + [own])
        keep = [i for i, kk in enumerate(keys) if n_test.get(kk[0]) and vals[-1][i] > 0]
        keys, vals = [keys[i] for i in keep], [v[keep] for v in vals]
        k = len(fams)
        n = np.array([n_test[kk[0]] for kk in keys], np.float64)
        diffs = [vals[i + 1] - vals[i] for i in range(k - 1)]
        tols = [z * np.asarray(st.accuracy_difference_se(vals[k + i], vals[k + i + 1], n)) / vals[-1]
                for i in range(k - 1)]
        out["order_margin_task"] = _model_interval(order_margin, diffs + tols, keys, next(keys_), n_resamples,
                                                   level, p_out, "order_margin_task")
    # claim 5a: the lift of P(high) by high CKA, beside P(high) for the ceiling
    cka = _directed(table.get("cka/linear", "all"))
    pairs = [(kk, cka[kk], v) for f in fams for kk, v in rel[f].items() if kk in cka and np.isfinite(v)
             and np.isfinite(cka[kk])]
    if pairs:
        x, y = np.array([p[1] for p in pairs]), np.array([p[2] for p in pairs])
        out["p_high_overall"] = float(np.mean(y >= high))
        out["sufficiency_lift_cka_090"] = (
            _undefined(f"no pair with linear CKA >= {cka_high:g}") if not np.any(x >= cka_high) else
            _model_interval(sufficiency_lift, ((x >= cka_high) * 1.0, (y >= high) * 1.0), [p[0] for p in pairs],
                            next(keys_), n_resamples, level, p_out, "sufficiency_lift_cka_090"))
    else:
        out["p_high_overall"] = out["sufficiency_lift_cka_090"] = _undefined(
            "no task-loss stitching with linear CKA in this run")
    out.update(_split_statistics(table, fams, below, keys_, n_resamples, level, p_out))
    out["bootstrap_p"] = p_out
    return out


def _split_statistics(table, fams, below, keys_, n_resamples, level, p_out) -> dict:
    """Claim 4 on halves of the test rows (``relative_accuracy_half0`` / ``_half1``)."""
    half = lambda f, task, h: table.get(f"task/{f}/relative_accuracy_half{h}", "held_out", task)  # noqa: E731
    if not any(half(f, "fine", 0) for f in fams):
        why = "not computed: the run predates the per-half recording of task-loss stitching"
        return {n: _undefined(why) for n in ("split_model_pairs", "granularity_split_summed",
                                             "granularity_split_head")}
    model_pairs = set()
    for f in fams:
        keys, (a0, a1) = _join([half(f, "fine", 0), half(f, "fine", 1)])
        model_pairs |= {(kk[0], kk[1], kk[3]) for kk, x0, x1 in zip(keys, a0, a1) if x0 < below or x1 < below}
    out: dict = {"split_model_pairs": len(model_pairs)}
    for name, prefix in (("granularity_split_summed", "coarse:"), ("granularity_split_head", "coarse_head:")):
        diffs, dkeys = [], []
        for f in fams:
            for task in table.tasks(prefix):
                keys, (f0, f1, c0, c1) = _join([half(f, "fine", 0), half(f, "fine", 1), half(f, task, 0),
                                                half(f, task, 1)])
                sel, d = (np.asarray(v) for v in split_half_differences(f0, c0, f1, c1, below=below))
                diffs += list(d[sel])
                dkeys += [kk for kk, s in zip(keys + keys, sel) if s]
        out[name] = (_undefined(f"no {prefix[:-1].replace('_', ' ')} task selected below the ceiling on a half")
                     if not diffs else _model_interval(st.weighted_mean, (np.array(diffs),), dkeys, next(keys_),
                                                       n_resamples, level, p_out, name, min_n=2))
    return out


@full_precision
def mean_abs(x: ArrayLike, /, *, weights: ArrayLike | None = None) -> jax.Array:
    """The weighted mean of ``|x|`` (e.g. how far forward and reverse stitching differ, whatever the sign).

    Examples:
      >>> round(float(mean_abs([0.1, -0.3])), 3)
      0.2
    """
    _check_rows(weights, x=x)
    x = jnp.abs(jnp.asarray(x) * 1.0)
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights, x.dtype)
    return jnp.sum(w * x) / jnp.sum(w)


@full_precision
def model_interval(stat, arrays: Sequence[ArrayLike], keys: Sequence[tuple], /, *, key: jax.Array,
                   n_resamples: int = 2000, level: float = 0.95, min_n: int = 4) -> dict:
    """A statistic with its model-resampled interval and, beside it, the pair-resampled one.

    ``interval`` resamples models (``bootstrap(..., models=)``, the two-way bootstrap: a model recurs
    in many pairs); ``interval_pairs`` resamples model pairs (clusters of their layer pairs), the
    interval the report's first rules read before 2026-12-06, kept for comparison. The keys of
    ``key``: ``jax.random.split(key)``, models first.

    Args:
      stat: a statistic taking the arrays and ``weights=`` (e.g. ``statistics.excess_kurtosis``).
      arrays: ``(n,)`` arrays.
      keys: ``(dataset, model_a, layer_a, model_b, layer_b, ...)`` per row.
      key, n_resamples, level: the bootstraps.
      min_n: fewer rows: undefined.

    Returns:
      ``{"value", "interval", "interval_pairs"}``, or ``{"value": None, "reason"}`` when the statistic
      or every model resample is undefined. With fewer than 3 models (one model pair) both intervals
      are None with the reason ``statistics.ONE_MODEL_PAIR`` (an interval rule reads that as inconclusive):
      every resample would hold the same pairs.
    """
    if len(keys) < min_n:
        return _undefined(f"{len(keys)} pairs (fewer than {min_n})")
    arrays = tuple(np.asarray(a, np.float64) for a in arrays)
    one = _one_model_pair(stat, arrays, keys)
    if one is not None:
        return one
    k_models, k_pairs = jax.random.split(key)
    q = [(1 - level) / 2, (1 + level) / 2]
    try:
        est, samples = st.bootstrap_distribution(stat, arrays, key=k_models, n_resamples=n_resamples,
                                                 models=_models(keys))
        pairs = st.bootstrap(stat, arrays, key=k_pairs, n_resamples=n_resamples, level=level,
                             clusters=np.array([f"{k[0]}|{k[1]}|{k[3]}" for k in keys]))
    except ValueError as e:
        return _undefined(str(e).split(";")[0])
    if not np.any(np.isfinite(samples)):
        return _undefined("undefined on every model resample")
    return {"value": est, "interval": [float(v) for v in np.nanquantile(samples, q)],
            "interval_pairs": [pairs.low, pairs.high]}


@full_precision
def directed_asymmetry(values: Mapping) -> tuple[list, np.ndarray]:
    """``score(A->B) - score(B->A)`` for every layer pair stitched both ways (finite both ways).

    Args:
      values: ``{(dataset, model_a, layer_a, model_b, layer_b, direction): score}``, directions
        ``"a->b"`` and ``"b->a"`` (e.g. task-loss relative accuracy).

    Returns:
      ``(keys, d)``: ``(dataset, model_a, layer_a, model_b, layer_b)`` per pair, sorted, and ``(n,)`` differences.

    Examples:
      >>> directed_asymmetry({("d", "m0", "l0", "m1", "l1", "a->b"): 0.9, ("d", "m0", "l0", "m1", "l1", "b->a"): 0.7})
      ([('d', 'm0', 'l0', 'm1', 'l1')], array([0.2]))
    """
    keys = sorted(k[:5] for k in values if k[5] == "a->b" and (*k[:5], "b->a") in values
                  and np.isfinite(values[k]) and np.isfinite(values[(*k[:5], "b->a")]))
    return keys, np.array([values[(*k, "a->b")] - values[(*k, "b->a")] for k in keys], np.float64)


@full_precision
def asymmetry_statistics(keys: Sequence[tuple], d: ArrayLike, /, *, key: jax.Array, n_resamples: int = 2000,
                         level: float = 0.95) -> dict:
    """Claim 1's tail statistics of forward minus reverse scores, with model-resampled intervals.

    Args:
      keys, d: :func:`directed_asymmetry`'s output.
      key, n_resamples, level: the bootstraps (:func:`model_interval`).

    Returns:
      ``statistics.tail_statistics(d)`` plus ``mean_abs`` and ``fraction_abs_gt_0.1``, and
      ``excess_kurtosis_ci95`` / ``mean_abs_ci95`` (model-resampled) with ``..._ci95_pairs``
      (pair-resampled) beside each; an interval is None where undefined (reason in ``undefined``).

    Raises:
      ValueError: fewer than 4 pairs.
    """
    d = np.asarray(d, np.float64)
    if d.size < 4:
        raise ValueError(f"{d.size} layer pairs stitched both ways (fewer than 4).")
    out = {**st.tail_statistics(d), "mean_abs": float(np.mean(np.abs(d))),
           "fraction_abs_gt_0.1": float(np.mean(np.abs(d) > 0.1))}
    keys = [(*k, None) for k in keys]
    for i, (name, stat) in enumerate((("excess_kurtosis", st.excess_kurtosis), ("mean_abs", mean_abs))):
        r = model_interval(stat, (d,), keys, key=jax.random.fold_in(key, i), n_resamples=n_resamples, level=level)
        out[f"{name}_ci95"], out[f"{name}_ci95_pairs"] = r.get("interval"), r.get("interval_pairs")
        if r["value"] is None:
            out.setdefault("undefined", {})[name] = r["reason"]
    return out


@full_precision
def primary_holm(verdicts: Iterable[Any], bootstrap_p: Mapping[str, Mapping[str, float]],
                 primary: Iterable[str], /, *, alpha: float = 0.025) -> list[dict]:
    """Holm-Bonferroni over the primary rules: does each label survive the correction?

    The family is the primary rules that were tested: a decided rule (passed or failed) and one whose
    interval straddles its threshold. A rule whose statistic is undefined or whose precondition failed
    (e.g. the ceiling) tested nothing and is left out, with p None. A passed rule's p-value is the
    one-sided bootstrap p-value of ``statistic <direction> 0``; a failed rule's, that of the opposite
    claim (:data:`OPPOSITE`); a straddling one's, that of the rule's own claim. A decided label stands
    when its Holm-adjusted p-value is at most ``alpha`` (0.025: the one-sided level of the rules'
    two-sided 95% intervals).

    Args:
      verdicts: the report's verdicts (``rule.claim``, ``rule.statistic``, ``rule.direction``,
        ``rule.threshold``, ``outcome``, ``reason``, ``label``).
      bootstrap_p: :func:`noise_statistics`' ``bootstrap_p``.
      primary: the claims of the primary rules.
      alpha: the family-wise level.

    Returns:
      ``[{"claim", "label", "p", "p_holm", "stands"}]`` in the verdicts' order (p and p_holm None
      for a rule left out).

    Raises:
      ValueError: a primary rule with a threshold other than 0 (the p-values are against 0).
    """
    primary = set(primary)
    rows, tested = [], []
    for v in verdicts:
        r = v.rule
        if r.claim not in primary:
            continue
        if r.threshold != 0:
            raise ValueError(f"The primary rule {r.claim!r} has threshold {r.threshold}; primary rules test a "
                             "sign (threshold 0), the bootstrap p-values are against 0.")
        ps = bootstrap_p.get(r.statistic)
        straddles = v.outcome == "undefined" and v.reason == "interval straddles the threshold"
        p = None
        if ps is not None and (v.outcome in ("pass", "fail") or straddles):
            p = float(ps[OPPOSITE[r.direction] if v.outcome == "fail" else r.direction])
            tested.append(len(rows))
        rows.append({"claim": r.claim, "label": v.label, "p": p, "p_holm": None, "stands": False})
    if tested:
        adjusted = np.asarray(st.holm(np.array([rows[i]["p"] for i in tested], np.float64)))
        for i, a in zip(tested, adjusted):
            rows[i]["p_holm"] = float(a)
            rows[i]["stands"] = bool(a <= alpha and not rows[i]["label"].startswith("inconclusive"))
    return rows
