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
