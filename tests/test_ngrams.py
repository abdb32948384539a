"""similarity.ngrams: corpus n-gram distributions at held-out positions, and a model's agreement with them."""

import itertools

import numpy as np
import pytest

from funsim.similarity import ngrams


def test_ngram_targets_match_brute_force_counts():
    rng = np.random.default_rng(0)
    vocab = 4
    train = rng.integers(0, vocab, size=400)
    x_eval = rng.integers(0, vocab, size=(3, 6))
    for n in (2, 3):
        mask, p = ngrams.ngram_targets(train, x_eval, n, vocab, min_count=3)
        rows = iter(p)
        for w, t in itertools.product(range(3), range(6)):
            if t < n - 2:
                assert not mask[w, t]
                continue
            ctx = tuple(x_eval[w, t - n + 2: t + 1])
            nxt = [train[i + n - 1] for i in range(len(train) - n + 1) if tuple(train[i: i + n - 1]) == ctx]
            if len(nxt) < 3:
                assert not mask[w, t]
                continue
            assert mask[w, t]
            np.testing.assert_allclose(next(rows), np.bincount(nxt, minlength=vocab) / len(nxt), rtol=1e-12)
        assert next(rows, None) is None


def test_ngram_scores_against_direct_formulas():
    rng = np.random.default_rng(1)
    vocab, w, length = 5, 3, 4
    logits = rng.normal(size=(w, length, vocab))
    y = rng.integers(0, vocab, size=(w, length))
    mask = rng.random((w, length)) < 0.6
    p = rng.dirichlet(np.ones(vocab), size=int(mask.sum()))
    p[0, 0] = 0.0  # a zero of the corpus distribution: no term in KL
    p[0] /= p[0].sum()
    row = ngrams.ngram_scores(logits, y, {2: (mask, p)})
    q = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert row["loss"] == pytest.approx(-np.mean(np.log(np.take_along_axis(q, y[..., None], -1))), rel=1e-12)
    assert row["accuracy"] == np.mean(q.argmax(-1) == y)
    qm = q[mask]
    assert row["2gram_agreement"] == pytest.approx(1 - 0.5 * np.abs(qm - p).sum(1).mean(), rel=1e-12)
    kl = [sum(pi * np.log(pi / qi) for pi, qi in zip(pr, qr) if pi > 0) for pr, qr in zip(p, qm)]
    assert row["2gram_kl"] == pytest.approx(np.mean(kl), rel=1e-12)
    perfect = ngrams.ngram_scores(np.log(q), y, {2: (mask, qm)})  # the model is the corpus: full agreement
    assert perfect["2gram_agreement"] == pytest.approx(1.0) and perfect["2gram_kl"] == pytest.approx(0.0, abs=1e-12)
