"""The grokking experiment: its data, its analysis helpers against references, and the driver end to end."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import cli, grokking
from funsim.experiments.data import modular_addition


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("p,fraction", [(113, 0.3), (7, 0.3), (10, 0.5), (13, 0.9)])
def test_modular_addition_exact_counts_and_disjoint_split(p, fraction):
    ds = modular_addition(p=p, train_fraction=fraction, seed=3)
    n_train = int(round(fraction * p * p))
    assert ds.x_train.shape == (n_train, 2) and ds.x_test.shape == (p * p - n_train, 2)
    assert ds.x_train.dtype == np.int32 and ds.y_train.dtype == np.int32
    train = {tuple(r) for r in ds.x_train.tolist()}
    test = {tuple(r) for r in ds.x_test.tolist()}
    assert len(train) == n_train and len(test) == p * p - n_train  # no duplicates
    assert not train & test  # disjoint
    assert train | test == {(a, b) for a in range(p) for b in range(p)}  # every pair once
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        np.testing.assert_array_equal(y, (x[:, 0] + x[:, 1]) % p)
    oh = modular_addition(p=p, train_fraction=fraction, seed=3, onehot=True)
    assert oh.x_train.shape == (n_train, 2 * p) and oh.x_train.dtype == np.float32
    np.testing.assert_array_equal(oh.x_train[:, :p].argmax(1), ds.x_train[:, 0])
    np.testing.assert_array_equal(oh.x_train[:, p:].argmax(1), ds.x_train[:, 1])
    assert set(np.unique(oh.x_train).tolist()) <= {0.0, 1.0} and np.all(oh.x_train.sum(1) == 2)
    np.testing.assert_array_equal(oh.y_test, ds.y_test)
    # the split is a function of the seed
    again = modular_addition(p=p, train_fraction=fraction, seed=3)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    other = modular_addition(p=p, train_fraction=fraction, seed=4)
    assert {tuple(r) for r in other.x_train.tolist()} != train


def test_token_pairs_equal_the_one_hot_model():
    from flax import nnx

    from funsim import models
    p = 7
    m = models.BilinearMLP(2 * p, p, d_hidden=5, n_layers=1, residual=False, embed=False, head=False, bias=True,
                           rngs=nnx.Rngs(0))
    m.layers[0].left_bias[...] = jnp.linspace(-1, 1, 5, dtype=jnp.float32)
    m.layers[0].down_bias[...] = jnp.linspace(0, 1, p, dtype=jnp.float32)
    tok = modular_addition(p=p, train_fraction=0.5)
    oh = modular_addition(p=p, train_fraction=0.5, onehot=True)
    wrapped = grokking.TokenPairs(m, p)
    np.testing.assert_allclose(wrapped(tok.x_train), m(oh.x_train), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wrapped(tok.x_test), similarity.apply_network(m.to_network(), oh.x_test), rtol=1e-5, atol=1e-5)
    # the same gradients, so training on tokens is training the one-hot model
    loss = lambda model, x: jnp.sum(model(x) ** 2)
    g_tok = nnx.grad(lambda mod: loss(mod, tok.x_train))(wrapped)
    g_oh = nnx.grad(lambda mod: loss(mod, oh.x_train))(m)
    np.testing.assert_allclose(g_tok.model.layers[0].left[...], g_oh.layers[0].left[...], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="TokenPairs needs"):
        grokking.TokenPairs(models.BilinearMLP(2 * p, p, rngs=nnx.Rngs(0)), p)


# --------------------------------------------------------------------------- Fourier


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
    power = grokking.fourier_power(w)
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
    per_row = grokking.fourier_power(np.stack(rows))
    power = per_row.sum(0)
    expected = np.zeros(p // 2 + 1)
    expected[0] = 6 * (0.3 * p) ** 2  # |F_0|^2 = (p c)^2 per row
    for k, a in planted.items():
        expected[k] = 6 * a * a * p * p / 2  # a cos wave carries a^2 p / 2 energy; times p (Parseval)
    np.testing.assert_allclose(power, expected, rtol=1e-9, atol=1e-7)
    s = grokking.spectrum_summary(per_row, n_top=1)
    np.testing.assert_allclose(s["top_fraction"], 4.0 / 4.25, rtol=1e-12)  # 2^2 / (2^2 + 0.5^2)
    q = np.array([4.0, 0.25]) / 4.25
    np.testing.assert_allclose(s["effective_frequencies"], 1.0 / np.sum(q * q), rtol=1e-12)
    np.testing.assert_allclose(s["unit_purity"], 4.0 / 4.25, rtol=1e-9)  # every row: the same two waves
    np.testing.assert_allclose(s["constant_fraction"], expected[0] / expected.sum(), rtol=1e-9)


def test_unit_purity_sees_single_wave_units_that_the_layer_spectrum_does_not():
    p = 31
    t = np.arange(p)
    units = np.stack([np.cos(2 * np.pi * k * t / p + 0.3 * k) for k in range(1, 16)])  # 15 units, one wave each
    s = grokking.spectrum_summary(grokking.fourier_power(units), n_top=5)
    np.testing.assert_allclose(s["unit_purity"], 1.0, rtol=1e-9)
    np.testing.assert_allclose(s["effective_frequencies"], 15.0, rtol=1e-9)  # the layer uses 15 frequencies
    mixed = units + units[::-1]  # every unit now two waves of equal power
    np.testing.assert_allclose(grokking.spectrum_summary(grokking.fourier_power(mixed[:7]), n_top=5)["unit_purity"], 0.5, rtol=1e-9)


def test_spectrum_summary_extremes():
    flat = np.ones((1, 57))  # one unit: constant bin + 56 equal frequencies
    s = grokking.spectrum_summary(flat, n_top=5)
    np.testing.assert_allclose(s["effective_frequencies"], 56.0)
    np.testing.assert_allclose(s["top_fraction"], 5 / 56)
    np.testing.assert_allclose(s["unit_purity"], 1 / 56)
    spike = np.zeros((2, 3, 57))  # 2 checkpoints x 3 units
    spike[..., 9] = 3.0
    s = grokking.spectrum_summary(spike, n_top=5)
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
    spec = grokking.operand_spectra(net, p)
    assert spec["a"].shape == spec["b"].shape == (2 * h, p // 2 + 1) and spec["out"].shape == (h, p // 2 + 1)
    assert [int(np.argmax(spec[k].sum(0))) for k in ("a", "b", "out")] == [2, 5, 4]
    for k, v in spec.items():
        assert np.sum(v.sum(0) > 1e-9 * v.max()) == 1, k  # all power in one bin
    stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), net)
    spec2 = grokking.operand_spectra(stacked, p)
    np.testing.assert_allclose(spec2["a"][1], 4 * spec["a"], rtol=1e-12)
    with pytest.raises(ValueError, match="operand_spectra expects left/right"):
        grokking.operand_spectra(net, 12)


# --------------------------------------------------------------------------- matrices, events


def _checkpoints(n=4, d=6, h=3, o=5, seed=0):
    rng = np.random.default_rng(seed)
    base = [rng.normal(size=s) for s in ((h, d), (h, d), (o, h))]
    nets = []
    for i in range(n):  # a drifting trajectory, like training
        l, r, dn = (b + 0.7 * i * rng.normal(size=b.shape) for b in base)
        nets.append((similarity.BilinearLayer(jnp.asarray(l), jnp.asarray(r), jnp.asarray(dn)),))
    return nets


def test_checkpoint_matrices_equal_the_pairwise_library_functions():
    nets = _checkpoints()
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *nets)
    x = np.random.default_rng(1).normal(size=(40, 6))
    mats = grokking.checkpoint_matrices(stacked, x)
    assert list(mats) == list(grokking.MEASURES)
    ref = {
        "tensor (symmetric)": lambda a, b: similarity.tensor_similarity(a, b, metric="symmetric"),
        "tensor (gaussian)": lambda a, b: similarity.tensor_similarity(a, b, metric="gaussian"),
        "weight cosine": similarity.weight_cosine,
        "behavioural": lambda a, b: similarity.behavioral_similarity(a, b, x),
        "CKA (logits)": lambda a, b: similarity.cka(similarity.apply_network(a, x), similarity.apply_network(b, x)),
    }
    for name, f in ref.items():
        expected = np.array([[float(f(a, b)) for b in nets] for a in nets])
        np.testing.assert_allclose(mats[name], expected, rtol=1e-9, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(mats[name], mats[name].T, atol=1e-12)
        np.testing.assert_allclose(np.diag(mats[name]), 1.0, atol=1e-12)


def test_evaluate_checkpoints_against_numpy():
    nets = _checkpoints(n=3, o=4)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *nets)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(30, 6)), rng.integers(0, 4, size=30)
    ev = grokking.evaluate_checkpoints(stacked, x, y)
    for i, (layer,) in enumerate(nets):
        l, r, d = (np.asarray(a) for a in (layer.left, layer.right, layer.down))
        logits = ((x @ l.T) * (x @ r.T)) @ d.T
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        np.testing.assert_allclose(ev["loss"][i], -logp[np.arange(30), y].mean(), rtol=1e-9)
        assert ev["accuracy"][i] == np.mean(logits.argmax(1) == y)


def test_accuracy_events_and_boundaries():
    steps = [0, 10, 20, 40, 80, 160, 320]
    train = [0.0, 0.3, 0.6, 1.0, 1.0, 1.0, 1.0]
    val = [0.0, 0.0, 0.01, 0.1, 0.6, 0.995, 1.0]
    loss = [4.0, 4.5, 6.0, 5.0, 2.0, 0.1, 0.01]
    ev = grokking.accuracy_events(steps, train, val, loss)
    assert ev == {"train accuracy >= 0.5": 20, "train accuracy >= 0.99": 40, "val loss peak": 20,
                  "val accuracy >= 0.5": 80, "val accuracy >= 0.99": 160, "val accuracy = 1": 320}
    assert set(ev) == set(grokking.PAPER["events"])
    rows = grokking.compare_boundaries([0, 3, 5], steps, ev)
    assert rows == [
        {"start_step": 40, "after_step": 20, "nearest_event": "train accuracy >= 0.99", "event_step": 40, "checkpoints_apart": 0},
        {"start_step": 160, "after_step": 80, "nearest_event": "val accuracy >= 0.99", "event_step": 160, "checkpoints_apart": 0},
    ]
    none = grokking.accuracy_events(steps, train, [0.0] * 7, loss)
    assert none["val accuracy >= 0.5"] is None and none["val accuracy = 1"] is None
    assert grokking.compare_boundaries([0, 2], steps, {"x": None})[0]["nearest_event"] is None


# --------------------------------------------------------------------------- the driver


def _run_smoke(tmp_path, capsys):
    rc = cli.main(["grokking", "--config", "smoke", "--no-progress", "--root", str(tmp_path)])
    assert rc == 0
    return capsys.readouterr().out


def test_grokking_smoke_end_to_end_and_resume(tmp_path, capsys):
    printed = _run_smoke(tmp_path, capsys)
    out = tmp_path / "grokking" / "smoke"  # the run is named after the config
    cfg = grokking.CONFIGS["smoke"]
    assert json.loads((out / "config.json").read_text())["p"] == cfg.p
    m = json.loads((out / "metrics.json").read_text())
    steps = m["steps"]
    assert steps[0] == 0 and steps[-1] == cfg.steps and steps == sorted(set(steps))
    for split in ("train", "val"):
        acc = np.array(m["checkpoints"][split]["accuracy"])
        assert acc.shape == (len(steps),) and np.all((acc >= 0) & (acc <= 1))
    # the smoke run memorises its training pairs
    assert m["final"]["train_accuracy"] == 1.0
    mats = np.load(out / "matrices.npz")
    assert mats["steps"].tolist() == steps
    for name in grokking.MEASURES:
        a = mats[name.replace(" ", "_")]
        assert a.shape == (len(steps), len(steps))
        np.testing.assert_allclose(a, a.T, atol=1e-5)
        np.testing.assert_allclose(np.diag(a), 1.0, atol=1e-5)
        assert np.all(a <= 1 + 1e-5) and np.all(a >= -1 - 1e-5)
    seg = m["segmentation"]
    for cost in similarity.SEGMENT_COSTS:
        for name in grokking.MEASURES:
            st = seg["starts"][cost][name]
            assert len(st) == cfg.n_segments and st[0] == 0 and st == sorted(set(st)) and st[-1] < len(steps)
    assert len(seg["boundaries_vs_events"]["tensor (symmetric)"]) == cfg.n_segments - 1
    spectra = np.load(out / "spectra.npz")
    assert spectra["a"].shape == (len(steps), cfg.p // 2 + 1)
    for f in ("accuracy.png", "similarity_matrices.png", "similarity_to_final.png", "fourier.png"):
        data = (out / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    summary = (out / "summary.md").read_text()
    assert "paper's run" in summary and "| tensor (symmetric) |" in summary
    assert "# grokking" in printed and str(out) in printed
    assert not list(out.glob("**/*.tmp*"))

    # interrupted after the 5th of 8 checkpoints: the rerun resumes and reproduces the run
    ckdir = out / "model" / "checkpoints"
    for s in steps[-3:]:
        shutil.rmtree(ckdir / str(s))
    printed = _run_smoke(tmp_path, capsys)
    assert f"resumed from step {steps[-4]}" in printed
    again = np.load(out / "matrices.npz")
    for name in grokking.MEASURES:
        np.testing.assert_array_equal(again[name.replace(" ", "_")], mats[name.replace(" ", "_")])
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["checkpoints"] == m["checkpoints"] and m2["segmentation"] == m["segmentation"]


def test_grokking_config_file_and_bad_fields(tmp_path):
    good = tmp_path / "tiny.json"
    good.write_text(json.dumps({"p": 5, "steps": 3}))
    name, cfg = grokking._config_from(str(good))
    assert name == "tiny" and cfg.p == 5 and cfg.steps == 3 and cfg.d_hidden == 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"p": 5, "stepz": 3}))
    with pytest.raises(ValueError, match=r"unknown GrokkingConfig fields \['stepz'\]"):
        grokking._config_from(str(bad))
    with pytest.raises(ValueError, match="neither one of smoke, default, paper nor a JSON file"):
        grokking._config_from("defualt")
