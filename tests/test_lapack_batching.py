"""No batched LAPACK kernel in funsim's CPU programs, and the deadlock they caused does not happen.

jaxlib's batched CPU LAPACK kernels (every one from jaxlib 0.10) split a batch into tasks on
XLA's intra-op pool and block a pool thread until they finish; enough of them at once hang the
process (see similarity._linalg). funsim routes every LAPACK call through similarity._linalg,
whose kernels run a batch as a loop of unbatched kernels on the CPU. These tests check that
property on the programs the library compiles (the lowered StableHLO of the comparison grid, the
batched stitcher fits and the task-loss training), that no module calls LAPACK directly, and,
on a jaxlib that has the hazard, that the old deadlock's reproducer finishes.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

CPU_LOWERING = pytest.mark.skipif(jax.default_backend() != "cpu",
                                  reason="inspects the CPU program's LAPACK custom calls")

_CALL = re.compile(r"stablehlo\.custom_call @(lapack_\w+)\(.* : \((.*)\) -> ")
_TENSOR = re.compile(r"tensor<((?:\d+x)*)\w+>")


def lapack_calls(text: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    """``(target, operand shapes)`` of every LAPACK custom call in StableHLO ``text``."""
    out = []
    for target, operands in _CALL.findall(text):
        shapes = [tuple(int(d) for d in dims.split("x")[:-1]) for dims in _TENSOR.findall(operands)]
        out.append((target, shapes))
    return out


@contextlib.contextmanager
def lowered_programs(directory: Path):
    """Every program lowered inside the block, as StableHLO text (a list filled on exit).

    JAX's own IR dump (``jax_dump_ir_to``); the in-memory caches are dropped first so that
    programs compiled earlier in the process are lowered again.
    """
    texts: list[str] = []
    jax.clear_caches()
    old = jax.config.read("jax_dump_ir_to")
    jax.config.update("jax_dump_ir_to", str(directory))
    try:
        yield texts
    finally:
        jax.config.update("jax_dump_ir_to", old)
        jax.clear_caches()
        texts.extend(p.read_text() for p in sorted(directory.glob("*.mlir")))


def _kernel(target: str) -> str:
    """``"lapack_dgetrf_ffi"`` -> ``"getrf_ffi"`` (the routine, whatever the dtype)."""
    return target[len("lapack_") + 1:]


def test_lapack_call_parser():
    """The parser reads the target and the operand shapes from a real lowering (batched and not)."""
    a, b = jnp.ones((3, 5, 5)), jnp.ones((3, 5, 2))
    batched = lapack_calls(jax.jit(jnp.linalg.solve).lower(a, b).as_text())
    single = lapack_calls(jax.jit(jnp.linalg.solve).lower(a[0], b[0]).as_text())
    if jax.default_backend() == "cpu":
        assert {_kernel(t) for t, _ in batched} == {"getrf_ffi", "trsm_ffi"}
        assert all(any(len(s) == 3 for s in shapes) for _, shapes in batched)
        assert single and all(len(s) <= 2 for _, shapes in single for s in shapes)


@CPU_LOWERING
def test_library_programs_have_no_batched_lapack_calls(rng, tmp_path):
    """The comparison grid (CCA, SVCCA, PWCCA, stitching), the batched stitcher fits and a task-loss training
    step, lowered for the CPU: LAPACK kernels, each on one matrix."""
    from funsim.similarity import fit_stitchers, train_stitchers
    from funsim.similarity.grid import compare_grid

    xs = [rng.normal(size=(40, d)) for d in (6, 9, 9)]
    ys = [rng.normal(size=(40, d)) for d in (9, 6, 6)]
    measures = ["cca/mean", "svcca", "pwcca", "stitch/affine", "stitch/orthogonal", "stitch/scaled_orthogonal"]
    y = jnp.asarray(rng.integers(0, 3, 40))
    head = jnp.asarray(rng.normal(size=(6, 3)))
    with lowered_programs(tmp_path) as texts:
        g = compare_grid(xs, ys, measures=measures)
        fits = fit_stitchers(xs, ys, family=["affine", "orthogonal", "scaled_orthogonal"])
        out = train_stitchers(xs, y, lambda w, h: h @ w, head, family=["affine", "orthogonal", "scaled_orthogonal"],
                              init="random", target_shape=(6,), steps=2, key=jax.random.key(0))
    for key in measures:
        assert np.all(np.isfinite(g.tables[key])), key
    assert len(fits) == 3 and len(out) == 3
    calls = [c for text in texts for c in lapack_calls(text)]
    targets = {_kernel(t) for t, _ in calls}
    # the programs do factorise and solve (the check below is not vacuous)
    assert {"getrf_ffi", "trsm_ffi", "potrf_ffi", "geqrf_ffi", "gesdd_ffi"} <= targets, targets
    batched = [(t, shapes) for t, shapes in calls if any(len(s) > 2 for s in shapes)]
    assert not batched, batched


def test_no_direct_lapack_calls_outside_linalg():
    """Every LAPACK call in the three packages goes through similarity._linalg (doctests aside)."""
    direct = re.compile(r"jnp\.linalg\.(?!norm\b)\w+|jax\.scipy\.linalg|lax\.linalg|jsp\.linalg")
    found = []
    for package in ("similarity", "models", "experiments"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_linalg.py" and package == "similarity":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if direct.search(line) and not line.lstrip().startswith(">>>"):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def _jaxlib_version() -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", jax.lib.__version__)[:2])


# The library's own batched solves and Cholesky factors (Cayley maps, as the orthogonal stitchers solve,
# the affine stitchers' normal equations), vmapped in one program with several independent kernels,
# and several such programs in flight from four threads: with jaxlib 0.10's batched kernels every
# pool thread ends up waiting on tasks no thread is free to run.
_REPRODUCER = """
import threading

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
from funsim.similarity._linalg import solve
from funsim.similarity.stitching import affine_system

rng = np.random.default_rng(0)
g = rng.normal(size=(64, 32, 32))
skew = jnp.asarray(g - np.swapaxes(g, 1, 2)) * 0.1
gram = jnp.asarray(np.einsum("bij,bkj->bik", g, g))


@jax.jit
def program(s, gm):
    eye = jnp.eye(32)
    return ([jnp.sum(jax.vmap(lambda a: solve(eye - a, eye + a))(s * (k + 1))) for k in range(4)]
            + [jnp.sum(jax.vmap(lambda a: affine_system(a, ridge=0.1))(gm * (k + 1))) for k in range(4)])


jax.block_until_ready(program(skew, gram))
work = lambda: jax.block_until_ready([program(skew + k, gram) for k in range(4)])
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("finished")
"""


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the deadlock is in jaxlib's CPU LAPACK kernels")
@pytest.mark.skipif(_jaxlib_version() < (0, 10),
                    reason="jaxlib < 0.10 runs these batched kernels inline (nothing to deadlock); "
                           "the reproducer means something from jaxlib 0.10")
def test_old_deadlock_reproducer_finishes():
    """Hung (0 % CPU, forever) with jaxlib 0.10.2 before every LAPACK call went through similarity._linalg."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(_REPRODUCER)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the batched-LAPACK reproducer did not finish in 120 s: a batched LAPACK kernel is back "
                    "in the library's programs (route it through similarity._linalg)")
    assert out.returncode == 0 and "finished" in out.stdout, out.stderr[-2000:]
