"""``funsim quickstart``'s arguments: its config and command-line options (imports no JAX).

The run itself is :mod:`funsim.experiments.quickstart`.
"""

from __future__ import annotations

import argparse
import dataclasses

from funsim.experiments import config as config_lib

__all__ = ["DEFAULT_MEASURES", "TENSOR_METRICS", "QuickstartConfig", "TINY", "add_arguments"]

# One or more of each family, chosen to keep `make demo` near a minute on 2 cores.
# (svcca and regression/r2 are slower per call; affine stitching below *is* the
# held-out regression R^2.) `--measures all` runs every registered measure.
DEFAULT_MEASURES = (
    "cka/linear",
    "cka/linear/debiased",
    "cka/rbf",
    "rsa/correlation/spearman",
    "cca/mean",
    "pwcca",
    "nbs",
    "procrustes",
    "shape/angular/alpha=0.5",
)
TENSOR_METRICS = ("frobenius", "symmetric", "gaussian")


@dataclasses.dataclass(frozen=True)
class QuickstartConfig:
    """Everything the quickstart does; saved as config.json."""

    dataset: str = "digits"
    steps: int = 400
    batch_size: int = 128
    learning_rate: float = 3e-3
    seeds: tuple[int, ...] = (0, 1)
    mlp_widths: tuple[int, ...] = (64, 64)
    bilinear_d_model: int = 64  # same width as the MLP: fewer shapes to compile
    bilinear_d_hidden: int = 64
    n_checkpoints: int = 5
    n_evals: int = 8  # evaluations per training run (plus step 0)
    n_compare: int = 300
    measures: tuple[str, ...] = DEFAULT_MEASURES
    stitch_split: float = 0.5
    stitch_ridge: float = 1e-3
    n_train: int | None = None


TINY = QuickstartConfig(
    # every layer 10 wide (= the 10 digit classes): one compiled shape per measure and family
    steps=12, batch_size=32, seeds=(0, 1), mlp_widths=(10,), bilinear_d_model=10, bilinear_d_hidden=8,
    n_checkpoints=2, n_evals=2, n_compare=60, measures=("cka/linear",), n_train=200,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="digits", choices=["digits", "mnist5k", "fashion_mnist"],
                        help="an offline data set (default: digits)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per model")
    parser.add_argument("--n-compare", type=int, default=None, help="held-out inputs used for the comparisons")
    parser.add_argument("--measures", default=None,
                        help="comma-separated registry names, or 'all' (default: a representative set)")
    parser.add_argument("--root", default="results", help="results root directory (default: results)")
    parser.add_argument("--run", default=None, help="run name (default: a UTC timestamp)")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: tiny models and data, about 13 s on 2 CPU cores, mostly XLA compilation "
                             "(compiled with XLA's backend optimisation off)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")
    config_lib.add_arguments(parser, QuickstartConfig, {}, config=False)
