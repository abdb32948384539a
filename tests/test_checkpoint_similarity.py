"""Checkpoint x checkpoint matrices: each entry equals the pairwise function of `similarity`."""

import numpy as np
import pytest

from funsim import similarity
from funsim.experiments import checkpoint_similarity as cs
from funsim.similarity import BilinearLayer, LinearLayer


def _net(rng, *, d=5, m=4, h=6, o=3, bias=True, scale=1.0):
    """embedding -> bilinear -> head, float64, with biases."""
    r = lambda *s: scale * rng.normal(size=s)
    b = (lambda n: r(n)) if bias else (lambda n: None)
    return (
        LinearLayer(r(m, d), b(m)),
        BilinearLayer(r(h, m), r(h, m), r(m, h), b(h), b(h), b(m)),
        LinearLayer(r(o, m), b(o)),
    )


def _checkpoints(rng, n=4, **kw):
    """A drifting 'training run': each checkpoint is the previous one plus noise."""
    nets = [_net(rng, **kw)]
    for _ in range(n - 1):
        step = _net(rng, scale=0.4, **kw)
        nets.append(tuple(type(l)(*[None if a is None else a + da for a, da in zip(_fields(l), _fields(s))],
                                  **({"residual": l.residual} if isinstance(l, BilinearLayer) else {}))
                          for l, s in zip(nets[-1], step)))
    return nets


def _fields(layer):
    if isinstance(layer, LinearLayer):
        return (layer.weight, layer.bias)
    return (layer.left, layer.right, layer.down, layer.left_bias, layer.right_bias, layer.down_bias)


@pytest.mark.parametrize("metric", ["symmetric", "gaussian", "frobenius"])
def test_tensor_matrices_equal_pairwise_similarity(rng, metric):
    nets = _checkpoints(rng)
    m = cs.tensor_matrices(nets, metrics=[metric])
    full, slices = m[f"tensor/{metric}"], m[f"tensor/{metric}/outputs"]
    assert full.shape == (4, 4) and slices.shape == (3, 4, 4)
    for i in range(4):
        for j in range(4):
            ref = float(similarity.tensor_similarity(nets[i], nets[j], metric=metric))
            assert full[i, j] == pytest.approx(ref, abs=1e-10)
            for c in range(3):
                ref_c = float(similarity.tensor_similarity(nets[i], nets[j], metric=metric, outputs=[c]))
                assert slices[c, i, j] == pytest.approx(ref_c, abs=1e-10)
    np.testing.assert_array_equal(full, full.T)
    np.testing.assert_allclose(np.diagonal(full), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.diagonal(slices, axis1=1, axis2=2), 1.0, atol=1e-12)
    # a slice differs from the whole (otherwise the test could not tell them apart)
    assert np.abs(slices[0] - full).max() > 1e-3


def test_tensor_matrices_residual_last_layer_falls_back_to_one_call_per_output(rng):
    def res(s):
        return (BilinearLayer(rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), s * rng.normal(size=(3, 4)), residual=True),)

    nets = [res(0.5), res(1.0), res(2.0)]
    m = cs.tensor_matrices(nets, metrics=["gaussian"])
    for i in range(3):
        for j in range(3):
            assert m["tensor/gaussian"][i, j] == pytest.approx(float(similarity.tensor_similarity(nets[i], nets[j])), abs=1e-10)
            assert m["tensor/gaussian/outputs"][2, i, j] == pytest.approx(
                float(similarity.tensor_similarity(nets[i], nets[j], outputs=[2])), abs=1e-10)


def test_float32_checkpoints_agree_with_float64_reference(rng):
    nets = _checkpoints(rng, n=3)
    nets32 = [tuple(type(l)(*[None if a is None else np.float32(a) for a in _fields(l)],
                            **({"residual": l.residual} if isinstance(l, BilinearLayer) else {})) for l in n) for n in nets]
    m32 = cs.tensor_matrices(nets32, metrics=["gaussian"])["tensor/gaussian"]
    m64 = cs.tensor_matrices(nets, metrics=["gaussian"])["tensor/gaussian"]
    np.testing.assert_allclose(m32, m64, atol=1e-5)


