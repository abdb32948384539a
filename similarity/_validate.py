"""Input checks that raise clear errors, and the in-program value checks behind them.

Every public function in :mod:`similarity` validates its inputs with these
helpers. Messages name the argument, the shape and what to do about it.

Shape, rank and dtype checks are static: they run on the host before anything
is computed, also under ``jax.jit`` and ``jax.vmap``. **Value checks** (NaN/Inf,
constant representations, rank, non-positive denominators) are computed *inside*
each measure's compiled program, as a few flags beside the result
(:func:`rep_flags`), so checking costs no extra pass over the data on the host.
With concrete inputs the function raises from those flags after the program
returns (:func:`raise_pair_flags`). Inside a user's ``jit``/``vmap``/``grad`` the
flags are tracers and cannot raise: there every measure returns NaN for input
that fails a value check (:func:`nan_unless`), never a number, so degenerate
input is visible in the result; validate eagerly first, or use the flag-returning
path (:func:`similarity.protocol.evaluate` gives ``(value, flags)``, and the core's
``reason`` turns fetched flags into the message), if you need the message.

A representation is **constant** when no entry differs from the first row's by
more than ``CONSTANT_RTOL`` (1e-12) times its largest magnitude: a relative rule,
so data at any scale (``x * 1e-15`` as much as ``x * 1e18``) is judged the same.

**Input dtypes (one policy for every public function).** float32 and float64
are computed as given. Half precision (float16, bfloat16) is promoted to
float32 for the computation, and the result is float32: the sums of squares
behind every measure overflow float16 beyond about 6e4 and lose all but two or
three digits in bfloat16. Integers and booleans are promoted to the default
float dtype (float64 with x64 enabled, else float32). float64 input while JAX's
x64 mode is off is computed in float32 (JAX has no float64 then); the first
time this happens a :class:`PrecisionWarning` says so (filter it with
``warnings.filterwarnings("ignore", category=PrecisionWarning)``, or enable x64
with ``jax.config.update("jax_enable_x64", True)``). Complex input is refused
with a ``TypeError``: every measure here is defined on real arrays, and a
silent cast would drop the imaginary part. Boolean options accept ``True`` and
``False`` (Python or NumPy bools) only.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = [
    "is_concrete",
    "warn_float64_without_x64",
    "as_float_array",
    "check_rep",
    "check_pair",
    "check_finite",
    "check_not_constant",
    "check_choice",
    "check_positive_result",
    "check_bool",
    "compute_dtype",
    "HALF_DTYPES",
    "CONSTANT_RTOL",
    "PrecisionWarning",
    "rep_flags",
    "flags_ok",
    "nan_unless",
    "nan_reaches_inputs",
    "fetch_flags",
    "raise_rep_flags",
    "raise_pair_flags",
    "check_option_positive",
    "Bound",
    "is_traced",
    "min_samples_reason",
    "constant_reason",
    "pair_constant_reason",
]

CONSTANT_RTOL = 1e-12


class PrecisionWarning(UserWarning):
    """float64 input computed in float32 because JAX's x64 mode is off (warned once per process)."""


_warned_x64 = False


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside ``funsim.similarity``: the user's call.

    A fixed ``stacklevel`` would point into funsim whenever the call went through
    another public function or the precision wrapper (:mod:`similarity._precision`).
    """
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the frame that called this function
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def warn_float64_without_x64(name: str) -> None:
    global _warned_x64
    if _warned_x64:
        return
    _warned_x64 = True
    warn_at_caller(
        f"{name} is float64 but JAX's x64 mode is off, so it is computed in float32 (about 7 "
        "significant digits). Enable x64 with jax.config.update('jax_enable_x64', True) before "
        "creating arrays for a float64 computation, or pass float32 to silence this warning "
        "(it is shown once per process; filter PrecisionWarning to hide it).",
        PrecisionWarning,
    )

# Promoted to float32 for the computation (see the module docstring).
HALF_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def is_concrete(*xs: Any) -> bool:
    """True when no argument is a JAX tracer (so values can be inspected)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def compute_dtype(dtype: Any, name: str) -> jnp.dtype:
    """The floating dtype an input of ``dtype`` is computed in, or a ``TypeError``.

    float32/float64 stay; float16/bfloat16 become float32; integers and bools
    become the default float dtype; complex and anything else are refused.

    Examples:
      >>> compute_dtype(jnp.bfloat16, "x").name
      'float32'
      >>> compute_dtype(np.complex64, "x")
      Traceback (most recent call last):
      ...
      TypeError: x has complex dtype complex64; funsim measures are defined on real arrays. Pass the real part (x.real), the magnitude (abs(x)) or both as separate features, explicitly.
    """
    dt = jnp.dtype(dtype)
    if jnp.issubdtype(dt, jnp.complexfloating):
        raise TypeError(
            f"{name} has complex dtype {dt}; funsim measures are defined on real arrays. Pass "
            f"the real part ({name}.real), the magnitude (abs({name})) or both as separate "
            "features, explicitly."
        )
    if dt in HALF_DTYPES:
        return jnp.dtype(jnp.float32)
    if jnp.issubdtype(dt, jnp.floating):
        return dt
    if jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_:
        return jnp.dtype(jnp.result_type(float))
    raise TypeError(f"{name} has unsupported dtype {dt}; pass a real float array.")


