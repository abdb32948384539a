"""Convolutional networks: a small CNN, a CIFAR-style ResNet and a MobileNet-lite.

Inputs are images ``(n, H, W, C)`` (NHWC, floats); an ``(n, H, W)`` batch is
accepted when ``C == 1``. Stage outputs are feature maps ``(n, H', W', C')``
until ``"pool"`` (global average, ``(n, C')``) and ``"logits"``. Use
:func:`models.flatten_features` to turn maps into 2-D representations.

No batch normalisation: the ResNet and MobileNet use GroupNorm, so a model is a
pure function of its parameters (no train/eval mode, no running statistics),
which keeps ``features``/``tail`` and checkpoint resumption exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models.base import FeatureModel


def _image_shape(input_shape) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3:
        raise ValueError(
            f"input_shape must be (H, W, C) for a convolutional model, got {tuple(input_shape)}."
        )
    return shape


class _ConvModel(FeatureModel):
    def _prepare(self, x):
        x = jnp.asarray(x)
        if x.ndim == 3 and self.input_shape[-1] == 1:
            x = x[..., None]
        return super()._prepare(x)


def _groups(c: int) -> int:
    for g in (8, 4, 2):
        if c % g == 0:
            return g
    return 1


def _avg_pool2(z):
    return nnx.avg_pool(z, window_shape=(2, 2), strides=(2, 2), padding="SAME")


class CNN(_ConvModel):
    """Small CNN: ``[conv3x3 -> relu -> avgpool2] * len(channels) -> global mean -> dense``.

    Layers: ``("conv0", ..., "pool", "logits")``.

    Args:
      input_shape: ``(H, W, C)`` (or ``(H, W)`` for one channel).
      n_classes: number of outputs.
      channels: output channels of each conv stage.
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> m = CNN((8, 8, 1), 10, channels=(4, 8), rngs=nnx.Rngs(0))
      >>> {k: v.shape for k, v in m.features(jnp.ones((2, 8, 8, 1))).items()}
      {'conv0': (2, 4, 4, 4), 'conv1': (2, 2, 2, 8), 'pool': (2, 8), 'logits': (2, 10)}
    """

    def __init__(self, input_shape, n_classes: int, *, channels: Sequence[int] = (16, 32), rngs: nnx.Rngs):
        self.input_shape = _image_shape(input_shape)
        cs = [self.input_shape[-1], *[int(c) for c in channels]]
        self.convs = nnx.List(
            [nnx.Conv(a, b, kernel_size=(3, 3), padding="SAME", rngs=rngs) for a, b in zip(cs[:-1], cs[1:])]
        )
        self.head = nnx.Linear(cs[-1], n_classes, rngs=rngs)

    def _stage_names(self):
        return (*(f"conv{i}" for i in range(len(self.convs))), "pool", "logits")

    def _stage(self, i, z):
        k = len(self.convs)
        if i < k:
            return _avg_pool2(jax.nn.relu(self.convs[i](z)))
        if i == k:
            return z.mean(axis=(1, 2))
        return self.head(z)


class _BasicBlock(nnx.Module):
    """Pre-activation-free basic block: conv-GN-relu-conv-GN + shortcut, relu."""

    def __init__(self, c_in: int, c_out: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(c_in, c_out, (3, 3), strides=stride, padding="SAME", use_bias=False, rngs=rngs)
        self.norm1 = nnx.GroupNorm(c_out, num_groups=_groups(c_out), rngs=rngs)
        self.conv2 = nnx.Conv(c_out, c_out, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.norm2 = nnx.GroupNorm(c_out, num_groups=_groups(c_out), rngs=rngs)
        if stride != 1 or c_in != c_out:
            self.proj = nnx.Conv(c_in, c_out, (1, 1), strides=stride, use_bias=False, rngs=rngs)
        else:
            self.proj = None

    def __call__(self, z):
        h = jax.nn.relu(self.norm1(self.conv1(z)))
        h = self.norm2(self.conv2(h))
        s = z if self.proj is None else self.proj(z)
        return jax.nn.relu(h + s)


class ResNet(_ConvModel):
    """CIFAR-style ResNet (He et al. 2016, §4.2) with GroupNorm; depth = 6k + 2.

    Stem conv (``width`` channels), then three stages of k basic blocks with
    ``width, 2*width, 4*width`` channels (stride 2 at the start of stages 2
    and 3), global mean, dense head. Depths 8, 14, 20, ... (k = 1, 2, 3).

    Layers: ``("stem", "block0_0", ..., "block2_{k-1}", "pool", "logits")``.

    Args:
      input_shape: ``(H, W, C)``.
      n_classes: number of outputs.
      depth: 6k + 2.
      width: channels of the first stage.
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> m = ResNet((8, 8, 3), 10, depth=8, width=4, rngs=nnx.Rngs(0))
      >>> m.layer_names()
      ('stem', 'block0_0', 'block1_0', 'block2_0', 'pool', 'logits')
    """

    def __init__(self, input_shape, n_classes: int, *, depth: int = 8, width: int = 16, rngs: nnx.Rngs):
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"ResNet depth must be 6k + 2 with k >= 1 (8, 14, 20, ...), got {depth}.")
        self.input_shape = _image_shape(input_shape)
        self.depth = depth
        k = (depth - 2) // 6
        self.stem = nnx.Conv(self.input_shape[-1], width, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.stem_norm = nnx.GroupNorm(width, num_groups=_groups(width), rngs=rngs)
        blocks, names, c = [], [], width
        for s in range(3):
            c_out = width * 2**s
            for b in range(k):
                stride = 2 if (s > 0 and b == 0) else 1
                blocks.append(_BasicBlock(c, c_out, stride, rngs=rngs))
                names.append(f"block{s}_{b}")
                c = c_out
        self.blocks = nnx.List(blocks)
        self.block_names = tuple(names)
        self.head = nnx.Linear(c, n_classes, rngs=rngs)

    def _stage_names(self):
        return ("stem", *self.block_names, "pool", "logits")

    def _stage(self, i, z):
        nb = len(self.blocks)
        if i == 0:
            return jax.nn.relu(self.stem_norm(self.stem(z)))
        if i <= nb:
            return self.blocks[i - 1](z)
        if i == nb + 1:
            return z.mean(axis=(1, 2))
        return self.head(z)


class _SeparableBlock(nnx.Module):
    """Depthwise 3x3 conv -> GN -> relu -> pointwise 1x1 conv -> GN -> relu."""

    def __init__(self, c_in: int, c_out: int, stride: int, *, rngs: nnx.Rngs):
        self.depthwise = nnx.Conv(
            c_in, c_in, (3, 3), strides=stride, padding="SAME", feature_group_count=c_in, use_bias=False, rngs=rngs
        )
        self.norm1 = nnx.GroupNorm(c_in, num_groups=_groups(c_in), rngs=rngs)
        self.pointwise = nnx.Conv(c_in, c_out, (1, 1), use_bias=False, rngs=rngs)
        self.norm2 = nnx.GroupNorm(c_out, num_groups=_groups(c_out), rngs=rngs)

    def __call__(self, z):
        z = jax.nn.relu(self.norm1(self.depthwise(z)))
        return jax.nn.relu(self.norm2(self.pointwise(z)))


class MobileNet(_ConvModel):
    """MobileNet-lite (Howard et al. 2017): a stem conv, then depthwise-separable blocks.

    Each entry of ``channels`` is one separable block; every block after the
    first halves the resolution (stride 2).

    Layers: ``("stem", "sep0", ..., "pool", "logits")``.

    Args:
      input_shape: ``(H, W, C)``.
      n_classes: number of outputs.
      channels: output channels of each separable block.
      stem_channels: channels of the stem conv.
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> m = MobileNet((8, 8, 1), 10, channels=(8, 16), stem_channels=4, rngs=nnx.Rngs(0))
      >>> m.layer_names()
      ('stem', 'sep0', 'sep1', 'pool', 'logits')
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        channels: Sequence[int] = (32, 64, 128),
        stem_channels: int = 16,
        rngs: nnx.Rngs,
    ):
        self.input_shape = _image_shape(input_shape)
        self.stem = nnx.Conv(self.input_shape[-1], stem_channels, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.stem_norm = nnx.GroupNorm(stem_channels, num_groups=_groups(stem_channels), rngs=rngs)
        cs = [stem_channels, *[int(c) for c in channels]]
        self.blocks = nnx.List(
            [_SeparableBlock(a, b, 1 if i == 0 else 2, rngs=rngs) for i, (a, b) in enumerate(zip(cs[:-1], cs[1:]))]
        )
        self.head = nnx.Linear(cs[-1], n_classes, rngs=rngs)

    def _stage_names(self):
        return ("stem", *(f"sep{i}" for i in range(len(self.blocks))), "pool", "logits")

    def _stage(self, i, z):
        nb = len(self.blocks)
        if i == 0:
            return jax.nn.relu(self.stem_norm(self.stem(z)))
        if i <= nb:
            return self.blocks[i - 1](z)
        if i == nb + 1:
            return z.mean(axis=(1, 2))
        return self.head(z)
