"""Linear-algebra kernels that are safe to batch on every backend.

:func:`svd`, :func:`solve`, :func:`cholesky`, :func:`cho_solve`,
:func:`triangular_solve` and :func:`qr` are their ``jnp.linalg`` /
``jax.scipy.linalg`` namesakes with one change in how they are *batched on the
CPU*; :func:`lstsq` is built on :func:`svd`. Every LAPACK call funsim makes goes
through this module.

Why. jaxlib's CPU LAPACK kernels (``lapack_?gesdd_ffi`` in jaxlib 0.9; from 0.10
every one of them: ``getrf``, ``trsm``, ``potrf``, ``geqrf``, ``orgqr``, ...) split
a batch of matrices (batch > 1, enough work per batch) into tasks on XLA's
intra-op thread pool and then *block* the pool thread they run on until those
tasks finish. When as many batched kernels run at once as the pool has threads
(two on a 2-core host: independent kernels in one program, or programs in
flight from several threads), every thread waits for tasks no thread is free
to run, and the process hangs at 0 % CPU. No XLA flag or jaxlib setting turns
the blocking off (the pool's size is not configurable and
``--xla_cpu_multi_thread_eigen=false`` does not shrink it). ``vmap`` is exactly
what creates batched kernels, so a vmapped comparison grid hung.

How. Under ``vmap`` on the CPU, each kernel here runs the batch as a
``lax.map`` of unbatched kernels (:func:`_cpu_unbatched`): an unbatched kernel
runs inline and never waits on the pool, so no interleaving of programs can
deadlock. The results are the same matrices, bit for bit. On GPU/TPU the batched
kernel is kept (it is fast and has no such problem);
:func:`jax.lax.platform_dependent` picks the branch when the program is
lowered. The derivatives are the standard ones, written in terms of the safe
kernels themselves so that ``vmap(grad(...))`` and higher derivatives stay safe:
triangular solves (and the LU solve) are :func:`jax.lax.custom_linear_solve`
calls whose solves are the safe kernels (differentiable in the matrix through
the product, transposable through the transposed solve); Cholesky and QR have
``custom_jvp`` rules built on those solves; the SVD's is Townsend's (2016), for
distinct non-zero singular values.

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

import functools

import jax
import jax.numpy as jnp
from jax import lax

from funsim.similarity._precision import sum_of_products

__all__ = ["arccos_unit", "cho_solve", "cholesky", "eigh", "fmix32", "lstsq", "pow2_at", "pow2_scale", "qr", "row_hash",
           "shared_hashes", "shared_rows", "solve", "sqrt_floor", "svd", "triangular_solve"]


def _cpu_unbatched(plain):
    """``plain`` (arrays -> array or tuple of arrays) as a ``custom_vmap`` function that is safe to batch.

    Unbatched it is ``plain``. Under ``vmap`` it is a ``lax.map`` of unbatched
    calls on the CPU (an unbatched LAPACK kernel never waits on the thread pool)
    and ``vmap(plain)`` (one batched kernel) elsewhere, chosen at lowering. The
    arguments that are not batched are shared by every call. Not differentiable
    by itself: the public functions below give each kernel its derivative.
    """
    fn = jax.custom_batching.custom_vmap(plain)

    @fn.def_vmap
    def _rule(axis_size, in_batched, *args):
        del axis_size
        if not any(in_batched):
            out = fn(*args)
            return out, jax.tree.map(lambda _: False, out)

        def one(sliced):
            it = iter(sliced)
            return fn(*[next(it) if b else x for x, b in zip(args, in_batched)])

        cpu = lambda *xs: lax.map(one, [x for x, b in zip(xs, in_batched) if b])
        default = jax.vmap(plain, in_axes=[0 if b else None for b in in_batched])
        out = lax.platform_dependent(*args, cpu=cpu, default=default)
        return out, jax.tree.map(lambda _: True, out)

    return fn


def _plain(x: jax.Array, compute_uv: bool):
    out = jnp.linalg.svd(x, full_matrices=False, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


_svd_uv = _cpu_unbatched(lambda x: _plain(x, True))
_svd_s = _cpu_unbatched(lambda x: _plain(x, False))


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
    return s, sum_of_products(u, dx @ jnp.swapaxes(vt, -1, -2), axis=-2)


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



# ----------------------------------------------------------------------------- solves and factorisations


@functools.cache
def _trsm(left_side: bool, lower: bool, transpose_a: bool, unit_diagonal: bool):
    """The batch-safe LAPACK triangular solve (``?trsm``) for one set of flags: ``(a, b) -> x``."""
    return _cpu_unbatched(lambda a, b: lax.linalg.triangular_solve(
        a, b, left_side=left_side, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal))


_lu = _cpu_unbatched(lambda a: tuple(lax.linalg.lu(a)))  # (lu, pivots, permutation), LAPACK ?getrf
_potrf = _cpu_unbatched(lambda a: lax.linalg.cholesky(a, symmetrize_input=False))  # lower factor, NaN if not PD
_geqrf = _cpu_unbatched(lambda a: tuple(lax.linalg.qr(a, full_matrices=False)))  # thin (q, r), ?geqrf + ?orgqr



def _check_matrix(name: str, arg: str, x: jax.Array, *, square: bool = False) -> None:
    if x.ndim < 2 or (square and x.shape[-1] != x.shape[-2]):
        want = "(..., m, m), square" if square else "(..., m, k)"
        raise ValueError(f"{name}: {arg} must be {want}, got shape {tuple(x.shape)}; pass one matrix per "
                         "trailing pair of axes (vmap or leading axes for a batch).")


def _check_rhs(name: str, a: jax.Array, b: jax.Array, rows: int) -> None:
    if b.ndim < 2 or b.shape[-2] != rows:
        raise ValueError(f"{name}: b must be (..., {rows}, k) for a of shape {tuple(a.shape)}, got shape "
                         f"{tuple(b.shape)}; a single right-hand side b of shape ({rows},) is b[:, None].")


def _triangular_2d(a, b, left_side: bool, lower: bool, transpose_a: bool, unit_diagonal: bool):
    tri = jnp.tril(a) if lower else jnp.triu(a)
    if unit_diagonal:
        tri = tri - jnp.diag(jnp.diagonal(tri)) + jnp.eye(a.shape[-1], dtype=a.dtype)
    op = tri.T if transpose_a else tri
    matvec = (lambda x: op @ x) if left_side else \
        (lambda x: x @ op)
    fwd, back = _trsm(left_side, lower, transpose_a, unit_diagonal), _trsm(left_side, lower, not transpose_a,
                                                                            unit_diagonal)
    return lax.custom_linear_solve(matvec, b, lambda _, r: fwd(a, r), lambda _, r: back(a, r))


def triangular_solve(a: jax.Array, b: jax.Array, /, *, left_side: bool = True, lower: bool = True,
                     transpose_a: bool = False, unit_diagonal: bool = False) -> jax.Array:
    """``op(a) x = b`` (``left_side``) or ``x op(a) = b``, ``a`` triangular, safe to ``vmap``.

    The same values as ``lax.linalg.triangular_solve`` (only ``a``'s ``lower``
    or upper triangle is read; ``op(a)`` is ``a.T`` when ``transpose_a``), with
    the exact derivative in ``a`` (that triangle) and ``b``.

    Args:
      a: ``(..., m, m)`` (``left_side``) or ``(..., k, k)``, real.
      b: ``(..., m, k)``.

    Returns:
      ``x: (..., m, k)``.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    _check_matrix("triangular_solve", "a", a, square=True)
    if left_side:
        _check_rhs("triangular_solve", a, b, a.shape[-1])
    elif b.ndim < 2 or b.shape[-1] != a.shape[-1]:
        raise ValueError(f"triangular_solve: b must be (..., m, {a.shape[-1]}) for a right-side solve with a of "
                         f"shape {tuple(a.shape)}, got shape {tuple(b.shape)}.")
    fn = functools.partial(_triangular_2d, left_side=left_side, lower=lower, transpose_a=transpose_a,
                           unit_diagonal=unit_diagonal)
    return jnp.vectorize(fn, signature="(m,m),(p,q)->(p,q)")(a, b)


