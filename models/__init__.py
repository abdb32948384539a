"""funsim.models: Flax NNX networks with layer access.

Every model exposes ``features(x) -> {layer: activations}``, ``layer_names()``
and ``tail(layer, z) -> logits`` (the rest of the network from a layer).
"""
