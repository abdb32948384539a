"""The batch-safe LAPACK kernels (similarity._linalg) against NumPy/SciPy float64.

Besides the numbers, the tests check the structural property the module exists
for: under ``vmap`` on the CPU, every compiled ``gesdd`` kernel is unbatched
(jaxlib's batched CPU SVD can deadlock XLA's thread pool).
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given
from jax.test_util import check_grads

from funsim.similarity._linalg import cho_solve, cholesky, lstsq, qr, solve, svd, triangular_solve

SHAPES = [(7, 3), (3, 7), (5, 5), (1, 4), (4, 1)]


#: The unbatched-SVD property belongs to the CPU lowering (LAPACK's gesdd); GPUs and TPUs keep the
#: batched kernel by design (docs/gpu.md), and their programs hold no gesdd to inspect.
CPU_LOWERING = pytest.mark.skipif(jax.default_backend() != "cpu",
                                  reason="inspects the CPU program's LAPACK SVD kernels")


def _gesdd_operands(fn, *args):
    """Shapes of the matrices fed to every LAPACK SVD kernel in ``jit(fn)``'s CPU program."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    lines = [ln for ln in hlo.splitlines() if "gesdd" in ln and "custom-call" in ln]
    # "%svd.9 = (f64[6,4]{0,1}, f64[4]{0}, ...) custom-call(...)": the first tuple
    # element is the overwritten input matrix, with any batch dimensions in front.
    return [tuple(int(d) for d in re.search(r"= \(\w+\[([\d,]*)\]", ln).group(1).split(",")) for ln in lines]


@pytest.mark.parametrize("shape", SHAPES)
def test_svd_matches_numpy(shape, rng):
    x = rng.normal(size=shape)
    u, s, vt = svd(jnp.asarray(x))
    s_ref = np.linalg.svd(x, compute_uv=False)
    r = min(shape)
    assert u.shape == (shape[0], r) and s.shape == (r,) and vt.shape == (r, shape[1])
    np.testing.assert_allclose(s, s_ref, atol=1e-12)
    np.testing.assert_allclose((u * s[None, :]) @ vt, x, atol=1e-12)
    np.testing.assert_allclose(u.T @ u, np.eye(r), atol=1e-12)
    np.testing.assert_allclose(vt @ vt.T, np.eye(r), atol=1e-12)
    np.testing.assert_allclose(svd(jnp.asarray(x), compute_uv=False), s_ref, atol=1e-12)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_svd_property_reconstruction(m, k, seed):
    x = np.random.default_rng(seed).normal(size=(m, k))
    u, s, vt = svd(jnp.asarray(x))
    np.testing.assert_allclose((u * s[None, :]) @ vt, x, atol=1e-11)
    assert np.all(np.diff(np.asarray(s)) <= 1e-12)  # descending


def test_vmap_equals_stack_and_leading_dims(rng):
    x = jnp.asarray(rng.normal(size=(3, 2, 6, 4)))
    stacked = np.stack([[np.linalg.svd(np.asarray(x[i, j]), compute_uv=False) for j in range(2)] for i in range(3)])
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.vmap(lambda a: svd(a, compute_uv=False))))(x), stacked, atol=1e-12)
    np.testing.assert_allclose(svd(x, compute_uv=False), stacked, atol=1e-12)  # leading dims
    u, s, vt = jax.vmap(svd)(x[0])
    np.testing.assert_allclose(jnp.einsum("bik,bk,bkj->bij", u, s, vt), x[0], atol=1e-12)


@CPU_LOWERING
def test_vmapped_svd_kernels_are_unbatched_on_cpu(rng):
    """The deadlock fix: no batched gesdd in a vmapped (or vmapped-gradient) program."""
    x = jnp.asarray(rng.normal(size=(5, 9, 9)))
    plain = _gesdd_operands(jax.vmap(lambda a: jnp.linalg.svd(a, compute_uv=False)), x)
    assert plain == [(5, 9, 9)]  # the hazard exists: jnp batches the kernel
    assert _gesdd_operands(jax.vmap(lambda a: svd(a, compute_uv=False)), x) == [(9, 9)]
    assert _gesdd_operands(jax.vmap(svd), x) == [(9, 9)]
    grads = _gesdd_operands(jax.vmap(jax.grad(lambda a: jnp.sum(jnp.sin(svd(a)[0])))), x)
    assert grads and all(len(shape) == 2 for shape in grads)