@pytest.mark.parametrize("metric", ["symmetric", "gaussian"])
def test_similarity_to_a_reference_of_another_architecture(rng, metric):
    nets = _checkpoints(rng)
    # reference: the difference of two other one-layer networks (hidden width 2h, no embedding)
    a = BilinearLayer(rng.normal(size=(6, 5)), rng.normal(size=(6, 5)), rng.normal(size=(3, 6)))
    b = BilinearLayer(rng.normal(size=(6, 5)), rng.normal(size=(6, 5)), rng.normal(size=(3, 6)))
    ref = (similarity.difference(a, b),)
    out = cs.tensor_similarity_to(nets, ref, metrics=[metric])
    for i in range(4):
        assert out[f"tensor/{metric}"][i] == pytest.approx(float(similarity.tensor_similarity(nets[i], ref, metric=metric)), abs=1e-10)
        for c in range(3):
            assert out[f"tensor/{metric}/outputs"][c, i] == pytest.approx(
                float(similarity.tensor_similarity(nets[i], ref, metric=metric, outputs=[c])), abs=1e-10)
    with pytest.raises(ValueError, match="reference has 2 outputs"):
        cs.tensor_similarity_to(nets, (LinearLayer(rng.normal(size=(4, 5))), BilinearLayer(
            rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(2, 3)))), metrics=[metric])


def test_similarity_to_a_residual_reference_falls_back_to_one_call_per_output(rng):
    res = lambda: (BilinearLayer(rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(3, 4)), residual=True),)
    nets, ref = [res(), res()], res()
    out = cs.tensor_similarity_to(nets, ref, metrics=["gaussian"])
    for i in range(2):
        assert out["tensor/gaussian"][i] == pytest.approx(float(similarity.tensor_similarity(nets[i], ref)), abs=1e-10)
        assert out["tensor/gaussian/outputs"][1, i] == pytest.approx(
            float(similarity.tensor_similarity(nets[i], ref, outputs=[1])), abs=1e-10)


def test_weight_cosine_matrix_equals_pairwise(rng):
    nets = _checkpoints(rng)
    w = cs.weight_cosine_matrix(nets)
    for i in range(4):
        for j in range(4):
            assert w[i, j] == pytest.approx(float(similarity.weight_cosine(nets[i], nets[j])), abs=1e-12)
    # independent numpy reference for one entry
    va = np.concatenate([np.ravel(x) for x in _flat(nets[0])])
    vb = np.concatenate([np.ravel(x) for x in _flat(nets[3])])
    assert w[0, 3] == pytest.approx(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb), abs=1e-12)


def _flat(net):
    return [a for l in net for a in _fields(l) if a is not None]


def test_behavioral_and_cka_matrices_equal_pairwise(rng):
    nets = _checkpoints(rng)
    x = rng.normal(size=(30, 5))
    y = cs.network_outputs(nets, x)
    assert y.shape == (4, 30, 3)
    b = cs.behavioral_matrix(y)
    k = cs.cka_matrix(y)
    for i in range(4):
        for j in range(4):
            assert b[i, j] == pytest.approx(float(similarity.behavioral_similarity(nets[i], nets[j], x)), abs=1e-12)
            assert k[i, j] == pytest.approx(float(similarity.cka(np.asarray(y[i]), np.asarray(y[j]))), abs=1e-12)
    # independent float64 numpy reference for one entry of each
    ya, yb = (np.asarray(similarity.apply_network(nets[n], x)) for n in (0, 2))
    cos = (ya * yb).sum(1) / np.linalg.norm(ya, axis=1) / np.linalg.norm(yb, axis=1)
    assert b[0, 2] == pytest.approx(cos.mean(), abs=1e-12)
    ca, cb = ya - ya.mean(0), yb - yb.mean(0)
    ref_cka = np.linalg.norm(ca.T @ cb) ** 2 / np.linalg.norm(ca.T @ ca) / np.linalg.norm(cb.T @ cb)
    assert k[0, 2] == pytest.approx(ref_cka, abs=1e-12)
    for mat in (b, k):
        np.testing.assert_array_equal(mat, mat.T)
        np.testing.assert_allclose(np.diagonal(mat), 1.0, atol=1e-12)


