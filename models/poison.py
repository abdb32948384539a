"""Data poisoning for training: a trigger patch stamped on a share of every minibatch, relabelled.

The tensor-similarity paper's SVHN backdoor: a filled diamond (:func:`diamond_mask`) in the
top-right corner, stamped (:func:`stamp`) on exactly ``round(rate * n)`` examples of each
minibatch, which are relabelled to the target class (:func:`poison_batch`).
:class:`PoisonTransform` is the hashable minibatch transform of :func:`models.train.train`
(``batch_transform=``), with Gaussian input noise; :func:`attack_success` measures the result.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["diamond_mask", "stamp", "poison_batch", "PoisonTransform", "attack_success"]


def diamond_mask(height: int, width: int, /, *, patch_width: int = 5, patch_height: int = 7, margin: int = 2) -> np.ndarray:
    """The trigger: a filled diamond in a ``patch_width`` x ``patch_height`` box at the top-right corner.

    The box starts ``margin`` pixels below the top edge and ends ``margin``
    pixels left of the right edge. Inside it, pixel ``(r, c)`` is on when
    ``|r - r0| / (patch_height / 2) + |c - c0| / (patch_width / 2) <= 1``, with
    ``(r0, c0)`` the box's centre: a rhombus touching the middle of every side.
    For 5 x 7 the rows are 1, 3, 3, 5, 3, 3, 1 pixels wide (19 pixels).

    Args:
      height, width: the image size.
      patch_width, patch_height: the box.
      margin: distance of the box from the top and right edges.

    Returns:
      ``(height, width)`` bool mask.

    Examples:
      >>> diamond_mask(12, 12).astype(int)[2:9, 5:10]
      array([[0, 0, 1, 0, 0],
             [0, 1, 1, 1, 0],
             [0, 1, 1, 1, 0],
             [1, 1, 1, 1, 1],
             [0, 1, 1, 1, 0],
             [0, 1, 1, 1, 0],
             [0, 0, 1, 0, 0]])
    """
    if patch_height + margin > height or patch_width + margin > width or min(patch_width, patch_height, margin + 1) < 1:
        raise ValueError(
            f"A {patch_width} x {patch_height} patch with margin {margin} does not fit a {height} x {width} image."
        )
    r = np.arange(patch_height)[:, None] - (patch_height - 1) / 2
    c = np.arange(patch_width)[None, :] - (patch_width - 1) / 2
    inside = np.abs(r) / (patch_height / 2) + np.abs(c) / (patch_width / 2) <= 1
    mask = np.zeros((height, width), bool)
    mask[margin:margin + patch_height, width - margin - patch_width:width - margin] = inside
    return mask


def stamp(x, mask, /, *, value: float):
    """Images ``x (n, H, W, C)`` with the pixels of ``mask (H, W)`` set to ``value`` in every channel.

    Examples:
      >>> stamp(np.zeros((1, 2, 2, 1)), np.array([[True, False], [False, False]]), value=1.0)[0, :, :, 0].tolist()
      [[1.0, 0.0], [0.0, 0.0]]
    """
    return jnp.where(jnp.asarray(mask)[None, :, :, None], jnp.asarray(value, jnp.asarray(x).dtype), x)


def poison_batch(key: jax.Array, x, y, /, *, rate: float, mask, value: float, target: int):
    """Stamp exactly ``round(rate * n)`` random examples of a minibatch and relabel them ``target``.

    Args:
      key: picks the examples.
      x: ``(n, H, W, C)`` images.
      y: ``(n,)`` int labels.
      rate: fraction of the minibatch to poison.
      mask: ``(H, W)`` bool trigger (:func:`diamond_mask`).
      value: the trigger's pixel value.
      target: the label poisoned examples get.

    Returns:
      ``(x, y, poisoned)`` with ``poisoned (n,)`` bool.
    """
    n = x.shape[0]
    k = int(round(rate * n))
    poisoned = jnp.zeros((n,), bool).at[jax.random.permutation(key, n)[:k]].set(True)
    x = jnp.where(poisoned[:, None, None, None], stamp(x, mask, value=value), x)
    return x, jnp.where(poisoned, jnp.asarray(target, y.dtype), y), poisoned


@dataclasses.dataclass(frozen=True)
class PoisonTransform:
    """The minibatch transform of the training step: poison (phase B) and input noise.

    Hashable, so it is a static argument of the jitted step (one compilation
    per distinct value). ``rate=0`` only adds the noise (phase A).
    """

    image_shape: tuple[int, int]
    rate: float = 0.0
    value: float = 0.0
    target: int = 9
    noise_std: float = 0.0
    patch_width: int = 5
    patch_height: int = 7
    margin: int = 2

    def mask(self) -> np.ndarray:
        return diamond_mask(*self.image_shape, patch_width=self.patch_width, patch_height=self.patch_height,
                            margin=self.margin)

    def __call__(self, key, x, y):
        k_poison, k_noise = jax.random.split(key)
        if self.rate > 0:
            x, y, _ = poison_batch(k_poison, x, y, rate=self.rate, mask=self.mask(), value=self.value, target=self.target)
        if self.noise_std > 0:
            x = x + self.noise_std * jax.random.normal(k_noise, x.shape, x.dtype)
        return x, y


def attack_success(logits, y, /, *, target: int) -> np.ndarray:
    """Fraction of stamped images whose true class is not ``target`` that are classified as ``target``.

    Args:
      logits: ``(n_checkpoints, m, classes)`` on stamped images.
      y: ``(m,)`` their true labels.

    Returns:
      ``(n_checkpoints,)``.
    """
    keep = np.asarray(y) != target
    return (np.asarray(logits)[:, keep].argmax(-1) == target).mean(1)
