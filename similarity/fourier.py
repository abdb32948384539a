"""Fourier power of weights over ``Z_p``: the frequencies a modular-addition network uses.

A network that adds modulo ``p`` learns waves over the tokens (Nanda et al. 2023): its input
weights, read as functions of a token, and its output weights, read as functions of the class,
concentrate their power on a few frequencies. :func:`fourier_power` pools each real wave's
two frequencies into one bin; :func:`operand_spectra` takes the spectra of a one-bilinear-layer
network per operand; :func:`spectrum_summary` condenses per-unit spectra into a few numbers
(concentration, per-unit purity). NumPy, float64, any leading (checkpoint) axes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fourier_power", "operand_spectra", "spectrum_summary"]


def fourier_power(w, /) -> np.ndarray:
    """Power of ``w`` per frequency along its last (token) axis.

    The discrete Fourier transform over ``Z_p``, ``F_k = sum_t w_t exp(-2 pi i k t / p)``;
    frequencies ``k`` and ``p - k`` describe the same real wave and are pooled
    into bin ``k``, so bin ``k`` in ``0..p//2`` holds ``|F_k|^2 + |F_{p-k}|^2``
    (``|F_0|^2`` for ``k = 0``, and ``|F_{p/2}|^2`` alone for even ``p``). By
    Parseval the bins sum to ``p * sum_t w_t^2``.

    Args:
      w: ``(..., p)`` real.

    Returns:
      ``(..., p // 2 + 1)`` float64.

    Examples:
      >>> t = np.arange(7)
      >>> fourier_power(np.cos(2 * np.pi * 2 * t / 7)).round(6).tolist()   # all power at k = 2
      [0.0, 0.0, 24.5, 0.0]
    """
    w = np.asarray(w, np.float64)
    p = w.shape[-1]
    pooled = np.full(p // 2 + 1, 2.0)
    pooled[0] = 1.0
    if p % 2 == 0:
        pooled[-1] = 1.0
    return np.abs(np.fft.rfft(w, axis=-1)) ** 2 * pooled


def operand_spectra(net, p: int, /) -> dict[str, np.ndarray]:
    """Fourier power of a one-bilinear-layer modular-addition network, per operand and per unit.

    ``"a"``: the rows of ``left`` and of ``right`` restricted to the one-hot of
    token a (input columns ``0..p-1``), each a function of a; ``"b"``: the same
    for token b (columns ``p..2p-1``); ``"out"``: each hidden unit's column of
    ``down``, a function of the output class.

    Args:
      net: ``(BilinearLayer,)`` with ``left, right: (..., h, 2p)`` and
        ``down: (..., p, h)`` (leading checkpoint axes allowed).
      p: the modulus.

    Returns:
      ``{"a": (..., 2h, K), "b": (..., 2h, K), "out": (..., h, K)}``, ``K = p // 2 + 1``
      (:func:`fourier_power` of every row; sum over the row axis for the layer's spectrum).
    """
    (layer,) = net
    left, right, down = (np.asarray(x) for x in (layer.left, layer.right, layer.down))
    if left.shape[-1] != 2 * p or down.shape[-2] != p:
        raise ValueError(f"operand_spectra expects left/right (..., h, {2 * p}) and down (..., {p}, h) "
                         f"for p={p}, got {left.shape} and {down.shape}.")
    rows = lambda cols: np.concatenate([left[..., cols], right[..., cols]], axis=-2)
    return {
        "a": fourier_power(rows(slice(0, p))),
        "b": fourier_power(rows(slice(p, 2 * p))),
        "out": fourier_power(np.swapaxes(down, -1, -2)),
    }


def spectrum_summary(power, /, *, n_top: int) -> dict[str, np.ndarray]:
    """Summary statistics of per-unit power spectra over the non-constant frequencies ``k >= 1``.

    Args:
      power: ``(..., r, K)``: the power per frequency bin (:func:`fourier_power`)
        of ``r`` units (rows); bin 0 is the constant.
      n_top: how many of the strongest frequencies ``top_fraction`` counts.

    Returns:
      ``{"top_fraction", "effective_frequencies", "unit_purity", "constant_fraction": (...),
      "distribution": (..., K - 1)}``. With ``q`` the layer's normalised non-constant power
      (summed over the units; ``distribution``): the share of it in the ``n_top`` strongest
      frequencies; its participation ratio ``1 / sum_k q_k^2`` (1 for a single frequency,
      ``K - 1`` for a flat spectrum); ``unit_purity``, the share of each unit's non-constant
      power in its own strongest frequency, averaged over the units weighted by their power
      (1 when every unit is a single wave, whatever the frequencies); the share of all power
      in bin 0.
    """
    power = np.asarray(power, np.float64)
    total = power[..., 1:].sum(axis=(-2, -1))
    layer = power.sum(axis=-2)
    q = layer[..., 1:] / total[..., None]
    return {
        "top_fraction": np.sort(q, axis=-1)[..., ::-1][..., :n_top].sum(axis=-1),
        "effective_frequencies": 1.0 / np.sum(q * q, axis=-1),
        "unit_purity": power[..., 1:].max(axis=-1).sum(axis=-1) / total,
        "constant_fraction": layer[..., 0] / layer.sum(axis=-1),
        "distribution": q,
    }
