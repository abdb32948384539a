"""Functional similarity of models' layers by task-loss stitching.

:func:`functional_similarity`: two models' layers, both directions.

Over the pure library (``similarity.train_stitcher``): it takes two
models and data, splits the data, extracts the activations, trains a stitcher
in each direction through the target model's frozen tail (obtained with
``models.split_tail``, so models of one architecture share the compiled loop),
and scores it on held-out data against the target model's own layer.

Models are duck-typed: each needs ``.features(x) -> {layer: activations}``,
``.tail(layer, z) -> logits`` and ``.layer_names()`` (every ``models.*``
network has them).

:func:`stitch_into_targets`: many source layers into one layer of a stack of models of one
architecture at once, on fine and coarse tasks (the similarity study's task-loss stitching).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from funsim.models.tails import coarsen_logits, penultimate, split_tail, stack_head_tails, stack_tails
from funsim.similarity import (
    FAMILIES,
    Stitcher,
    TrainHistory,
    stitch_representation,
    stitched_logits,
    train_stitcher,
    train_stitchers,
)

__all__ = ["DirectionResult", "FunctionalSimilarity", "functional_similarity", "split_data", "logit_scores",
           "TargetScore", "head_takes", "stitch_into_targets"]


class DirectionResult(NamedTuple):
    """One stitching direction, source layer -> target model, scored on held-out data.

    Attributes:
      source, target: ``"A:layer"`` and ``"B:layer"`` labels.
      family: the stitcher family.
      n_train, n_eval: samples used to fit the stitcher and to score it.
      own_accuracy, stitched_accuracy: held-out accuracy of the target model
        with its own layer, and with the stitched source layer.
      relative_accuracy: ``stitched_accuracy / own_accuracy``.
      own_ce, stitched_ce: held-out mean cross-entropies in nats.
      ce_gap: ``stitched_ce - own_ce`` (nats): the usable information about the
        labels that the target layer has and the source layer, through this
        family, lacks. Near 0 means the source layer is functionally as good.
      relative_ce: ``stitched_ce / own_ce``.
      train_stitched_accuracy, train_stitched_ce: the same on the training
        split (in-sample, optimistic; shown for diagnosis, not the score).
      stitcher: the trained :class:`~similarity.Stitcher`.
      history: its :class:`~similarity.TrainHistory`.
    """

    source: str
    target: str
    family: str
    n_train: int
    n_eval: int
    own_accuracy: float
    stitched_accuracy: float
    relative_accuracy: float
    own_ce: float
    stitched_ce: float
    ce_gap: float
    relative_ce: float
    train_stitched_accuracy: float
    train_stitched_ce: float
    stitcher: Stitcher
    history: TrainHistory


class FunctionalSimilarity(NamedTuple):
    """Task-loss stitching in both directions between two layers (``print`` it for a table).

    Attributes:
      a_to_b: A's layer stitched into B (scored with B's tail and B's own accuracy).
      b_to_a: B's layer stitched into A, or ``None`` when one direction was asked.
    """

    a_to_b: DirectionResult
    b_to_a: DirectionResult | None

    @property
    def accuracy_asymmetry(self) -> float:
        """``relative_accuracy(A->B) - relative_accuracy(B->A)``; > 0: A's layer serves B better."""
        self._need_reverse()
        return self.a_to_b.relative_accuracy - self.b_to_a.relative_accuracy

    @property
    def ce_asymmetry(self) -> float:
        """``ce_gap(B->A) - ce_gap(A->B)`` in nats; > 0: B's layer lacks more of what A needs."""
        self._need_reverse()
        return self.b_to_a.ce_gap - self.a_to_b.ce_gap

    def _need_reverse(self):
        if self.b_to_a is None:
            raise ValueError("Only one direction was computed; call with both_directions=True.")

    def summary(self) -> str:
        """A small fixed-width table of both directions and the asymmetry."""
        d = self.a_to_b
        lines = [
            f"Functional similarity by task-loss stitching ({d.family}; fit on {d.n_train}, "
            f"scored on {d.n_eval} held-out samples)",
            f"{'direction':<24} {'own acc':>8} {'stitch acc':>10} {'rel acc':>8} "
            f"{'own CE':>8} {'stitch CE':>9} {'CE gap':>8}",
        ]
        for r in (self.a_to_b, self.b_to_a):
            if r is None:
                continue
            lines.append(
                f"{r.source + ' -> ' + r.target:<24} {r.own_accuracy:>8.3f} "
                f"{r.stitched_accuracy:>10.3f} {r.relative_accuracy:>8.3f} {r.own_ce:>8.3f} "
                f"{r.stitched_ce:>9.3f} {r.ce_gap:>8.3f}"
            )
        if self.b_to_a is not None:
            lines.append(
                f"asymmetry: rel acc (A->B) - (B->A) = {self.accuracy_asymmetry:+.3f}; "
                f"CE gap (B->A) - (A->B) = {self.ce_asymmetry:+.3f} nats"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _check_layer(model, layer, arg: str, model_arg: str) -> None:
    for attr in ("features", "tail", "layer_names"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(
                f"{model_arg} must have .features(x) -> {{layer: activations}}, .tail(layer, z) "
                f"-> logits and .layer_names(); {type(model).__name__} has no callable .{attr}."
            )
    names = list(model.layer_names())
    if layer not in names:
        raise ValueError(
            f"{arg}={layer!r} is not a layer of {model_arg}; its layers are: "
            f"{', '.join(repr(x) for x in names)}."
        )


def _check_xy(x, y, tag: str) -> None:
    if y.ndim != 1:
        raise ValueError(f"data labels{tag} must be 1-D (n,), got shape {tuple(y.shape)}.")
    if x.ndim < 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"data inputs{tag} must be (n, ...) with the same n as the labels "
                         f"{tuple(y.shape)}, got shape {tuple(x.shape)}.")
    if not jnp.issubdtype(y.dtype, jnp.integer):
        raise ValueError(f"data labels{tag} must have an integer dtype, got {y.dtype}. Convert class labels "
                         "with y.astype(int).")


def _check_family(family) -> None:
    if family not in FAMILIES:
        close = difflib.get_close_matches(str(family), FAMILIES, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown family {family!r}.{hint} Valid options: {', '.join(map(repr, FAMILIES))}.")


def split_data(data, *, test_fraction: float, min_eval: int, key: jax.Array):
    """``(x_train, y_train, x_test, y_test)`` from ``(x, y)`` (split at random) or an explicit split.

    Args:
      data: ``(x, y)`` or ``((x_train, y_train), (x_test, y_test))``; ``x (n, ...)``, ``y (n,)`` int.
      test_fraction: held-out fraction for ``(x, y)``.
      min_eval: fewest held-out samples accepted.
      key: randomness of the split.

    Returns:
      NumPy arrays ``x_train, y_train, x_test, y_test``.
    """
    pair = isinstance(data, (tuple, list)) and len(data) == 2
    if pair and all(isinstance(p, (tuple, list)) for p in data):
        (x_tr, y_tr), (x_te, y_te) = ((np.asarray(a), np.asarray(b)) for a, b in data)
        _check_xy(x_tr, y_tr, " (train split)")
        _check_xy(x_te, y_te, " (test split)")
        if x_tr.shape[1:] != x_te.shape[1:]:
            raise ValueError(f"train and test inputs differ in per-sample shape: "
                             f"{x_tr.shape[1:]} vs {x_te.shape[1:]}.")
    elif pair:
        x, y = np.asarray(data[0]), np.asarray(data[1])
        _check_xy(x, y, "")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.")
        perm = np.asarray(jax.random.permutation(key, y.shape[0]))
        n_te = int(round(test_fraction * y.shape[0]))
        x_tr, y_tr, x_te, y_te = x[perm[n_te:]], y[perm[n_te:]], x[perm[:n_te]], y[perm[:n_te]]
    else:
        raise TypeError("data must be (x, y) or ((x_train, y_train), (x_test, y_test)).")
    if y_te.shape[0] < min_eval:
        raise ValueError(
            f"Only {y_te.shape[0]} held-out samples, fewer than min_eval_samples={min_eval}: "
            "the held-out accuracy and cross-entropy would be too noisy. Pass more data, a larger "
            "test_fraction, or lower min_eval_samples."
        )
    if y_tr.shape[0] < 2:
        raise ValueError(f"Only {y_tr.shape[0]} training samples; pass more data.")
    return x_tr, y_tr, x_te, y_te


def logit_scores(logits, y) -> tuple[float, float]:
    """Accuracy and mean cross-entropy (nats) of ``logits (n, C)`` on labels ``y (n,)``, in float64 NumPy.

    Examples:
      >>> import numpy as np
      >>> acc, ce = logit_scores(np.log(np.array([[0.5, 0.5], [0.9, 0.1]])), np.array([0, 0]))
      >>> acc, round(ce, 4)
      (1.0, 0.3993)
    """
    logits = np.asarray(logits, np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return float(np.mean(np.argmax(logits, axis=-1) == y)), float(-np.mean(logp[np.arange(len(y)), y]))


def _features(model, layer, x, arg):
    feats = model.features(x)
    if layer not in feats:
        raise ValueError(f"{arg}.features(x) has no entry {layer!r}; it returned {sorted(feats)}.")
    z = jnp.asarray(feats[layer])
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"{arg}.features(x)[{layer!r}] has shape {tuple(z.shape)}; expected "
                         f"{x.shape[0]} rows, one per input.")
    return z


def _direction(names, z_src, z_tgt, tgt_model, tgt_layer, y_tr, y_te, own_tr, own_te, *, n_tr,
               family, early_stopping, val_fraction, key, train_kw):
    """Train ``z_src -> tgt_model@tgt_layer`` on the train rows, score on the test rows."""
    tail_apply, tail_params = split_tail(tgt_model, tgt_layer)
    src_tr, src_te, tgt_tr = z_src[:n_tr], z_src[n_tr:], z_tgt[:n_tr]
    fit_idx = np.arange(n_tr)
    kl = train_kw["loss"] == "kl"
    eval_data = None
    if early_stopping is not None:  # a validation split carved from train: test is never seen
        n_val = max(1, int(round(val_fraction * n_tr)))
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 7), n_tr))
        val_idx, fit_idx = perm[:n_val], perm[n_val:]
        eval_data = (src_tr[val_idx], y_tr[val_idx]) + ((own_tr[val_idx],) if kl else ())
    stitcher, history = train_stitcher(
        src_tr[fit_idx], y_tr[fit_idx], tail_apply, tail_params, family=family,
        z_tgt=tgt_tr[fit_idx], teacher_logits=own_tr[fit_idx] if kl else None,
        eval_data=eval_data, early_stopping=early_stopping, key=key, **train_kw,
    )
    spatial = tuple(tgt_tr.shape[1:3]) if tgt_tr.ndim == 4 else None

    def stitched(z):
        z = z if spatial is not None else z.reshape(z.shape[0], -1)
        return tgt_model.tail(tgt_layer, stitch_representation(stitcher, z, spatial=spatial))

    own_acc, own_ce = logit_scores(own_te, y_te)
    st_acc, st_ce = logit_scores(stitched(src_te), y_te)
    tr_acc, tr_ce = logit_scores(stitched(src_tr), y_tr)
    if own_acc == 0:
        raise ValueError(f"{names[1]} has held-out accuracy 0, so relative accuracy is undefined; "
                         "check that the model is trained and the labels match its outputs.")
    return DirectionResult(
        source=names[0], target=names[1], family=family, n_train=int(fit_idx.shape[0]),
        n_eval=int(y_te.shape[0]), own_accuracy=own_acc, stitched_accuracy=st_acc,
        relative_accuracy=st_acc / own_acc, own_ce=own_ce, stitched_ce=st_ce,
        ce_gap=st_ce - own_ce, relative_ce=st_ce / own_ce if own_ce > 0 else math.inf,
        train_stitched_accuracy=tr_acc, train_stitched_ce=tr_ce, stitcher=stitcher,
        history=history,
    )


