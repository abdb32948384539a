"""All-pairs comparisons across layers and models, in a handful of compiled programs (docs/design.md §3).

:func:`compare_grid` takes two collections of layer representations of the
same samples and returns one ``(La, Lb)`` table per measure. It reads the
registry, and only the registry: ``tables[name][i, j] == measure(name)(A_i, B_j)``
for every key it returns, and with ``reverse=True``
``reverse[name][i, j] == measure(name)(B_j, A_i)``; the undefined cells and
their reasons are those of the pairwise calls.

The package's parts:

* :mod:`.layers`: the checked inputs, zero-padded into one stack per side
  (widths and layer counts on the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ...), so a
  grid compiles the same programs whatever mix of widths it holds, and a grid of
  another architecture in the same buckets compiles nothing;
* :mod:`.devices`: the pair axis sharded over the devices (every process's after
  ``jax.distributed.initialize()``), with the same results as one device;
* :mod:`.moment_passes`: the *moment measures* (``measure(name).moments``: linear
  CKA, NBS, Procrustes, the alpha = 1 shape metrics and every ``stitch/*``
  reconstruction score), from per-layer and per-pair centred second moments: one
  program per side for the layers' moments, one for every pair of a block of
  source layers (their cross moments come out of one large matrix product),
  streamed over row chunks with ``chunk_size``;
* :mod:`.generic`: every other measure through its compiled core
  (:class:`similarity.protocol.Core`): the per-layer work once per layer (an RDM,
  a kernel matrix, a basis), the per-pair work over all pairs;
* :mod:`.undefined`: each undefined cell's reason, from the flags the programs
  return beside the values (the measure's ``core.reason``, the message of the
  pairwise call).

Calling :func:`compare_grid`:

**Compiled programs.** Each side's layers are zero-padded to one width and
their number to one count, both on the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24,
32, ... (at most 1.5x per axis), so a call compiles a handful of programs
whatever its widths (each measure's core is exact under zero padding), and a
later grid whose sizes fall in the same buckets compiles none. To keep them
across processes, turn on JAX's persistent compilation cache
(:func:`funsim.runtime.enable_compile_cache`, or
``jax.config.update("jax_compilation_cache_dir", path)``).

**Layers wider than the rows.** Where every requested moment measure is
invariant to rotations (``"rotation" in measure(name).invariances``: every
built-in one), a group of layers wider than the ``n`` rows is evaluated from its
rows rotated into their span (``n`` columns, :func:`.moment_passes.row_space`):
zero padding and a rotation change none of these measures, so the values are
the same, and each pair's products, SVDs and solves are ``n x n`` instead of
``W x W`` (layers of 2,048 to 256 features on 600 rows: 7x faster warm on the
2-core CPU, benchmarks/RESULTS.md). Not with ``chunk_size`` or ``buckets=False``.
A user-registered moment measure that declares ``"rotation"`` must therefore be
invariant to it (the registry's tests check the built-in ones).

**Undefined cells.** Where the pairwise call raises a ``ValueError`` for a
pair of valid layers (a constant layer, a rank-deficient one for CCA, PWCCA
or the whitened shape metrics, singular normal equations, a source wider
than the fitting rows), the cell is NaN and ``GridResult.undefined[name][(i, j)]``
holds the pairwise call's message (``reverse_undefined`` for the reverse
table); one :class:`UndefinedCellWarning` summarises them. The compiled
programs return each cell's flags beside its value, and the measure's
``core.reason`` turns them into that message (see :mod:`similarity.protocol`).
``on_undefined="raise"`` raises instead, at the first source a measure
refuses by its width or the first undefined cell, naming it. Invalid input
is an error either way: NaN/Inf, mismatched sample counts, a bad split,
unknown measures.

``compare_grid`` is a host-level driver (it reads the flags and builds the
reasons on the host): call it on concrete arrays, not inside ``jax.jit`` or
``jax.grad``; inside your own transformations use the measures themselves.

The reconstruction scores are named by family, figure and ridge:
``"stitch/<family>"`` (held out), ``"stitch/<family>/in_sample"`` (the
leaky in-sample figure on the train rows), and for the affine family
``"stitch/affine/ridge=<r>"`` and ``"stitch/affine/in_sample/ridge=<r>"``.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._precision import full_precision
from funsim.similarity.grid import generic as G
from funsim.similarity.grid import layers as L
from funsim.similarity.grid import moment_passes as M
from funsim.similarity.grid import undefined as U
from funsim.similarity.grid.devices import default_stats_budget, make_plan
from funsim.similarity.grid.undefined import UndefinedCellWarning
from funsim.similarity.moments import check_split, split_weights
from funsim.similarity.registry import Measure, list_measures
from funsim.similarity.registry import measure as get_measure

__all__ = ["MOMENT_MEASURES", "GridResult", "UndefinedCellWarning", "compare_grid"]

MOMENT_MEASURES = tuple(n for n in list_measures() if get_measure(n).moments is not None)
"""The built-in moment measures (``measure(name).moments is not None``); any such measure streams."""


class GridResult(NamedTuple):
    """Tables of an all-pairs comparison.

    Attributes:
      tables: ``{name: (La, Lb) array}`` with ``tables[name][i, j] ==
        measure(name)(rows[i] layer, cols[j] layer)``.
      rows: names of the ``reps_a`` layers.
      cols: names of the ``reps_b`` layers.
      reverse: with ``reverse=True``, ``{name: (La, Lb) array}`` with
        ``reverse[name][i, j] == measure(name)(cols[j] layer, rows[i] layer)``
        (for a symmetric measure, the same array as ``tables[name]`` unless
        the two directions differ in where they are defined); else ``{}``.
      undefined: ``{name: {(i, j): reason}}`` for every measure: the cells of
        ``tables[name]`` where the pairwise call ``measure(name)(A_i, B_j)``
        raises a ``ValueError`` (they are NaN), with its message.
      reverse_undefined: the same for ``reverse`` (``(i, j)`` indexes
        ``reverse[name]``, i.e. the call ``measure(name)(B_j, A_i)``); ``{}``
        without ``reverse=True``.
    """

    tables: dict[str, jax.Array]
    rows: tuple
    cols: tuple
    reverse: dict[str, jax.Array]
    undefined: dict[str, dict[tuple[int, int], str]] = {}
    reverse_undefined: dict[str, dict[tuple[int, int], str]] = {}


def _resolve(measures, *, streaming) -> tuple[list[tuple[str, Measure]], list[tuple[str, Measure]]]:
    """``(moment measures, other measures)`` as ``(name, Measure)``, in request order."""
    names = list(dict.fromkeys(measures))
    if not names:
        raise ValueError("measures is empty; e.g. measures=['cka/linear', 'stitch/affine'].")
    moment, generic = [], []
    for name in names:
        m = get_measure(name)
        (moment if m.moments is not None else generic).append((name, m))
    if streaming and generic:
        raise ValueError(
            f"measure {generic[0][0]!r} cannot stream samples in chunks; with chunk_size only moment "
            f"measures (measure(name).moments, e.g. {', '.join(MOMENT_MEASURES[:4])}, ...) are "
            "available. Drop chunk_size or the measure."
        )
    return moment, generic


def _refuse_process_sharded(reps_a, reps_b, measure_name: str) -> None:
    """Raise for a layer spread over several processes when a measure needs all of its rows in one place.

    Moment measures sum over rows, so a layer whose rows are sharded across
    processes (a ``jax.Array`` that is not fully addressable) works for them;
    the others build per-layer statistics over all samples (RDMs, kernels, bases).
    """
    for name, k, z in L.global_layers(reps_a, reps_b):
        keys = L.as_layers(reps_a if name == "reps_a" else reps_b, name)[0]
        raise ValueError(
            f"{name}[{k}] ({keys[k]!r}, shape {tuple(z.shape)}) is spread over several processes, and "
            f"measure {measure_name!r} needs every row of a layer in each process. With rows sharded "
            f"across processes use the moment measures only (similarity.MOMENT_MEASURES, e.g. "
            f"{', '.join(MOMENT_MEASURES[:3])}), or gather the rows first: "
            "jax.experimental.multihost_utils.process_allgather(x, tiled=True)."
        )


def _moment_fallback_reason(m: Measure, n_fit: int):
    """The reasons of a user's moment measure without a core: its width check, constant layers, and a
    non-finite value (it cannot say more)."""
    base = G.no_reason(m.name)

    def reason(flags, shape_x, shape_y, opts):
        if flags is None:
            if m.moments.check is None:
                return None
            try:
                m.moments.check(n_fit, int(shape_x[1]), m.name)
            except ValueError as e:
                return str(e)
            return None
        return base(flags, shape_x, shape_y, opts)

    return reason


def _reason(m: Measure, n_fit: int):
    """``(reason, opts)`` of a measure: its core's, or a fallback."""
    if m.core is not None:
        return m.core.reason, m.core.opts
    if m.moments is not None:
        return _moment_fallback_reason(m, n_fit), ()
    return G.core_of(m)[0].reason, ()