@CPU_LOWERING
def test_library_programs_have_unbatched_svds(rng):
    """The comparison grid and the batched stitcher fit, compiled: only unbatched SVDs."""
    from funsim.similarity.grid import compare_grid

    xs = [rng.normal(size=(40, 9)) for _ in range(3)]
    ys = [rng.normal(size=(40, 9)) for _ in range(3)]
    g = compare_grid(xs, ys, measures=["nbs", "procrustes", "stitch/orthogonal", "svcca"])
    for key in ("nbs", "procrustes", "stitch/orthogonal", "svcca"):
        assert np.all(np.isfinite(g.tables[key]))
    # fit_stitchers' stacked path, traced the way it runs
    from funsim.similarity._stitch_batch import fit_padded

    args = (jnp.asarray(np.stack(xs)), jnp.asarray(np.stack(ys)), jnp.ones((3, 9)))
    fit = lambda a, b, m: fit_padded(a, b, m, jnp.zeros(3), jnp.zeros(3, jnp.int32), jnp.ones(3, bool),
                                        families=("orthogonal",))[0]  # noqa: E731
    ops = _gesdd_operands(fit, *args)
    assert ops and all(len(shape) == 2 for shape in ops)


def _gauge_invariant(x):
    """A smooth function of the SVD that does not depend on the signs of the singular vectors."""
    u, s, vt = svd(x)
    return jnp.sum(jnp.sin((u * (s**2)[None, :]) @ u.T)) + jnp.sum(jnp.cos(vt.T @ (s[:, None] * vt))) + jnp.sum(jnp.tanh(u @ vt))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_svd_gradients(shape, rng):
    x = jnp.asarray(rng.normal(size=shape))
    check_grads(_gauge_invariant, (x,), order=1, modes=["fwd", "rev"])
    check_grads(lambda a: jnp.sum(svd(a, compute_uv=False) ** 1.5), (x,), order=2, modes=["fwd", "rev"])

    def ref(a):
        u, s, vt = jnp.linalg.svd(a, full_matrices=False)
        return jnp.sum(jnp.sin((u * (s**2)[None, :]) @ u.T)) + jnp.sum(jnp.cos(vt.T @ (s[:, None] * vt))) + jnp.sum(jnp.tanh(u @ vt))

    np.testing.assert_allclose(jax.grad(_gauge_invariant)(x), jax.grad(ref)(x), atol=1e-10)
    # vmap of grad equals the stacked grads
    xb = jnp.stack([x, 2 * x + 1])
    np.testing.assert_allclose(jax.vmap(jax.grad(_gauge_invariant))(xb),
                               np.stack([jax.grad(_gauge_invariant)(a) for a in xb]), atol=1e-10)


@pytest.mark.parametrize("shape", [(9, 4), (4, 9)])
def test_lstsq_matches_numpy(shape, rng):
    a = rng.normal(size=shape)
    b = rng.normal(size=(shape[0], 2))
    np.testing.assert_allclose(lstsq(jnp.asarray(a), jnp.asarray(b)), np.linalg.lstsq(a, b, rcond=None)[0], atol=1e-10)
    # rank-deficient: a duplicated column gets the minimum-norm solution
    a2 = np.concatenate([a, a[:, :1]], axis=1)
    np.testing.assert_allclose(lstsq(jnp.asarray(a2), jnp.asarray(b)), np.linalg.lstsq(a2, b, rcond=None)[0], atol=1e-10)