def functional_similarity(
    model_a: Any,
    layer_a: str,
    model_b: Any,
    layer_b: str,
    data: tuple,
    /,
    *,
    family: str = "affine",
    both_directions: bool = True,
    init: str = "closed_form",
    loss: str = "ce",
    steps: int = 500,
    optimizer: str = "adam",
    learning_rate: float = 1e-2,
    optimizer_options: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
    test_fraction: float = 0.25,
    min_eval_samples: int = 20,
    early_stopping: int | None = None,
    val_fraction: float = 0.15,
    eval_every: int = 50,
    ridge: float = 1e-6,
    key: jax.Array | None = None,
    progress: bool = True,
) -> FunctionalSimilarity:
    """Stitch A's ``layer_a`` into B at ``layer_b`` (and back), fit on train, score held out.

    Both models must output logits over the same label set. The stitcher is
    trained with ``similarity.train_stitcher`` on the training split only
    (minus a validation split when ``early_stopping`` is set); every reported
    number is measured on the held-out test split.

    Args:
      model_a, model_b: the two models.
      layer_a, layer_b: layer names (see ``.layer_names()``).
      data: ``(x, y)``, split at random into train and test with
        ``test_fraction``, or an explicit ``((x_train, y_train), (x_test, y_test))``.
        ``x`` is whatever the models take, ``(n, ...)``; ``y`` is ``(n,)`` int.
      family: stitcher family, one of ``similarity.FAMILIES``.
      both_directions: also stitch B's layer into A (needed for the asymmetry).
      init, loss, steps, optimizer, learning_rate, optimizer_options, batch_size,
        eval_every, ridge: as in ``similarity.train_stitcher``. With
        ``loss="kl"`` the teacher is the target model's own logits.
      test_fraction: held-out fraction when ``data`` is ``(x, y)``.
      min_eval_samples: fewest held-out samples accepted.
      early_stopping: patience (in evaluations every ``eval_every`` steps) on a
        validation split of ``val_fraction`` of the training data.
      key: randomness for the split, inits and minibatches (default ``jax.random.key(0)``).
      progress: a progress bar over the directions.

    Returns:
      A :class:`FunctionalSimilarity` (``print`` it for a table).

    Raises:
      ValueError: unknown layer (the valid names are listed), wrongly shaped data,
        too few held-out samples, models with different label sets.
      TypeError: a model without ``features``/``tail``/``layer_names``.

    Examples:
      >>> import numpy as np
      >>> class Linear:  # a toy "model": layer "h" = x, logits = 4 * h
      ...     def layer_names(self): return ("h",)
      ...     def features(self, x): return {"h": x}
      ...     def tail(self, layer, z): return 4.0 * z
      >>> x = np.random.default_rng(0).normal(size=(200, 3))
      >>> y = np.argmax(x, axis=1)
      >>> res = functional_similarity(Linear(), "h", Linear(), "h", (x, y), family="orthogonal",
      ...                             init="identity", steps=20, progress=False)
      >>> bool(res.a_to_b.relative_accuracy > 0.95), bool(abs(res.b_to_a.ce_gap) < 0.05)
      (True, True)
    """
    _check_layer(model_a, layer_a, "layer_a", "model_a")
    _check_layer(model_b, layer_b, "layer_b", "model_b")
    _check_family(family)
    key = jax.random.key(0) if key is None else key
    k_split, k_ab, k_ba = jax.random.split(key, 3)
    x_tr, y_tr, x_te, y_te = split_data(data, test_fraction=test_fraction,
                                        min_eval=min_eval_samples, key=k_split)
    x_all = np.concatenate([x_tr, x_te])
    n_tr = y_tr.shape[0]
    za = _features(model_a, layer_a, x_all, "model_a")
    zb = _features(model_b, layer_b, x_all, "model_b")
    own_a = np.asarray(model_a.tail(layer_a, za))
    own_b = np.asarray(model_b.tail(layer_b, zb))
    if own_a.ndim != 2 or own_b.ndim != 2 or own_a.shape[1] != own_b.shape[1]:
        raise ValueError(
            f"model_a and model_b must predict the same label set: their logits have shapes "
            f"{own_a.shape} and {own_b.shape}. Stitching compares models trained on the same task."
        )
    y_all = np.concatenate([y_tr, y_te])
    if int(y_all.max()) >= own_b.shape[1] or int(y_all.min()) < 0:
        raise ValueError(f"data labels range up to {int(y_all.max())} but the models predict "
                         f"{own_b.shape[1]} classes; labels must be in [0, {own_b.shape[1]}).")
    train_kw = dict(init=init, loss=loss, steps=steps, optimizer=optimizer,
                    learning_rate=learning_rate, optimizer_options=optimizer_options,
                    batch_size=batch_size, eval_every=eval_every, ridge=ridge)
    common = dict(n_tr=n_tr, family=family, early_stopping=early_stopping,
                  val_fraction=val_fraction, train_kw=train_kw)
    name_a, name_b = f"A:{layer_a}", f"B:{layer_b}"
    jobs = [((name_a, name_b), za, zb, model_b, layer_b, own_b, k_ab)]
    if both_directions:
        jobs.append(((name_b, name_a), zb, za, model_a, layer_a, own_a, k_ba))
    out = []
    with tqdm(total=len(jobs), desc="stitching directions", leave=False, disable=not progress) as bar:
        for names, z_src, z_tgt, model, layer, own, k in jobs:
            out.append(_direction(names, z_src, z_tgt, model, layer, y_tr, y_te, own[:n_tr],
                                  own[n_tr:], key=k, **common))
            bar.update(1)
    return FunctionalSimilarity(a_to_b=out[0], b_to_a=out[1] if both_directions else None)


