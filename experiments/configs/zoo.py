"""``funsim zoo``'s arguments: the zoo config (data sets x architectures x seeds), its named configs,
published reference accuracies and ``add_arguments``. No JAX: ``funsim zoo --help`` imports only this;
the run module, :mod:`funsim.experiments.zoo`, trains the zoo.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from funsim.experiments import config as config_lib

__all__ = ["DataSpec", "ModelSpec", "ZooConfig", "CONFIGS", "REFERENCE_ACCURACY", "config_from_dict", "add_arguments"]

SUPPORTS_MULTIPROCESS = True  # `funsim launch -n N zoo`: models are split over the processes (see run)
# Each process trains its own models, with no collective: the processes do not join JAX's multi-process
# runtime (whose orbax checkpointing would make every save a joint one), only split the list.
JOINS_JAX_RUNTIME = False


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """One data set of the zoo.

    Attributes:
      name: a :func:`experiments.data.load` name (``cifar100_coarse`` trains on the 20 superclasses).
      n_train: keep the first ``n_train`` training examples (None: all).
      n_test: keep the first ``n_test`` test examples (None: all).
      optional: if the data is absent, skip it with the reason in the manifest instead of failing.
      options: extra loader options, e.g. ``{"source": "idx"}`` for Fashion-MNIST.
      train: :class:`models.train.TrainConfig` overrides for this data set (e.g. ``augment``).
    """

    name: str
    n_train: int | None = None
    n_test: int | None = None
    optional: bool = False
    options: dict = dataclasses.field(default_factory=dict)
    train: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One architecture of the zoo.

    Attributes:
      name: the model's name in the zoo, e.g. ``"mlp_wide"``.
      arch: a :func:`models.get_model` name.
      kwargs: the model's keyword options (sizes).
      train: :class:`models.train.TrainConfig` overrides for this model.
    """

    name: str
    arch: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    train: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ZooConfig:
    """A zoo: every data set x model x seed.

    Attributes:
      name: the config's name (the default run name).
      datasets: the data sets.
      models: the architectures.
      seeds: one model per seed (initialisation and minibatch order).
      train: base :class:`models.train.TrainConfig` fields (then the data set's, then the model's overrides).
      n_checkpoints: power-spaced checkpoints per model (``power_schedule(steps, n, power=2)``).
      download: let tfds download missing data (needs internet).
      data_dir: the tfds data directory (None: tfds's default).
    """

    name: str
    datasets: tuple[DataSpec, ...]
    models: tuple[ModelSpec, ...]
    seeds: tuple[int, ...] = (0, 1)
    train: dict = dataclasses.field(default_factory=dict)
    n_checkpoints: int = 8
    download: bool = False
    data_dir: str | None = None


# ----------------------------------------------------------------------------- configs

_SMOKE = ZooConfig(
    name="smoke",
    datasets=(DataSpec("digits", n_train=256, n_test=96),),
    models=(
        ModelSpec("linear", "linear"),
        ModelSpec("mlp", "mlp", {"widths": (16,)}),
        ModelSpec("cnn", "cnn", {"channels": (4,)}),
    ),
    seeds=(0, 1),
    train={"steps": 16, "batch_size": 32, "learning_rate": 1e-2, "eval_every": 8, "eval_train_size": 128},
    n_checkpoints=2,
)

# The offline zoo: 8 architectures x 2 seeds on each data set. Sizes keep the
# run near 25 minutes on 2 quiet CPU cores (README: measured time and load).
_CPU_MODELS = (
    ModelSpec("linear", "linear"),
    ModelSpec("mlp_narrow", "mlp", {"widths": (64, 64)}),
    ModelSpec("mlp_wide", "mlp", {"widths": (256, 256, 256)}),
    ModelSpec("cnn", "cnn", {"channels": (16, 32, 64)}),
    ModelSpec("resnet8", "resnet", {"depth": 8, "width": 8}),
    ModelSpec("densenet_lite", "densenet", {"depth": 10, "growth": 8}),
    # depthwise convolutions are slow on XLA's CPU backend: downsample from the first block
    ModelSpec("mobilenet_lite", "mobilenet", {"channels": (16, 32, 64), "stem_channels": 8, "strides": (2, 2, 2)}),
    ModelSpec("shufflenet_lite", "shufflenet",
              {"channels": (24, 48, 96), "repeats": (1, 1, 1), "stem_channels": 8, "final_channels": 128}),
)

_DEFAULT = ZooConfig(
    name="default",
    datasets=(
        DataSpec("mnist5k"),
        DataSpec("digits"),
        # only from the Debian package's IDX files (`make data`); never tfds here
        DataSpec("fashion_mnist", n_train=6000, n_test=1000, optional=True, options={"source": "idx"}),
    ),
    models=_CPU_MODELS,
    seeds=(0, 1),
    train={"steps": 600, "batch_size": 64, "learning_rate": 3e-3, "eval_every": 150, "eval_train_size": 1000,
           "eval_batch_size": 500},
    n_checkpoints=8,
)

