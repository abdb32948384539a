"""Convolutional networks: a small CNN, and CIFAR-style ResNet, MobileNet, DenseNet and ShuffleNet.

Inputs are images ``(n, H, W, C)`` (NHWC, floats); an ``(n, H, W)`` batch is
accepted when ``C == 1``. Stage outputs are feature maps ``(n, H', W', C')``
until ``"pool"`` (global average, ``(n, C')``) and ``"logits"``. Use
:func:`models.flatten_features` to turn maps into 2-D representations.

No batch normalisation: the ResNet, MobileNet, DenseNet and ShuffleNet use
GroupNorm, so a model is a pure function of its parameters (no train/eval mode,
no running statistics), which keeps ``features``/``tail`` and checkpoint
resumption exact. These four share one layout (:class:`_StagedConvNet`):
``"stem"``, one named stage per block, ``"pool"`` (global mean) and ``"logits"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from funsim.models.base import FeatureModel


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


class _StagedConvNet(_ConvModel):
    """``stem -> blocks -> global mean -> dense``, one named stage per block.

    Subclasses set ``stem`` (conv) and ``stem_norm`` (or override
    :meth:`_stem`), ``blocks`` (an ``nnx.List``), ``block_names`` and ``head``;
    ``final`` (optional) is applied before the global mean, e.g. the closing
    norm and ReLU of a pre-activation network.

    Layers: ``("stem", *block_names, "pool", "logits")``.
    """

    final = None

    def _stem(self, z):
        return jax.nn.relu(self.stem_norm(self.stem(z)))

    def _stage_names(self):
        return ("stem", *self.block_names, "pool", "logits")

    def _stage(self, i, z):
        nb = len(self.blocks)
        if i == 0:
            return self._stem(z)
        if i <= nb:
            return self.blocks[i - 1](z)
        if i == nb + 1:
            return (z if self.final is None else self.final(z)).mean(axis=(1, 2))
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


class ResNet(_StagedConvNet):
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


class MobileNet(_StagedConvNet):
    """MobileNet-lite (Howard et al. 2017): a stem conv, then depthwise-separable blocks.

    Each entry of ``channels`` is one separable block. By default every block
    after the first halves the resolution (stride 2); ``strides`` sets them
    one by one (e.g. the 13-block CIFAR MobileNet of the paper-scale zoo).

    Layers: ``("stem", "sep0", ..., "pool", "logits")``.

    Args:
      input_shape: ``(H, W, C)``.
      n_classes: number of outputs.
      channels: output channels of each separable block.
      stem_channels: channels of the stem conv.
      strides: the stride (1 or 2) of each block; default ``(1, 2, 2, ...)``.
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
        strides: Sequence[int] | None = None,
        rngs: nnx.Rngs,
    ):
        self.input_shape = _image_shape(input_shape)
        cs = [stem_channels, *[int(c) for c in channels]]
        strides = tuple(1 if i == 0 else 2 for i in range(len(cs) - 1)) if strides is None else tuple(strides)
        if len(strides) != len(cs) - 1 or any(s not in (1, 2) for s in strides):
            raise ValueError(
                f"strides must give 1 or 2 for each of the {len(cs) - 1} blocks in channels, got {strides}."
            )
        self.stem = nnx.Conv(self.input_shape[-1], stem_channels, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.stem_norm = nnx.GroupNorm(stem_channels, num_groups=_groups(stem_channels), rngs=rngs)
        self.blocks = nnx.List(
            [_SeparableBlock(a, b, st, rngs=rngs) for a, b, st in zip(cs[:-1], cs[1:], strides)]
        )
        self.block_names = tuple(f"sep{i}" for i in range(len(self.blocks)))
        self.head = nnx.Linear(cs[-1], n_classes, rngs=rngs)


def _norm(c: int, rngs: nnx.Rngs) -> nnx.GroupNorm:
    return nnx.GroupNorm(c, num_groups=_groups(c), rngs=rngs)


class _DenseLayer(nnx.Module):
    """Pre-activation ``GN -> relu -> conv3x3(growth)``; its output is concatenated to its input."""

    def __init__(self, c_in: int, growth: int, *, rngs: nnx.Rngs):
        self.norm = _norm(c_in, rngs)
        self.conv = nnx.Conv(c_in, growth, (3, 3), padding="SAME", use_bias=False, rngs=rngs)

    def __call__(self, z):
        return jnp.concatenate([z, self.conv(jax.nn.relu(self.norm(z)))], axis=-1)


class _DenseBlock(nnx.Module):
    """``n`` dense layers: ``c_in -> c_in + n * growth`` channels, same resolution."""

    def __init__(self, c_in: int, n: int, growth: int, *, rngs: nnx.Rngs):
        self.layers = nnx.List([_DenseLayer(c_in + i * growth, growth, rngs=rngs) for i in range(n)])

    def __call__(self, z):
        for layer in self.layers:
            z = layer(z)
        return z


class _Transition(nnx.Module):
    """``GN -> relu -> conv1x1(c_out) -> avgpool2``: compresses channels, halves the resolution."""

    def __init__(self, c_in: int, c_out: int, *, rngs: nnx.Rngs):
        self.norm = _norm(c_in, rngs)
        self.conv = nnx.Conv(c_in, c_out, (1, 1), use_bias=False, rngs=rngs)

    def __call__(self, z):
        return _avg_pool2(self.conv(jax.nn.relu(self.norm(z))))


class _NormRelu(nnx.Module):
    def __init__(self, c: int, *, rngs: nnx.Rngs):
        self.norm = _norm(c, rngs)

    def __call__(self, z):
        return jax.nn.relu(self.norm(z))


class DenseNet(_StagedConvNet):
    """CIFAR DenseNet (Huang et al. 2017, §3-4) with GroupNorm; depth = 3n + 4.

    A 3x3 stem conv (``stem_channels``, default ``2 * growth``), then three
    dense blocks of n layers each (every layer: GN, ReLU, 3x3 conv with
    ``growth`` channels, concatenated to its input), with a transition (GN,
    ReLU, 1x1 conv to ``floor(compression * C)`` channels, 2x2 average pool)
    between blocks, a closing GN and ReLU, global mean and a dense head. With
    ``depth=40, growth=12`` this is DenseNet-40 (k = 12); ``compression=0.5``
    and the ``2k`` stem follow the paper's released CIFAR code (``compression=1,
    stem_channels=16`` is Huang et al.'s original DenseNet-40). The default
    is a CPU-sized ``lite`` network (depth 10, growth 8).

    Layers: ``("stem", "dense0", "trans0", "dense1", "trans1", "dense2", "pool",
    "logits")``; ``dense{i}`` is a whole dense block's output (all its
    concatenated channels), ``pool`` includes the closing GN and ReLU.

    Args:
      input_shape: ``(H, W, C)``.
      n_classes: number of outputs.
      depth: 3n + 4 (n >= 1 layers per block): 7, 10, 13, ..., 40, ...
      growth: channels added by each dense layer (k).
      compression: fraction of channels a transition keeps, in (0, 1].
      stem_channels: channels of the stem conv (default ``2 * growth``).
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> m = DenseNet((8, 8, 1), 10, depth=7, growth=4, rngs=nnx.Rngs(0))
      >>> m.feature_shapes()["dense0"], m.feature_shapes()["trans0"], m.feature_shapes()["pool"]
      ((8, 8, 12), (4, 4, 6), (9,))
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        depth: int = 10,
        growth: int = 8,
        compression: float = 0.5,
        stem_channels: int | None = None,
        rngs: nnx.Rngs,
    ):
        if depth < 7 or (depth - 4) % 3 != 0:
            raise ValueError(f"DenseNet depth must be 3n + 4 with n >= 1 (7, 10, 13, ..., 40), got {depth}.")
        if not 0 < compression <= 1:
            raise ValueError(f"DenseNet compression must be in (0, 1], got {compression}.")
        if growth < 1:
            raise ValueError(f"DenseNet growth must be >= 1, got {growth}.")
        self.input_shape = _image_shape(input_shape)
        n = (depth - 4) // 3
        c = 2 * growth if stem_channels is None else int(stem_channels)
        self.stem = nnx.Conv(self.input_shape[-1], c, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        blocks, names = [], []
        for b in range(3):
            blocks.append(_DenseBlock(c, n, growth, rngs=rngs))
            names.append(f"dense{b}")
            c += n * growth
            if b < 2:
                c_out = max(1, int(c * compression))
                blocks.append(_Transition(c, c_out, rngs=rngs))
                names.append(f"trans{b}")
                c = c_out
        self.blocks = nnx.List(blocks)
        self.block_names = tuple(names)
        self.final = _NormRelu(c, rngs=rngs)
        self.head = nnx.Linear(c, n_classes, rngs=rngs)

    def _stem(self, z):
        return self.stem(z)  # pre-activation: the first dense layer normalises


def channel_shuffle(z: jax.Array, /, *, groups: int = 2) -> jax.Array:
    """ShuffleNet's channel shuffle of an NHWC map (Zhang et al. 2018).

    Channels ``[g0_0, ..., g0_{m-1}, g1_0, ...]`` (``groups`` blocks of m)
    become ``[g0_0, g1_0, ..., g0_1, g1_1, ...]``.

    Args:
      z: ``(..., C)`` with C divisible by ``groups``.
      groups: number of channel groups.

    Returns:
      ``(..., C)``, the channels interleaved.

    Examples:
      >>> import jax.numpy as jnp
      >>> channel_shuffle(jnp.arange(6.0), groups=2).tolist()
      [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    """
    c = z.shape[-1]
    if c % groups:
        raise ValueError(f"channel_shuffle: {c} channels are not divisible by groups={groups}.")
    return jnp.swapaxes(z.reshape(*z.shape[:-1], groups, c // groups), -1, -2).reshape(z.shape)


class _ShuffleUnit(nnx.Module):
    """ShuffleNet V2 unit (Ma et al. 2018, Fig. 3c/d), GroupNorm for BatchNorm.

    stride 1: split the channels in half; the second half goes through
    ``1x1-GN-relu, dw3x3-GN, 1x1-GN-relu``; concatenate with the first half.
    stride 2: both branches see all channels (``dw3x3/2-GN, 1x1-GN-relu`` and
    ``1x1-GN-relu, dw3x3/2-GN, 1x1-GN-relu``), each giving ``c_out / 2``.
    Then a channel shuffle with 2 groups.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, *, rngs: nnx.Rngs):
        if c_out % 2 or (stride == 1 and c_in != c_out):
            raise ValueError(
                f"ShuffleNet unit needs an even c_out and c_in == c_out at stride 1, got {c_in} -> {c_out} (stride {stride})."
            )
        b = c_out // 2
        self.stride = stride
        c_b2 = c_in if stride == 2 else b
        if stride == 2:
            self.b1_dw = nnx.Conv(c_in, c_in, (3, 3), strides=2, padding="SAME", feature_group_count=c_in, use_bias=False, rngs=rngs)
            self.b1_norm1 = _norm(c_in, rngs)
            self.b1_pw = nnx.Conv(c_in, b, (1, 1), use_bias=False, rngs=rngs)
            self.b1_norm2 = _norm(b, rngs)
        self.b2_pw1 = nnx.Conv(c_b2, b, (1, 1), use_bias=False, rngs=rngs)
        self.b2_norm1 = _norm(b, rngs)
        self.b2_dw = nnx.Conv(b, b, (3, 3), strides=stride, padding="SAME", feature_group_count=b, use_bias=False, rngs=rngs)
        self.b2_norm2 = _norm(b, rngs)
        self.b2_pw2 = nnx.Conv(b, b, (1, 1), use_bias=False, rngs=rngs)
        self.b2_norm3 = _norm(b, rngs)

    def _branch2(self, z):
        z = jax.nn.relu(self.b2_norm1(self.b2_pw1(z)))
        z = self.b2_norm2(self.b2_dw(z))
        return jax.nn.relu(self.b2_norm3(self.b2_pw2(z)))

    def __call__(self, z):
        if self.stride == 1:
            half = z.shape[-1] // 2
            out = jnp.concatenate([z[..., :half], self._branch2(z[..., half:])], axis=-1)
        else:
            b1 = jax.nn.relu(self.b1_norm2(self.b1_pw(self.b1_norm1(self.b1_dw(z)))))
            out = jnp.concatenate([b1, self._branch2(z)], axis=-1)
        return channel_shuffle(out, groups=2)


class _ConvNormRelu(nnx.Module):
    def __init__(self, c_in: int, c_out: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(c_in, c_out, (1, 1), use_bias=False, rngs=rngs)
        self.norm = _norm(c_out, rngs)

    def __call__(self, z):
        return jax.nn.relu(self.norm(self.conv(z)))


class ShuffleNet(_StagedConvNet):
    """ShuffleNet V2 (Ma et al. 2018) for small images, with GroupNorm.

    A 3x3 stem conv (stride 1: CIFAR resolution is kept, no max pool), three
    stages of shuffle units (the first unit of each has stride 2), a 1x1 conv
    to ``final_channels``, global mean and a dense head. ``channels=(116, 232,
    464), repeats=(4, 8, 4), stem_channels=24, final_channels=1024`` is the
    1.0x network (the same parameters as torchvision's ``shufflenet_v2_x1_0``);
    the default is a CPU-sized ``lite`` network.

    Layers: ``("stem", "unit0_0", ..., "unit2_{r-1}", "conv5", "pool", "logits")``.

    Args:
      input_shape: ``(H, W, C)``.
      n_classes: number of outputs.
      channels: output channels of the three stages (even numbers).
      repeats: units per stage.
      stem_channels: channels of the stem conv.
      final_channels: channels of the closing 1x1 conv (``"conv5"``).
      rngs: ``nnx.Rngs``.

    Examples:
      >>> from flax import nnx
      >>> m = ShuffleNet((8, 8, 1), 10, channels=(8, 16, 32), repeats=(2, 1, 1), stem_channels=4,
      ...                final_channels=32, rngs=nnx.Rngs(0))
      >>> m.layer_names()
      ('stem', 'unit0_0', 'unit0_1', 'unit1_0', 'unit2_0', 'conv5', 'pool', 'logits')
    """

    def __init__(
        self,
        input_shape,
        n_classes: int,
        *,
        channels: Sequence[int] = (32, 64, 128),
        repeats: Sequence[int] = (1, 2, 1),
        stem_channels: int = 16,
        final_channels: int = 256,
        rngs: nnx.Rngs,
    ):
        channels, repeats = tuple(int(c) for c in channels), tuple(int(r) for r in repeats)
        if len(channels) != len(repeats) or not channels or any(r < 1 for r in repeats) or any(c % 2 for c in channels):
            raise ValueError(
                f"ShuffleNet needs one even channel count and one repeat count >= 1 per stage, got "
                f"channels={channels}, repeats={repeats}."
            )
        self.input_shape = _image_shape(input_shape)
        self.stem = nnx.Conv(self.input_shape[-1], stem_channels, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.stem_norm = _norm(stem_channels, rngs)
        blocks, names, c = [], [], stem_channels
        for s, (c_out, r) in enumerate(zip(channels, repeats)):
            for u in range(r):
                blocks.append(_ShuffleUnit(c, c_out, 2 if u == 0 else 1, rngs=rngs))
                names.append(f"unit{s}_{u}")
                c = c_out
        blocks.append(_ConvNormRelu(c, final_channels, rngs=rngs))
        names.append("conv5")
        self.blocks = nnx.List(blocks)
        self.block_names = tuple(names)
        self.head = nnx.Linear(final_channels, n_classes, rngs=rngs)
