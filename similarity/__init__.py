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
from similarity.task_stitching import DirectionResult as DirectionResult
from similarity.task_stitching import FunctionalSimilarity as FunctionalSimilarity
from similarity.task_stitching import TrainHistory as TrainHistory
from similarity.task_stitching import functional_similarity as functional_similarity
from similarity.task_stitching import resize_spatial as resize_spatial
from similarity.task_stitching import stitch_representation as stitch_representation
from similarity.task_stitching import stitching_loss as stitching_loss
from similarity.task_stitching import train_stitcher as train_stitcher
from similarity.task_stitching import train_stitchers as train_stitchers

# --- multilinear networks and tensor similarity ---
from similarity.multilinear import BilinearLayer as BilinearLayer
from similarity.multilinear import LinearLayer as LinearLayer
from similarity.multilinear import apply_layer as apply_layer
from similarity.multilinear import apply_network as apply_network

# --- comparison grid ---
