"""Stitched evaluation: the logits of many stitchers, each into many frozen tails, in one compiled program.

After :func:`~similarity.train_stitchers` with ``stacked_tails=True`` each trained
stitcher holds one weight per tail (``weight (M, d_src, d_tgt)``). Evaluating K
such stitchers on held-out sources means K x M passes through a tail; one eager
pass each pays Python dispatch per layer, per stitcher and per tail.
:func:`stitched_logits` runs them as one ``lax.map`` over the stitchers (the M
tails unrolled inside it) per chunk of rows, with one compiled program per
chunk shape, tail and padded width: a second call with other stitchers, other
tail parameters or other sources of the same shapes compiles nothing.

The tail is the pair ``(tail_apply, tail_params)`` of
:mod:`similarity.task_stitching`: ``tail_apply(params_m, h) -> logits``,
hashable (a static argument), with ``tail_params`` stacked along a leading axis
of length M (``models.stack_tails``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._precision import full_precision
from funsim.similarity.stitching import Stitcher
from funsim.similarity.task_stitching import resize_spatial, stitch_representation

__all__ = ["stitched_logits"]


@full_precision
def stitched_logits(
    tail_apply: Callable[[Any, jax.Array], jax.Array],
    tail_params: Any,
    stitchers: Sequence[Stitcher],
    sources: Sequence[ArrayLike],
    target_shape: Sequence[int],
    /,
    *,
    chunk: int = 512,
) -> np.ndarray:
    """Logits ``(K, M, n, C)`` of each of K stitchers into each of M stacked tails.

    Stitcher ``k`` reads source ``k``; its weight ``m`` feeds tail ``m``. A source
    is brought to the target's form first: flattened to ``(n, d)`` for a dense
    target, resized to the target's grid (:func:`~similarity.resize_spatial`) for an
    NHWC target. The stitchers' sources may differ in width (they are zero-padded
    to the widest, with their weights), and in family: applying a stitcher is
    ``scale * (z @ weight) + bias`` for every family. Rows run in chunks of
    ``chunk``, each chunk one compiled call (the last is padded by repeating its
    final row, and cut back).

    Args:
      tail_apply: ``tail_apply(params_m, h (b, *target_shape)) -> logits (b, C)``,
        hashable (a module-level function or ``models.stack_tails``' tail).
      tail_params: a pytree whose leaves are stacked along a leading axis of length M.
      stitchers: K :class:`~similarity.Stitcher` with ``weight (M, d_k, T)``,
        ``bias (M, T)``, ``scale (M,)``, where ``T = target_shape[-1]``.
      sources: K arrays, source ``k`` of shape ``(n, d_k)``, ``(n, ...)`` flattening to
        ``d_k`` (dense target), or ``(n, H, W, d_k)`` (NHWC target); one ``n`` for all.
      target_shape: the target layer's activation shape without the batch axis:
        ``(T,)`` or ``(H', W', T)``.
      chunk: rows per compiled call, >= 1.

    Returns:
      ``(K, M, n, C)`` NumPy logits.

    Raises:
      ValueError: no stitchers, as many sources as stitchers not given, rows that
        differ between sources, weights that do not match their source's width,
        ``T`` or M, or a ``chunk`` below 1.

    Examples:
      >>> import numpy as np
      >>> from funsim.similarity import Stitcher
      >>> def tail(p, h):  # one dense layer, the same for both tails but for its parameters
      ...     return h @ p
      >>> params = np.stack([np.eye(2, dtype=np.float32), 2 * np.eye(2, dtype=np.float32)])  # M = 2
      >>> st = Stitcher(np.stack([np.eye(2, dtype=np.float32)] * 2), np.zeros((2, 2), np.float32),
      ...               np.ones(2, np.float32), "affine")
      >>> stitched_logits(tail, params, [st], [np.ones((1, 2), np.float32)], (2,))[0, :, 0].tolist()
      [[1.0, 1.0], [2.0, 2.0]]
    """
    tshape = tuple(int(s) for s in target_shape)
    _check(stitchers, sources, tshape, chunk)
    spatial = tshape[:2] if len(tshape) == 3 else None
    zs = [_target_form(z, spatial, k) for k, z in enumerate(sources)]
    for k, (st, z) in enumerate(zip(stitchers, zs)):
        if st.weight.shape[1] != z.shape[-1]:
            raise ValueError(f"stitchers[{k}] has weight {tuple(st.weight.shape)} (M, d_src, T) but sources[{k}] "
                             f"has {z.shape[-1]} features in the target's form {tuple(z.shape)}; give each stitcher "
                             "the source it was trained on.")
    width = max(z.shape[-1] for z in zs)
    z = np.stack([_pad(a, -1, width) for a in zs])  # (K, n, ..., W)
    weight = np.stack([_pad(st.weight, -2, width) for st in stitchers])  # (K, M, W, T)
    bias = np.stack([np.asarray(st.bias) for st in stitchers])  # (K, M, T)
    scale = np.stack([np.asarray(st.scale) for st in stitchers])  # (K, M)
    n = z.shape[1]
    rows = min(chunk, n)
    parts = []
    for i in range(0, n, rows):
        zc = z[:, i:i + rows]
        if zc.shape[1] < rows:  # every chunk one shape: repeat the last row
            zc = np.concatenate([zc, np.repeat(zc[:, -1:], rows - zc.shape[1], axis=1)], axis=1)
        parts.append(np.asarray(_stitched_chunk(tail_apply, tail_params, weight, bias, scale, zc)))
    return np.concatenate(parts, axis=2)[:, :, :n]


def _check(stitchers, sources, tshape: tuple[int, ...], chunk) -> None:
    """The argument checks of :func:`stitched_logits` that need no data moved."""
    if len(stitchers) == 0:
        raise ValueError("stitchers is empty: give at least one Stitcher.")
    if len(sources) != len(stitchers):
        raise ValueError(f"sources has {len(sources)} arrays for {len(stitchers)} stitchers; give one source "
                         "per stitcher (repeat a source that several stitchers read).")
    if len(tshape) not in (1, 3):
        raise ValueError(f"target_shape must be (T,) or (H, W, T), got {tshape}.")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}.")
    ns = {int(np.shape(z)[0]) if np.ndim(z) else -1 for z in sources}
    if len(ns) != 1 or min(ns) < 1:
        raise ValueError(f"every source must have the same number of rows n >= 1, got leading sizes "
                         f"{[np.shape(z)[:1] for z in sources]}.")
    m_counts = set()
    for k, st in enumerate(stitchers):
        w, b, s = np.shape(st.weight), np.shape(st.bias), np.shape(st.scale)
        if len(w) != 3 or w[2] != tshape[-1] or b != (w[0], w[2]) or s != (w[0],):
            raise ValueError(f"stitchers[{k}] must have weight (M, d_src, {tshape[-1]}), bias (M, {tshape[-1]}) and "
                             f"scale (M,) (one per tail; target_shape {tshape}), got weight {w}, bias {b}, scale {s}.")
        m_counts.add(w[0])
    if len(m_counts) != 1:
        raise ValueError(f"every stitcher must hold one weight per tail (the same M), got M = {sorted(m_counts)}.")


def _target_form(z, spatial, k: int) -> np.ndarray:
    """Source ``k`` as the target takes it: resized NHWC for a conv target, flattened for a dense one."""
    if spatial is None:
        z = np.asarray(z)
        return z.reshape(len(z), -1)
    if np.ndim(z) != 4:
        raise ValueError(f"sources[{k}] must be NHWC (n, H, W, C) for the target's grid {spatial}, "
                         f"got shape {np.shape(z)}.")
    return np.asarray(resize_spatial(z, size=spatial))


def _pad(a, axis: int, width: int) -> np.ndarray:
    """``a`` zero-padded to ``width`` along ``axis``."""
    a = np.asarray(a)
    return np.pad(a, [(0, width - a.shape[axis]) if d == axis % a.ndim else (0, 0) for d in range(a.ndim)])


@functools.partial(jax.jit, static_argnums=(0,))
def _stitched_chunk(tail_apply, tail_params, weight, bias, scale, z):
    """``(K, M, rows, C)``: stitcher ``(k, m)`` on source ``k``, into tail ``m``."""
    def per_source(args):
        w, b, s, zk = args
        # the M tails unrolled, not vmapped: a vmapped conv tail becomes a grouped convolution,
        # which XLA's CPU backend runs several times slower than M plain ones
        out = []
        for m in range(w.shape[0]):
            p = jax.tree.map(lambda a, m=m: a[m], tail_params)
            out.append(tail_apply(p, stitch_representation(Stitcher(w[m], b[m], s[m], "affine"), zk)))
        return jnp.stack(out)

    return jax.lax.map(per_source, (weight, bias, scale, z))