@full_precision
def compare_grid(
    reps_a: Mapping[Any, ArrayLike] | Sequence[ArrayLike],
    reps_b: Mapping[Any, ArrayLike] | Sequence[ArrayLike] | None = None,
    /,
    *,
    measures: str | Sequence[str] = ("cka/linear", "stitch/affine"),
    reverse: bool = False,
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    stats_budget: float | None = None,
    on_undefined: str = "nan",
    buckets: bool = True,
    on_step: Callable[[int, int], Any] | None = None,
) -> GridResult:
    """Compare every layer of ``reps_a`` with every layer of ``reps_b``, for every measure by name.

    ``tables[name][i, j] == similarity.measure(name)(A_i, B_j)`` for every
    returned name (to rounding; the tests check 1e-10 in float64), where
    ``A_i``, ``B_j`` are the i-th layer of ``reps_a`` and the j-th of ``reps_b``.
    With ``reverse=True`` the same call also returns
    ``reverse[name][i, j] == measure(name)(B_j, A_i)``, reusing the same
    per-layer (and, for moment measures, per-pair) work.

    Each side's layers are padded into size buckets, so a call compiles a handful
    of programs whatever its widths; a pair whose pairwise call raises a
    ``ValueError`` is an undefined cell (NaN, its message in ``undefined``, one
    :class:`UndefinedCellWarning`); invalid input is an error. Call it on
    concrete arrays, not under ``jax.jit`` or ``jax.grad``. The reconstruction
    scores are ``"stitch/<family>"`` (held out), ``"stitch/<family>/in_sample"``
    and ``"stitch/affine[/in_sample]/ridge=<r>"``. The module docstring has the
    details: compiled programs, undefined cells, tracing.

    Args:
      reps_a: dict ``{name: (n, d_i)}`` or list of ``(n, d_i)`` arrays.
      reps_b: the same for the other model (default: ``reps_a``). Same ``n``
        samples, in the same order, as ``reps_a``.
      measures: registry names (``similarity.list_measures()``; parametrised
        names like ``"shape/angular/alpha=0.5"`` too); one name may be passed
        as a plain string.
      reverse: also return ``GridResult.reverse`` (see above); for one side with
        itself (``reps_b`` omitted or ``reps_a`` itself) it is the forward table
        transposed, and costs nothing.
      split: the train/test split of the held-out reconstruction scores, shared
        by every pair: a train fraction or ``(train_idx, test_idx)``. The
        registered measures use the default (0.5 with ``key=jax.random.key(0)``);
        with another split the tables equal
        :func:`similarity.reconstruction_score` with that split.
      key: PRNG key for a fractional split (default ``jax.random.key(0)``).
      chunk_size: stream samples in chunks of this many rows (moment measures only).
      devices: devices to shard the pair axis over (default: all of ``jax.devices()``).
      stats_budget: bytes allowed for the per-layer statistics of a measure
        (RDMs, kernel matrices, bases), all layers together. Within it, such a
        measure does its per-layer work once per layer; above it (e.g. ``n^2``
        RDMs for large ``n``), a block of layers at a time (two blocks, one per
        side, fit in it): once per block of the other side; when not one layer
        per side fits, once per pair. The grid holds one measure's statistics
        at a time (the measures that share them run one after the other). Default
        (``None``): a quarter of the smallest free device memory where the
        devices report it (GPU, TPU), else 2 GiB (the CPU):
        :func:`.devices.default_stats_budget`. The tables do not depend on it
        (to rounding).
      on_undefined: ``"nan"`` (default): undefined cells are NaN, with their
        reasons in the result and one warning; ``"raise"``: a ``ValueError`` at
        the first refused source or undefined cell (cells in order of their
        layers' widths, narrowest first).
      buckets: pad sizes into buckets (see above); ``False`` groups the layers
        by their exact widths instead (one program per pair of widths: only for
        a user-registered measure whose code reads its input's width), and keeps
        layers wider than the rows in their own features (see the module docstring).
      on_step: ``on_step(done, total)``, called on the host after each step of the
        work (a block of source layers of the moment measures, or one other
        measure), for a progress bar around a long grid; ``total`` is final from
        the first call on.

    Returns:
      :class:`GridResult` ``(tables, rows, cols, reverse, undefined,
      reverse_undefined)``; each table is ``(La, Lb)``.

    Raises:
      ValueError: unknown measure, a measure without moments with ``chunk_size``,
        mismatched sample counts, NaN/Inf, a bad split, a measure that returns a
        non-finite value without a reason (named by its pair), or with
        ``on_undefined="raise"`` an undefined cell.
      TypeError: called under a JAX transformation (a traced layer, ``split`` or ``key``).

    Examples:
      >>> import jax
      >>> x = jax.random.normal(jax.random.key(0), (40, 3))
      >>> g = compare_grid({"a": x, "b": 2 * x}, [x, x[:, :2]], measures=["cka/linear", "stitch/affine"],
      ...                  reverse=True)
      >>> g.tables["cka/linear"].shape, g.rows, sorted(g.reverse)
      ((2, 2), ('a', 'b'), ['cka/linear', 'stitch/affine'])

      A dead layer (constant) leaves its cells undefined, not the grid:

      >>> import warnings
      >>> with warnings.catch_warnings(record=True) as w:
      ...     warnings.simplefilter("always")
      ...     g = compare_grid({"x": x, "dead": 0 * x}, [x], measures="cka/linear")
      >>> g.tables["cka/linear"][:, 0].tolist()[1], list(g.undefined["cka/linear"]), w[0].category.__name__
      (nan, [(1, 0)], 'UndefinedCellWarning')
    """
    _refuse_tracers(reps_a, reps_b, split, key)
    streaming, reverse, strict, buckets = _check_options(chunk_size, reverse, on_undefined, buckets,
                                                         stats_budget)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a function on_step(done, total) or None, got {type(on_step).__name__}.")
    measures = [measures] if isinstance(measures, str) else list(measures)
    moment, generic = _resolve(measures, streaming=streaming)
    steps = _Steps(len(generic), on_step)
    if generic:
        _refuse_process_sharded(reps_a, reps_b, generic[0][0])
    lay = L.prepare(reps_a, reps_b, buckets=buckets)
    n_tr, n_te, weights = _split_rows(lay, split, key, moment)
    plan = make_plan(devices)
    if stats_budget is None and generic:  # only the generic measures keep per-layer statistics
        stats_budget = default_stats_budget(devices)
    stacks = G.Stacks(lay, plan)
    reasons = {name: _reason(m, n_tr if _uses_split(m) else lay.n) for name, m in moment + generic}
    if strict:
        for name, _ in moment + generic:
            U.raise_static_sources(name, *reasons[name], lay, reverse=reverse)
    tables: dict[str, dict[str, U.Table]] = {}
    # a side with itself: the reverse table is the forward one transposed (measure(B_j, A_i) = fwd[j, i])
    transpose = reverse and lay.same
    computed_reverse = reverse and not transpose
    if moment:
        entries = tuple(M.Entry(name, m.moments, computed_reverse) for name, m in moment)
        tables.update(M.moment_tables(lay, entries, weights=weights, chunk_size=chunk_size, plan=plan,
                                      stacks=stacks,
                                      rotation_invariant=buckets and all("rotation" in m.invariances
                                                                         for _, m in moment), steps=steps))
    stats_cache: dict = {}
    generic_table = functools.partial(G.generic_table, lay, plan=plan, stats_budget=stats_budget, stacks=stacks,
                                      stats_cache=stats_cache)
    generic = G.by_statistics(generic)  # the measures that share per-layer statistics one after another
    for k, (name, m) in enumerate(generic):
        tables[name] = generic_table(m, directions=("fwd", "rev") if computed_reverse and not m.symmetric
                                     else ("fwd",))
        G.evict(stats_cache, keep=[later for _, later in generic[k + 1:]])  # one measure's statistics at a time
        steps.advance()
    if transpose:
        for t in tables.values():
            t["rev"] = U.transposed(t["fwd"])
    names = list(dict.fromkeys(measures))
    fwd, rev, undefined, rev_undefined = _settle(
        names, dict(moment + generic), tables, reasons, lay, reverse=reverse, strict=strict,
        extra={"n_rows": n_tr + n_te, "n_test": n_te},
        generic_table=lambda m, **kw: _once(generic_table, stats_cache, m, **kw))
    U.warn_undefined(undefined, rev_undefined, lay)
    out, rev_out = _arrays(names, fwd, rev, reverse)
    return GridResult(out, lay.rows, lay.cols, rev_out, undefined, rev_undefined if reverse else {})