def cho_solve(chol: jax.Array, b: jax.Array, /) -> jax.Array:
    """``(L L^T) x = b`` from the lower Cholesky factor ``chol = L`` (``jax.scipy.linalg.cho_solve((L, True), b)``).

    Args:
      chol: ``(..., m, m)`` lower triangular.
      b: ``(..., m, k)``.

    Returns:
      ``x: (..., m, k)``.
    """
    y = triangular_solve(chol, b, left_side=True, lower=True)
    return triangular_solve(chol, y, left_side=True, lower=True, transpose_a=True)


def _solve_2d(a, b):
    lu, _, perm = _lu(lax.stop_gradient(a))  # the derivative in a enters through the product a @ x
    unit_lower, upper = _trsm(True, True, False, True), _trsm(True, False, False, False)
    upper_t, unit_lower_t = _trsm(True, False, True, False), _trsm(True, True, True, True)

    def fwd(_, r):
        return upper(lu, unit_lower(lu, r[perm, :]))

    def back(_, r):
        _, inverse = lax.sort_key_val(perm, lax.iota(perm.dtype, perm.shape[0]))
        return unit_lower_t(lu, upper_t(lu, r))[inverse, :]

    return lax.custom_linear_solve(lambda x: a @ x, b, fwd, back)


def solve(a: jax.Array, b: jax.Array, /) -> jax.Array:
    """``a x = b`` by LU with partial pivoting, as ``jnp.linalg.solve``, safe to ``vmap``.

    A singular ``a`` gives Inf/NaN, as ``jnp.linalg.solve`` does. The derivative
    is exact in both arguments (one factorisation serves the solve and its
    derivative).

    Args:
      a: ``(..., m, m)``, real.
      b: ``(..., m, k)``.

    Returns:
      ``x: (..., m, k)``.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    _check_matrix("solve", "a", a, square=True)
    _check_rhs("solve", a, b, a.shape[-1])
    return jnp.vectorize(_solve_2d, signature="(m,m),(m,k)->(m,k)")(a, b)


@jax.custom_jvp
def _cholesky_sym(a):
    return _potrf(a)


@_cholesky_sym.defjvp
def _cholesky_jvp(primals, tangents):
    """``dL = L phi(L^-1 dA L^-T)``, ``phi`` the lower triangle with the diagonal halved (Murray 2016)."""
    (a,), (da,) = primals, tangents
    low = _cholesky_sym(a)
    inner = triangular_solve(low, triangular_solve(low, da, left_side=False, lower=True, transpose_a=True),
                             left_side=True, lower=True)
    phi = jnp.tril(inner) / (1.0 + jnp.eye(a.shape[-1], dtype=a.dtype))
    return low, low @ phi


def cholesky(a: jax.Array, /) -> jax.Array:
    """Lower Cholesky factor of ``(a + a^T) / 2``, as ``jnp.linalg.cholesky``, safe to ``vmap``.

    Not positive definite: NaN, as ``jnp.linalg.cholesky``.

    Args:
      a: ``(..., m, m)``, real, symmetric positive definite.

    Returns:
      ``L: (..., m, m)`` lower triangular with ``L L^T = a``.
    """
    a = jnp.asarray(a)
    _check_matrix("cholesky", "a", a, square=True)
    sym = (a + jnp.swapaxes(a, -1, -2)) / 2
    return jnp.vectorize(_cholesky_sym, signature="(m,m)->(m,m)")(sym)


@jax.custom_jvp
def _qr_diff(x):
    return _geqrf(x)


def _thin_qr_tangents(q, r, dx):
    """``(dq, dr)`` of ``x = q r`` with ``x: (m, n)``, ``m >= n`` (Walter and Lehmann 2018)."""
    dx_rinv = triangular_solve(r, dx, left_side=False, lower=False)  # dx r^-1
    qt_dx_rinv = q.T @ dx_rinv
    lower = jnp.tril(qt_dx_rinv, -1)
    skew = lower - lower.T
    return q @ (skew - qt_dx_rinv) + dx_rinv, (qt_dx_rinv - skew) @ r


@_qr_diff.defjvp
def _qr_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    q, r = _qr_diff(x)
    m, n = x.shape
    if m >= n:
        return (q, r), _thin_qr_tangents(q, r, dx)
    # wide: x = q [r1 r2] with r1 (m, m); r2 = q^T x2, so dr2 = dq^T x2 + q^T dx2
    dq, dr1 = _thin_qr_tangents(q, r[:, :m], dx[:, :m])
    return (q, r), (dq, jnp.concatenate([dr1, dq.T @ x[:, m:] + q.T @ dx[:, m:]], axis=1))


def qr(x: jax.Array, /) -> tuple[jax.Array, jax.Array]:
    """Thin QR ``x = q r``, as ``jnp.linalg.qr(x, mode="reduced")``, safe to ``vmap``.

    The derivative is exact where ``r``'s leading square block is invertible
    (full column rank for a tall ``x``, full row rank for a wide one).

    Args:
      x: ``(..., m, n)``, real.

    Returns:
      ``q: (..., m, r)`` with orthonormal columns and ``r: (..., r, n)`` upper
      triangular, ``r = min(m, n)``.
    """
    x = jnp.asarray(x)
    _check_matrix("qr", "x", x)
    return jnp.vectorize(_qr_diff, signature="(m,n)->(m,p),(p,n)")(x)


_syevd = _cpu_unbatched(lambda a: tuple(jnp.linalg.eigh(a, symmetrize_input=False)))  # (w, v), ?syevd


@jax.custom_jvp
def _eigh_diff(a):
    return _syevd(a)


@_eigh_diff.defjvp
def _eigh_jvp(primals, tangents):
    """``dw = diag(V^T dA V)``, ``dV = V (F * V^T dA V)`` with ``F_ij = 1 / (w_j - w_i)`` off the diagonal;
    a pair of eigenvalues equal to rounding (``|w_i - w_j| <= 64 eps max|w|``) is not coupled (its
    eigenvectors are not unique there, as for :func:`svd`)."""
    (a,), (da,) = primals, tangents
    w, v = _eigh_diff(a)
    vdv = v.T @ ((da + da.T) / 2) @ v
    gap = w[None, :] - w[:, None]
    tiny = 64 * jnp.finfo(a.dtype).eps * jnp.max(jnp.abs(w))
    f = jnp.where(jnp.abs(gap) > tiny, 1.0 / jnp.where(jnp.abs(gap) > tiny, gap, 1.0), 0.0)
    return (w, v), (jnp.diagonal(vdv), v @ (f * vdv))


def eigh(a: jax.Array, /) -> tuple[jax.Array, jax.Array]:
    """Eigenvalues (ascending) and eigenvectors of ``(a + a^T) / 2``, as ``jnp.linalg.eigh``, safe to ``vmap``.

    The derivative is exact where the eigenvalues are distinct; within a group of
    equal eigenvalues the eigenvectors are held fixed (see :func:`_eigh_jvp`).

    Args:
      a: ``(..., m, m)``, real, symmetric.

    Returns:
      ``w: (..., m)`` and ``v: (..., m, m)`` with ``a v = v diag(w)``.
    """
    a = jnp.asarray(a)
    _check_matrix("eigh", "a", a, square=True)
    sym = (a + jnp.swapaxes(a, -1, -2)) / 2
    return jnp.vectorize(_eigh_diff, signature="(m,m)->(m),(m,m)")(sym)


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
    """:func:`pow2_scale` from a precomputed ``max |x|`` (e.g. the value checks' pass), no gradient.

    Elementwise, any shape: the largest power of two ``<= max_abs`` (subnormals included); 1 where
    ``max_abs`` is 0, negative or NaN; 0.5 where it is infinite. These are the values of
    ``ldexp(1, frexp(max_abs)[1] - 1)`` (``tests/test_linalg.py`` checks every float32 exponent and
    subnormal), read off the exponent bits with a few ``lax`` operations: ``jnp.frexp`` and ``jnp.ldexp``
    trace several times as many operations, and the grid's programs trace this on every new shape.
    """
    m = lax.stop_gradient(max_abs)
    m = jnp.asarray(m, m.dtype)  # not weakly typed (a strong result, as before)
    info = jnp.finfo(m.dtype)
    itype = jnp.dtype(f"int{info.bits}")

    def full(v, dtype=m.dtype):
        return lax.full_like(m, v, dtype)

    big = full(2.0 ** (info.nmant + 1))  # brings a subnormal into the normal range, exactly
    sub = lax.lt(m, full(info.tiny))
    x = lax.select(sub, lax.mul(m, big), m)
    exponent = full(((1 << info.nexp) - 1) << info.nmant, itype)
    p = lax.bitcast_convert_type(lax.bitwise_and(lax.bitcast_convert_type(x, itype), exponent), m.dtype)
    p = lax.select(sub, lax.div(p, big), p)
    p = lax.select(lax.gt(m, full(0)), p, full(1))
    return lax.select(lax.eq(m, full(float("inf"))), full(0.5), p)


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
