"""funsim.similarity: pure, jit-able, vmap-able similarity measures.

Three families under one roof:

1. Representational similarity: CKA, RSA, CCA/SVCCA/PWCCA, shape metrics, regression.
2. Functional similarity through usable (V-)information: stitching, V-information.
3. Weight-based tensor similarity of multilinear (bilinear) networks.

Representations are 2-D arrays ``(n_samples, n_features)``; arrays are
positional, options keyword-only. Each measure's name says whether it is a
score (higher is more similar) or a distance.
"""

# ruff: noqa: F401  (explicit re-exports, one per line, as JAX does)

# --- representational similarity (cka, rsa, cca, shape, regression, registry) ---

# --- stitching and usable information ---

# --- multilinear networks and tensor similarity ---

# --- comparison grid ---