def as_float_array(x: ArrayLike, name: str) -> jax.Array:
    """Convert to a floating JAX array in its compute dtype (:func:`compute_dtype`).

    float32/float64 are kept; float16/bfloat16 are promoted to float32;
    integers and booleans to the default float dtype. Complex input is refused.
    """
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(
            f"{name} must be an array (numpy or jax), got {type(x).__name__}."
        )
    dt = compute_dtype(x.dtype, name)
    if dt == jnp.dtype(jnp.float64) and not jax.config.jax_enable_x64:
        warn_float64_without_x64(name)
        dt = jnp.dtype(jnp.float32)
    if isinstance(x, np.ndarray) or not isinstance(x, jax.Array):
        # host data is converted on the host and transferred: jnp.asarray would compile a small
        # program per shape from jax 0.10 on ("stage"), before any check could refuse the input
        return jax.device_put(np.asarray(x, dtype=dt))
    return x if jnp.dtype(x.dtype) == dt else x.astype(dt)


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` as a Python bool, or raise ``TypeError`` unless it is one.

    ``True``/``False`` and NumPy bools are accepted; strings, numbers and
    ``None`` are not (``"no"`` would otherwise count as true).

    Examples:
      >>> check_bool(np.True_, "debiased")
      True
      >>> check_bool("yes", "debiased")
      Traceback (most recent call last):
      ...
      TypeError: debiased must be True or False, got 'yes' (str).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")


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
    msg = min_samples_reason(tuple(x.shape), name, min_samples, why)
    if msg is not None:
        raise ValueError(msg)
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


def _constant_message(name: str, shape: tuple, what: str) -> str:
    return (
        f"{name} of shape {tuple(shape)} is constant across samples (zero variance "
        f"after centring), so {what} is undefined (0/0). Check that the layer is not "
        "dead and that the samples differ."
    )


def min_samples_reason(shape: tuple, name: str, min_samples: int, why: str = "") -> str | None:
    """The message of :func:`check_rep` for too few samples, or ``None`` (for a core's ``reason``)."""
    if shape[0] >= min_samples:
        return None
    reason = f" for {why}" if why else ""
    return (f"{name} has {shape[0]} samples (shape {tuple(shape)}), but at least {min_samples} "
            f"are needed{reason}. Pass more samples.")


def constant_reason(flags: dict, name: str, shape: tuple, what: str = "similarity") -> str | None:
    """The constant-representation message for one side's fetched :func:`rep_flags`, or ``None``."""
    return None if bool(flags["varies"]) else _constant_message(name, shape, what)


def pair_constant_reason(flags: dict, shape_x: tuple, shape_y: tuple, names: tuple[str, str] = ("x", "y"), *,
                         what: str = "similarity") -> str | None:
    """A constant ``x`` then a constant ``y`` (the order of the eager checks), from ``flags["x"]``, ``flags["y"]``."""
    for key, name, shape in zip(("x", "y"), names, (shape_x, shape_y)):
        msg = constant_reason(flags[key], name, shape, what)
        if msg is not None:
            return msg
    return None


def check_not_constant(x: jax.Array, name: str, *, what: str = "similarity") -> None:
    """Raise if every row of a concrete ``x`` is the same, to ``CONSTANT_RTOL`` of its scale (host pass).

    Measures check this inside their program instead (:func:`rep_flags`); this host
    version serves callers that hold the data on the host anyway.
    """
    if not is_concrete(x):
        return
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape[0] == 0:
        return
    spread = float(np.abs(arr - arr[:1]).max())
    if not spread > CONSTANT_RTOL * float(np.abs(arr).max()):
        raise ValueError(_constant_message(name, arr.shape, what))


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


def is_traced(value: Any) -> bool:
    """True for a JAX tracer (an option or input under a caller's ``jit``/``vmap``/``grad``)."""
    return isinstance(value, jax.core.Tracer)


class Bound(NamedTuple):
    """The valid range of a float option, checked eagerly for a concrete value and in-program for a traced one.

    Attributes:
      name: the option's name, for messages.
      lo, hi: the bounds (``-inf``/``inf`` allowed: the value must still be finite).
      lo_open, hi_open: whether ``lo`` (``hi``) itself is excluded.
      why: what the option means, appended to the message.
      message: the whole message instead, a format string with ``{value!r}`` (for wordings
        users already match on).

    Examples:
      >>> b = Bound("alpha", 0.0, 1.0, why="partial-whitening strength")
      >>> b.check(0.5)
      0.5
      >>> b.check(2.0)
      Traceback (most recent call last):
      ...
      ValueError: alpha must be a finite number in [0, 1], got 2.0 (partial-whitening strength).
    """

    name: str
    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""
    message: str = ""

    def _range(self) -> str:
        lo, hi = (f"{v:g}" for v in (self.lo, self.hi))
        if self.hi == np.inf:
            return f"{'>' if self.lo_open else '>='} {lo}"
        return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"

    def _inside(self, v) -> Any:
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        return above & below

    def check(self, value: Any) -> Any:
        """A concrete value as a Python float (``ValueError`` outside the range); a traced ``()``
        real value as it is (checked in the program by :meth:`ok`; any other tracer a ``TypeError``)."""
        reason = f" ({self.why})" if self.why else ""
        if is_traced(value):
            if value.shape != () or not jnp.issubdtype(value.dtype, jnp.floating):
                raise TypeError(f"{self.name} must be a real scalar, got a traced {value.dtype} array of shape "
                                f"{tuple(value.shape)}; vmap over a vector of values instead.")
            return value
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        if not ok and isinstance(value, (np.ndarray, jax.Array)) and value.shape == () \
                and np.issubdtype(value.dtype, np.number) and not np.issubdtype(value.dtype, np.complexfloating):
            ok = True
        if not ok or not (np.isfinite(float(value)) and self._inside(float(value))):
            shown = float(value) if ok and not isinstance(value, (int, float)) else value
            if self.message:
                raise ValueError(self.message.format(value=shown))
            raise ValueError(f"{self.name} must be a finite number {self._range()}, got {shown!r}{reason}.")
        return float(value)

    def ok(self, value: Any) -> jax.Array:
        """``()`` bool in the program: ``value`` is finite and in range."""
        value = jnp.asarray(value)
        return jnp.isfinite(value) & self._inside(value)


def check_option_positive(value: Any, name: str, *, why: str = "") -> Any:
    """A float option that must be finite and > 0 (e.g. a bandwidth): a Python float, or a traced
    ``()`` value as it is (see :class:`Bound`).

    Examples:
      >>> check_option_positive(0.5, "rbf_scale")
      0.5
      >>> check_option_positive(0.0, "rbf_scale", why="the RBF bandwidth is rbf_scale x the median distance")
      Traceback (most recent call last):
      ...
      ValueError: rbf_scale must be a finite number > 0, got 0.0 (the RBF bandwidth is rbf_scale x the median distance).
    """
    return Bound(name, 0.0, np.inf, lo_open=True, why=why).check(value)


# ----------------------------------------------------------------- in-program value checks


def rep_flags(x: jax.Array) -> dict[str, jax.Array]:
    """In-program value checks of one representation ``(n, d)`` (pure, jit-able), in one pass.

    From the column minima and maxima alone: NaN or Inf anywhere makes them
    non-finite, and the data is constant when no column's range exceeds
    ``CONSTANT_RTOL`` times its largest magnitude (the range of an exactly
    constant column is exactly 0 in any dtype: no rounding from a mean).

    Returns:
      ``{"finite": bool, "varies": bool, "max_abs": ()}`` as arrays; see
      :func:`raise_rep_flags` and :func:`flags_ok`. ``max_abs`` is there for a
      caller that also needs the scale (e.g. :func:`similarity._linalg.pow2_scale`).
    """
    lo, hi = jnp.min(x, axis=0), jnp.max(x, axis=0)
    finite = jnp.all(jnp.isfinite(lo)) & jnp.all(jnp.isfinite(hi))
    max_abs = jnp.maximum(jnp.max(jnp.abs(lo)), jnp.max(jnp.abs(hi)))
    return {"finite": finite, "varies": jnp.max(hi - lo) > CONSTANT_RTOL * max_abs, "max_abs": max_abs}


def flags_ok(*flags: dict[str, jax.Array]) -> jax.Array:
    """``()`` bool: every check in these :func:`rep_flags` dicts passed."""
    ok = jnp.ones((), bool)
    for f in flags:
        ok = ok & f["finite"] & f["varies"]
    return ok


def nan_unless(ok: jax.Array, out: Any) -> Any:
    """Every floating leaf of ``out`` where ``ok``, else NaN (so failed checks never return a number),
    and so are its derivatives.

    Formed as ``v * where(ok, 1, nan)``, not ``where(ok, v, nan)``: a ``where`` sends the
    cotangent 0 to ``v`` where ``not ok``, so ``jax.grad`` of a NaN value was an all-zero
    gradient (a number). The product sends ``nan`` back instead, which reaches every input the
    value depends on; where ``ok`` it multiplies the value and its derivatives by exactly 1
    (bit-identical to ``v``).
    """

    def one(v):
        v = jnp.asarray(v)
        if not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        return v * jnp.where(ok, jnp.ones((), v.dtype), jnp.full((), jnp.nan, v.dtype))

    return jax.tree.map(one, out)


def nan_reaches_inputs(value: Any, *inputs: jax.Array) -> Any:
    """``value`` unchanged, but where an entry of it is NaN, that entry's derivative along every entry
    of ``inputs`` is NaN (every floating leaf of a pytree ``value``, of any shape).

    :func:`nan_unless` sends NaN back into the computation of a failed value; it cannot reach an
    input the value does not depend on there (SVCCA keeping no direction of a constant side: every
    correlation is masked; the RDM of a constant layer, whose distances sit at their kink with
    derivative 0). This multiplies by ``1 + probe * zero``, where ``zero = sum(z - stop_gradient(z))``
    over the inputs is exactly 0 with derivative 1 along every input entry, and ``probe`` is NaN
    where the entry of ``value`` is, else 0: a NaN value then never has a derivative that is a
    number. Where an entry is a number the factor is exactly 1 and the added derivative exactly 0.
    """
    zero = sum(jnp.sum(z - jax.lax.stop_gradient(z)) for z in inputs)

    def one(v):
        v = jnp.asarray(v)
        if not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        probe = jnp.where(jnp.isnan(v), jnp.full((), jnp.nan, v.dtype), jnp.zeros((), v.dtype))
        return v * (1 + probe * zero.astype(v.dtype))

    return jax.tree.map(one, value)


def fetch_flags(flags: Any, *inputs: Any) -> Any | None:
    """The flags as NumPy values (one transfer), or ``None`` under tracing (nothing to raise).

    Tracing is judged by the flags and by ``inputs`` (the data and options the flags came
    from): under ``jax.grad`` boolean flags come back concrete (they carry no tangent), but
    the call is still inside the caller's transformation, where the rule is NaN, not an error.
    """
    leaves = jax.tree.leaves(flags)
    if not is_concrete(*leaves, *jax.tree.leaves(inputs)):
        return None
    return jax.device_get(flags)


def raise_rep_flags(flags: dict | None, x: jax.Array, name: str, *, what: str = "similarity",
                    constant: bool = True, shape: tuple | None = None) -> None:
    """Raise the message :func:`check_finite` / :func:`check_not_constant` would, from fetched flags.

    Only on failure is ``x`` read on the host (to count its NaN and Inf values).
    ``shape`` overrides the shape shown for a constant ``x`` (e.g. its train rows).
    """
    if flags is None:
        return
    if not flags["finite"]:
        check_finite(x, name)
        raise AssertionError(f"{name}: non-finite flag without NaN/Inf")  # pragma: no cover
    if constant and not bool(flags["varies"]):
        raise ValueError(_constant_message(name, x.shape if shape is None else shape, what))


def raise_pair_flags(fx: dict | None, fy: dict | None, x: jax.Array, y: jax.Array,
                     names: tuple[str, str] = ("x", "y"), *, what: str = "similarity",
                     constant: bool = True) -> None:
    """NaN/Inf of ``x`` then ``y``, then a constant ``x`` then ``y`` (the order of the eager checks)."""
    nx, ny = names
    raise_rep_flags(fx, x, nx, constant=False)
    raise_rep_flags(fy, y, ny, constant=False)
    if constant:
        raise_rep_flags(fx, x, nx, what=what)
        raise_rep_flags(fy, y, ny, what=what)


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


