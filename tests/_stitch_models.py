"""Tiny models for the task-loss stitching tests (library and experiments level).

The MLPs are pure-JAX, duck-typed funsim models (``features`` / ``tail`` /
``layer_names``), trained by scikit-learn in NumPy (nothing to compile). Their
tails are also available as pure functions of their parameters
(:data:`TAILS`), the form ``similarity.train_stitchers`` takes.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

from funsim import similarity


def _dense(x, w, b):
    return x @ w + b[None, :]


def tail_h1(p, z):
    """The rest of the network after layer h1: ``p`` is the MLP's parameter list."""
    return _dense(jnp.tanh(_dense(z, *p[1])), *p[2])


def tail_h2(p, z):
    """The rest of the network after layer h2."""
    return _dense(z, *p[2])


TAILS = {"h1": tail_h1, "h2": tail_h2}


class MLP:
    """64 -> 32 (tanh) -> 16 (tanh) -> 10, as a duck-typed funsim model."""

    def __init__(self, params):
        self.p = params

    def layer_names(self):
        return ("h1", "h2")

    def features(self, x):
        h1 = jnp.tanh(_dense(jnp.asarray(x), *self.p[0]))
        h2 = jnp.tanh(_dense(h1, *self.p[1]))
        return {"h1": h1, "h2": h2}

    def tail(self, layer, z):
        return TAILS[layer](self.p, z)


class Rotated(MLP):
    """The same function with layer h1 rotated: h1' = h1 @ q, tail(h1') = tail(h1' @ q^T)."""

    def __init__(self, base, q):
        super().__init__(base.p)
        self.base, self.q = base, q

    def features(self, x):
        f = self.base.features(x)
        return {"h1": f["h1"] @ self.q, "h2": f["h2"]}

    def tail(self, layer, z):
        return self.base.tail(layer, z @ self.q.T if layer == "h1" else z)


class Bottleneck:
    """Model B whose only layer is a lossy projection of A's h1: p = h1 @ P, P (32, 2)."""

    def __init__(self, base, proj):
        self.base, self.proj = base, proj

    def layer_names(self):
        return ("p",)

    def features(self, x):
        return {"p": self.base.features(x)["h1"] @ self.proj}

    def tail(self, layer, z):
        return self.base.tail("h1", z @ self.proj.T)


def train_mlp(x, y, seed):
    """64 -> 32 -> 16 -> 10 tanh MLP trained by scikit-learn (NumPy: nothing to compile)."""
    clf = MLPClassifier((32, 16), activation="tanh", max_iter=200, random_state=seed, tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: we want a fixed budget
        clf.fit(x, y)
    return MLP([(jnp.asarray(w), jnp.asarray(b)) for w, b in zip(clf.coefs_, clf.intercepts_)])


def digits_data():
    d = load_digits()
    return (d.data / 16.0).astype(np.float64), d.target.astype(np.int32)


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's digits, ``x (1797, 64)`` in [0, 1] float64 and ``y (1797,)`` int32."""
    return digits_data()


@pytest.fixture(scope="module")
def models(digits):
    """Two trained MLPs (seeds 0 and 1) on the first 1200 digits."""
    x, y = digits
    return train_mlp(x[:1200], y[:1200], 0), train_mlp(x[:1200], y[:1200], 1)


def split(digits):
    x, y = digits
    return (x[:1200], y[:1200]), (x[1200:], y[1200:])


def haar(n, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def np_ce_acc(logits, y):
    """Mean cross-entropy and accuracy in float64 NumPy/SciPy (the reference)."""
    logits = np.asarray(logits, np.float64)
    logp = logits - scipy.special.logsumexp(logits, axis=1, keepdims=True)
    return -logp[np.arange(len(y)), y].mean(), (logits.argmax(1) == y).mean()


def np_adaptive_pool(z, size):
    """Adaptive average pooling of NHWC ``z`` to ``size`` (PyTorch bins), by explicit loops."""
    n, h, w, c = z.shape
    out = np.zeros((n, size[0], size[1], c))
    for i in range(size[0]):
        h0, h1 = (i * h) // size[0], int(np.ceil((i + 1) * h / size[0]))
        for j in range(size[1]):
            w0, w1 = (j * w) // size[1], int(np.ceil((j + 1) * w / size[1]))
            out[:, i, j] = z[:, h0:h1, w0:w1].mean(axis=(1, 2))
    return out


def stacked_stitchers(rng, widths, m, t, family="affine"):
    """One stitcher per source width, each with M weights (one per tail)."""
    return [similarity.Stitcher(
        rng.normal(size=(m, d, t)).astype(np.float32) / np.sqrt(d),
        rng.normal(size=(m, t)).astype(np.float32) * 0.1,
        rng.uniform(0.5, 2.0, size=(m,)).astype(np.float32),
        family,
    ) for d in widths]


def reference_stitched_logits(targets, layer, sts, zs, spatial, coarse=None):
    """(K, M, n, C) by NumPy stitching (float64) and each target model's own eager tail."""
    out = []
    for st, z in zip(sts, zs):
        z = np.asarray(z, np.float64)
        z = np_adaptive_pool(z, spatial) if spatial is not None else z.reshape(len(z), -1)
        per = []
        for mi, model in enumerate(targets):
            w, b, s = (np.asarray(a[mi], np.float64) for a in (st.weight, st.bias, st.scale))
            h = s * np.einsum("...d,dt->...t", z, w) + b
            logits = np.asarray(model.tail(layer, h.astype(np.float32)), np.float64)
            if coarse is not None:
                logits = np.stack([np.logaddexp.reduce(logits[:, np.asarray(coarse) == g], axis=1)
                                   for g in range(max(coarse) + 1)], axis=1)
            per.append(logits)
        out.append(np.stack(per))
    return np.stack(out)
