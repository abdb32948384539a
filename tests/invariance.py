"""Shared invariance harness: random maps of each class in ``similarity.INVARIANCES``.

A measure declares invariances in the registry; ``tests/test_registry.py``
applies these maps to either or both arguments and asserts that declared
invariances hold and undeclared ones do not (on generic data).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def random_orthogonal(d: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-random orthogonal ``(d, d)`` matrix (QR of a Gaussian with sign fix)."""
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))[None, :]


def random_transform(kind: str, d: int, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """A generic map of class ``kind`` acting on ``(n, d)`` arrays."""
    if kind == "translation":
        c = rng.normal(size=d) * 3.0 + 2.0
        return lambda x: x + c[None, :]
    if kind == "rotation":
        q = random_orthogonal(d, rng)
        return lambda x: x @ q
    if kind == "isotropic_scale":
        s = 3.7
        return lambda x: s * x
    if kind == "permutation":
        p = np.roll(np.arange(d), 1) if d > 1 else np.arange(d)
        return lambda x: x[:, p]
    if kind == "invertible_linear":
        a = random_orthogonal(d, rng) @ np.diag(np.geomspace(0.2, 5.0, d)) @ random_orthogonal(d, rng)
        return lambda x: x @ a
    raise ValueError(f"unknown invariance class {kind!r}")


def invariance_data(rng: np.random.Generator, n: int = 16, d1: int = 4, d2: int = 4):
    """A related pair ``x (n, d1)``, ``y (n, d2)``: anisotropic, rotated, with a small tail.

    The spectrum of ``x`` has a direction below 1% of the variance, so SVCCA's
    truncation bites and its non-invariance to invertible maps is visible.
    """
    spec = np.array([4.0, 2.0, 1.0, 0.5, 0.3, 0.2, 0.1][: d1 - 1] + [0.03])
    x = rng.normal(size=(n, d1)) * spec[None, :] @ random_orthogonal(d1, rng) + 1.0
    b = rng.normal(size=(d1, d2))
    y = np.tanh(x @ b) + 0.3 * rng.normal(size=(n, d2))
    return x, y
