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
from similarity.stitching import ReconstructionScore as ReconstructionScore
from similarity.stitching import Stitcher as Stitcher
from similarity.stitching import StitchingAsymmetry as StitchingAsymmetry
from similarity.stitching import apply_stitcher as apply_stitcher
from similarity.stitching import fit_stitcher as fit_stitcher
from similarity.stitching import fit_stitchers as fit_stitchers
from similarity.stitching import reconstruction_score as reconstruction_score
from similarity.stitching import stitching_asymmetry as stitching_asymmetry
from similarity.usable_info import V_FAMILIES as V_FAMILIES
from similarity.usable_info import PointwiseVInfo as PointwiseVInfo
from similarity.usable_info import VResult as VResult
from similarity.usable_info import conditional_v_information as conditional_v_information
from similarity.usable_info import pointwise_v_information as pointwise_v_information
from similarity.usable_info import v_entropy as v_entropy
from similarity.usable_info import v_information as v_information

# --- multilinear networks and tensor similarity ---
from similarity.multilinear import BilinearLayer as BilinearLayer
from similarity.multilinear import LinearLayer as LinearLayer
from similarity.multilinear import apply_layer as apply_layer
from similarity.multilinear import apply_network as apply_network

# --- comparison grid ---
