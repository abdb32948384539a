"""Input checks that raise clear errors before any math runs.

Every public function in :mod:`similarity` validates its inputs with these
helpers *before* it computes anything. Messages name the argument, the shape
and what to do about it.

Shape, rank and dtype checks are static, so they also run under ``jax.jit``
and ``jax.vmap``. Value checks (NaN/Inf, constant representations, too-small
denominators) need concrete values: they run eagerly when the inputs are
concrete arrays, and are skipped when the inputs are tracers (inside a user's
``jit``/``vmap``/``grad``). Under tracing, degenerate input propagates as NaN
in the result, exactly as ``jnp`` arithmetic does; validate eagerly first, or
wrap the call with ``jax.experimental.checkify``, if that matters to you.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = [
    "is_concrete",
    "as_float_array",
    "check_rep",
    "check_pair",
    "check_finite",
    "check_not_constant",
    "check_choice",
    "check_positive_result",
]


def is_concrete(*xs: Any) -> bool:
    """True when no argument is a JAX tracer (so values can be inspected)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def as_float_array(x: ArrayLike, name: str) -> jax.Array:
    """Convert to a floating JAX array, keeping float32/float64 as given.

    Integers and booleans are promoted to the default float dtype. Complex
    input is rejected.
    """
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(
            f"{name} must be an array (numpy or jax), got {type(x).__name__}."
        )
    dt = jnp.dtype(x.dtype)
    if jnp.issubdtype(dt, jnp.complexfloating):
        raise TypeError(f"{name} has complex dtype {dt}; funsim works on real arrays.")
    if not jnp.issubdtype(dt, jnp.floating):
        if not (jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_):
            raise TypeError(f"{name} has unsupported dtype {dt}; pass a float array.")
        x = jnp.asarray(x, dtype=jnp.result_type(float))
    return jnp.asarray(x)


def check_finite(x: jax.Array, name: str) -> None:
    """Raise ``ValueError`` if a concrete array holds NaN or Inf (no-op under tracing)."""
    if not is_concrete(x):
        return
    arr = np.asarray(x)
    if not np.all(np.isfinite(arr)):
        n_nan = int(np.isnan(arr).sum())
        n_inf = int(np.isinf(arr).sum())
        raise ValueError(
            f"{name} of shape {tuple(arr.shape)} contains {n_nan} NaN and {n_inf} Inf "
            "values; remove or impute them before computing similarity."
        )


def check_rep(
    x: ArrayLike,
    name: str,
    *,
    min_samples: int = 2,
    why: str = "",
    finite: bool = True,
) -> jax.Array:
    """Validate one representation matrix ``(n_samples, n_features)``.

    Args:
      x: the representation, shape ``(n, d)``.
      name: the argument name used in error messages.
      min_samples: the smallest n the estimator accepts.
      why: a short reason shown when n is too small (e.g. "the debiased HSIC").
      finite: check for NaN/Inf eagerly.

    Returns:
      ``x`` as a floating ``jax.Array``.
    """
    x = as_float_array(x, name)
    if x.ndim != 2:
        hint = ""
        if x.ndim == 1:
            hint = f" For a single feature use {name}[:, None]; for one sample use {name}[None, :]."
        elif x.ndim > 2:
            hint = (
                f" Flatten the trailing axes first, e.g. {name}.reshape({name}.shape[0], -1),"
                " or use a models.* helper with an explicit flattening policy."
            )
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features), got shape {tuple(x.shape)} "
            f"(rank {x.ndim}).{hint}"
        )
    n, d = x.shape
    if d == 0:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: it needs at least one feature.")
    if n < min_samples:
        reason = f" for {why}" if why else ""
        raise ValueError(
            f"{name} has {n} samples (shape {tuple(x.shape)}), but at least {min_samples} "
            f"are needed{reason}. Pass more samples."
        )
    if finite:
        check_finite(x, name)
    return x


def check_pair(
    x: ArrayLike,
    y: ArrayLike,
    names: tuple[str, str] = ("x", "y"),
    *,
    min_samples: int = 2,
    why: str = "",
    finite: bool = True,
    same_dtype: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Validate a pair of representations with matching sample counts.

    Mixed float32/float64 inputs are promoted to the wider dtype when
    ``same_dtype`` is set.
    """
    nx, ny = names
    x = check_rep(x, nx, min_samples=min_samples, why=why, finite=finite)
    y = check_rep(y, ny, min_samples=min_samples, why=why, finite=finite)
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{nx} and {ny} must have the same number of samples (axis 0), got "
            f"{nx}.shape={tuple(x.shape)} and {ny}.shape={tuple(y.shape)}. Rows must be "
            "the same inputs, in the same order, for both representations."
        )
    if same_dtype and x.dtype != y.dtype:
        dt = jnp.promote_types(x.dtype, y.dtype)
        x, y = x.astype(dt), y.astype(dt)
    return x, y


def check_not_constant(x: jax.Array, name: str, *, what: str = "similarity") -> None:
    """Raise if every row of a concrete ``x`` is the same (zero centred variance)."""
    if not is_concrete(x):
        return
    arr = np.asarray(x, dtype=np.float64)
    centred = arr - arr.mean(axis=0, keepdims=True)
    scale = max(float(np.abs(arr).max()), 1.0)
    if float(np.abs(centred).max()) <= 1e-12 * scale:
        raise ValueError(
            f"{name} of shape {tuple(arr.shape)} is constant across samples (zero variance "
            f"after centring), so {what} is undefined (0/0). Check that the layer is not "
            "dead and that the samples differ."
        )


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """Raise ``ValueError`` for an unknown option, suggesting close names."""
    choices = list(choices)
    if value in choices:
        return value
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown {name} {value!r}.{hint} Valid options: {', '.join(repr(c) for c in choices)}."
    )


def check_positive_result(value: jax.Array, what: str, cause: str) -> jax.Array:
    """Raise eagerly if a computed denominator is not positive (no-op under tracing).

    Args:
      value: the computed quantity, any shape.
      what: what it is, e.g. "HSIC(y, y)".
      cause: the likely cause and fix, shown to the user.
    """
    if is_concrete(value):
        arr = np.asarray(value)
        if not np.all(arr > 0):
            raise ValueError(f"{what} = {arr.min()!r} is not positive: {cause}")
    return value


def check_int_labels(y: ArrayLike, name: str, *, n_classes: int | None = None) -> jax.Array:
    """Validate integer class labels of shape ``(n,)`` in ``[0, n_classes)``."""
    if not hasattr(y, "dtype"):
        y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D integer labels (n,), got shape {tuple(y.shape)}.")
    if not jnp.issubdtype(jnp.dtype(y.dtype), jnp.integer):
        raise ValueError(
            f"{name} must have an integer dtype, got {y.dtype}. Convert class labels with "
            f"{name}.astype(int)."
        )
    if is_concrete(y) and n_classes is not None and y.shape[0] > 0:
        arr = np.asarray(y)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n_classes:
            raise ValueError(
                f"{name} has labels in [{lo}, {hi}], outside [0, {n_classes}). "
                "Relabel to 0..n_classes-1 or pass the right n_classes."
            )
    return jnp.asarray(y)


__all__ += ["check_int_labels"]


