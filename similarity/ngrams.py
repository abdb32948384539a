"""A language model's next-token distributions against the corpus' n-gram statistics.

For a context of ``n - 1`` tokens, the training text gives the empirical distribution of the
next token (:func:`ngram_targets`); :func:`ngram_scores` compares a model's predicted distribution
with it at held-out positions whose context is frequent enough: the agreement ``1 - TV`` and
``KL(p_corpus || p_model)``, beside the model's held-out loss and accuracy. NumPy, float64.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ngram_targets", "ngram_scores"]


def _context_codes(ids, n, vocab):
    """Base-V code of the ``n - 1`` characters ending at each position (-1 where too early)."""
    if n < 2:
        raise ValueError(f"n-gram order must be >= 2, got {n}.")
    codes = np.full(ids.shape, -1, dtype=np.int64)
    length = ids.shape[-1]
    acc = np.zeros(ids[..., n - 2:].shape, dtype=np.int64)
    for k in range(n - 1):  # the characters t-n+2 .. t, most significant first
        acc = acc * vocab + ids[..., k: length - (n - 2) + k]
    codes[..., n - 2:] = acc
    return codes


def ngram_targets(train_ids, x_eval, n: int, vocab: int, min_count: int):
    """The corpus estimate ``p(next | previous n-1 characters)`` at held-out positions.

    Counts come from ``train_ids`` (the training text); a held-out position of
    ``x_eval (W, L)`` is kept when its context (the ``n - 1`` characters ending
    there, inside its window) occurs at least ``min_count`` times in training.

    Args:
      train_ids: ``(N,)`` integer token ids of the training text, in order.
      x_eval: ``(W, L)`` held-out windows of token ids.
      n: the order, ``>= 2`` (the context is ``n - 1`` tokens).
      vocab: the vocabulary size ``V`` (ids in ``0..V-1``).
      min_count: the fewest occurrences of a context in training for its position to count.

    Returns:
      ``(mask (W, L) bool, p (n_kept, V))`` with rows in the order of ``np.nonzero(mask)``.
    """
    train_ctx = _context_codes(train_ids[:-1], n, vocab)
    nxt = train_ids[1:]
    eval_ctx = _context_codes(x_eval, n, vocab)
    wanted = np.unique(eval_ctx[eval_ctx >= 0])
    keep = np.isin(train_ctx, wanted)
    rows = np.searchsorted(wanted, train_ctx[keep])
    counts = np.zeros((len(wanted), vocab))
    np.add.at(counts, (rows, nxt[keep]), 1)
    total = counts.sum(1)
    idx = np.searchsorted(wanted, np.where(eval_ctx >= 0, eval_ctx, wanted[0]))
    mask = (eval_ctx >= 0) & (total[idx] >= max(min_count, 1))
    p = counts[idx[mask]] / total[idx[mask]][:, None]
    return mask, p


def ngram_scores(logits, y, targets: dict, /) -> dict[str, float]:
    """Held-out loss and accuracy, and per n the mean agreement (1 - TV) and KL(corpus || model), of one model.

    Args:
      logits: ``(W, L, V)`` the model's next-token logits on the held-out windows.
      y: ``(W, L)`` the true next tokens.
      targets: ``{n: ngram_targets(...)}`` on the same windows.

    Returns:
      ``{"loss", "accuracy", "<n>gram_agreement", "<n>gram_kl" for each n}``.
    """
    logits = np.asarray(logits, np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    row = {
        "loss": float(-np.take_along_axis(logp, y[..., None], -1).mean()),
        "accuracy": float((logits.argmax(-1) == y).mean()),
    }
    for n, (mask, p) in targets.items():
        lp = logp[mask]
        q = np.exp(lp)
        row[f"{n}gram_agreement"] = float(1 - 0.5 * np.abs(q - p).sum(1).mean())
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(p > 0, p * (np.log(p) - lp), 0.0).sum(1)
        row[f"{n}gram_kl"] = float(kl.mean())
    return row
