"""Many closed-form stitcher fits in one vmapped, jit-compiled call: :func:`fit_stitchers`.

The problems, of any widths and families, are zero-padded to one width per side (and up the
ladder ``similarity._ladder.bucket``), fitted by :func:`fit_padded` and sliced back on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._ladder import bucket as size_bucket
from funsim.similarity._precision import full_precision
from funsim.similarity._stitch_fit import (
    Stitcher,
    check_fit_rows,
    check_options,
    fit_impl,
    normalise_option,
    raise_not_finite,
)


def _host_float(z, name: str) -> np.ndarray:
    """A concrete array as NumPy in its compute dtype (:func:`similarity._validate.compute_dtype`),
    cast on the host: no device program, whatever the input dtype."""
    if isinstance(z, (list, tuple)):
        z = np.asarray(z)
    if not hasattr(z, "dtype") or not hasattr(z, "shape"):
        V.as_float_array(z, name)  # raises its TypeError
    dt = V.compute_dtype(z.dtype, name)
    if dt == jnp.dtype(jnp.float64) and not jax.config.jax_enable_x64:
        return np.asarray(V.as_float_array(z, name))  # float32 (cast on the host) and its PrecisionWarning
    return np.asarray(z, dtype=dt)


def _host_rep(z, name: str) -> np.ndarray:
    """:func:`_host_float` with the shape checks of :func:`similarity._validate.check_rep` (no NaN check)."""
    z = _host_float(z, name)
    if z.ndim != 2 or z.shape[1] == 0 or z.shape[0] < 2:
        V.check_rep(z, name, finite=False)  # raises its message
    return z


def _is_traced(*zs) -> bool:
    return any(isinstance(z, jax.core.Tracer) for z in zs)


@functools.partial(jax.jit, static_argnames=("families",))
def fit_padded(xs, ys, mask_src, ridge, code, normalize, *, families):
    """Fit ``b`` zero-padded problems of any families in one vmapped program: ``((weight, bias, scale), flags)``.

    ``xs: (b, n, W1)``, ``ys: (b, n, W2)``, ``mask_src: (b, W1)`` (1 on each source's real
    features); per problem ``ridge: (b,)``, ``code: (b,)`` int (the index of its family in the
    static tuple ``families``) and ``normalize: (b,)`` bool. With several families every fit is
    computed for every problem and ``code`` selects (arithmetic is cheap, a compile is not).
    ``flags: (b, 3)`` bool, per problem: all finite, source varies, target varies (zero features
    change none of them). One program per tuple of families and padded shapes.
    """

    def fit(x, y, m, r, c, nz):
        outs = [fit_impl(x, y, m, family=f, ridge=r, normalize=nz) for f in families]
        return functools.reduce(
            lambda acc, j: jax.tree.map(lambda a, o: jnp.where(c == j, o, a), acc, outs[j]),
            range(1, len(outs)), outs[0])

    out = jax.vmap(fit)(xs, ys, mask_src, ridge, code, normalize)
    fx, fy = jax.vmap(V.rep_flags)(xs), jax.vmap(V.rep_flags)(ys)
    return out, jnp.stack([fx["finite"] & fy["finite"], fx["varies"], fy["varies"]], axis=1)


def _default_names(i: int) -> tuple[str, str]:
    return f"zs_src[{i}]", f"zs_tgt[{i}]"


def _fit_batch(xs: list, ys: list, fams: Sequence[str], normalize: Sequence[bool], ridge: Sequence[float],
               bucket: bool, dt, names=_default_names) -> list[Stitcher]:
    """Every problem, of any families and options, padded to one width per side (and, with ``bucket``,
    the widths and the count up the ladder ``similarity._ladder.bucket``), fitted in one call of :func:`fit_padded`.

    Concrete inputs are padded and the results sliced on the host (NumPy), so that no program is
    compiled per width; traced inputs (under a caller's ``jit``) are padded in the caller's trace.
    ``names(i) -> (source name, target name)`` for the messages.
    """
    idx = list(range(len(xs)))
    families = tuple(sorted(set(fams)))
    d1s, d2s = [x.shape[1] for x in xs], [y.shape[1] for y in ys]
    w1, w2, count = max(d1s), max(d2s), len(idx)
    if bucket:
        w1, w2, count = size_bucket(w1), size_bucket(w2), size_bucket(count)
    pidx = idx + [idx[-1]] * (count - len(idx))  # dummy problems repeat the last one; dropped
    n = xs[0].shape[0]
    widths = np.array([d1s[i] for i in pidx])
    mask = (np.arange(w1)[None, :] < widths[:, None]).astype(dt)
    per = dict(ridge=np.array([ridge[i] for i in pidx], dt),
               code=np.array([families.index(fams[i]) for i in pidx], np.int32),
               normalize=np.array([bool(normalize[i]) for i in pidx]))
    traced = _is_traced(*xs, *ys)
    if traced:
        pad = lambda z, w: jnp.pad(jnp.asarray(z, dt), ((0, 0), (0, w - z.shape[1])))  # noqa: E731
        xp = jnp.stack([pad(xs[i], w1) for i in pidx])
        yp = jnp.stack([pad(ys[i], w2) for i in pidx])
    else:
        xp, yp = np.zeros((count, n, w1), dt), np.zeros((count, n, w2), dt)
        for k, i in enumerate(pidx):
            xp[k, :, : d1s[i]] = xs[i]
            yp[k, :, : d2s[i]] = ys[i]
    (w, b, s), flags = fit_padded(xp, yp, mask, per["ridge"], per["code"], per["normalize"], families=families)
    if traced:
        return [Stitcher(w[k, :d1, :d2], b[k, :d2], s[k], family=fams[k])
                for k, (d1, d2) in enumerate(zip(d1s, d2s))]
    (w, b, s), flags = jax.device_get(((w, b, s), flags))
    _raise_flags(flags, idx, names)
    parts = []
    for k, (d1, d2) in enumerate(zip(d1s, d2s)):
        weight = w[k, :d1, :d2]
        if not np.all(np.isfinite(weight)):
            raise_not_finite(f"The fitted stitcher weight of {names(k)[0]}")
        parts.append((weight, b[k, :d2], s[k]))
    return [Stitcher(*p, family=f) for p, f in zip(jax.device_put(parts), fams)]


@full_precision
def fit_stitchers(
    zs_src: Sequence[ArrayLike] | ArrayLike,
    zs_tgt: Sequence[ArrayLike] | ArrayLike,
    /,
    *,
    family: str | Sequence[str] = "affine",
    ridge: float | Sequence[float] = 0.0,
    normalise: bool | Sequence[bool] = True,
    bucket: bool = True,
    names: Sequence[str] | None = None,
    **old_spelling,
) -> list[Stitcher]:
    """Fit many stitchers in one vmapped, jit-compiled call, whatever their widths and families.

    The problems are zero-padded to one source width and one target width, with
    feature masks (padded source features get a unit diagonal in the normal
    equations and weight 0; the orthogonal families are exact under zero
    padding), and fitted in one program, so each result equals the individual
    unpadded :func:`fit_stitcher` and a call compiles one program, however many
    widths and families it mixes (with several families each problem's fit is
    selected from all of them, computed side by side). Padding and slicing run
    on the host (NumPy), so no small program is compiled per width either.
    Where the padded source has more features than there are rows (wide
    sources, few rows), the affine fit is solved in the span of the rows
    (a QR of the rows, ``O(n^2 d)``), not on the ``d x d`` normal equations:
    the same ridge fit, so ``ridge > 0`` is still needed for a source that
    itself has at least as many features as rows.

    ``bucket`` (kept, with a new meaning): with ``True`` (default) the padded
    widths and the number of problems are rounded up the ladder 1, 2, 3, 4, 6, 8,
    12, 16, 24, ... (at most 1.5x per axis; the padded problems repeat the last
    one and are dropped), so that later calls with similar widths and counts reuse
    the compiled programs; with ``False`` the problems are padded to the call's
    largest widths only, and the program is for this exact batch.

    Args:
      zs_src: a sequence of b ``(n, d_src_i)`` arrays (same ``n``), or one stacked
        ``(b, n, d_src)`` array.
      zs_tgt: the matching ``(n, d_tgt_i)`` arrays, or ``(b, n, d_tgt)``.
      family: one family for all, or b families (see ``FAMILIES``).
      ridge, normalise: as in :func:`fit_stitcher`; one for all, or b of them.
      bucket: round the padded sizes up the ladder (see above).
      names: b labels for the error messages (default: the problems' indices,
        ``zs_src[i]``), e.g. the layer pairs.

    Returns:
      b :class:`Stitcher` (unpadded), in order, whatever the input form; stack
      them with ``jax.tree.map(lambda *a: jnp.stack(a), *stitchers)`` when
      they share a shape and family.

    Examples:
      >>> import jax
      >>> k = jax.random.split(jax.random.key(0), 3)
      >>> xs = [jax.random.normal(k[0], (30, 3)), jax.random.normal(k[1], (30, 5))]
      >>> ys = [x[:, :2] for x in xs]
      >>> [tuple(s.weight.shape) for s in fit_stitchers(xs, ys)]
      [(3, 2), (5, 2)]
    """
    bucket = V.check_bool(bucket, "bucket")
    stacked = hasattr(zs_src, "ndim") and hasattr(zs_tgt, "ndim")
    b = zs_src.shape[0] if stacked and zs_src.ndim else len(zs_src)
    fams = _per_problem(family, b, "family")
    ridges = _per_problem(ridge, b, "ridge")
    for fam, r in zip(fams, ridges):
        check_options(fam, r)
    ridges = [float(r) for r in ridges]
    norms = normalise_option(normalise, old_spelling, "fit_stitchers", check=lambda v, nm: [
        V.check_bool(x, nm) for x in _per_problem(v, b, nm)])
    labels = None if names is None else [str(v) for v in _per_problem(names, b, "names", scalar=False)]
    where = _default_names if labels is None else (lambda i: (f"the source of {labels[i]}", f"the target of {labels[i]}"))
    if stacked:
        if _is_traced(zs_src, zs_tgt):
            big_x, big_y = V.as_float_array(zs_src, "zs_src"), V.as_float_array(zs_tgt, "zs_tgt")
        else:
            big_x, big_y = _host_float(zs_src, "zs_src"), _host_float(zs_tgt, "zs_tgt")
        if big_x.ndim != 3 or big_y.ndim != 3 or big_x.shape[:2] != big_y.shape[:2]:
            raise ValueError(
                "Stacked zs_src and zs_tgt must be (b, n, d) arrays with the same b and n, got "
                f"{tuple(big_x.shape)} and {tuple(big_y.shape)}."
            )
        for i, (fam, r) in enumerate(zip(fams, ridges)):
            check_fit_rows(big_x.shape[1], big_x.shape[2], fam, r, "zs_src" if labels is None else where(i)[0])
        xs, ys = [big_x[i] for i in range(b)], [big_y[i] for i in range(b)]
    else:
        zs_src, zs_tgt = list(zs_src), list(zs_tgt)
        if len(zs_src) != len(zs_tgt) or not zs_src:
            raise ValueError(
                f"zs_src and zs_tgt must be non-empty and of equal length, got {len(zs_src)} and "
                f"{len(zs_tgt)}."
            )
        xs, ys = [], []
        for i, (a, b_) in enumerate(zip(zs_src, zs_tgt)):
            # shapes and dtypes here (on the host for concrete input); values (NaN/Inf, constant
            # sides) are checked inside the batched call, in one pass, and raised below
            names = where(i)
            if _is_traced(a, b_):
                x, y = V.check_pair(a, b_, names, finite=False)
            else:
                x, y = _host_rep(a, names[0]), _host_rep(b_, names[1])
                if x.shape[0] != y.shape[0]:
                    V.check_pair(x, y, names, finite=False)  # raises its message
            check_fit_rows(x.shape[0], x.shape[1], fams[i], ridges[i], names[0])
            xs.append(x)
            ys.append(y)
        ns = {x.shape[0] for x in xs}
        if len(ns) != 1:
            raise ValueError(f"All problems must share the sample count n; got n in {sorted(ns)}.")
    dt = np.dtype(functools.reduce(jnp.promote_types, [z.dtype for z in xs + ys]))
    return _fit_batch(xs, ys, fams, norms, ridges, bucket, dt, where)


def _per_problem(value, b: int, name: str, scalar: bool = True) -> list:
    """One option for all b problems (``scalar``: anything but a sequence, checked by the caller)
    or a sequence of b of them."""
    one = isinstance(value, (str, bytes)) or not hasattr(value, "__len__")
    if scalar and one:
        return [value] * b
    if one:
        raise TypeError(f"{name} must be a sequence of b = {b} values, got {value!r}.")
    value = list(np.asarray(value).tolist() if isinstance(value, np.ndarray) else value)
    if len(value) != b:
        raise ValueError(f"{name} has {len(value)} entries but there are {b} problems; pass one value "
                         f"or one per problem.")
    return value


def _raise_flags(flags, idx, names=_default_names) -> None:
    """The value checks of :func:`fit_padded` (``(b, 3)``, fetched) for the problems ``idx``;
    ``names(i) -> (source name, target name)``."""
    flags = np.asarray(flags)
    for k, i in enumerate(idx):
        src, tgt = names(i)
        if not flags[k, 0]:
            raise ValueError(f"{src} or {tgt} contains NaN or Inf values; remove or impute them.")
        for col, nm in ((1, src), (2, tgt)):
            if not flags[k, col]:
                raise ValueError(
                    f"{nm} is constant across samples (zero variance after centring), so "
                    "the stitcher fit is undefined (0/0). Check that the layer is not dead."
                )
