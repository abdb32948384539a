"""Full float32 precision for the matrix products of every public function, on every backend.

On GPUs and TPUs, JAX computes float32 matrix products and convolutions at reduced
precision by default: TF32 on NVIDIA GPUs from Ampere on (10 mantissa bits instead of
23), bfloat16 passes on TPUs. On an H200 that put linear CKA 5e-6 from NumPy's float32
value (6e-8 on the CPU) and RSA up to 1.3e-4 from a float64 reference. A similarity measure
that users compare at the fourth decimal needs the full precision, so every public function
of ``funsim.similarity`` traces its products at ``"highest"`` precision
(:func:`full_precision`). The CPU computes float32 products in full in either case.

A precision the caller chose wins: inside ``with jax.default_matmul_precision(...)``,
or with ``jax_default_matmul_precision`` set, funsim traces at that precision. To take
TF32's speed on a GPU, for example, wrap the call in
``with jax.default_matmul_precision("tensorfloat32"):``.

**Long sums of products** (a Frobenius inner product, a batch of them) are written as
:func:`sum_of_products`, an elementwise product and a sum, never as an ``einsum`` or ``dot``
that contracts every axis: XLA:CPU lowers such a dot to one sequential accumulation, whose
float32 relative error grew with the length (measured on uniform random data: 1.4e-4 at
2^20 terms, 1.9e-3 at 2^22, 2.2e-2 at 2^24), while the reduction's stayed below 6e-6 (below
4e-7 where it fuses with the product, as in a compiled program). A 2,048-wide Gram matrix has
2^22 entries; its norm is linear CKA's denominator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp

__all__ = ["full_precision", "sum_of_products"]

F = TypeVar("F", bound=Callable)


def full_precision(fn: F) -> F:
    """Run ``fn`` (and trace what it compiles) with ``jax.default_matmul_precision("highest")``.

    Unless the caller set a precision of their own, which is kept. The context is part of
    ``jax.jit``'s cache key, so programs traced under it compile separately from those
    traced without it.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> f = full_precision(lambda a: a @ a)
      >>> "HIGHEST" in str(jax.make_jaxpr(f)(jnp.ones((2, 2))))
      True
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if jax.config.jax_default_matmul_precision is not None:  # the caller's choice
            return fn(*args, **kwargs)
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    wrapper.__full_precision__ = True
    return wrapper


def sum_of_products(a, b, axis=None) -> jax.Array:
    """``sum(a * b)`` over ``axis`` (all by default): an inner product accurate at any length.

    An elementwise product and a reduction, not a contracting ``dot`` (see the module docstring:
    on the CPU a dot over every axis sums sequentially). Real arrays; shapes broadcast.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(sum_of_products(jnp.ones((3, 4)), jnp.full((3, 4), 2.0)))
      24.0
      >>> sum_of_products(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)), axis=(1, 2)).tolist()
      [12.0, 12.0]
    """
    return jnp.sum(a * b, axis=axis)