# ----------------------------------------------------------------------------- many sources into a stack of targets


class TargetScore(NamedTuple):
    """One stitcher of :func:`stitch_into_targets`, scored on the held-out rows of one task.

    Attributes:
      source: the index of its source in ``sources``.
      target: the index of its target model in ``targets``.
      task: the task it is scored on: a task of ``tasks``, or ``coarsened:<grouping>`` for the fine
        stitcher's and the target's predictions mapped to the groups of task ``coarse:<grouping>``.
      values: ``relative_accuracy`` (stitched / the target's own accuracy), ``accuracy``,
        ``own_accuracy`` and (not for a coarsened task) ``ce_gap`` (stitched minus own
        cross-entropy, nats) and ``relative_accuracy_half0`` / ``_half1``: on the even and the odd
        test rows (claim 4 selects pairs on one half and scores them on the other).
    """

    source: int
    target: int
    task: str
    values: dict[str, float]


def head_takes(model: Any, layer: str) -> bool:
    """Whether a new head on ``model``'s penultimate stage (:func:`models.penultimate`) can follow ``layer``."""
    pen = penultimate(model)
    names = list(model.layer_names())
    return pen is not None and names.index(layer) <= names.index(pen)


def _family_keys(seed: int, jobs: tuple[int, ...], k_count: int, repeat: int):
    """The stitchers' keys of one target in one compiled program (not an eager op per key and shape).

    Family ``f``'s K keys are ``split(fold_in(key(seed), jobs[f]), K)``; returns them family by family,
    ``repeat`` times over (one block per task trained through the target's tail), and once.
    """
    return _family_keys_jit()(seed, np.asarray(jobs, np.int32), k_count, repeat)


