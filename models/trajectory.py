"""A training run as a sequence of networks: the pure network of every saved checkpoint.

:func:`models.train.train` saves checkpoints in a run's ``workdir``; the similarity measures take
pure networks (``model.to_network()``: a tuple of layers, or a ``similarity.AttentionNetwork``).
:func:`checkpoint_networks` reads the checkpoints back into a fresh model each and returns those
networks, step 0 being the model as built (its initialisation);
``similarity.checkpoints.stack_networks`` stacks them along a leading checkpoint axis.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence

from flax import nnx
from tqdm.auto import tqdm

from funsim.models.train import TrainConfig, load_checkpoint

__all__ = ["checkpoint_networks"]


def checkpoint_networks(make: Callable[[], nnx.Module], workdir: str | pathlib.Path, steps: Sequence[int], /, *,
                        config: TrainConfig, to_network: Callable | None = None, progress: bool = False) -> list:
    """The network of each checkpoint in ``steps`` of the run saved in ``workdir``.

    Args:
      make: builds the run's model as it was before training (same structure and seed):
        step 0 is ``make()`` itself, every other step ``make()`` with that checkpoint loaded.
      workdir: the run's folder (:func:`models.train.train`'s ``workdir``).
      steps: checkpoint steps (0: the initialisation); each other one must be saved.
      config: the run's :class:`models.train.TrainConfig` (it shapes the stored optimiser state).
      to_network: model -> pure network (default: ``model.to_network()``).
      progress: a progress bar over the checkpoints.

    Returns:
      one network per step, in the order of ``steps``.

    Raises:
      ValueError: a step that has no checkpoint (the message lists the saved ones).
      FileNotFoundError: no checkpoint at all in ``workdir``.
    """
    convert = to_network or (lambda m: m.to_network())
    nets = []
    for step in tqdm(steps, desc="loading checkpoints", disable=not progress, leave=False):
        model = make()
        if step:
            load_checkpoint(model, workdir, step, config=config)
        nets.append(convert(model))
    return nets

