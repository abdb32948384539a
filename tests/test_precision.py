"""Every public function traces its matrix products at full float32 precision, unless the caller chose one.

On GPUs JAX's default float32 matrix product is TF32 (10 mantissa bits); on an H200 it put RSA
and CCA outside 1e-6 of the float64 reference. The CPU computes float32 products in full, so
these tests check the traced programs, which decide the precision on every backend.
"""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funsim.similarity as sim
from funsim.similarity._precision import full_precision

#: Public functions that compute nothing (bookkeeping of the registry and of JAX's caches).
NOT_NUMERIC = {"list_measures", "make_measure", "measure", "register", "register_family"}


def _public_functions():
    return sorted(n for n in dir(sim) if not n.startswith("_") and inspect.isfunction(getattr(sim, n)))


def test_every_public_function_is_full_precision():
    missing = [n for n in _public_functions() if n not in NOT_NUMERIC
               and not getattr(getattr(sim, n), "__full_precision__", False)]
    assert not missing, f"public functions without @full_precision: {missing}"
    assert len(_public_functions()) > 60  # the listing itself works


def _precisions(jaxpr_text: str) -> list[str]:
    """The precision of every dot_general and convolution in a printed jaxpr (sub-jaxprs included)."""
    out = []
    for m in re.finditer(r"(dot_general|conv_general_dilated)\[(.*?)\n\s*\]", jaxpr_text, re.S):
        p = re.search(r"precision=(\([^)]*\)|None)", m.group(2))
        out.append(p.group(1) if p else "None")  # JAX omits precision=None when printing
    return out


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    return x, (x @ rng.normal(size=(6, 5))).astype(np.float32)


