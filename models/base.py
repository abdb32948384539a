"""Shared machinery for funsim models: named stages, layer access and flattening.

Every model is a chain of named *stages*. ``features(x)`` records the output of
each stage, in order; ``tail(layer, z)`` runs the stages after ``layer``; the
last stage is always ``"logits"``, so ``tail("logits", z)`` is the identity.

Flattening policy for similarity measures (docs/design.md §1): measures take 2-D
``(n_samples, n_features)`` arrays, while convolutional stages output
``(n, H, W, C)`` maps and sequence models ``(n, T, D)``. :func:`flatten_features`
turns any of these into 2-D, with an explicit ``policy``:

* ``"flatten"``: ``(n, H, W, C) -> (n, H*W*C)`` in row-major (H, W, C) order.
  Keeps all spatial information; ``tail`` accepts this form back and reshapes.
* ``"spatial_mean"``: ``(n, H, W, C) -> (n, C)``, the mean over every axis
  between the sample axis and the channel axis (for sequences, over tokens).
  Invariant to spatial translations of the map; not invertible, so ``tail``
  cannot take it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import ArrayLike

FLATTEN_POLICIES = ("flatten", "spatial_mean")
ACTIVATION_POINTS = ("post_activation", "pre_activation")
"""Where ``features`` taps a stage that ends in an elementwise activation: after it (the
stage's output, the default) or before it (the raw linear output, as the usable-information
paper's code reads MLP layers). Stages without such an activation give the same either way."""


def _check_point(point: str) -> None:
    if point not in ACTIVATION_POINTS:
        raise ValueError(f"point must be one of {', '.join(repr(p) for p in ACTIVATION_POINTS)}, got {point!r}.")


def flatten(z: ArrayLike, /, *, policy: str = "flatten") -> jax.Array:
    """Flatten one activation array to ``(n, features)`` by ``policy``.

    Args:
      z: ``(n, ...)``; 2-D input is returned unchanged.
      policy: ``"flatten"`` or ``"spatial_mean"`` (see the module docstring).

    Returns:
      ``(n, prod(...))`` for ``"flatten"``, ``(n, C)`` for ``"spatial_mean"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> flatten(jnp.ones((2, 4, 4, 3)), policy="spatial_mean").shape
      (2, 3)
    """
    if policy not in FLATTEN_POLICIES:
        raise ValueError(
            f"Unknown flattening policy {policy!r}. Valid options: "
            f"{', '.join(repr(p) for p in FLATTEN_POLICIES)}."
        )
    z = jnp.asarray(z)
    if z.ndim < 2:
        raise ValueError(f"z must have a sample axis and a feature axis, got shape {z.shape}.")
    if z.ndim == 2:
        return z
    if policy == "flatten":
        return z.reshape(z.shape[0], -1)
    return z.mean(axis=tuple(range(1, z.ndim - 1)))


def flatten_features(
    feats: Mapping[str, ArrayLike], /, *, policy: str = "flatten"
) -> dict[str, jax.Array]:
    """Apply :func:`flatten` to every entry of a ``features(x)`` dict.

    Args:
      feats: ``{layer: (n, ...)}``.
      policy: ``"flatten"`` or ``"spatial_mean"``.

    Returns:
      ``{layer: (n, d_layer)}``, same keys and order.

    Examples:
      >>> import jax.numpy as jnp
      >>> out = flatten_features({"conv0": jnp.ones((2, 4, 4, 3))})
      >>> out["conv0"].shape
      (2, 48)
    """
    return {k: flatten(v, policy=policy) for k, v in feats.items()}


def unknown_name_error(what: str, value: str, valid) -> ValueError:
    valid = list(valid)
    close = difflib.get_close_matches(str(value), valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"Unknown {what} {value!r}.{hint} Valid {what}s: {', '.join(repr(v) for v in valid)}."
    )


class FeatureModel(nnx.Module):
    """Base class: a chain of named stages with layer access.

    Subclasses set ``self.input_shape`` (per-sample shape, a tuple), implement
    ``_stage_names()`` and ``_stage(i, z)``, and may override ``_prepare(x)``.
    """

    input_shape: tuple

    def _stage_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _stage(self, i: int, z: jax.Array) -> jax.Array:
        raise NotImplementedError

    def _pre_activation(self, i: int):
        """The elementwise map that ends stage ``i`` (``_stage(i, z) == act(_stage_pre(i, z))``): its
        activation, or e.g. an MLP's evaluation-mode BatchNorm then activation; None when the stage has
        no pre-activation tap (the default)."""
        return None

    def _stage_pre(self, i: int, z: jax.Array) -> jax.Array:
        """Stage ``i`` up to, not including, its final activation (only where :meth:`_pre_activation` is set)."""
        raise NotImplementedError

    def _prepare(self, x: ArrayLike) -> jax.Array:
        """Validate ``x`` of shape ``(n, *input_shape)`` (float)."""
        x = jnp.asarray(x)
        if tuple(x.shape[1:]) != tuple(self.input_shape) or x.ndim != len(self.input_shape) + 1:
            raise ValueError(
                f"{type(self).__name__} expects x of shape (n, {', '.join(map(str, self.input_shape))}), "
                f"got {tuple(x.shape)}. Reshape the data or build the model with "
                f"input_shape={tuple(x.shape[1:])}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        return x

    def training_logits(self, x: ArrayLike, key: jax.Array) -> jax.Array:
        """The logits of one training step on the minibatch ``x`` (what ``models.train`` differentiates).

        The same as ``self(x)`` here; a model with BatchNorm or dropout (``MLP(batch_norm=True,
        dropout=...)``) overrides it: BatchNorm on the minibatch's statistics, updating its running
        averages (``nnx.BatchStat``) in place, and dropout drawn from ``key``. Every other call
        (``__call__``, :meth:`features`, :meth:`tail`) is the deterministic evaluation mode.
        """
        return self(x)

    def layer_names(self) -> tuple[str, ...]:
        """The names of the stages, in order; the last is ``"logits"``."""
        return self._stage_names()

    def _index(self, layer: str) -> int:
        names = self._stage_names()
        if layer not in names:
            raise unknown_name_error("layer name", layer, names)
        return names.index(layer)

    def __call__(self, x: ArrayLike) -> jax.Array:
        z = self._prepare(x)
        for i in range(len(self._stage_names())):
            z = self._stage(i, z)
        return z

    def features(self, x: ArrayLike, *, point: str = "post_activation") -> dict[str, jax.Array]:
        """Every stage's output, in order: ``{layer: (n, ...)}``.

        Args:
          x: ``(n, *input_shape)``.
          point: ``"post_activation"`` (each stage's output) or ``"pre_activation"``:
            a stage that ends in an elementwise activation is tapped before it
            (same shape); :meth:`tail` with the same ``point`` continues from there.
        """
        _check_point(point)
        z = self._prepare(x)
        out = {}
        for i, name in enumerate(self._stage_names()):
            act = self._pre_activation(i) if point == "pre_activation" else None
            if act is None:
                z = self._stage(i, z)
                out[name] = z
            else:
                pre = self._stage_pre(i, z)
                out[name] = pre
                z = act(pre)
        return out

    def feature_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sample shape of every stage's output (computed abstractly)."""
        dummy = jax.ShapeDtypeStruct((1, *self.input_shape), self._input_dtype())
        shapes = jax.eval_shape(self.features, dummy)
        return {k: tuple(v.shape[1:]) for k, v in shapes.items()}

    def _input_dtype(self):
        return jnp.result_type(float)

    def tail(self, layer: str, z: ArrayLike, *, point: str = "post_activation", until: str | None = None) -> jax.Array:
        """Run the rest of the network from the output of ``layer``.

        Args:
          layer: one of :meth:`layer_names`.
          z: ``(n, *shape)`` as returned by ``features(x, point=point)[layer]``, or its
            ``"flatten"``-policy form ``(n, prod(shape))``.
          point: where ``z`` was tapped (see :meth:`features`); from a pre-activation
            tap the stage's activation is applied first.
          until: stop after this stage (its output, e.g. ``"pool"`` for a new head on the
            penultimate features); None: run to the logits. Must not come before ``layer``.

        Returns:
          logits, as ``self(x)`` would give them.
        """
        i = self._index(layer)
        z = jnp.asarray(z)
        shape = self.feature_shapes()[layer]
        if tuple(z.shape[1:]) != shape:
            if z.ndim == 2 and z.shape[1] == int(np.prod(shape)):
                z = z.reshape(z.shape[0], *shape)
            else:
                raise ValueError(
                    f"tail({layer!r}, z) expects z of shape (n, {', '.join(map(str, shape))}) "
                    f"or flattened (n, {int(np.prod(shape))}), got {tuple(z.shape)}."
                )
        _check_point(point)
        act = self._pre_activation(i) if point == "pre_activation" else None
        if act is not None:
            z = act(z)
        stop = len(self._stage_names()) - 1 if until is None else self._index(until)
        if stop < i:
            raise ValueError(f"tail({layer!r}, until={until!r}): {until!r} comes before {layer!r}.")
        for j in range(i + 1, stop + 1):
            z = self._stage(j, z)
        return z
