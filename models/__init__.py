"""funsim.models: Flax NNX networks with layer access.

Every model exposes ``features(x) -> {layer: activations}``, ``layer_names()``
and ``tail(layer, z) -> logits`` (the rest of the network from a layer);
:func:`compiled` runs them as jitted programs, in chunks of rows.
Convolutional and sequence activations are turned into 2-D representations by
:func:`flatten_features` with an explicit policy.
"""

from __future__ import annotations

from flax import nnx

from funsim.models.base import FeatureModel as FeatureModel
from funsim.models.base import flatten as flatten
from funsim.models.base import flatten_features as flatten_features
from funsim.models.base import unknown_name_error as _unknown_name_error
from funsim.models.bilinear import BilinearMLP as BilinearMLP
from funsim.models.bilinear import BilinearTransformer as BilinearTransformer
from funsim.models.bilinear import TokenPairs as TokenPairs
from funsim.models.bilinear import bilinear_attention as bilinear_attention
from funsim.models.compiled import CompiledModel as CompiledModel
from funsim.models.compiled import compiled as compiled
from funsim.models.cnn import CNN as CNN
from funsim.models.cnn import DenseNet as DenseNet
from funsim.models.cnn import MobileNet as MobileNet
from funsim.models.cnn import ResNet as ResNet
from funsim.models.cnn import ShuffleNet as ShuffleNet
from funsim.models.cnn import channel_shuffle as channel_shuffle
from funsim.models.mlp import MLP as MLP
from funsim.models.mlp import Linear as Linear
from funsim.models.tails import TailApply as TailApply
from funsim.models.tails import split_tail as split_tail
from funsim.models.tails import stack_tails as stack_tails
from funsim.models.tails import HeadTail as HeadTail
from funsim.models.tails import penultimate as penultimate
from funsim.models.tails import stack_head_tails as stack_head_tails
from funsim.models.tails import train_head as train_head
from funsim.models.tails import CoarseTail as CoarseTail
from funsim.models.tails import coarsen_logits as coarsen_logits

MODELS = {
    "linear": Linear,
    "mlp": MLP,
    "cnn": CNN,
    "resnet": ResNet,
    "mobilenet": MobileNet,
    "densenet": DenseNet,
    "shufflenet": ShuffleNet,
    "bilinear_mlp": BilinearMLP,
    "bilinear_transformer": BilinearTransformer,
}


def list_models() -> tuple[str, ...]:
    """Names accepted by :func:`get_model`."""
    return tuple(MODELS)


def get_model(name: str, *args, seed: int = 0, rngs: nnx.Rngs | None = None, **kwargs) -> FeatureModel:
    """Build a model by name.

    Args:
      name: one of :func:`list_models`.
      *args: the model's positional arguments (e.g. ``input_shape, n_classes``).
      seed: used for ``nnx.Rngs(seed)`` when ``rngs`` is not given.
      rngs: explicit ``nnx.Rngs``.
      **kwargs: the model's keyword options.

    Returns:
      the model.

    Raises:
      ValueError: for an unknown name (the message lists the valid ones).

    Examples:
      >>> get_model("mlp", 4, 3, widths=(8,)).layer_names()
      ('fc0', 'logits')
    """
    if name not in MODELS:
        raise _unknown_name_error("model name", name, MODELS)
    return MODELS[name](*args, rngs=rngs if rngs is not None else nnx.Rngs(seed), **kwargs)
