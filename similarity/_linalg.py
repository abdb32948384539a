"""Linear-algebra kernels that are safe to batch on every backend.

:func:`svd` is ``jnp.linalg.svd(x, full_matrices=False)`` with one change in
how it is *batched on the CPU*.

Why. jaxlib's CPU SVD kernel (``lapack_?gesdd_ffi``) splits a batch of
matrices (batch > 1, matrices of 64 entries or more) into tasks on XLA's
intra-op thread pool and then *blocks* the pool thread it runs on until those
tasks finish (jaxlib 0.9; from 0.10 every batched LAPACK kernel does this).
When as many batched kernels run at once as the pool has threads (two on a
2-core host: two independent SVDs in one program, or two programs in flight),
every thread waits for tasks no thread is free to run, and the process hangs
at 0 % CPU. ``vmap`` is exactly what creates batched kernels, so a vmapped
comparison grid hung.

How. Under ``vmap`` on the CPU, :func:`svd` runs the batch as a ``lax.map``
of unbatched SVDs: an unbatched kernel runs inline and never waits on the
pool, so no interleaving of programs can deadlock. The results are the same
matrices, bit for bit. On GPU/TPU the batched kernel is kept (it is fast and
has no such problem); :func:`jax.lax.platform_dependent` picks the branch
when the program is lowered. The derivative is the standard SVD derivative
(Townsend 2016, for distinct non-zero singular values), written in terms of
:func:`svd` itself so that ``vmap(grad(...))`` stays safe too.

**Degenerate singular values.** Where two singular values coincide (to
rounding, ``|s_i^2 - s_j^2| <= 64 eps s_max^2``) the singular vectors are not
unique and their derivative is undefined; the textbook formula divides by
``s_j^2 - s_i^2`` and returns Inf, NaN or, with a rounding-sized denominator,
an arbitrary large number. Here that pair's coupling is set to zero (the
vectors are held fixed within the degenerate subspace), and the
out-of-span term is dropped for singular values at rounding level (a
pseudo-inverse). Every function of the SVD that does not depend on the choice
of basis within a degenerate subspace (sums of singular values, projectors,
the polar factor ``u vt`` of a full-rank matrix, PWCCA at canonical
correlations that are all 1) then gets its exact derivative; a function that
does depend on that choice has no derivative there.

:func:`sqrt_floor` and :func:`arccos_unit` are ``sqrt`` and ``arccos`` whose
derivative at the kink of a distance (``sqrt(0)``, ``arccos(1)``: a distance
of zero, where the one-sided derivatives differ by direction) is the
subgradient 0 instead of Inf or NaN. :func:`pow2_scale` is the power of two
at a side's largest magnitude, for exact normalisation before products.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["arccos_unit", "fmix32", "lstsq", "pow2_at", "pow2_scale", "row_hash", "shared_hashes", "shared_rows", "sqrt_floor", "svd"]


def _plain(x: jax.Array, compute_uv: bool):
    out = jnp.linalg.svd(x, full_matrices=False, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


@jax.custom_batching.custom_vmap
def _svd_uv(x: jax.Array):
    return _plain(x, True)


@jax.custom_batching.custom_vmap
def _svd_s(x: jax.Array):
    return _plain(x, False)


def _batched(fn, compute_uv):
    """``custom_vmap`` rule: ``lax.map`` of unbatched kernels on the CPU."""

    def rule(axis_size, in_batched, x):
        del axis_size
        (batched,) = in_batched
        spec = (batched,) * 3 if compute_uv else batched
        if not batched:
            return fn(x), spec
        out = lax.platform_dependent(x, cpu=lambda x: lax.map(fn, x), default=lambda x: _plain(x, compute_uv))
        return out, spec

    return rule


_svd_uv.def_vmap(_batched(_svd_uv, True))
_svd_s.def_vmap(_batched(_svd_s, False))


def _h(a: jax.Array) -> jax.Array:
    return jnp.swapaxes(a, -1, -2)


@jax.custom_jvp
def _svd_uv_diff(x):
    return _svd_uv(x)


@jax.custom_jvp
def _svd_s_diff(x):
    return _svd_s(x)


def _tangents(x, dx):
    """Primal ``(u, s, vt)`` and tangents ``(du, ds, dvt)`` of the thin SVD of ``x: (m, k)``."""
    u, s, vt = _svd_uv_diff(x)  # differentiable itself, for higher orders
    v = _h(vt)
    ut_dx_v = jnp.einsum("im,in,nj->mj", u, dx, v)  # (r, r), r = min(m, k)
    ds = jnp.diagonal(ut_dx_v)
    si, sj = s[:, None], s[None, :]
    eye = jnp.eye(s.shape[0], dtype=x.dtype)
    # f_ij = 1 / (s_j^2 - s_i^2) off the diagonal, 0 on it and for degenerate pairs.
    gap = sj * sj - si * si
    s_max = jnp.max(s)
    degenerate = (jnp.abs(gap) <= 64.0 * jnp.finfo(x.dtype).eps * s_max * s_max) | (eye > 0)
    f = jnp.where(degenerate, 0.0, 1.0 / jnp.where(degenerate, 1.0, gap))
    # 1 / s_j for the out-of-span terms; 0 for singular values at rounding level
    live = s > jnp.finfo(x.dtype).eps * max(x.shape[-2:]) * s_max
    inv_s = jnp.where(live, 1.0 / jnp.where(live, s, 1.0), 0.0)[None, :]
    sym = ut_dx_v * sj + _h(ut_dx_v) * si  # P_ij s_j + P_ji s_i
    sym_v = ut_dx_v * si + _h(ut_dx_v) * sj
    du = u @ (f * sym)  # real input: u^T du is antisymmetric with zero diagonal
    dv = v @ (f * sym_v)
    m, k = x.shape[-2:]
    if m > k:  # component of dx outside the column space of u
        dxv = dx @ v
        du = du + (dxv - u @ (_h(u) @ dxv)) * inv_s
    if k > m:
        dxtu = _h(dx) @ u
        dv = dv + (dxtu - v @ (vt @ dxtu)) * inv_s
    return (u, s, vt), (du, ds, _h(dv))


@_svd_uv_diff.defjvp
def _svd_uv_jvp(primals, tangents):
    return _tangents(primals[0], tangents[0])


@_svd_s_diff.defjvp
def _svd_s_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    u, s, vt = _svd_uv_diff(x)
    return s, jnp.einsum("im,in,mn->m", u, dx, vt)


def svd(x: jax.Array, /, *, compute_uv: bool = True):
    """Thin SVD ``x = u @ diag(s) @ vt``, safe to ``vmap`` on every backend.

    Same results as ``jnp.linalg.svd(x, full_matrices=False,
    compute_uv=compute_uv)``; see the module docstring for why it exists.

    Args:
      x: ``(..., m, k)`` real floating array.
      compute_uv: return ``(u, s, vt)`` when True, else only ``s``.

    Returns:
      ``u: (..., m, r)``, ``s: (..., r)`` (descending), ``vt: (..., r, k)`` with
      ``r = min(m, k)``; or ``s`` alone.
    """
    x = jnp.asarray(x)
    fn = _svd_uv_diff if compute_uv else _svd_s_diff
    for _ in range(x.ndim - 2):
        fn = jax.vmap(fn)
    return fn(x)


def lstsq(a: jax.Array, b: jax.Array, /) -> jax.Array:
    """Minimum-norm least-squares solution of ``a @ x = b``, through :func:`svd`.

    Singular values below ``eps * max(m, k) * s_max`` are treated as zero
    (``numpy.linalg.lstsq``'s default ``rcond``), so rank-deficient systems get
    the minimum-norm solution.

    Args:
      a: ``(m, k)``.
      b: ``(m, e)``.

    Returns:
      ``x: (k, e)``.
    """
    u, s, vt = svd(a)
    tol = jnp.finfo(a.dtype).eps * max(a.shape[-2:]) * s[..., :1]
    keep = s > tol
    s_inv = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0), 0.0)
    return jnp.einsum("rk,r,mr,me->ke", vt, s_inv, u, b)



@jax.custom_jvp
def sqrt_floor(a: jax.Array, floor: jax.Array) -> jax.Array:
    """``sqrt(max(a, 0))`` whose derivative is 0 where ``a <= floor`` (the kink of a distance at 0).

    ``floor`` (>= 0, not differentiated) is the rounding level of ``a``: below
    it, ``a`` is a distance of zero up to rounding, where the one-sided
    derivatives differ by direction and 0 is the minimum-norm subgradient.

    Examples:
      >>> float(jax.grad(lambda a: sqrt_floor(a, 0.0))(0.0))
      0.0
      >>> float(jax.grad(lambda a: sqrt_floor(a, 0.0))(4.0))
      0.25
    """
    return jnp.sqrt(jnp.maximum(a, 0.0))


@sqrt_floor.defjvp
def _sqrt_floor_jvp(primals, tangents):
    a, floor = primals
    da, _ = tangents
    out = sqrt_floor(a, floor)
    live = a > jnp.maximum(floor, 0.0)
    return out, jnp.where(live, da / (2.0 * jnp.where(live, out, 1.0)), 0.0)


@jax.custom_jvp
def arccos_unit(c: jax.Array) -> jax.Array:
    """``arccos(clip(c, -1, 1))`` whose derivative is 0 within rounding of ``c = +-1``.

    At ``c = 1`` (an angle of zero between two points that coincide) the
    one-sided derivatives of the angle differ by direction and 0 is the
    minimum-norm subgradient; within ``64 eps`` of it the textbook derivative
    ``-1/sqrt(1 - c^2)`` would multiply rounding noise by up to ``1e7``.

    Examples:
      >>> abs(float(jax.grad(arccos_unit)(1.0))), round(float(jax.grad(arccos_unit)(0.0)), 6)
      (0.0, -1.0)
    """
    return jnp.arccos(jnp.clip(c, -1.0, 1.0))


@arccos_unit.defjvp
def _arccos_unit_jvp(primals, tangents):
    (c,), (dc,) = primals, tangents
    out = arccos_unit(c)
    one_minus = 1.0 - jnp.abs(c)
    live = one_minus > 64.0 * jnp.finfo(jnp.result_type(c)).eps
    rate = -1.0 / jnp.sqrt(jnp.where(live, (1.0 - c) * (1.0 + c), 1.0))
    return out, jnp.where(live, rate * dc, 0.0)


def pow2_scale(x: jax.Array) -> jax.Array:
    """The largest power of two not above ``max |x|`` (1 for an all-zero ``x``), with no gradient.

    Dividing by it is exact (no rounding) and brings the largest magnitude
    into ``[1, 2)``, so sums of squares neither overflow (data near 1e20 in
    float32) nor underflow (data near 1e-20). For a scale-invariant measure it
    changes nothing, gradients included (the factor is piecewise constant).

    Examples:
      >>> float(pow2_scale(jnp.array([3.0, -5.0])))
      4.0
    """
    return pow2_at(jnp.max(jnp.abs(x)))


def pow2_at(max_abs: jax.Array) -> jax.Array:
    """:func:`pow2_scale` from a precomputed ``max |x|`` (e.g. the value checks' pass), no gradient."""
    m = jax.lax.stop_gradient(max_abs)
    _, e = jnp.frexp(jnp.where(m > 0, m, jnp.ones((), m.dtype)))
    return jnp.ldexp(jnp.ones((), m.dtype), e - 1)


_MIX = (0x85EBCA6B, 0xC2B2AE35)  # murmur3's finaliser constants


def fmix32(h: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_MIX[0])
    h = h ^ (h >> 13)
    h = h * jnp.uint32(_MIX[1])
    return h ^ (h >> 16)


def row_hash(x: jax.Array, seed: int, width: jax.Array | int | None = None) -> jax.Array:
    """A ``uint32`` hash ``(n,)`` of each row's exact bit pattern (``-0.0`` and ``0.0`` equal).

    Independent of the reduction order, so the same in every program; two
    different seeds give independent hashes. Equal rows always hash equal;
    different rows collide with probability about ``2^-32`` per pair and seed.
    With ``width`` (a traced ``()`` integer allowed) only the first ``width``
    features count: a zero-padded row hashes as the unpadded one.
    """
    n = x.shape[0]
    z = jnp.where(x == 0, jnp.zeros((), x.dtype), x)
    bits = jax.lax.bitcast_convert_type(z, jnp.uint32).reshape(n, -1)  # (n, d) or (n, 2d) for float64
    col = fmix32(jnp.arange(bits.shape[1], dtype=jnp.uint32) * jnp.uint32(0x9E3779B9) + jnp.uint32(seed))
    mixed = fmix32(bits ^ col[None, :])
    if width is not None:  # the words of feature j are columns j * k ... j * k + k - 1 of bits
        per = bits.shape[1] // x.shape[1]
        mixed = jnp.where((jnp.arange(bits.shape[1]) // per < width)[None, :], mixed, jnp.zeros((), jnp.uint32))
    return fmix32(jnp.sum(mixed, axis=1, dtype=jnp.uint32))


def shared_rows(x: jax.Array, in_a: jax.Array, in_b: jax.Array) -> jax.Array:
    """How many rows in ``b`` equal (bit for bit) some row in ``a``, in ``O(n log n)``.

    ``in_a``, ``in_b``: ``(n,)`` bool masks of the two row sets. Rows are
    matched by two independent 32-bit hashes (:func:`row_hash`); a hash
    collision can only add a spurious match with probability about ``n 2^-64``,
    and a row whose first hash collides with another ``a`` row's may be missed
    (about ``n 2^-32``): the count is for a warning, not for a computation.
    """
    return shared_hashes(row_hash(x, 0x3C6EF372), row_hash(x, 0xA54FF53A), in_a, in_b)


def shared_hashes(h1: jax.Array, h2: jax.Array, in_a: jax.Array, in_b: jax.Array) -> jax.Array:
    """:func:`shared_rows` from two independent ``uint32`` row hashes ``h1``, ``h2`` ``(n,)``."""
    big = jnp.asarray(jnp.iinfo(jnp.uint32).max, jnp.uint32)  # a uint32, not a Python int (int32 with x64 off)
    key = jnp.where(in_a, h1, big)
    order = jnp.argsort(key)
    sk, s2, sa = key[order], h2[order], in_a[order]
    pos = jnp.clip(jnp.searchsorted(sk, h1), 0, h1.shape[0] - 1)
    hit = in_b & sa[pos] & (sk[pos] == h1) & (s2[pos] == h2)
    return jnp.sum(hit)
