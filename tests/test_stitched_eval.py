"""similarity.stitched_logits: K stitchers into M stacked tails, one compiled map, against NumPy and eager tails."""

import numpy as np
import pytest
from flax import nnx

from funsim import models, similarity
from funsim.runtime.compile_count import CompileCounter
from tests._stitch_models import reference_stitched_logits as reference
from tests._stitch_models import stacked_stitchers as stitchers


def _dense_case():
    rng = np.random.default_rng(0)
    targets = [models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (0, 1)]
    tail, params = models.stack_tails(targets, "fc0")
    widths, n = (5, 9, 3), 11
    zs = [rng.normal(size=(n, d)).astype(np.float32) for d in widths]
    zs[1] = zs[1].reshape(n, 3, 3)  # a source with more axes is flattened
    return targets, tail, params, zs, stitchers(rng, widths, 2, 7)


def test_dense_tails_match_numpy_and_the_eager_tails_in_any_chunking():
    targets, tail, params, zs, st = _dense_case()
    want = reference(targets, "fc0", st, zs, None)
    for chunk in (4, 512):  # 11 rows: padded chunks, or one call
        got = similarity.stitched_logits(tail, params, st, zs, (7,), chunk=chunk)
        assert got.shape == (3, 2, 11, 5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_families_mix_and_the_program_is_reused_for_new_stitchers_and_tails():
    targets, tail, params, zs, st = _dense_case()
    mixed = stitchers(np.random.default_rng(1), (5, 9, 3), 2, 7)
    mixed = [similarity.Stitcher(s.weight, s.bias, s.scale, f) for s, f in zip(mixed, similarity.FAMILIES)]
    similarity.stitched_logits(tail, params, st, zs, (7,), chunk=4)
    _, params2 = models.stack_tails([models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (2, 3)], "fc0")
    with CompileCounter() as c:
        got = similarity.stitched_logits(tail, params2, mixed, zs, (7,), chunk=4)
    assert c.count == 0
    targets2 = [models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (2, 3)]
    np.testing.assert_allclose(got, reference(targets2, "fc0", mixed, zs, None), rtol=1e-5, atol=1e-5)


def test_conv_tails_resize_the_sources():
    rng = np.random.default_rng(2)
    targets = [models.CNN((8, 8, 1), 4, channels=(3, 5), rngs=nnx.Rngs(s)) for s in (0, 1)]
    layer = "conv0"
    tshape = targets[0].feature_shapes()[layer]  # (4, 4, 3)
    n = 6
    zs = [rng.normal(size=(n, 8, 8, 2)).astype(np.float32), rng.normal(size=(n, 4, 4, 6)).astype(np.float32),
          rng.normal(size=(n, 2, 2, 4)).astype(np.float32)]
    st = stitchers(rng, (2, 6, 4), 2, tshape[-1])
    tail, params = models.stack_tails(targets, layer)
    got = similarity.stitched_logits(tail, params, st, zs, tshape, chunk=4)
    np.testing.assert_allclose(got, reference(targets, layer, st, zs, tshape[:2]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change, match", [
    (lambda st, zs: ([], zs, (7,), 4), "stitchers is empty"),
    (lambda st, zs: (st, zs[:2], (7,), 4), "one source per stitcher"),
    (lambda st, zs: (st, zs, (7,), 0), "chunk must be an integer >= 1"),
    (lambda st, zs: (st, zs, (8,), 4), r"weight \(M, d_src, 8\)"),
    (lambda st, zs: (st, zs, (7, 7), 4), r"target_shape must be \(T,\) or \(H, W, T\)"),
    (lambda st, zs: (st, [zs[0][:5], *zs[1:]], (7,), 4), "same number of rows"),
    (lambda st, zs: (st, [zs[2], zs[1], zs[0]], (7,), 4), r"stitchers\[0\] has weight \(2, 5, 7\)"),
    (lambda st, zs: (st, zs, (2, 2, 7), 4), r"sources\[0\] must be NHWC"),
    (lambda st, zs: ([st[0], similarity.Stitcher(st[1].weight[:1], st[1].bias[:1], st[1].scale[:1])], zs[:2],
                     (7,), 4), "the same M"),
])
def test_bad_arguments_are_named(change, match):
    _, tail, params, zs, st = _dense_case()
    st_, zs_, tshape, chunk = change(st, zs)
    with pytest.raises(ValueError, match=match):
        similarity.stitched_logits(tail, params, st_, zs_, tshape, chunk=chunk)
