"""Stitchers: maps from a source representation to a target one (DESIGN.md §3).

Families, nested: ``orthogonal`` ⊂ ``scaled_orthogonal`` ⊂ ``affine``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

FAMILIES = ("orthogonal", "scaled_orthogonal", "affine")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stitcher:
    """A fitted stitcher ``g(z) = scale * (z @ weight) + bias``, acting on raw activations.

    Attributes:
      weight: ``(d_src, d_tgt)``. For the orthogonal families this is the
        ``(d_src, d_tgt)`` block of a square orthogonal matrix on the
        zero-padded space (the netrep convention), or a semi-orthogonal matrix
        when trained with the task loss.
      bias: ``(d_tgt,)``.
      scale: ``()``; 1 for ``orthogonal``, the fitted isotropic scale otherwise
        (for ``affine`` it is 1 and the scale lives in ``weight``).
      family: static; one of ``FAMILIES``.
    """

    weight: jax.Array
    bias: jax.Array
    scale: jax.Array
    family: str = dataclasses.field(default="affine", metadata=dict(static=True))


def apply_stitcher(stitcher: Stitcher, z: ArrayLike, /) -> jax.Array:
    """Apply a stitcher to a batch.

    Args:
      stitcher: a :class:`Stitcher`.
      z: ``(n, d_src)``.

    Returns:
      ``(n, d_tgt)``.
    """
    z = jnp.asarray(z)
    return stitcher.scale * jnp.einsum("ns,st->nt", z, stitcher.weight) + stitcher.bias
