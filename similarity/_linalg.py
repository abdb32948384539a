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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["lstsq", "svd"]


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
    # f_ij = 1 / (s_j^2 - s_i^2) off the diagonal, 0 on it.
    f = (1.0 - eye) / (sj * sj - si * si + eye)
    sym = ut_dx_v * sj + _h(ut_dx_v) * si  # P_ij s_j + P_ji s_i
    sym_v = ut_dx_v * si + _h(ut_dx_v) * sj
    du = u @ (f * sym)  # real input: u^T du is antisymmetric with zero diagonal
    dv = v @ (f * sym_v)
    m, k = x.shape[-2:]
    if m > k:  # component of dx outside the column space of u
        dxv = dx @ v
        du = du + (dxv - u @ (_h(u) @ dxv)) / sj
    if k > m:
        dxtu = _h(dx) @ u
        dv = dv + (dxtu - v @ (vt @ dxtu)) / sj
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
