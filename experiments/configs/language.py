"""``funsim language``'s arguments: :class:`LanguageConfig`, its named configs, the matrices and the verdict rules.

Imports no JAX (``funsim language --help`` answers at once); the run module,
:mod:`funsim.experiments.language`, does the work and re-exports these names.
"""

from __future__ import annotations

import argparse
import dataclasses

from funsim.experiments import config as config_lib
from funsim.experiments.verdict import Rule

#: The checkpoint x checkpoint matrices, keyed as :mod:`funsim.similarity.checkpoints`
#: keys them, with the label each has in the summary and the figures. The tensor ones use the
#: Gaussian metric on ``context`` positions, at the token-space scale 1/sqrt(V) unless stated.
MATRICES = {
    "tensor/gaussian/layers=1": "tensor, layer 1 exact (scale 1/sqrt(V))",
    "tensor/gaussian/layers=1/scale=1": "tensor, layer 1 exact (scale 1, paper)",
    "tensor/gaussian/monte_carlo": "tensor, 2 layers Monte Carlo (1/sqrt(V))",
    "tensor/gaussian/monte_carlo/scale=1": "tensor, 2 layers Monte Carlo (scale 1, paper)",
    "behavioral/held_out": "behavioural (held-out text)",
    "weight_cosine": "matrix cosine (weights)",
}

PAPER_CLAIM = (
    "tensor similarity shows sharp transitions and block structure across training checkpoints "
    "that the baselines (behavioural similarity on text, matrix cosine of weights) blur"
)

#: The primary tensor matrix the rules read by default (``LanguageConfig.primary``): the full two-layer network
#: by Monte Carlo at scale 1/sqrt(V). ``paper_scale`` reads the same network at the paper's scale 1.
PRIMARY = "tensor/gaussian/monte_carlo"

#: The statistics ``experiments.language.verdict_statistics`` computes.
STATISTICS = {
    "explained_margin": "share of the primary tensor matrix's dispersion its K = 3 blocks explain, minus the "
                        "largest such share among the baselines (behavioural, matrix cosine)",
    "primary_transition_ratio": "max / median over adjacent checkpoints of 1 - S[i, i+1], primary tensor matrix",
    "transition_ratio_margin": "that ratio minus the same ratio of behavioural similarity",
    "block_contrast_margin": "K = 3 blocks' within- minus between-block mean similarity, primary minus best baseline",
    "late_range_margin": "share of the primary tensor matrix's range of similarity to the final checkpoint "
                         "still to come after the bigram agreement peaks, minus the same for behavioural similarity",
    "primary_max_similarity_se": "largest standard error of an entry of the primary matrix (0: computed exactly)",
}

#: The verdict rules, committed before the runs they judge. Thresholds set knowing the first pass
#: (d_model 64: explained 0.864 vs matrix cosine 0.875, margin -0.011; smooth bands, no sharp
#: transition; late range margin 0.36). The paper's claim counts as reproduced only if the block
#: rule and both transition rules pass (:data:`CLAIM_RULES`); else "not reproduced at this scale".
#: Every rule requires a primary matrix measured to 0.01 (added after the ``paper_scale`` run, whose scale-1
#: Monte Carlo matrix had errors up to 0.32 and labels that flip with the random key; 1/sqrt(V): at most 6.4e-4).
PRECISE = Rule("the primary matrix is measured to 0.01", "primary_max_similarity_se", "<", 0.01,
               labels=("measured", "Monte Carlo error too large"))
RULES: tuple[Rule, ...] = (
    Rule("block structure sharper than the baselines", "explained_margin", ">", 0.02, requires=(PRECISE,)),
    Rule("sharp transitions in tensor similarity", "primary_transition_ratio", ">=", 3.0, requires=(PRECISE,)),
    Rule("transitions sharper than behavioural similarity's", "transition_ratio_margin", ">", 0.0, requires=(PRECISE,)),
    Rule("tensor similarity keeps moving after the logits settle", "late_range_margin", ">", 0.2, requires=(PRECISE,)),
    Rule("block contrast sharper than the baselines'", "block_contrast_margin", ">", 0.1, requires=(PRECISE,)),
)
#: The statistics whose rules must all pass for the paper's claim (sharp transitions and block structure).
CLAIM_RULES = ("explained_margin", "primary_transition_ratio", "transition_ratio_margin")
#: The claim by rules that pass on the authors' matrices (0.1: half their block contrast margin 0.208).
CALIBRATED_CLAIM_RULES = ("block_contrast_margin", "primary_transition_ratio")