@functools.cache
def _family_keys_jit():
    def run(seed, jobs, k_count, repeat):
        base = jax.random.key(seed)
        keys = jax.vmap(lambda j: jax.random.split(jax.random.fold_in(base, j), k_count))(jobs).reshape(-1)
        return jnp.concatenate([keys] * repeat), keys

    return jax.jit(run, static_argnums=(2, 3))


def stitch_into_targets(
    targets: Sequence[Any],
    layer: str,
    sources: Sequence[tuple[np.ndarray, np.ndarray]],
    target_features: Sequence[tuple[np.ndarray, np.ndarray]],
    labels: Mapping[str, tuple[np.ndarray, np.ndarray]],
    tasks: Mapping[str, tuple[int, ...] | None],
    families: Mapping[str, int],
    /,
    *,
    heads: Mapping[str, Sequence[dict | None]] | None = None,
    seed: int = 0,
    steps: int = 200,
    learning_rate: float = 1e-2,
    batch_size: int | None = 128,
) -> dict[str, dict[str, list[TargetScore]]]:
    """Train every source into ``layer`` of every target model (the seeds of one architecture); score held out.

    Training and evaluation are one compiled program each per tail, not per task or family: the fine
    and coarse tasks' stitchers of every family train in one ``similarity.train_stitchers`` call through
    the targets' stacked tails (:func:`models.stack_tails`; a coarse task's with its ``label_groups``: the
    summed softmax of each group, as :class:`models.CoarseTail`) and are evaluated together (a coarse
    task's logits are the fine ones coarsened on the host); each ``coarse_head:<grouping>`` task's
    stitchers train and evaluate through each target's new head (:func:`models.stack_head_tails`), where
    the head can follow ``layer`` (:func:`head_takes`). The targets' own logits come from the same
    evaluation program, through identity stitchers on their own activations. Every stitcher starts
    from the closed-form fit to the target's activations.

    Args:
      targets: M networks of one architecture.
      layer: the target layer.
      sources: K ``(train (n, ...), test (n_test, ...))`` source activations.
      target_features: per target, its ``(train, test)`` activations at ``layer``.
      labels: per task, ``(y_train (n,), y_test (n_test,))``; a ``coarse:<grouping>`` task's training
        labels must be ``grouping[y_fine]``.
      tasks: task -> its grouping of the fine classes (None for ``"fine"``, which must be present);
        ``coarse:<g>`` trains through the summed softmax, ``coarse_head:<g>`` through a new head.
      families: stitcher family -> its job index, which seeds its keys (``split(fold_in(key(seed),
        index), K)``, the same keys a call for one task alone would use).
      heads: ``{grouping: [head or None per target]}`` (:func:`models.train_head`) for the
        ``coarse_head:<grouping>`` tasks.
      seed, steps, learning_rate, batch_size: the stitchers' training (Adam).

    Returns:
      ``{family: {task: [TargetScore, ...]}}``: every (source, target) pair, a source that is the
      target itself included; a ``coarse_head`` task the targets cannot take is absent.

    Raises:
      ValueError: a coarse task's training labels are not the grouping of the fine ones.
    """
    tail, params = stack_tails(targets, layer)
    z_tr = [s[0] for s in sources]
    z_te = [s[1] for s in sources]
    z_tgt = np.stack([t[0] for t in target_features])
    z_own = [t[1] for t in target_features]
    tshape = tuple(z_own[0].shape[1:])
    fams = list(families)
    k_count, m_count, width = len(sources), len(targets), tshape[-1]
    identity = [Stitcher(np.broadcast_to(np.eye(width, dtype=z_own[0].dtype), (m_count, width, width)),
                         np.zeros((m_count, width), z_own[0].dtype), np.ones(m_count, z_own[0].dtype),
                         "affine")] * m_count
    train_kw = dict(init="closed_form", z_tgt=z_tgt, stacked_tails=True, steps=steps, learning_rate=learning_rate,
                    batch_size=batch_size, eval_every=steps)
    # the fine and coarse tasks: one call through the targets' own tail, the coarse stitchers with their grouping
    plain = [t for t in tasks if not t.startswith("coarse_head:")]
    y_fine = labels["fine"][0]
    for task in plain:
        if tasks[task] is not None and not np.array_equal(labels[task][0], np.asarray(tasks[task])[y_fine]):
            raise ValueError(f"The {task!r} training labels are not the grouping {tasks[task]} of the fine "
                             "labels; the zoo's manifest and its data disagree (rebuild the zoo).")
    keys, head_keys = _family_keys(seed, tuple(families.values()), k_count, len(plain))
    trained_plain = train_stitchers(
        z_tr * len(fams) * len(plain), y_fine, tail, params, family=[f for _ in plain for f in fams for _ in z_tr],
        label_groups=[tasks[t] for t in plain for _ in fams for _ in z_tr], key=keys, **train_kw)
    per_task = len(fams) * k_count
    trained = {t: trained_plain[i * per_task:(i + 1) * per_task] for i, t in enumerate(plain)}
    evals = {"own tail": (tail, params, plain)}  # tail name -> (tail, params, [tasks])
    for task in tasks:
        if not task.startswith("coarse_head:") or not head_takes(targets[0], layer):
            continue
        # the paper's coarse readout: each target's new head on its frozen penultimate features
        tail_t, params_t = stack_head_tails(targets, layer, heads[task.split(":", 1)[1]])
        evals[task] = (tail_t, params_t, [task])
        trained[task] = train_stitchers(z_tr * len(fams), labels[task][0], tail_t, params_t,
                                        family=[f for f in fams for _ in z_tr], key=head_keys, **train_kw)
    out = {f: {} for f in fams}
    for tail_e, params_e, names in evals.values():
        stitchers = [t.stitcher for task in names for t in trained[task]] + identity
        logits_all = stitched_logits(tail_e, params_e, stitchers, z_te * len(fams) * len(names) + z_own, tshape)
        own_all = logits_all[-m_count:][np.arange(m_count), np.arange(m_count)]  # (M, n, C): target m's own
        for ti, task in enumerate(names):
            groups = tasks[task]
            coarse = task.startswith("coarse:")  # trained through the coarsened tail: coarsen here too
            logits_task = logits_all[ti * per_task:(ti + 1) * per_task]
            own = np.asarray(coarsen_logits(own_all, groups)) if coarse else own_all
            if coarse:
                logits_task = np.asarray(coarsen_logits(logits_task, groups))
            evaluations = [(task, None)]
            if groups is None:  # the fine stitchers' predictions, coarsened: accuracy can only go up
                evaluations += [(t.replace("coarse:", "coarsened:"), gr) for t, gr in tasks.items()
                                if gr is not None and t.startswith("coarse:")]
            for fi, family in enumerate(fams):
                logits = logits_task[fi * k_count:(fi + 1) * k_count]
                out[family][task] = _target_scores(labels, labels[task][1], own, logits, evaluations)
    return out