CASES = {
    "cka": lambda x, y: sim.cka(x, y),
    "cka/debiased": lambda x, y: sim.cka(x, y, debiased=True),
    "rsa": lambda x, y: sim.rsa(x, y, compare="pearson"),
    "svcca": lambda x, y: sim.svcca(x, y, keep_variance=0.99),
    "pwcca": lambda x, y: sim.pwcca(x, y),
    "procrustes": lambda x, y: sim.procrustes_distance(x, y),
    "regression": lambda x, y: sim.linear_regression_r2(x, y),
    "stitching": lambda x, y: sim.reconstruction_score(x, y, family="affine"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_products_traced_at_highest(name):
    x, y = _data()
    text = str(jax.make_jaxpr(CASES[name])(x, y))
    precisions = _precisions(text)
    assert precisions, f"{name}: no matrix product found in its program"
    assert all("HIGHEST" in p for p in precisions), (name, precisions)


@pytest.mark.parametrize("name", ["cka", "cka/debiased", "rsa", "regression"])
def test_gradient_products_traced_at_highest(name):
    """Users differentiate the measures: the backward pass's products keep the precision too."""
    x, y = _data()
    precisions = _precisions(str(jax.make_jaxpr(jax.grad(lambda a: CASES[name](a, y)))(x)))
    assert precisions and all("HIGHEST" in p for p in precisions), (name, precisions)


@pytest.mark.parametrize("name", ["cka", "rsa", "stitching"])
def test_the_callers_precision_wins(name):
    x, y = _data()
    with jax.default_matmul_precision("bfloat16"):
        precisions = _precisions(str(jax.make_jaxpr(CASES[name])(x, y)))
    assert precisions and not any("HIGHEST" in p for p in precisions), (name, precisions)


def test_without_the_wrapper_the_default_is_none():
    """The check above can fail: a plain product is traced with precision None."""
    a = jnp.ones((3, 3))
    assert _precisions(str(jax.make_jaxpr(lambda a: a @ a)(a))) == ["None"]
    assert _precisions(str(jax.make_jaxpr(full_precision(lambda a: a @ a))(a)))[0].count("HIGHEST") == 2


def test_wrapper_keeps_name_doc_and_signature():
    assert sim.cka.__name__ == "cka" and "kernel alignment" in sim.cka.__doc__
    assert "debiased" in inspect.signature(sim.cka).parameters


def test_warnings_point_at_the_callers_line(recwarn):
    """Through the precision wrapper and nested public calls, a warning names this file, not funsim's."""
    import warnings

    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.fit_stitcher(x, x, family="affine", normalize=False)  # the deprecated spelling
    dep = [w for w in caught if issubclass(w.category, DeprecationWarning) and "normalize" in str(w.message)]
    assert dep and dep[0].filename == __file__, [(w.filename, str(w.message)[:40]) for w in caught]


# ----------------------------------------------------------------------------- long sums of products


def _is_inner_product(spec: str) -> bool:
    """Whether an einsum ``spec`` sums products over whole axes with no operand keeping an axis of its
    own (a batched inner product, which XLA lowers to a dot that the CPU sums sequentially), over
    more than one axis or down to a scalar: a long sum (a matrix product's one axis is not)."""
    spec = spec.replace(" ", "")
    ins, out = spec.split("->") if "->" in spec else (spec, "".join(sorted(c for c in set(spec) if spec.count(c) == 1)))
    ops = ins.split(",")
    contracted = set("".join(ops)) - set(out)
    if len(ops) < 2 or not contracted or (len(contracted) == 1 and out):
        return False
    for k, op in enumerate(ops):
        others = set("".join(o for j, o in enumerate(ops) if j != k))
        if any(c in out and c not in others for c in op):
            return False  # an axis of this operand's own survives: a matrix product
    return True


def test_the_inner_product_rule_itself():
    assert _is_inner_product("ij,ij->") and _is_inner_product("lij,lij->l") and _is_inner_product("ij,ik,kj->")
    assert _is_inner_product("i,i->") and _is_inner_product("snij,snji->sn") and _is_inner_product("im,in,mn->m")
    assert not _is_inner_product("ij,jk->ik") and not _is_inner_product("n,lni,lnj->lij")
    assert not _is_inner_product("ui,ui->u") and not _is_inner_product("i,ni,nj,j->ij")
    assert not _is_inner_product("ti,tj->tij") and not _is_inner_product("uii->u")


def test_no_inner_product_is_written_as_a_contracting_dot():
    """Every sum of products over whole axes goes through ``sum_of_products`` (a reduction): the
    CPU's dot over every axis lost 1.9e-3 of a 2,048-wide Gram matrix's norm in float32."""
    from pathlib import Path

    root = Path(sim.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        offenders += [f"{path.relative_to(root)}: einsum({m.group(1)!r})"
                      for m in re.finditer(r'einsum\(\s*"([^"]+)"', text) if _is_inner_product(m.group(1))]
        offenders += [f"{path.relative_to(root)}: {fn}" for fn in ("jnp.vdot(", "jnp.inner(") if fn in text]
    assert not offenders, offenders
    assert len(list(root.rglob("*.py"))) > 30  # the scan saw the package


def _wide_layer(rng, n, d):
    base = rng.standard_normal((n, 20))
    return (np.tanh(base @ rng.standard_normal((20, d)) + 1.0) + 0.1 * rng.standard_normal((n, d))).astype(np.float32)


def test_wide_layers_in_float32_match_float64():
    """Linear CKA of 1,024-wide float32 layers, in the grid and pairwise, within 2e-6 (relative) of
    float64. With the Gram norm summed by a dot, the grid's value was 5e-4 (relative) too high."""
    from funsim.similarity.grid import compare_grid

    rng = np.random.default_rng(0)
    x, y = _wide_layer(rng, 300, 1024), _wide_layer(rng, 300, 1024)
    xc, yc = (z.astype(np.float64) - z.astype(np.float64).mean(0) for z in (x, y))
    ref = np.linalg.norm(xc.T @ yc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    grid = float(compare_grid([x], [y], measures=["cka/linear"]).tables["cka/linear"][0, 0])
    assert abs(grid - ref) <= 2e-6 * ref, (grid, ref)
    assert abs(float(sim.cka(x, y)) - ref) <= 2e-6 * ref


def test_gram_norm_and_weight_cosine_of_many_terms_match_float64():
    """The moments' Gram norm (2^22 entries) and the weight cosine (2^22 weights) in float32."""
    from funsim.similarity.moments import full_moments_of
    from funsim.similarity.multilinear import LinearLayer

    rng = np.random.default_rng(1)
    g = rng.random((2048, 2048)).astype(np.float32)
    norm = float(full_moments_of(jnp.ones(()), jnp.asarray(g)).gram_norm)  # with a dot: 1.9e-3 low
    assert abs(norm / np.linalg.norm(g.astype(np.float64)) - 1) <= 1e-5
    w = g + 0.5 * rng.random(g.shape).astype(np.float32)
    ref = np.sum(g.astype(np.float64) * w) / (np.linalg.norm(g.astype(np.float64)) * np.linalg.norm(w.astype(np.float64)))
    assert abs(float(sim.weight_cosine(LinearLayer(jnp.asarray(g)), LinearLayer(jnp.asarray(w)))) - ref) <= 1e-5