#: What the paper's width (d_model 256) costs and gave on this project's 2-core CPU machine (measured; see
#: experiments/README.md for the commands and load).
WIDE_COST = ("`wide_paper_recipe` (the paper's learning rate 1e-3 and 500 warmup steps) trained and ran in 15.4 min "
             "wall on 2026-12-06 (training 6.0 min, analysis 9.3 min, beside a study run); `wide`, with the d_model-64 "
             "recipe, diverged after step 250 (34 min at load 5-7; experiments/README.md)")


@dataclasses.dataclass(frozen=True)
class LanguageConfig(config_lib.RuledConfig, statistics=STATISTICS):
    """Everything the experiment does; saved as config.json (a changed config is refused on resume)."""

    seq_len: int = 32
    max_chars: int | None = None
    d_model: int = 64
    n_heads: int = 8
    d_head: int = 8
    n_layers: int = 2
    steps: int = 3000
    batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 100
    eval_every: int = 250
    n_checkpoints: int = 20
    checkpoint_power: float = 2.0
    seed: int = 0
    context: int = 4
    mc_samples: int = 32768
    mc_batches: int = 16
    mc_check_pairs: int = 3
    closure_checkpoints: int = 6
    n_eval_windows: int = 512
    ngram_orders: tuple[int, ...] = (2, 3, 4)
    ngram_min_count: int = 10
    segments: tuple[int, ...] = (2, 3, 4)
    verdict_rules: tuple[Rule, ...] = RULES
    primary: str = PRIMARY  # the tensor matrix (a key of MATRICES) the statistics read

    def __post_init__(self):
        super().__post_init__()
        if self.primary not in MATRICES or not self.primary.startswith("tensor/"):
            raise ValueError(f"primary must be a tensor matrix of {list(MATRICES)[:4]}, got {self.primary!r}.")


CONFIGS = {
    "smoke": LanguageConfig(
        seq_len=8, max_chars=60_000, d_model=8, n_heads=2, d_head=4, steps=40, batch_size=16,
        warmup_steps=0, eval_every=20, n_checkpoints=4, context=2, mc_samples=512, mc_batches=4,
        mc_check_pairs=1, closure_checkpoints=0, n_eval_windows=32, ngram_orders=(2, 3), ngram_min_count=2,
        segments=(2,),
    ),
    "default": LanguageConfig(),
    # The paper's width (d_model 256, 8 heads of 32) at the default protocol's length, with 11 checkpoints
    # (55 pairs) and no closure subset (at d_model 64 the closure and the Monte Carlo matrix agreed to 0.001).
    # Measured: WIDE_COST (this recipe's training diverged; `wide_paper_recipe` trains).
    # `default` judged on the two-layer matrix at the paper's input scale 1 (same rules, same run).
    "paper_scale": LanguageConfig(primary="tensor/gaussian/monte_carlo/scale=1"),
    "wide": LanguageConfig(d_model=256, n_heads=8, d_head=32, n_checkpoints=10, closure_checkpoints=0),
    # `wide` with the `paper` config's optimiser (peak learning rate 1e-3, 500 warmup steps), since `wide`'s
    # d_model-64 recipe (3e-3, 100 warmup steps) diverged at this width. Chosen before its first run, from
    # that divergence alone; the verdict rules are the same as every other config's.
    "wide_paper_recipe": LanguageConfig(d_model=256, n_heads=8, d_head=32, n_checkpoints=10, closure_checkpoints=0,
                                        learning_rate=1e-3, warmup_steps=500),
    "paper": LanguageConfig(
        seq_len=128, d_model=256, n_heads=8, d_head=32, steps=20_000, batch_size=128, learning_rate=1e-3,
        warmup_steps=500, eval_every=500, n_checkpoints=50, mc_samples=262_144, mc_batches=32,
        closure_checkpoints=20, n_eval_windows=2048,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_lib.add_arguments(parser, LanguageConfig, CONFIGS, run_options=True, authors=True)