class _Steps:
    """The grid's steps for ``on_step``: ``total`` grows while the work is planned, ``advance`` reports."""

    def __init__(self, total: int, callback):
        self.total, self.done, self.callback = total, 0, callback

    def add(self, k: int) -> None:
        self.total += k

    def advance(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total)


def _arrays(names, fwd, rev, reverse: bool) -> tuple[dict, dict]:
    """The tables as JAX arrays, ``(tables, reverse)``; a reverse table that is its forward one stays one array."""
    out = {name: jnp.asarray(fwd[name]) for name in names}
    rev_out = {}
    if reverse:
        rev_out = {name: out[name] if rev[name] is fwd[name] else jnp.asarray(rev[name]) for name in names}
    return out, rev_out


def _check_options(chunk_size, reverse, on_undefined, buckets, stats_budget) -> tuple[bool, bool, bool, bool]:
    """``(streaming, reverse, strict, buckets)``: :func:`compare_grid`'s options, checked (``stats_budget``
    too)."""
    streaming = chunk_size is not None
    if streaming and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    reverse = V.check_bool(reverse, "reverse")
    if stats_budget is not None and (isinstance(stats_budget, (bool, np.bool_))
                                     or not isinstance(stats_budget, numbers.Real) or not stats_budget >= 0):
        raise ValueError(f"stats_budget must be a number of bytes >= 0 (0: per-pair statistics) or None (the "
                         f"default, from the devices' memory), got {stats_budget!r}.")
    strict = V.check_choice(on_undefined, "on_undefined", ("nan", "raise")) == "raise"
    return streaming, reverse, strict, V.check_bool(buckets, "buckets")