# The usable-information paper code's MLPs (its LinearNet, src/linear_models.py: dense -> BatchNorm -> ReLU ->
# dropout 0.1 per hidden layer) at its five presets' widths, a plain MLP of linear_medium's widths and the
# default CNN for contrast; the default zoo's data, seeds and training. Measured: mnist5k at one seed (the 7
# models) 192 s wall, 89 s CPU on the 2-core CPU under load average 7-10; the whole config is 6 data set x seed runs.
_AUTHORS_WIDTHS = {"small": (512, 256), "medium": (1024, 512, 256), "large": (2048, 1024, 512, 256),
                   "deep": (512, 512, 256, 256, 128), "wide": (2048, 1024)}
_AUTHORS_MLP = dataclasses.replace(_DEFAULT, name="authors_mlp", models=(
    *(ModelSpec(f"mlp_{k}", "mlp", {"widths": w, "batch_norm": True, "dropout": 0.1}) for k, w in _AUTHORS_WIDTHS.items()),
    ModelSpec("mlp_medium_plain", "mlp", {"widths": _AUTHORS_WIDTHS["medium"]}),
    next(m for m in _CPU_MODELS if m.name == "cnn"),
))

# Enough digits models for the study's cluster bootstrap (at least 30 model pairs: 9 models give 36) at a
# CPU budget: the default zoo's MLPs and CNN (no ResNet, whose many layers multiply the stitched pairs),
# three seeds each; for `similarity-study --config unsaturated --set zoo=digits9`.
_DIGITS9 = dataclasses.replace(_DEFAULT, name="digits9", datasets=(DataSpec("digits"),),
                               models=tuple(m for m in _CPU_MODELS if m.name in ("mlp_narrow", "mlp_wide", "cnn")),
                               seeds=(0, 1, 2))

# The paper-scale zoo (Almudevar et al.'s CIFAR/SVHN setting); for a GPU or TPU.
_PAPER = ZooConfig(
    name="paper",
    datasets=(
        DataSpec("cifar10", train={"augment": "crop_flip"}),
        DataSpec("cifar100", train={"augment": "crop_flip"}),
        DataSpec("cifar100_coarse", train={"augment": "crop_flip"}),
        DataSpec("svhn_cropped", train={"augment": "crop"}),  # digits: no mirror images
    ),
    models=(
        ModelSpec("linear", "linear"),
        ModelSpec("mlp_narrow", "mlp", {"widths": (512, 512)}),
        ModelSpec("mlp_wide", "mlp", {"widths": (2048, 2048, 2048)}),
        ModelSpec("cnn", "cnn", {"channels": (32, 64, 128)}),
        ModelSpec("resnet20", "resnet", {"depth": 20, "width": 16}),
        ModelSpec("resnet56", "resnet", {"depth": 56, "width": 16}),
        ModelSpec("densenet40", "densenet", {"depth": 40, "growth": 12}),
        # the 13-block CIFAR MobileNet (Howard et al. 2017 with a stride-1 stem)
        ModelSpec("mobilenet", "mobilenet", {
            "stem_channels": 32,
            "channels": (64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024),
            "strides": (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1),
        }),
        ModelSpec("shufflenet", "shufflenet", {
            "channels": (116, 232, 464), "repeats": (4, 8, 4), "stem_channels": 24, "final_channels": 1024,
        }),
    ),
    seeds=(0, 1),
    train={"steps": 40_000, "batch_size": 128, "learning_rate": 2e-3, "optimizer": "adamw", "weight_decay": 5e-2,
           "warmup_steps": 1000, "eval_every": 2000, "eval_train_size": 5000, "eval_batch_size": 1000},
    n_checkpoints=10,
)

CONFIGS: dict[str, ZooConfig] = {"smoke": _SMOKE, "default": _DEFAULT, "authors_mlp": _AUTHORS_MLP,
                                 "digits9": _DIGITS9, "paper": _PAPER}

# Published test accuracies of the paper-scale architectures (as published: BatchNorm,
# standard augmentation), for the summary. Ours use GroupNorm, and the paper's DenseNet
# compresses at transitions: close relatives, not the same networks.
REFERENCE_ACCURACY = {
    ("cifar10", "resnet20"): (0.9125, "He et al. 2016, Table 6"),
    ("cifar10", "resnet56"): (0.9303, "He et al. 2016, Table 6"),
    ("cifar10", "densenet40"): (0.9476, "Huang et al. 2017, Table 2 (C10+, no compression)"),
    ("cifar100", "densenet40"): (0.7558, "Huang et al. 2017, Table 2 (C100+, no compression)"),
    ("svhn_cropped", "densenet40"): (0.9821, "Huang et al. 2017, Table 2 (SVHN, no compression)"),
}


def config_from_dict(d: Mapping[str, Any]) -> ZooConfig:
    """A :class:`ZooConfig` from its JSON form (``config.json``), or ``{"base": name, **overrides}``.

    Examples:
      >>> config_from_dict({"base": "smoke", "seeds": [0]}).seeds
      (0,)
    """
    return config_lib.from_dict(ZooConfig, CONFIGS, d)  # typed: data sets and models become DataSpec / ModelSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, ZooConfig, CONFIGS, run_options=True)
    parser.add_argument("--download", action="store_true", help="let tfds download missing data sets (internet)")
    parser.add_argument("--data-dir", default=None, help="the tfds data directory")

