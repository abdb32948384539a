"""The similarity study's model evaluation: stitched logits (one compiled map over stitchers and tails)."""

import numpy as np
from flax import nnx

from funsim import models, similarity
from funsim.experiments import similarity_study as S
from tests._stitch_models import CompileCounter, np_adaptive_pool


def _stitchers(rng, widths, m, t, family="affine"):
    out = []
    for d in widths:
        out.append(similarity.Stitcher(
            rng.normal(size=(m, d, t)).astype(np.float32) / np.sqrt(d),
            rng.normal(size=(m, t)).astype(np.float32) * 0.1,
            rng.uniform(0.5, 2.0, size=(m,)).astype(np.float32),
            family,
        ))
    return out


def _reference(targets, layer, stitchers, zs, spatial, coarse=None):
    """(K, M, n, C) by NumPy stitching and each target model's own eager tail."""
    out = []
    for st, z in zip(stitchers, zs):
        z = np.asarray(z, np.float64)
        z = np_adaptive_pool(z, spatial) if spatial is not None else z.reshape(len(z), -1)
        per = []
        for mi, model in enumerate(targets):
            w, b, s = (np.asarray(a[mi], np.float64) for a in (st.weight, st.bias, st.scale))
            h = s * np.einsum("...d,dt->...t", z, w) + b
            logits = np.asarray(model.tail(layer, h.astype(np.float32)), np.float64)
            if coarse is not None:
                logits = np.stack([np.logaddexp.reduce(logits[:, np.asarray(coarse) == g], axis=1)
                                   for g in range(max(coarse) + 1)], axis=1)
            per.append(logits)
        out.append(np.stack(per))
    return np.stack(out)


def test_stitched_logits_into_dense_tails_match_numpy_and_the_eager_tails():
    rng = np.random.default_rng(0)
    targets = [models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (0, 1)]
    tail, params = models.stack_tails(targets, "fc0")
    widths, n = (5, 9, 3), 11
    zs = [rng.normal(size=(n, d)).astype(np.float32) for d in widths]
    zs[1] = zs[1].reshape(n, 3, 3)  # a source with more axes is flattened
    st = _stitchers(rng, widths, 2, 7)
    want = _reference(targets, "fc0", st, zs, None)
    for chunk in (4, 512):  # 11 rows: padded chunks, or one call
        got = S._stitched_logits(tail, params, st, zs, (7,), chunk=chunk)
        assert got.shape == (3, 2, n, 5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    coarse = (0, 0, 1, 1, 1)
    got = S._stitched_logits(S.CoarseTail(tail, coarse), params, st, zs, (7,), chunk=4)
    np.testing.assert_allclose(got, _reference(targets, "fc0", st, zs, None, coarse), rtol=1e-5, atol=1e-5)
    # other stitchers and tails of the same shapes: the compiled program is reused
    st2 = _stitchers(np.random.default_rng(1), widths, 2, 7)
    _, params2 = models.stack_tails([models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (2, 3)], "fc0")
    with CompileCounter() as c:
        S._stitched_logits(tail, params2, st2, zs, (7,), chunk=4)
    assert c.count == 0


def test_stitched_logits_into_conv_tails_resize_the_sources():
    rng = np.random.default_rng(2)
    targets = [models.CNN((8, 8, 1), 4, channels=(3, 5), rngs=nnx.Rngs(s)) for s in (0, 1)]
    layer = "conv0"
    tshape = targets[0].feature_shapes()[layer]  # (4, 4, 3)
    n = 6
    zs = [rng.normal(size=(n, 8, 8, 2)).astype(np.float32), rng.normal(size=(n, 4, 4, 6)).astype(np.float32),
          rng.normal(size=(n, 2, 2, 4)).astype(np.float32)]
    st = _stitchers(rng, (2, 6, 4), 2, tshape[-1])
    tail, params = models.stack_tails(targets, layer)
    got = S._stitched_logits(tail, params, st, zs, tshape, chunk=4)
    np.testing.assert_allclose(got, _reference(targets, layer, st, zs, tshape[:2]), rtol=1e-5, atol=1e-5)


def test_study_features_are_the_models_features():
    x = np.random.default_rng(3).normal(size=(9, 8, 8, 1)).astype(np.float32)
    m = models.CNN((8, 8, 1), 4, channels=(3, 5), rngs=nnx.Rngs(0))
    got = S._features(m, x, batch=4)
    want = m.features(x)
    assert list(got) == list(want) and all(isinstance(v, np.ndarray) for v in got.values())
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)