def _uses_split(m: Measure) -> bool:
    """Whether ``m`` is a moment measure on train/test ("split") moments."""
    return m.moments is not None and m.moments.moments == "split"


def _split_rows(lay: L.Layers, split, key, moment) -> tuple[int, int, tuple | None]:
    """``(n_train, n_test, weights)``: the split, checked even when no measure uses it, and its 0/1 row
    weights (NumPy) when a moment measure does (else ``None``)."""
    n_tr, n_te = check_split(lay.n, split)
    if not any(_uses_split(m) for _, m in moment):
        return n_tr, n_te, None
    weights = tuple(np.asarray(w) for w in split_weights(lay.n, split, key, lay.dtype))
    return int(round(float(weights[0].sum()))), int(round(float(weights[1].sum()))), weights


def _once(generic_table, stats_cache: dict, measure, **kw):
    """A generic table computed after the measures' pass (a symmetric measure's reverse where it could differ),
    its statistics dropped afterwards: the grid holds one measure's statistics at a time."""
    try:
        return generic_table(measure, **kw)
    finally:
        G.evict(stats_cache, keep=[])


def _settle(names, by_name, tables, reasons, lay, *, reverse, strict, extra, generic_table):
    """``(fwd, rev, undefined, rev_undefined)``: each measure's tables with their undefined cells settled
    (:func:`.undefined.settle`), computing a symmetric generic measure's reverse table only where it could
    differ from its forward one."""
    fwd, rev, undefined, rev_undefined = {}, {}, {}, {}
    for name in names:
        m = by_name[name]
        reason, opts = reasons[name]
        ex = extra if _uses_split(m) else None
        fwd[name], undefined[name] = U.settle(name, m, tables[name]["fwd"], lay, reverse=False, strict=strict,
                                              reason=reason, opts=opts, extra=ex)
        if not reverse:
            continue
        if "rev" not in tables[name]:  # a symmetric generic measure: its reverse only where it could differ
            static_differs = any(reason(None, lay.shape("b", j), lay.shape("a", i), opts) is not None
                                 for i in range(len(lay.va)) for j in range(len(lay.vb)))
            if not (undefined[name] or static_differs):
                rev[name], rev_undefined[name] = fwd[name], {}
                continue
            tables[name].update(generic_table(m, directions=("rev",)))
        rev[name], rev_undefined[name] = U.settle(name, m, tables[name]["rev"], lay, reverse=True, strict=strict,
                                                  reason=reason, opts=opts, extra=ex)
        if m.symmetric and rev_undefined[name].keys() == undefined[name].keys():
            rev[name] = fwd[name]  # its own reverse
    return fwd, rev, undefined, rev_undefined


