"""similarity.fourier: the Fourier power of weights over Z_p, against an explicit DFT and planted waves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.similarity.fourier import fourier_power, operand_spectra, spectrum_summary


def _dft_power_reference(w):
    """Float64 power per pooled frequency bin from an explicit DFT matrix (no FFT)."""
    w = np.asarray(w, np.float64)
    p = w.shape[-1]
    t = np.arange(p)
    full = np.abs(w @ np.exp(-2j * np.pi * np.outer(t, t) / p)) ** 2  # (..., p): |F_k|^2, k = 0..p-1
    return np.stack([full[..., 0] if k == 0 else (full[..., k] if 2 * k == p else full[..., k] + full[..., p - k])
                     for k in range(p // 2 + 1)], axis=-1)


@pytest.mark.parametrize("p", [7, 12, 113])
def test_fourier_power_against_explicit_dft_and_parseval(p):
    w = np.random.default_rng(p).normal(size=(5, p))
    power = fourier_power(w)
    assert power.shape == (5, p // 2 + 1)
    np.testing.assert_allclose(power, _dft_power_reference(w), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(power.sum(-1), p * (w * w).sum(-1), rtol=1e-12)


@pytest.mark.parametrize("p", [113, 12])
def test_fourier_power_recovers_a_planted_signal(p):
    rng = np.random.default_rng(0)
    t = np.arange(p)
    planted = {3: 2.0, 5: 0.5}  # frequency -> amplitude
    rows = []
    for _ in range(6):  # random phases, the same amplitudes, and a constant offset
        rows.append(sum(a * np.cos(2 * np.pi * k * t / p + rng.uniform(0, 2 * np.pi)) for k, a in planted.items()) + 0.3)
    per_row = fourier_power(np.stack(rows))
    power = per_row.sum(0)
    expected = np.zeros(p // 2 + 1)
    expected[0] = 6 * (0.3 * p) ** 2  # |F_0|^2 = (p c)^2 per row
    for k, a in planted.items():
        expected[k] = 6 * a * a * p * p / 2  # a cos wave carries a^2 p / 2 energy; times p (Parseval)
    np.testing.assert_allclose(power, expected, rtol=1e-9, atol=1e-7)
    s = spectrum_summary(per_row, n_top=1)
    np.testing.assert_allclose(s["top_fraction"], 4.0 / 4.25, rtol=1e-12)  # 2^2 / (2^2 + 0.5^2)
    q = np.array([4.0, 0.25]) / 4.25
    np.testing.assert_allclose(s["effective_frequencies"], 1.0 / np.sum(q * q), rtol=1e-12)
    np.testing.assert_allclose(s["unit_purity"], 4.0 / 4.25, rtol=1e-9)  # every row: the same two waves
    np.testing.assert_allclose(s["constant_fraction"], expected[0] / expected.sum(), rtol=1e-9)


def test_unit_purity_sees_single_wave_units_that_the_layer_spectrum_does_not():
    p = 31
    t = np.arange(p)
    units = np.stack([np.cos(2 * np.pi * k * t / p + 0.3 * k) for k in range(1, 16)])  # 15 units, one wave each
    s = spectrum_summary(fourier_power(units), n_top=5)
    np.testing.assert_allclose(s["unit_purity"], 1.0, rtol=1e-9)
    np.testing.assert_allclose(s["effective_frequencies"], 15.0, rtol=1e-9)  # the layer uses 15 frequencies
    mixed = units + units[::-1]  # every unit now two waves of equal power
    np.testing.assert_allclose(spectrum_summary(fourier_power(mixed[:7]), n_top=5)["unit_purity"], 0.5, rtol=1e-9)


def test_spectrum_summary_extremes():
    flat = np.ones((1, 57))  # one unit: constant bin + 56 equal frequencies
    s = spectrum_summary(flat, n_top=5)
    np.testing.assert_allclose(s["effective_frequencies"], 56.0)
    np.testing.assert_allclose(s["top_fraction"], 5 / 56)
    np.testing.assert_allclose(s["unit_purity"], 1 / 56)
    spike = np.zeros((2, 3, 57))  # 2 checkpoints x 3 units
    spike[..., 9] = 3.0
    s = spectrum_summary(spike, n_top=5)
    np.testing.assert_allclose(s["effective_frequencies"], [1.0, 1.0])
    np.testing.assert_allclose(s["top_fraction"], [1.0, 1.0])
    assert s["distribution"].shape == (2, 56)


def test_operand_spectra_separates_the_operands():
    p, h = 13, 4
    t = np.arange(p)
    wave = lambda k: np.cos(2 * np.pi * k * t / p + 0.4)
    left = np.concatenate([np.tile(wave(2), (h, 1)), np.tile(wave(5), (h, 1))], axis=1)  # a: k=2, b: k=5
    right = np.concatenate([np.tile(wave(2), (h, 1)), np.tile(wave(5), (h, 1))], axis=1)
    down = np.tile(wave(4)[:, None], (1, h))  # classes: k=4
    net = (similarity.BilinearLayer(jnp.asarray(left), jnp.asarray(right), jnp.asarray(down)),)
    spec = operand_spectra(net, p)
    assert spec["a"].shape == spec["b"].shape == (2 * h, p // 2 + 1) and spec["out"].shape == (h, p // 2 + 1)
    assert [int(np.argmax(spec[k].sum(0))) for k in ("a", "b", "out")] == [2, 5, 4]
    for k, v in spec.items():
        assert np.sum(v.sum(0) > 1e-9 * v.max()) == 1, k  # all power in one bin
    stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), net)
    spec2 = operand_spectra(stacked, p)
    np.testing.assert_allclose(spec2["a"][1], 4 * spec["a"], rtol=1e-12)
    with pytest.raises(ValueError, match="operand_spectra expects left/right"):
        operand_spectra(net, 12)