def test_checkpoint_matrices_bundle(rng):
    nets = _checkpoints(rng, n=3)
    x = rng.normal(size=(20, 5))
    m = cs.checkpoint_matrices(nets, data={"clean": x, "shifted": x + 1.0})
    assert set(m) == {
        "tensor/symmetric", "tensor/symmetric/outputs", "tensor/gaussian", "tensor/gaussian/outputs",
        "weight_cosine", "behavioral/clean", "cka/clean", "behavioral/shifted", "cka/shifted",
    }
    np.testing.assert_array_equal(m["behavioral/clean"], cs.behavioral_matrix(cs.network_outputs(nets, x)))
    assert not np.allclose(m["behavioral/clean"], m["behavioral/shifted"])


def test_bad_input_is_refused_with_a_clear_message(rng):
    nets = _checkpoints(rng, n=2)
    with pytest.raises(ValueError, match="nets is empty"):
        cs.tensor_matrices([])
    with pytest.raises(ValueError, match=r"nets\[1\] does not have the structure and shapes of nets\[0\]"):
        cs.tensor_matrices([nets[0], _net(rng, h=7)])
    with pytest.raises(ValueError, match="Unknown|metric"):
        cs.tensor_matrices(nets, metrics=["cosine"])
    # a checkpoint whose output 1 is exactly zero: its slice similarity is undefined
    head = nets[1][2]
    w = np.array(head.weight)
    w[1] = 0
    zero = (nets[1][0], nets[1][1], LinearLayer(w, np.where(np.arange(3) == 1, 0.0, head.bias)))
    with pytest.raises(ValueError, match="outputs: output 1, checkpoint 1 has zero"):
        cs.tensor_matrices([nets[0], zero], metrics=["gaussian"])
    assert cs.tensor_matrices([nets[0], zero], metrics=["gaussian"], per_output=False)["tensor/gaussian"].shape == (2, 2)
    with pytest.raises(ValueError, match=r"x must be \(m, 5\)"):
        cs.network_outputs(nets, rng.normal(size=(4, 6)))
    y = np.ones((2, 3, 2))
    y[1, 2] = 0.0
    with pytest.raises(ValueError, match="Checkpoint 1 outputs the zero vector on input 2"):
        cs.behavioral_matrix(y)
    with pytest.raises(ValueError, match="Checkpoint 0 has constant outputs"):
        cs.cka_matrix(np.stack([np.ones((5, 2)), rng.normal(size=(5, 2))]))
    with pytest.raises(ValueError, match=r"\(n_checkpoints, m, o\)"):
        cs.behavioral_matrix(np.ones((3, 2)))


def test_block_gap():
    m = np.array([[1.0, 0.5, 0.1, 0.1], [0.5, 1.0, 0.2, 0.2], [0.1, 0.2, 1.0, 0.9], [0.1, 0.2, 0.9, 1.0]])
    b = np.array([False, False, True, True])
    assert cs.block_gap(m, b) == pytest.approx((1 + 0.9 + 0.9 + 1) / 4 - (0.1 + 0.1 + 0.2 + 0.2) / 4)
    assert cs.block_gap(m + 3.0, b) == pytest.approx(cs.block_gap(m, b))  # shift-invariant
    assert cs.block_gap(2 * m, b) == pytest.approx(2 * cs.block_gap(m, b))
    with pytest.raises(ValueError, match="some checkpoints but not all"):
        cs.block_gap(m, np.ones(4, bool))
    with pytest.raises(ValueError, match=r"\(n, n\)"):
        cs.block_gap(m[:3], b)


def test_figures_are_written(tmp_path, rng):
    steps = np.array([0, 10, 20, 30, 40])
    spans = [(0, 20, "base"), (20, 40, "add 5")]
    mats = {"a": np.eye(5), "b": np.full((5, 5), 0.5)}
    p = cs.heatmap_panels(mats, steps, tmp_path / "h.png", spans=spans, suptitle="test")
    q = cs.curves_over_steps(steps, {"x": steps / 40.0}, tmp_path / "c.png", spans=spans, title="t", ylabel="y")
    for f in (p, q):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cs._stage_ticks(steps, spans) == ([(1, "base"), (3, "add 5")], [2])
