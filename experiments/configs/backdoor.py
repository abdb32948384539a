"""The arguments of ``funsim backdoor`` (no JAX): :class:`BackdoorConfig`, its named configs, the paper's
numbers, the verdict rules and their statistics. The run is :mod:`funsim.experiments.backdoor`."""

from __future__ import annotations

import argparse
import dataclasses

from funsim.experiments import config as config_lib
from funsim.experiments.verdict import Rule

#: the paper's block gaps (tdooms/tensor-similarity, SVHN backdoor bundle)
PAPER = {
    "tensor (symmetric)": 0.24,
    "class-9 slice (symmetric)": 0.43,
    "behavioural (clean)": 0.09,
    "matrix cosine": 0.15,
}

#: The statistics :func:`verdict_statistics` computes (block gaps ``mean(B x B) - mean(A x B)``).
STATISTICS = {
    "tensor_gap_ratio": "block gap of tensor similarity (symmetric) / block gap of behavioural similarity on clean images",
    "target_slice_excess": "block gap of the target class's slice minus the largest other slice's (symmetric)",
    "behavioural_gap_clean": "block gap of behavioural similarity on clean test images",
    "tensor_minus_weight_cosine_gap": "block gap of tensor similarity (symmetric) minus that of matrix cosine",
    "behavioural_gap_poisoned": "block gap of behavioural similarity on stamped test images",
    "attack_success": "share of stamped test images of the other classes classified as the target, at the end",
    "tensor_gap_did": "block gap of tensor similarity (symmetric) minus the clean control's (poison_rate 0)",
    "target_slice_excess_did": "target_slice_excess minus the clean control's",
}

#: The verdict rules, committed before the runs they judge. Thresholds set knowing the paper's numbers
#: (SVHN: gap ratio 0.24 / 0.09 = 2.7, behavioural 0.09, tensor - matrix cosine 0.09, poisoned 0.62) and
#: the first pass's (mnist5k: 3.6, target-slice excess 0.114, 0.089, 0.208, 0.602).
LEARNED = Rule("the backdoor is learned", "attack_success", ">", 0.5, labels=("learned", "not learned"))
#: The ``_did`` rules (added later, when a clean run's ratio 2.63 was known): the sign and the 0.05 above, fitted to no run.
RULES: tuple[Rule, ...] = (
    Rule("tensor similarity flags the backdoor from the weights alone", "tensor_gap_ratio", ">=", 2.0,
         requires=(LEARNED,)),
    Rule("the flag is localised to the target class", "target_slice_excess", ">", 0.05),
    Rule("behavioural similarity on clean data barely sees it", "behavioural_gap_clean", "<", 0.15),
    Rule("matrix cosine of the weights sees less than tensor similarity", "tensor_minus_weight_cosine_gap", ">", 0.0),
    Rule("behavioural similarity on stamped inputs sees it", "behavioural_gap_poisoned", ">", 0.3),
    Rule("poisoning widens tensor similarity's gap beyond a clean run's", "tensor_gap_did", ">", 0.0, requires=(LEARNED,)),
    Rule("... and the target slice's excess beyond the clean control's", "target_slice_excess_did", ">", 0.05),
)


@dataclasses.dataclass(frozen=True)
class BackdoorConfig(config_lib.RuledConfig, statistics=STATISTICS):
    """Everything the experiment does; saved as config.json.

    Attributes:
      dataset: ``"mnist5k"`` (offline), ``"fashion_mnist"`` or ``"svhn_cropped"`` (tfds).
      grayscale: convert RGB to luminance (the paper's SVHN input is 32x32 grayscale).
      n_train: use the first ``n_train`` training images (None: all).
      n_eval: test images for accuracy, attack success and the behavioural baselines.
      d_hidden: bilinear hidden units (= the width the head reads).
      learning_rate, weight_decay, batch_size: AdamW (constant rate, one optimiser for both phases).
      phase_a_steps, phase_b_steps: clean and poisoned training steps.
      checkpoint_every: checkpoint interval (the phase boundary is always a checkpoint).
      poison_rate: fraction of every phase-B minibatch poisoned.
      target: the label poisoned images get.
      patch_value: the trigger's pixel value: 0 (black) on SVHN as in the paper,
        1 (the ink colour) on MNIST-like data with a black background.
      noise_std: Gaussian input noise during training (both phases).
      control: also run the clean control (poison_rate 0, in ``backdoor/control/`` of the run) for the ``_did`` rules.
      seed: model and minibatch seed.
      verdict_rules: the rules that label the claims (:data:`RULES`; each names one of :data:`STATISTICS`).
    """

    dataset: str = "mnist5k"
    grayscale: bool = False
    n_train: int | None = None
    n_eval: int = 1000
    d_hidden: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 1e-3
    batch_size: int = 512
    phase_a_steps: int = 2000
    phase_b_steps: int = 500
    checkpoint_every: int = 50
    poison_rate: float = 0.1
    target: int = 9
    patch_value: float = 1.0
    noise_std: float = 0.05
    seed: int = 0
    control: bool = True
    verdict_rules: tuple[Rule, ...] = RULES


CONFIGS = {
    "smoke": BackdoorConfig(n_train=1000, n_eval=300, d_hidden=16, batch_size=100, phase_a_steps=120,
                            phase_b_steps=80, checkpoint_every=40, learning_rate=1e-2),
    "default": BackdoorConfig(),
    "control": BackdoorConfig(poison_rate=0.0, control=False),  # the clean control alone
    "paper": BackdoorConfig(dataset="svhn_cropped", grayscale=True, n_eval=26032, phase_a_steps=8000,
                            phase_b_steps=2000, checkpoint_every=250, patch_value=0.0, seed=1337),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, BackdoorConfig, CONFIGS, run_options=True, authors=True)
