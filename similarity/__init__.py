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
from similarity.stitching import FAMILIES as FAMILIES
from similarity.stitching import Stitcher as Stitcher
from similarity.stitching import apply_stitcher as apply_stitcher

# --- multilinear networks and tensor similarity ---
from similarity.multilinear import BilinearLayer as BilinearLayer
from similarity.multilinear import LinearLayer as LinearLayer
from similarity.multilinear import apply_layer as apply_layer
from similarity.multilinear import apply_network as apply_network
from similarity.multilinear import difference as difference
from similarity.multilinear import fold_network as fold_network
from similarity.multilinear import interaction_tensor as interaction_tensor
from similarity.multilinear import lift as lift
from similarity.multilinear import lift_linear as lift_linear
from similarity.multilinear import network_depth as network_depth
from similarity.multilinear import validate_network as validate_network
from similarity.tensor_similarity import METHODS as TENSOR_METHODS
from similarity.tensor_similarity import METRICS as TENSOR_METRICS
from similarity.tensor_similarity import behavioral_similarity as behavioral_similarity
from similarity.tensor_similarity import similarity_matrix as similarity_matrix
from similarity.tensor_similarity import tensor_inner as tensor_inner
from similarity.tensor_similarity import tensor_similarity as tensor_similarity
from similarity.tensor_similarity import weight_cosine as weight_cosine
from similarity.validate_numerics import monte_carlo_inner as monte_carlo_inner
from similarity.validate_numerics import quadrature_inner as quadrature_inner

# --- comparison grid ---