def _target_scores(labels, y_te, own, logits, evaluations) -> list[TargetScore]:
    """The scores of one family's K stitchers (``logits (K, M, n, C)``) into M targets (``own (M, n, C)``)."""
    out = []
    for k in range(logits.shape[0]):
        for m in range(logits.shape[1]):
            for ev_task, coarsen in evaluations:
                if coarsen is None:
                    yv, st_logits, own_logits = y_te, logits[k, m], own[m]
                else:
                    yv = labels[ev_task.replace("coarsened", "coarse")][1]
                    pick = np.asarray(coarsen)
                    st_logits = np.eye(max(coarsen) + 1)[pick[np.argmax(logits[k, m], -1)]]
                    own_logits = np.eye(max(coarsen) + 1)[pick[np.argmax(own[m], -1)]]
                acc, ce = logit_scores(st_logits, yv)
                own_acc, own_ce = logit_scores(own_logits, yv)
                vals = {"relative_accuracy": acc / own_acc if own_acc > 0 else float("nan"),
                        "accuracy": acc, "own_accuracy": own_acc}
                if coarsen is None:
                    vals["ce_gap"] = ce - own_ce
                    for h in (0, 1) if len(yv) > 1 else ():  # the test rows' halves (even, odd): claim 4
                        acc_h, own_h = (logit_scores(lg[h::2], yv[h::2])[0] for lg in (st_logits, own_logits))
                        vals[f"relative_accuracy_half{h}"] = acc_h / own_h if own_h > 0 else float("nan")
                out.append(TargetScore(k, m, ev_task, vals))
    return out
