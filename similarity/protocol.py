"""One measure protocol: every registered measure has a compiled core that returns ``(value, flags)``.

A :class:`Core` is a measure written for batches of layers of many widths:

* ``layer(z, width, opts) -> stats``: the per-layer work (a kernel matrix, an
  RDM, a basis, a whitening) on one layer ``z: (n, W)`` whose first ``width``
  features are real and whose others are zero (``width`` is a traced ``()``
  integer, so one compiled program serves every width up to ``W``);
* ``pair(stats_x, stats_y, opts) -> (value, flags)``: the per-pair work.
  ``value`` is ``()``, NaN wherever the measure is undefined (never a number
  there); ``flags`` is a dict of ``()`` arrays (or of such dicts) with
  everything needed to say why, and always holds ``"x"`` and ``"y"``, each
  side's :func:`similarity._validate.rep_flags` (``finite``, ``varies``; a
  zero-padded layer has the flags of the unpadded one);
* ``reason(flags, shape_x, shape_y, opts) -> str | None`` (on the host): the
  ``ValueError`` message of the pairwise call for these flags (fetched as
  NumPy values) and the *real* shapes, or ``None`` where the value is defined.
  With ``flags=None`` it checks what the shapes alone decide (e.g. CCA needs
  ``d < n``); the pairwise call asks that before it runs the program.

The contract that makes padding free: ``pair(layer(pad(x), dx), layer(pad(y), dy))``
equals ``pair(layer(x, dx), layer(y, dy))`` to rounding for any zero padding,
and so do the flags. The tests check it for every registered measure.

The public function of a measure is its core plus a thin wrapper (:func:`call`):
static checks, one compiled program, then a ``ValueError`` from the flags after the
program returns. :func:`similarity.compare_grid` runs the same cores over all pairs
of layers padded to one width, in a few compiled programs, and reads each undefined
cell's reason from the same ``reason`` function, so a grid cell and the pairwise
call agree on the value and on the message.

``opts`` are the measure's numerical options (a bandwidth factor, a ridge, an
epsilon) as Python floats; they are passed into the programs as arrays, so two
measures of one family that differ only in an option share every compiled program.
An option may also be a caller's tracer (``jit``, ``vmap`` or ``grad`` over the option
itself): then its range (``bounds``, a :class:`similarity._validate.Bound` per option) is
checked inside the program, and a value out of range gives NaN with NaN derivatives, as
every other failed value check does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity import _validate as V

__all__ = ["Core", "call", "evaluate", "feature_mask", "opts_arrays", "raise_from_flags"]


class Core(NamedTuple):
    """A measure's compiled core (see the module docstring).

    Attributes:
      layer: ``(z (n, W), width () int, opts) -> stats`` (pure, jit-able; zero padding allowed).
      pair: ``(stats_x, stats_y, opts) -> (value (), flags)`` (pure, jit-able).
      reason: ``(flags or None, shape_x, shape_y, opts) -> str | None`` (host).
      opts: the numerical options, a tuple of Python floats (traced in every program), or of a
        caller's ``()`` tracers.
      bounds: one :class:`similarity._validate.Bound` per option (empty: not checked in the program).
    """

    layer: Callable
    pair: Callable
    reason: Callable
    opts: tuple = ()
    bounds: tuple = ()


def opts_arrays(core: Core, dtype) -> tuple:
    """The core's options as ``()`` arrays of ``dtype`` (NumPy: placing them compiles nothing; a
    traced option stays traced)."""
    return tuple(jnp.asarray(o, dtype) if V.is_traced(o) else np.asarray(o, dtype=dtype) for o in core.opts)


def traced_opts(core: Core) -> bool:
    """Whether any of the core's options is a caller's tracer."""
    return any(V.is_traced(o) for o in core.opts)


def feature_mask(width, size: int, dtype) -> jax.Array:
    """``(size,)``: 1 on the first ``width`` features, 0 on the zero padding (pure)."""
    return (jnp.arange(size) < width).astype(dtype)


@functools.lru_cache(maxsize=None)
def _program(layer: Callable, pair: Callable):
    """``pair(layer(x), layer(y))`` as one jit-compiled program (once per core and shapes).

    A NaN value has a NaN derivative along every entry of ``x`` and ``y``
    (:func:`similarity._validate.nan_reaches_inputs`), never a number such as 0.
    """

    def run(x, y, opts):
        sx = layer(x, jnp.asarray(x.shape[1], jnp.int32), opts)
        sy = layer(y, jnp.asarray(y.shape[1], jnp.int32), opts)
        value, flags = pair(sx, sy, opts)
        return V.nan_reaches_inputs(value, x, y), flags

    return jax.jit(run)


def evaluate(core: Core, x: jax.Array, y: jax.Array) -> tuple[jax.Array, dict]:
    """``(value, flags)`` of the core on two checked layers, unpadded (pure and traceable).

    With a traced option, ``flags["opts"]`` says whether every option is in its range, and the
    value is NaN (NaN derivatives too) where one is not."""
    opts = opts_arrays(core, x.dtype)
    value, flags = _program(core.layer, core.pair)(x, y, opts)
    if traced_opts(core) and core.bounds:
        ok = jnp.ones((), bool)
        for bound, o in zip(core.bounds, opts):
            ok = ok & bound.ok(o)
        value = V.nan_reaches_inputs(V.nan_unless(ok, value), *(o for o in opts if V.is_traced(o)))
        flags = {**flags, "opts": ok}
    return value, flags


def raise_from_flags(core: Core, flags: dict | None, x: jax.Array, y: jax.Array,
                     names: tuple[str, str] = ("x", "y")) -> None:
    """The pairwise call's errors from fetched flags: NaN/Inf in either input (counted on the host),
    then the core's own reason. No-op for ``flags=None`` (under tracing)."""
    if flags is None:
        return
    for key, name, z in zip(("x", "y"), names, (x, y)):
        if not flags[key]["finite"]:
            V.check_finite(z, name)
    msg = core.reason(flags, tuple(x.shape), tuple(y.shape), core.opts)
    if msg is not None:
        raise ValueError(msg)


def call(core: Core, x: jax.Array, y: jax.Array, names: tuple[str, str] = ("x", "y")) -> jax.Array:
    """The pairwise measure: shape checks, the compiled core, then a ``ValueError`` from its flags.

    ``x``, ``y``: checked ``(n, d)`` arrays of one dtype. Under a user's
    ``jit``/``vmap``/``grad`` the flags are tracers and nothing is raised: the value is NaN
    wherever the measure is undefined.
    """
    msg = core.reason(None, tuple(x.shape), tuple(y.shape), core.opts)
    if msg is not None:
        raise ValueError(msg)
    value, flags = evaluate(core, x, y)
    raise_from_flags(core, V.fetch_flags(flags, x, y, *core.opts), x, y, names)
    return value

