"""One spelling in public names and options (British, as most of the code and docs): the old American
spellings users may already call still work, warn, and give the same result."""

import numpy as np
import pytest

from funsim import similarity


def test_behavioural_similarity_and_its_deprecated_spelling():
    rng = np.random.default_rng(0)
    a = similarity.LinearLayer(rng.normal(size=(2, 3)))
    b = similarity.LinearLayer(rng.normal(size=(2, 3)))
    x = rng.normal(size=(5, 3))
    new = similarity.behavioural_similarity(a, b, x)
    with pytest.warns(DeprecationWarning, match="behavioural_similarity"):
        old = similarity.behavioral_similarity(a, b, x)
    assert float(old) == float(new)


@pytest.mark.parametrize("fit", ["fit_stitcher", "fit_stitchers"])
def test_normalise_option_and_its_deprecated_spelling(fit):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 3)), rng.normal(size=(30, 3))
    call = (lambda **kw: similarity.fit_stitcher(x, y, family="orthogonal", **kw)) if fit == "fit_stitcher" else (
        lambda **kw: similarity.fit_stitchers([x], [y], family="orthogonal", **kw)[0])
    new = call(normalise=False)
    with pytest.warns(DeprecationWarning, match="normalise="):
        old = call(normalize=False)
    np.testing.assert_array_equal(old.scale, new.scale)
    assert float(new.scale) == 1.0 and float(call().scale) != 1.0  # the option does something
    with pytest.raises(TypeError, match="normalise"):
        call(normalise="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalization'"):
        call(normalization=False)


def test_layer_moments_normalise_and_its_deprecated_spelling():
    from funsim.similarity.stitching import layer_moments

    z = np.random.default_rng(2).normal(size=(12, 3))
    w_tr, w_te = (np.arange(12) < 8).astype(float), (np.arange(12) >= 8).astype(float)
    new = layer_moments(z, w_tr, w_te, normalise=False)
    with pytest.warns(DeprecationWarning, match="normalise="):
        old = layer_moments(z, w_tr, w_te, normalize=False)
    np.testing.assert_array_equal(np.asarray(old.gram_train), np.asarray(new.gram_train))
    assert float(new.norm) == 1.0 and float(layer_moments(z, w_tr, w_te).norm) != 1.0  # the option does something
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalization'"):
        layer_moments(z, w_tr, w_te, normalization=False)
