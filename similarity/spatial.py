"""Reconstruction scores of convolutional maps over spatial positions (the paper code's conv protocol).

The usable-information paper's code (Almudevar et al., ``src/similarity_metrics.py``,
``_conv1x1_similarity``) compares two conv layers ``X (n, Hx, Wx, Cx)`` and ``Y (n, Hy, Wy, Cy)``
without flattening or pooling them away: it pools the source to the target's spatial size by
adaptive average pooling, maps it by a ``1 x 1`` convolution (one channel map shared by every
position: the ``n Hy Wy`` positions are the samples) and reports
``1 - mean((Y - g(X))^2) / mean(Y^2)``, uncentred, clipped to ``[0, 1]``, on the rows it fitted
``g`` on. It trains ``g`` with Adam and a soft orthogonality penalty; this module fits each
family in closed form (:func:`similarity.stitching.fit_from_moments`), so the score is the
optimum the training approaches.

* **Pooling.** The source is resized to ``(Hy, Wy)`` with PyTorch's ``AdaptiveAvgPool2d`` bins
  (:func:`similarity.task_stitching.resize_spatial`), as the paper code calls it: output row ``i``
  averages source rows ``floor(i Hx / Hy)`` to ``ceil((i + 1) Hx / Hy) - 1`` (columns alike, each
  axis on its own). An integer ratio gives block means; other ratios give bins of unequal, possibly
  overlapping extent; a smaller source (``Hx < Hy``) gives bins of one or two cells (each source cell
  repeated, or two neighbours averaged). Equal sizes leave the source as it is. Every size ``>= 1``
  is defined; an axis of size 0 is refused.
* **Families** (nested: ``orthogonal`` ⊂ ``scaled_orthogonal`` ⊂ ``affine``), acting on the
  channels of every position alike: ``orthogonal`` ``Y ≈ P Q``, ``scaled_orthogonal`` ``Y ≈ s P Q``
  (no bias: the paper code's orthogonal 1x1 convolutions have none), ``affine`` ``Y ≈ P W + b``
  (with a bias, as its ``nn.Conv2d``). ``Q`` is the orthogonal Procrustes solution on the channels
  zero-padded to ``max(Cx, Cy)`` and the error is counted in that padded space (the convention of
  :mod:`similarity.stitching`); the paper code's trained semi-orthogonal map differs from it
  when ``Cx > Cy``. Uncentred in-sample scores in closed form, with
  ``sigma`` the singular values of ``P^T Y`` and ``a = ||P||``, ``b = ||Y||`` (Frobenius):
  ``scaled_orthogonal = (sum sigma)^2 / (a b)^2``, ``orthogonal = (2 sum sigma - a^2) / b^2``,
  ``affine = 1 - SSE / b^2`` with ``SSE`` the least-squares residual of the centred fit.
* **Score.** In sample (fitted and scored on the same rows, as the paper code), uncentred, with
  the denominator ``sum(Y^2)`` (``mean(Y^2)`` times the number of entries): a score, at most 1;
  ``clip=True`` (default) clips it to ``[0, 1]`` as the paper code does (only ``orthogonal`` can
  fall below 0). A target that is zero everywhere makes it 0/0: refused (the paper code returns
  1.0 there). Data are divided by exact powers of two before any product (no overflow).

:func:`spatial_reconstruction_score` scores one pair (pure; ``jit``/``vmap``-able);
:func:`spatial_score_table` scores every source against every target in a few compiled
programs (one per target spatial size and padded widths), for a study's layer pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._ladder import bucket
from funsim.similarity._linalg import pow2_scale
from funsim.similarity._precision import full_precision, sum_of_products
from funsim.similarity._stitch_fit import FAMILIES, fit_from_moments
from funsim.similarity.task_stitching import resize_spatial

__all__ = ["spatial_reconstruction_score", "spatial_score_table"]


# ----------------------------------------------------------------------------- moments and scores


def _target_moments(y: jax.Array):
    """``y (N, Cy)`` rows -> ``(scale, mean, centred sum of squares, sum of squares)`` of ``y / scale``
    (reductions only: ``y / scale`` is not kept)."""
    c = pow2_scale(y)
    my = jnp.mean(y / c, axis=0)
    yyc = jnp.sum((y / c - my[None, :]) ** 2)
    return c, my, yyc, yyc + y.shape[0] * jnp.sum(my * my)


def _source_moments(p: jax.Array):
    """Pooled source rows ``p (N, Cx)`` -> ``(scale, mean, centred rows, centred Gram (Cx, Cx))``."""
    c = pow2_scale(p)
    p = p / c
    mp = jnp.mean(p, axis=0)
    pc = p - mp[None, :]
    return c, mp, pc, jnp.einsum("ni,nj->ij", pc, pc)


def _safe(v: jax.Array) -> jax.Array:
    return jnp.where(v > 0, v, jnp.ones((), v.dtype))


def _scores(src, tgt, cc, n_rows: int, *, families: tuple[str, ...], mask=None) -> jax.Array:
    """``(F,)`` uncentred in-sample scores of each family (unclipped) from one pair's moments.

    ``src = (scale, mean, gram_c)`` of the pooled source, ``tgt = (scale, mean, yy_c, yy)`` of the
    target (both divided by their scales), ``cc = Pc^T Y (Cx, Cy)`` the centred cross moment;
    ``mask (Cx,)`` marks the source's real channels when it is zero-padded.
    """
    cp, mp, gc = src
    cy, my, yyc, yy = tgt
    out = []
    for fam in families:
        if fam == "affine":  # centred least squares with a bias; the residual in units of yy_c
            ac2 = _safe(jnp.trace(gc))
            gu, cu = gc / ac2, cc / jnp.sqrt(ac2 * _safe(yyc))
            w, _ = fit_from_moments(gu, cu, family="affine", mask_src=mask)
            sse = 1.0 - 2.0 * jnp.sum(w * cu) + sum_of_products(w, gu @ w)
            out.append(1.0 - sse * yyc / yy)
            continue
        a2 = jnp.trace(gc) + n_rows * jnp.sum(mp * mp)  # ||P||^2, uncentred
        cu = (cc + n_rows * mp[:, None] * my[None, :]) / jnp.sqrt(_safe(a2) * yy)
        w, _ = fit_from_moments(jnp.ones((), cu.dtype), cu, family=fam)
        lin = jnp.sum(w * cu)  # sum of the singular values of P^T Y / (a b)
        if fam == "scaled_orthogonal":
            out.append(lin * lin)
        else:  # s = a / b in raw units: 1 - ||V - s U Q||^2 = s (2 lin - s)
            s = jnp.sqrt(a2 / yy) * (cp / cy)
            out.append(s * (2.0 * lin - s))
    return jnp.stack(out)


def _finish(scores: jax.Array, clip: bool) -> jax.Array:
    return jnp.clip(scores, 0.0, 1.0) if clip else scores


def _rows(z: jax.Array) -> jax.Array:
    return z.reshape(-1, z.shape[-1])


# ----------------------------------------------------------------------------- checks


def _check_map(z: ArrayLike, name: str, *, host: bool = False):
    """``z`` as a float array in its compute dtype (a NumPy array with ``host``), or the error naming ``name``."""
    if host and hasattr(z, "dtype") and not isinstance(z, jax.core.Tracer):
        dt = V.compute_dtype(z.dtype, name)
        if dt == np.dtype(np.float64) and not jax.config.jax_enable_x64:
            V.warn_float64_without_x64(name)
            dt = np.dtype(np.float32)
        z = np.asarray(z, dt)
    else:
        z = V.as_float_array(z, name)
    if z.ndim != 4:
        raise ValueError(f"{name} must be a conv map (n, H, W, C), got shape {tuple(z.shape)} (rank {z.ndim}). "
                         "Dense layers have no spatial positions: use reconstruction_score.")
    if min(z.shape) < 1:
        raise ValueError(f"{name} has shape {tuple(z.shape)}: every axis of (n, H, W, C) needs size >= 1 "
                         "(adaptive average pooling is undefined for an empty spatial axis).")
    return z


def _check_n(xs: Sequence, ys: Sequence, names_x: Sequence[str], names_y: Sequence[str]) -> None:
    first, fname = xs[0], names_x[0]
    for z, name in zip([*xs, *ys], [*names_x, *names_y]):
        if z.shape[0] != first.shape[0]:
            raise ValueError(f"{fname} and {name} must have the same number of samples (axis 0), got "
                             f"{fname}.shape={tuple(first.shape)} and {name}.shape={tuple(z.shape)}. Rows must be "
                             "the same inputs, in the same order, for both maps.")


def _zero_message(name: str, shape: tuple) -> str:
    return (f"{name} of shape {shape} is zero everywhere: the score's denominator mean({name}^2) is 0, so the "
            "reconstruction score is undefined (0/0). Check that the layer is not dead.")


def _raise_flags(finite: bool, nonzero: bool, z: jax.Array, name: str) -> None:
    if not finite:
        V.check_finite(np.asarray(z), name)
        raise AssertionError(f"{name}: non-finite flag without NaN/Inf")  # pragma: no cover
    if not nonzero:
        raise ValueError(_zero_message(name, tuple(z.shape)))


# ----------------------------------------------------------------------------- one pair


@functools.partial(jax.jit, static_argnames=("family", "clip"))
def _pair_program(x, y, *, family, clip):
    p = _rows(resize_spatial(x, size=y.shape[1:3]))
    cp, mp, pc, gc = _source_moments(p)
    cy, my, yyc, yy = _target_moments(_rows(y))
    cc = jnp.einsum("ni,nj->ij", pc, _rows(y)) / cy
    value = _finish(_scores((cp, mp, gc), (cy, my, yyc, yy), cc, p.shape[0], families=(family,))[0], clip)
    flags = dict(x=jnp.all(jnp.isfinite(x)), y=jnp.all(jnp.isfinite(y)), y_nonzero=jnp.any(y != 0))
    ok = flags["x"] & flags["y"] & flags["y_nonzero"] & ~jnp.isnan(value)
    return V.nan_unless(ok, value), flags


@full_precision
def spatial_reconstruction_score(
    x_map: ArrayLike, y_map: ArrayLike, /, *, family: str = "affine", clip: bool = True
) -> jax.Array:
    """The paper code's conv-to-conv score: a closed-form ``1 x 1`` map over spatial positions (a score).

    The source map is pooled to the target's spatial size (adaptive average pooling, PyTorch's
    bins; see the module docstring for the rule), its ``n Hy Wy`` positions become rows, the
    family's ``1 x 1`` map is fitted in closed form to the target's rows, and the score is
    ``1 - sum((Y - g(P))^2) / sum(Y^2)`` on those same rows: in sample and uncentred, the
    denominator ``mean(Y^2)``, as the paper code's ``_conv1x1_similarity``.

    Args:
      x_map: ``(n, Hx, Wx, Cx)`` source conv map (NHWC).
      y_map: ``(n, Hy, Wy, Cy)`` target conv map, the same ``n`` inputs in the same order.
      family: ``"orthogonal"`` (``Y ≈ P Q``), ``"scaled_orthogonal"`` (``Y ≈ s P Q``) or
        ``"affine"`` (``Y ≈ P W + b``).
      clip: clip to ``[0, 1]`` as the paper code does (default); ``False`` gives the raw value
        (at most 1; only ``orthogonal`` can be negative).

    Returns:
      ``()`` the score. With ``Hy = Wy = 1`` it is the uncentred score of the pooled
      (spatial-mean) features; nested in the family: ``orthogonal <= scaled_orthogonal <= affine``.

    Raises:
      ValueError: an unknown family; a map that is not 4-D, has an axis of size 0, or holds
        NaN/Inf; mismatched ``n``; a target that is zero everywhere (the score is 0/0). Under
        ``jit``/``vmap``/``grad`` the value checks give NaN instead.
      TypeError: complex input, or a non-bool ``clip``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.key(0), (8, 4, 4, 3))
      >>> q, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(1), (3, 3)))
      >>> y = resize_spatial(x, size=(2, 2)) @ q   # a rotation of the pooled source
      >>> round(float(spatial_reconstruction_score(x, y, family="orthogonal")), 5)
      1.0
    """
    V.check_choice(family, "family", FAMILIES)
    clip = V.check_bool(clip, "clip")
    x, y = _check_map(x_map, "x_map"), _check_map(y_map, "y_map")
    _check_n([x], [y], ["x_map"], ["y_map"])
    dt = jnp.promote_types(x.dtype, y.dtype)
    x, y = x.astype(dt), y.astype(dt)
    value, flags = _pair_program(x, y, family=family, clip=clip)
    flags = V.fetch_flags(flags, x, y)
    if flags is not None:
        _raise_flags(bool(flags["x"]), True, x, "x_map")
        _raise_flags(bool(flags["y"]), bool(flags["y_nonzero"]), y, "y_map")
        if np.isnan(np.asarray(value)):
            raise ValueError("The spatial reconstruction score is not finite (a failed SVD or solve); "
                             "try float64.")
    return value


# ----------------------------------------------------------------------------- every pair


def _stack(zs: list[np.ndarray], count: int, width: int, dt) -> np.ndarray:
    """``(count, n, H, W, width)``: the maps zero-padded in channels; dummies repeat the last map."""
    out = np.zeros((count, *zs[0].shape[:3], width), dt)
    for k in range(count):
        z = zs[min(k, len(zs) - 1)]
        out[k, ..., : z.shape[-1]] = z
    return out


@functools.partial(jax.jit, static_argnames=("families",))
def _table_program(src_groups, ys, *, families):
    """Scores of every source (grouped by spatial size) against every target of one spatial size.

    ``src_groups``: a tuple of ``(xs (J, n, Hx, Wx, Cx), mask (J, Cx))``, one per source size;
    ``ys (K, n, Hy, Wy, Cy)``. Returns ``([(J, F, K) per group], flags)``; the sources run one after
    another (``lax.map``: one pooled source in memory at a time), the targets vmapped.
    """
    size = ys.shape[2:4]
    cy, my, yyc, yy = jax.vmap(lambda y: _target_moments(_rows(y)))(ys)
    out, finite_src = [], []
    for xs, mask in src_groups:
        def one(args):
            x, m = args
            p = _rows(resize_spatial(x, size=size))
            cp, mp, pc, gc = _source_moments(p)
            cc = jnp.einsum("nhwi,knhwj->kij", pc.reshape(*ys.shape[1:4], -1), ys) / cy[:, None, None]
            score = lambda t, c: _scores((cp, mp, gc), t, c, p.shape[0], families=families, mask=m)  # noqa: E731
            return jax.vmap(score, out_axes=1)((cy, my, yyc, yy), cc)

        out.append(jax.lax.map(one, (xs, mask)))
        finite_src.append(jax.vmap(lambda x: jnp.all(jnp.isfinite(x)))(xs))
    flags = dict(src=finite_src, y=jax.vmap(lambda y: jnp.all(jnp.isfinite(y)))(ys),
                 y_nonzero=jax.vmap(lambda y: jnp.any(y != 0))(ys))
    return out, flags


@full_precision
def spatial_score_table(
    sources: Sequence[ArrayLike],
    targets: Sequence[ArrayLike],
    /,
    *,
    families: Sequence[str] = FAMILIES,
    clip: bool = True,
) -> dict[str, np.ndarray]:
    """:func:`spatial_reconstruction_score` of every source map against every target map, batched.

    The targets are grouped by spatial size ``(Hy, Wy)`` and the sources by theirs; each target
    size is one compiled program over every source, with the channels zero-padded (the padded
    source channels masked out of the affine fit) and the counts and widths rounded up the
    ladder of :func:`similarity._ladder.bucket`, so a study of many layers compiles a handful of
    programs, not one per pair. Within a program the sources run one at a time (one pooled map
    in memory) and the targets are vmapped. Concrete arrays only (a driver for studies).

    Args:
      sources: ``S`` conv maps ``(n, Hx_i, Wx_i, Cx_i)``.
      targets: ``T`` conv maps ``(n, Hy_j, Wy_j, Cy_j)``, the same ``n`` inputs.
      families: the families to score (each of ``FAMILIES``).
      clip: as in :func:`spatial_reconstruction_score`.

    Returns:
      ``{family: (S, T) NumPy array}`` in the maps' compute dtype: entry ``[i, j]`` scores ``sources[i] -> targets[j]``,
      equal to ``spatial_reconstruction_score(sources[i], targets[j], family=family)``.

    Raises:
      ValueError: as :func:`spatial_reconstruction_score`, naming ``sources[i]`` or ``targets[j]``;
        an empty list; an unknown family.

    Examples:
      >>> import numpy as np
      >>> rng = np.random.default_rng(0)
      >>> maps = [rng.normal(size=(6, 4, 4, 3)), rng.normal(size=(6, 2, 2, 5))]
      >>> t = spatial_score_table(maps, maps, families=("scaled_orthogonal",))["scaled_orthogonal"]
      >>> t.shape, round(float(t[1, 1]), 6)
      ((2, 2), 1.0)
    """
    families = tuple(V.check_choice(f, "families", FAMILIES) for f in families)
    clip = V.check_bool(clip, "clip")
    if not sources or not targets or not families:
        raise ValueError("spatial_score_table needs at least one source, one target and one family.")
    names_x = [f"sources[{i}]" for i in range(len(sources))]
    names_y = [f"targets[{j}]" for j in range(len(targets))]
    xs = [_check_map(z, nm, host=True) for z, nm in zip(sources, names_x)]
    ys = [_check_map(z, nm, host=True) for z, nm in zip(targets, names_y)]
    _check_n(xs, ys, names_x, names_y)
    dt = np.dtype(functools.reduce(jnp.promote_types, [z.dtype for z in xs + ys]))
    by_size = lambda zs: {s: [i for i, z in enumerate(zs) if z.shape[1:3] == s]  # noqa: E731
                          for s in dict.fromkeys(z.shape[1:3] for z in zs)}
    src_sizes, out = by_size(xs), {f: np.full((len(xs), len(ys)), np.nan, dt) for f in families}
    groups = []
    for idx in src_sizes.values():
        width = bucket(max(xs[i].shape[-1] for i in idx))
        count = bucket(len(idx))
        mask = np.stack([np.arange(width) < xs[idx[min(k, len(idx) - 1)]].shape[-1] for k in range(count)])
        groups.append((_stack([xs[i] for i in idx], count, width, dt), mask.astype(dt)))
    groups = tuple(jax.device_put(groups))  # once, not once per target size
    for tidx in by_size(ys).values():
        stack = _stack([ys[j] for j in tidx], bucket(len(tidx)), bucket(max(ys[j].shape[-1] for j in tidx)), dt)
        scores, flags = jax.device_get(_table_program(groups, stack, families=families))
        for k, j in enumerate(tidx):
            _raise_flags(bool(flags["y"][k]), bool(flags["y_nonzero"][k]), ys[j], names_y[j])
        for g, idx in enumerate(src_sizes.values()):
            for k, i in enumerate(idx):
                _raise_flags(bool(flags["src"][g][k]), True, xs[i], names_x[i])
                for f, fam in enumerate(families):
                    out[fam][i, tidx] = scores[g][k, f, : len(tidx)]
    for fam, t in out.items():
        if np.isnan(t).any():
            raise ValueError(f"A {fam} spatial reconstruction score is not finite (a failed SVD or solve); "
                             "try float64.")
        if clip:
            out[fam] = np.clip(t, 0.0, 1.0)
    return out