@pytest.mark.slow
def test_full_size_grid_does_not_hang():
    """The 12 x 12 grid of the benchmark (n = 2,000) that hung before the fix, in a subprocess."""
    code = textwrap.dedent(
        """
        import numpy as np
        from funsim.similarity.grid import compare_grid
        rng = np.random.default_rng(0)
        a = [rng.standard_normal((2000, (64, 128)[i % 2])).astype(np.float32) for i in range(12)]
        b = [rng.standard_normal((2000, (128, 64)[i % 2])).astype(np.float32) for i in range(12)]
        ms = ["stitch/affine", "stitch/orthogonal", "stitch/scaled_orthogonal", "nbs", "procrustes", "cka/linear"]
        for _ in range(3):
            g = compare_grid(a, b, measures=ms)
        print("ok", float(g.tables["nbs"].sum()))
        """
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_shared_rows_without_x64():
    """shared_rows runs in the default float32/int32 mode too (the test suite enables x64: this checks the
    other mode): it used to overflow on its uint32 sentinel, from the grid's pairwise fallback."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from funsim.similarity._linalg import shared_rows

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    x[4] = x[0]  # one b row equals an a row
    with jax.enable_x64(False):
        n = shared_rows(jnp.asarray(x), jnp.asarray([1, 1, 1, 0, 0, 0], bool), jnp.asarray([0, 0, 0, 1, 1, 1], bool))
    assert int(n) == 1


# ----------------------------------------------------------------------------- solve, Cholesky, triangular, QR


def _spd(rng, m):
    a = rng.normal(size=(m, m))
    return a @ a.T + m * np.eye(m)


def _same(x, y):
    """Bit for bit (the safe kernels run the same LAPACK routine on each matrix)."""
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_solve_cholesky_triangular_qr_match_scipy(rng):
    a, b, s = rng.normal(size=(6, 6)) + 3 * np.eye(6), rng.normal(size=(6, 3)), _spd(rng, 6)
    np.testing.assert_allclose(solve(a, b), scipy.linalg.solve(a, b), rtol=1e-12, atol=1e-12)
    low = np.asarray(cholesky(s))
    np.testing.assert_allclose(low, scipy.linalg.cholesky(s, lower=True), rtol=1e-12, atol=1e-12)
    assert np.all(np.triu(low, 1) == 0)
    np.testing.assert_allclose(cho_solve(low, b), scipy.linalg.cho_solve((low, True), b), rtol=1e-12, atol=1e-12)
    for left, lower, trans, unit in [(True, True, False, False), (True, False, True, True), (False, False, False, False),
                                     (False, True, True, False)]:
        rhs = b if left else b.T
        got = triangular_solve(a, rhs, left_side=left, lower=lower, transpose_a=trans, unit_diagonal=unit)
        tri = np.tril(a) if lower else np.triu(a)
        if unit:
            tri = tri - np.diag(np.diag(tri)) + np.eye(6)
        op = tri.T if trans else tri
        want = np.linalg.solve(op, rhs) if left else np.linalg.solve(op.T, rhs.T).T
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    for shape in [(7, 4), (4, 7), (5, 5)]:
        x = rng.normal(size=shape)
        q, r = map(np.asarray, qr(x))
        q_ref, r_ref = scipy.linalg.qr(x, mode="economic")
        signs = np.sign(np.diag(r)) * np.sign(np.diag(r_ref))  # LAPACK's signs; the same routine here
        np.testing.assert_allclose(q * signs[None, :], q_ref, atol=1e-12)
        np.testing.assert_allclose(r * signs[:, None], r_ref, atol=1e-12)


def test_batched_equals_plain_kernels_bit_for_bit(rng):
    """vmapped (and leading-axis) calls give exactly the plain jnp/jax.scipy results."""
    a = jnp.asarray(rng.normal(size=(4, 6, 6)) + 3 * np.eye(6))
    b = jnp.asarray(rng.normal(size=(4, 6, 3)))
    s = jnp.asarray(np.stack([_spd(rng, 6) for _ in range(4)]))
    low = jnp.linalg.cholesky(s)
    _same(jax.jit(jax.vmap(solve))(a, b), jax.vmap(jnp.linalg.solve)(a, b))
    _same(solve(a, b), jnp.linalg.solve(a, b))
    _same(jax.vmap(cholesky)(s), low)
    _same(jax.vmap(cho_solve)(low, b), jax.vmap(lambda c, r: jax.scipy.linalg.cho_solve((c, True), r))(low, b))
    _same(jax.vmap(triangular_solve)(low, b), jax.scipy.linalg.solve_triangular(low, b, lower=True))
    for x in (a, jnp.asarray(rng.normal(size=(4, 8, 5))), jnp.asarray(rng.normal(size=(4, 3, 5)))):
        for got, want in zip(jax.vmap(qr)(x), jnp.linalg.qr(x)):
            _same(got, want)
    # nested vmap with an unbatched operand shared by the inner map
    _same(jax.vmap(jax.vmap(solve, (None, 0)), (0, None))(a, b), jax.vmap(jax.vmap(jnp.linalg.solve, (None, 0)),
                                                                            (0, None))(a, b))


@CPU_LOWERING
def test_vmapped_kernels_and_their_gradients_are_unbatched_on_cpu(rng):
    from tests.test_lapack_batching import lapack_calls

    a = jnp.asarray(rng.normal(size=(3, 6, 6)) + 3 * np.eye(6))
    b = jnp.asarray(rng.normal(size=(3, 6, 2)))

    def f(a, b):
        s = a @ a.T
        return jnp.sum(jnp.sin(cho_solve(cholesky(s), b))) + jnp.sum(qr(a)[1] ** 2) + jnp.sum(solve(a, b) ** 3)

    def batched(fn, *args):
        calls = lapack_calls(jax.jit(fn).lower(*args).as_text())
        return [c for c in calls if any(len(s) > 2 for s in c[1])], calls

    bad, calls = batched(jax.vmap(jax.grad(f, argnums=(0, 1))), a, b)
    assert calls and not bad, bad
    bad, calls = batched(jax.vmap(jax.hessian(lambda x: f(x, b[0]))), a)
    assert calls and not bad, bad
    # the hazard exists: the plain kernels are batched
    assert batched(jax.vmap(jnp.linalg.solve), a, b)[0]


_TRI_FLAGS = [(True, True, False), (True, False, True), (False, False, False), (False, True, True)]


def _fd_case(name, rng):
    """``(function, args)`` of one kernel for the finite-difference checks (small, well-conditioned)."""
    a = jnp.asarray(rng.normal(size=(4, 4)) + 3 * np.eye(4))
    b = jnp.asarray(rng.normal(size=(4, 2)))
    if name == "solve":
        return solve, (a, b)
    if name == "cholesky":
        return lambda x: cholesky(x @ x.T + 4 * jnp.eye(4)), (a,)
    if name == "cho_solve":
        return lambda c, r: cho_solve(jnp.tril(c), r), (a, b)
    if name.startswith("triangular"):
        left, lower, trans = _TRI_FLAGS[int(name[-1])]
        return (lambda m, r: triangular_solve(m, r, left_side=left, lower=lower, transpose_a=trans)), (a, b if left else b.T)
    shape = {"qr_tall": (6, 3), "qr_wide": (3, 5), "qr_square": (4, 4)}[name]
    return qr, (jnp.asarray(rng.normal(size=shape)),)


@pytest.mark.parametrize("name", ["solve", "cholesky", "cho_solve", "triangular0", "triangular1", "triangular2",
                                  "triangular3", "qr_tall", "qr_wide", "qr_square"])
def test_gradients_match_finite_differences(name, rng):
    """JVP and VJP, first and second order, of every kernel against central finite differences."""
    fn, args = _fd_case(name, rng)
    check_grads(fn, args, order=2, modes=["fwd", "rev"])


def test_gradients_equal_jax_own_rules(rng):
    """The same derivative as the plain jnp kernels (whose rules these restate), vmapped over a batch."""
    a = jnp.asarray(rng.normal(size=(3, 6, 6)) + 3 * np.eye(6))
    b = jnp.asarray(rng.normal(size=(3, 6, 2)))
    pairs = [
        (lambda m, r: jnp.sum(jnp.sin(solve(m, r))), lambda m, r: jnp.sum(jnp.sin(jnp.linalg.solve(m, r)))),
        (lambda m, r: jnp.sum(jnp.sin(cholesky(m @ m.T) @ r)), lambda m, r: jnp.sum(jnp.sin(jnp.linalg.cholesky(m @ m.T) @ r))),
        (lambda m, r: jnp.sum(jnp.sin(qr(m)[0] @ r)), lambda m, r: jnp.sum(jnp.sin(jnp.linalg.qr(m)[0] @ r))),
    ]
    for mine, plain in pairs:
        for got, want in zip(jax.vmap(jax.grad(mine, (0, 1)))(a, b), jax.vmap(jax.grad(plain, (0, 1)))(a, b)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match=r"solve: a must be \(\.\.\., m, m\), square, got shape \(3, 4\)"):
        solve(jnp.ones((3, 4)), jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"solve: b must be \(\.\.\., 3, k\).*got shape \(3,\).*b\[:, None\]"):
        solve(jnp.eye(3), jnp.ones(3))
    with pytest.raises(ValueError, match=r"cholesky: a must be .*got shape \(2, 3\)"):
        cholesky(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"triangular_solve: b must be \(\.\.\., m, 3\) for a right-side solve"):
        triangular_solve(jnp.eye(3), jnp.ones((3, 2)), left_side=False)
    with pytest.raises(ValueError, match=r"qr: x must be \(\.\.\., m, k\), got shape \(4,\)"):
        qr(jnp.ones(4))


def test_not_positive_definite_gives_nan_as_jnp():
    bad = jnp.asarray([[1.0, 2.0], [2.0, 1.0]])
    assert np.all(np.isnan(np.asarray(cholesky(bad)))) == np.all(np.isnan(np.asarray(jnp.linalg.cholesky(bad))))
    assert np.any(np.isnan(np.asarray(cholesky(bad))))


def test_eigh_matches_numpy_batches_exactly_and_is_unbatched_on_cpu(rng):
    """eigh: values and vectors against NumPy float64 (vectors up to sign), vmap bit for bit equal to
    jnp.linalg.eigh, and no batched LAPACK eigensolver in a vmapped program on the CPU."""
    from funsim.similarity._linalg import eigh

    s = np.stack([_spd(rng, 6) for _ in range(3)])
    w, v = map(np.asarray, eigh(s[0]))
    w_ref, v_ref = np.linalg.eigh(s[0])
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.abs(np.sum(v * v_ref, axis=0)), np.ones(6), atol=1e-10)
    for got, want in zip(jax.jit(jax.vmap(eigh))(jnp.asarray(s)), jnp.linalg.eigh(jnp.asarray(s))):
        _same(got, want)
    if jax.default_backend() == "cpu":
        from tests.test_lapack_batching import lapack_calls

        calls = lapack_calls(jax.jit(jax.vmap(eigh)).lower(jnp.asarray(s)).as_text())
        assert calls and not [c for c in calls if any(len(sh) > 2 for sh in c[1])], calls


def test_eigh_gradients_match_finite_differences(rng):
    """Distinct eigenvalues: the eigenvalues and a sign-invariant function of the vectors (their projectors),
    first and second order, forward and reverse."""
    from funsim.similarity._linalg import eigh

    a = jnp.asarray(np.diag([1.0, 2.0, 4.0, 7.0]) + 0.1 * rng.normal(size=(4, 4)))

    def f(m):
        w, v = eigh(m)
        return w, v[:, :2] @ v[:, :2].T

    check_grads(f, (a,), order=2, modes=["fwd", "rev"])


def _pow2_by_frexp(max_abs):
    """pow2_at's definition: ``ldexp(1, frexp(m)[1] - 1)``, with 1 for a non-positive or NaN ``m``."""
    m = jax.lax.stop_gradient(max_abs)
    _, e = jnp.frexp(jnp.where(m > 0, m, jnp.ones((), m.dtype)))
    return jnp.ldexp(jnp.ones((), m.dtype), e - 1)


def test_pow2_at_reads_the_exponent_bits_as_frexp_and_ldexp_would():
    """Bit for bit on every exponent (subnormals, zero, inf and NaN included), each sign, in every float
    dtype the tests run (float16 and bfloat16 exhaustively)."""
    from funsim.similarity._linalg import pow2_at

    r = np.random.default_rng(0)
    kinds = [(jnp.float16, np.uint16, None, None), (jnp.bfloat16, np.uint16, None, None), (np.float32, np.uint32, 23, 8)]
    if jax.config.jax_enable_x64:
        kinds.append((np.float64, np.uint64, 52, 11))
    for dt, it, nmant, nexp in kinds:
        if nmant is None:
            bits = np.arange(1 << 16, dtype=it)
        else:
            mant = np.concatenate([np.arange(64), (1 << nmant) - 1 - np.arange(64),
                                   r.integers(0, 1 << nmant, 512, dtype=np.uint64)]).astype(it)
            bits = np.concatenate([(it(e) << it(nmant)) | mant for e in range(1 << nexp)])
            bits = np.concatenate([bits, bits | (it(1) << it(nmant + nexp))])
        x = jnp.asarray(bits.view(dt))
        got, want = np.asarray(jax.jit(pow2_at)(x)), np.asarray(jax.jit(_pow2_by_frexp)(x))
        assert got.dtype == want.dtype and np.array_equal(got.view(it), want.view(it)), dt
    assert not pow2_at(jnp.asarray(3.0)).weak_type and float(pow2_at(np.float32(5.0))) == 4.0
    assert float(jax.grad(lambda z: pow2_at(z) * z)(3.0)) == 2.0  # no gradient through the scale
