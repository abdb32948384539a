"""Modular addition with one bilinear layer: the grokking network, its checkpoints and the authors' run.

* :func:`modular_addition_model`: one-hot ``(a, b)`` of width ``2p`` -> one bilinear layer ->
  ``p`` classes, fed the tokens (:class:`models.TokenPairs` around a :class:`models.BilinearMLP`);
* :func:`checkpoint_schedule`: the checkpoint steps of the tensor-similarity authors' rule;
* :func:`evaluate_checkpoints`: loss and accuracy of every checkpoint of a stacked network;
* :func:`authors_run`: the authors' released grokking run (tdooms/tensor-similarity), read and
  checked from their original files in a clone (the project ships none of them).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from funsim.models.bilinear import BilinearMLP, TokenPairs
from funsim.models.train import power_schedule
from funsim.similarity.multilinear import apply_network

__all__ = [
    "CHECKPOINT_RULES",
    "checkpoint_schedule",
    "modular_addition_model",
    "evaluate_checkpoints",
    "AUTHORS_REPOSITORY",
    "AUTHORS_BUNDLE",
    "AUTHORS_ENV",
    "AUTHORS_FILES",
    "AUTHORS_HOWTO",
    "authors_run",
]

#: The rules :func:`checkpoint_schedule` knows.
CHECKPOINT_RULES = ("authors", "power")


def checkpoint_schedule(total_steps: int, n: int, /, *, power: float = 5.0, rule: str = "authors") -> tuple[int, ...]:
    """The checkpoint steps after step 0 (which is always evaluated: the initialisation).

    ``rule="authors"``: ``floor(T (i / (n - 1))^power)`` for ``i = 0..n-1``, and ``T``
    (the authors' power schedule; with ``T = 100_000, n = 100, power = 5`` it gives the 89
    steps of their released run). ``rule="power"``: ``round(T (i / n)^power)`` for
    ``i = 1..n`` (:func:`models.train.power_schedule`). Duplicates merge, so fewer than
    ``n`` steps can come back; the last is always ``T``.

    Examples:
      >>> checkpoint_schedule(1000, 5, power=2.0)
      (62, 250, 562, 1000)
      >>> checkpoint_schedule(1000, 5, power=2.0, rule="power")
      (40, 160, 360, 640, 1000)
    """
    if rule not in CHECKPOINT_RULES:
        raise ValueError(f"checkpoint rule must be one of {', '.join(CHECKPOINT_RULES)}, got {rule!r}.")
    if rule == "power":
        return power_schedule(total_steps, n, power=power)
    if total_steps < 1 or n < 2 or not power > 0:
        raise ValueError(f"checkpoint_schedule needs total_steps >= 1, n >= 2, power > 0; got {total_steps}, {n}, {power}.")
    t = np.floor(total_steps * np.linspace(0.0, 1.0, n) ** power).astype(np.int64)
    return tuple(sorted({int(s) for s in t if s > 0} | {int(total_steps)}))


def modular_addition_model(p: int, *, d_hidden: int, seed: int) -> TokenPairs:
    """The grokking network for the modulus ``p``, initialised from ``seed``: a :class:`models.TokenPairs`
    around a one-layer :class:`models.BilinearMLP` (one-hot width ``2p``, ``d_hidden`` hidden units whose
    ``down`` projection is the head to the ``p`` classes; no embedding, no residual)."""
    return TokenPairs(BilinearMLP(2 * p, p, d_hidden=d_hidden, n_layers=1, residual=False, embed=False, head=False,
                                  rngs=nnx.Rngs(seed)), p)


@functools.cache
def _evaluate():
    """The jitted ``evaluate(nets, x, y) -> (loss, correct)`` (built on first use)."""

    @jax.jit
    def evaluate(nets, x, y):
        def one(net):
            logits = apply_network(net, x)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, jnp.sum(jnp.argmax(logits, axis=-1) == y)  # a count: a float32 mean of 1s can fall short of 1

        return jax.lax.map(one, nets)

    return evaluate


def evaluate_checkpoints(nets, x, y, /) -> dict[str, np.ndarray]:
    """Cross-entropy and accuracy of every checkpoint of a stacked network.

    Args:
      nets: stacked network (leading checkpoint axis ``n``).
      x: ``(m, d)`` inputs.
      y: ``(m,)`` integer labels.

    Returns:
      ``{"loss": (n,), "accuracy": (n,)}``.
    """
    loss, correct = _evaluate()(nets, jnp.asarray(x), jnp.asarray(y))
    return {"loss": np.asarray(loss, np.float64), "accuracy": np.asarray(correct, np.float64) / len(y)}


#: Where the authors' released grokking run lives: a clone of tdooms/tensor-similarity, this folder.
#: The project ships none of their files; :func:`authors_run` reads them from a directory the user
#: points at (``--authors-run DIR`` or the environment variable :data:`AUTHORS_ENV`).
AUTHORS_REPOSITORY = "https://github.com/tdooms/tensor-similarity"
AUTHORS_BUNDLE = "workspaces/logan/grokking_summary_bundle/results_grokking_summary"
AUTHORS_ENV = "FUNSIM_GROKKING_AUTHORS"
#: The files :func:`authors_run` reads (as the authors released them).
AUTHORS_FILES = ("checkpoint_steps.npy", "tn_similarity.npy", "act_similarity.npy", "training_history.json",
                 "config.json")
AUTHORS_HOWTO = (f"to compare, clone {AUTHORS_REPOSITORY} (checked against commit bc914a4babc9) and pass "
                 f"`--authors-run <clone>/{AUTHORS_BUNDLE}` (or set {AUTHORS_ENV} to that directory)")


def authors_run(directory: str | pathlib.Path | None = None) -> dict | None:
    """The authors' released grokking run (tdooms/tensor-similarity), read from their original files.

    The files are the authors' (:data:`AUTHORS_FILES`, in their
    ``workspaces/logan/grokking_summary_bundle/results_grokking_summary/``): their checkpoint
    steps, symmetric tensor-similarity matrix (``tn_similarity.npy``), behavioural
    similarity (``act_similarity.npy``: mean per-sample cosine of the logits on all
    ``p^2`` pairs; ours is on ``n_eval`` held-out pairs), training history and config.
    Their run: p = 113, hidden 64, AdamW lr 1e-3, weight decay 0.3, 30% of pairs for
    training, batch 512, 100k steps, seed 1337, 90 checkpoints by the 5th-power rule.

    Args:
      directory: the folder holding those files. None: the environment variable
        :data:`AUTHORS_ENV`; unset (or empty), the run is not available and None comes back.

    Returns:
      ``{"steps": (n,) int, "matrices": {"tensor (symmetric)", "behavioural": (n, n)},
      "train_accuracy", "val_accuracy", "train_loss", "val_loss": (n,), "source": dict}``,
      or None when no directory is given.

    Raises:
      ValueError: a directory that does not exist, a missing or damaged file, wrong
        shapes, non-finite numbers, a history without a checkpoint's step; the message
        names the file.
    """
    if directory is None:
        directory = os.environ.get(AUTHORS_ENV) or None
        if directory is None:
            return None
    d = pathlib.Path(directory)
    if not d.is_dir():
        raise ValueError(f"The authors' grokking run: {d} is not a directory; {AUTHORS_HOWTO}.")
    for name in AUTHORS_FILES:
        if not (d / name).is_file():
            raise ValueError(f"The authors' grokking run: {d / name} is missing (expected the files "
                             f"{', '.join(AUTHORS_FILES)} of {AUTHORS_BUNDLE}/); {AUTHORS_HOWTO}.")

    def npy(name):
        try:
            return np.load(d / name, allow_pickle=False)
        except Exception as e:  # truncated or not an .npy file
            raise ValueError(f"{d / name}: not a readable .npy file ({type(e).__name__}: {e}).") from None

    def js(name):
        try:
            return json.loads((d / name).read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{d / name}: not a readable JSON file ({type(e).__name__}: {e}).") from None

    raw = npy("checkpoint_steps.npy")
    steps = np.asarray(raw)
    if steps.ndim != 1 or len(steps) < 2 or not np.all(np.isfinite(steps)) or np.any(steps != np.round(steps)):
        raise ValueError(f"{d / 'checkpoint_steps.npy'}: expected a 1-D array of at least 2 integer steps, "
                         f"got shape {steps.shape}.")
    steps = steps.astype(np.int64)
    if steps[0] != 0 or np.any(np.diff(steps) <= 0):
        raise ValueError(f"{d / 'checkpoint_steps.npy'}: steps must increase strictly from 0, got "
                         f"{steps[:5].tolist()}...")
    n = len(steps)
    out = {"steps": steps, "matrices": {}}
    for name, key in (("tn_similarity.npy", "tensor (symmetric)"), ("act_similarity.npy", "behavioural")):
        m = np.asarray(npy(name), np.float64)
        if m.shape != (n, n):
            raise ValueError(f"{d / name}: expected a {n} x {n} matrix (one row per checkpoint of "
                             f"checkpoint_steps.npy), got shape {m.shape}.")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"{d / name}: {int(np.sum(~np.isfinite(m)))} non-finite entries.")
        if not np.allclose(m, m.T, atol=1e-6):
            raise ValueError(f"{d / name}: not symmetric (largest |S - S^T| = {np.abs(m - m.T).max():.3g}).")
        out["matrices"][key] = m
    hist = js("training_history.json")
    fields = {"train_accuracy": "train_acc", "val_accuracy": "val_acc", "train_loss": "train_loss",
              "val_loss": "val_loss"}
    if not isinstance(hist, dict):
        raise ValueError(f"{d / 'training_history.json'}: expected an object keyed by step, got {type(hist).__name__}.")
    for ours, theirs in fields.items():
        vals = []
        for s in steps:
            row = hist.get(str(int(s)))
            if not isinstance(row, dict) or theirs not in row:
                raise ValueError(f"{d / 'training_history.json'}: no {theirs!r} at checkpoint step {int(s)}.")
            vals.append(row[theirs])
        try:
            v = np.asarray(vals, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{d / 'training_history.json'}: {theirs!r} must be numbers.") from None
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{d / 'training_history.json'}: non-finite {theirs!r} at steps "
                             f"{steps[~np.isfinite(v)][:5].tolist()}.")
        out[ours] = v
    cfg = js("config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{d / 'config.json'}: expected a JSON object, got {type(cfg).__name__}.")
    out["source"] = {"repository": AUTHORS_REPOSITORY, "path": AUTHORS_BUNDLE, "directory": str(d.resolve()),
                     "files": list(AUTHORS_FILES),
                     "config": {k: v for k, v in cfg.items() if k != "output_dir"}}
    return out