def _traced(reps_a, reps_b, split, key):
    """``(argument, shape)`` of the first tracer among compare_grid's array arguments, or ``None``."""
    for name, r in (("reps_a", reps_a), ("reps_b", reps_b)):
        if isinstance(r, jax.core.Tracer):
            return name, r.shape
        if isinstance(r, Mapping):
            for k, z in r.items():
                if isinstance(z, jax.core.Tracer):
                    return f"{name}[{k!r}]", z.shape
        elif isinstance(r, Sequence) and not isinstance(r, str):
            for i, z in enumerate(r):
                if isinstance(z, jax.core.Tracer):
                    return f"{name}[{i}]", z.shape
    for name, a in (("split", split), ("key", key)):
        for z in jax.tree.leaves(a):
            if isinstance(z, jax.core.Tracer):
                return name, z.shape
    return None


def _refuse_tracers(reps_a, reps_b, split, key) -> None:
    """A clear ``TypeError`` for a traced argument (inside ``jit``/``grad``/``vmap``), before anything
    would convert it to NumPy (a bare ``TracerArrayConversionError``)."""
    hit = _traced(reps_a, reps_b, split, key)
    if hit is None:
        return
    name, shape = hit
    raise TypeError(
        f"compare_grid got a traced {name} of shape {tuple(shape)} (it was called inside jax.jit, jax.grad or "
        "jax.vmap): the grid is a host-level driver that pads and groups layers and reads each cell's flags on "
        "the host to name undefined cells, so it cannot be traced. Call it on concrete arrays; inside your "
        "transformation use the per-pair measures, e.g. similarity.cka(a, b) or "
        "jax.vmap(similarity.measure('cka/linear')) over stacked layers (similarity.similarity_matrix is the "
        "jit-compiled all-pairs call for tensor-network checkpoints)."
    )
