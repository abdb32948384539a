"""The similarity study's model evaluation: stitched logits through its coarsened tails, and its features."""

import numpy as np
from flax import nnx

from funsim import models, similarity
from funsim.experiments import similarity_study as S
from tests._stitch_models import reference_stitched_logits as reference
from tests._stitch_models import stacked_stitchers as stitchers


def test_the_study_evaluates_through_coarsened_tails():
    """The study's coarse task: CoarseTail (a hashable wrapper) goes through similarity.stitched_logits."""
    rng = np.random.default_rng(0)
    targets = [models.MLP(6, 5, widths=(7, 4), rngs=nnx.Rngs(s)) for s in (0, 1)]
    tail, params = models.stack_tails(targets, "fc0")
    zs = [rng.normal(size=(11, d)).astype(np.float32) for d in (5, 3)]
    st = stitchers(rng, (5, 3), 2, 7)
    coarse = (0, 0, 1, 1, 1)
    got = similarity.stitched_logits(S.CoarseTail(tail, coarse), params, st, zs, (7,), chunk=4)
    np.testing.assert_allclose(got, reference(targets, "fc0", st, zs, None, coarse), rtol=1e-5, atol=1e-5)


def test_study_features_are_the_models_features():
    x = np.random.default_rng(3).normal(size=(9, 8, 8, 1)).astype(np.float32)
    m = models.CNN((8, 8, 1), 4, channels=(3, 5), rngs=nnx.Rngs(0))
    got = S._features(m, x, batch=4)
    want = m.features(x)
    assert list(got) == list(want) and all(isinstance(v, np.ndarray) for v in got.values())
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)

