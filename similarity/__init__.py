"""funsim.similarity: pure, jit-able, vmap-able similarity measures.

Three families under one roof:

1. Representational similarity: CKA, RSA, CCA/SVCCA/PWCCA, shape metrics, regression.
2. Functional similarity through usable (V-)information: stitching, V-information.
3. Weight-based tensor similarity of multilinear (bilinear) networks, including
   bilinear-attention transformers.

Representations are 2-D arrays ``(n_samples, n_features)``; arrays are
positional, options keyword-only. Each measure's name says whether it is a
score (higher is more similar) or a distance.
"""

# ruff: noqa: F401  (explicit re-exports, one per line, as JAX does)

# --- representational similarity (cka, rsa, cca, shape, regression, registry) ---
from similarity.cka import cka as cka
from similarity.cka import hsic as hsic
from similarity.cka import minibatch_cka as minibatch_cka
from similarity.cka import cka_init as cka_init
from similarity.cka import cka_accumulate as cka_accumulate
from similarity.cka import cka_merge as cka_merge
from similarity.cka import cka_finalize as cka_finalize
from similarity.cka import CKAState as CKAState
from similarity.cka import LinearStats as LinearStats
from similarity.cka import linear_stats as linear_stats
from similarity.cka import linear_hsic_cross as linear_hsic_cross
from similarity.cka import linear_cka_from_stats as linear_cka_from_stats
from similarity.cka import centre_features as centre_features
from similarity.cka import centre_gram as centre_gram
from similarity.cka import linear_gram as linear_gram
from similarity.cka import rbf_gram as rbf_gram
from similarity.rsa import rdm as rdm
from similarity.rsa import rsa as rsa
from similarity.rsa import rank_average as rank_average
from similarity.cca import cca as cca
from similarity.cca import cca_r2 as cca_r2
from similarity.cca import cca_mean as cca_mean
from similarity.cca import svcca as svcca
from similarity.cca import pwcca as pwcca
from similarity.shape import shape_distance as shape_distance
from similarity.shape import nbs as nbs
from similarity.shape import procrustes_distance as procrustes_distance
from similarity.shape import partial_whiten as partial_whiten
from similarity.regression import linear_regression_r2 as linear_regression_r2
from similarity.registry import Measure as Measure
from similarity.registry import INVARIANCES as INVARIANCES
from similarity.registry import measure as measure
from similarity.registry import list_measures as list_measures
from similarity.registry import register as register
from similarity.registry import register_family as register_family
from similarity.registry import make_measure as make_measure
from similarity._layer_stats import LayerStats as LayerStats
from similarity._layer_stats import MomentStats as MomentStats
from similarity._layer_stats import MomentPair as MomentPair

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
from similarity.task_stitching import INITS as INITS
from similarity.task_stitching import LOSSES as LOSSES
from similarity.task_stitching import OPTIMIZERS as OPTIMIZERS
from similarity.task_stitching import TrainedStitcher as TrainedStitcher
from similarity.task_stitching import TrainHistory as TrainHistory
from similarity.task_stitching import resize_spatial as resize_spatial
from similarity.task_stitching import stitch_representation as stitch_representation
from similarity.task_stitching import stitching_loss as stitching_loss
from similarity.task_stitching import train_stitcher as train_stitcher
from similarity.task_stitching import train_stitchers as train_stitchers

# --- multilinear networks and tensor similarity ---
from similarity.multilinear import BilinearLayer as BilinearLayer
from similarity.multilinear import LinearLayer as LinearLayer
from similarity.multilinear import Node as Node
from similarity.multilinear import apply_layer as apply_layer
from similarity.multilinear import apply_network as apply_network
from similarity.multilinear import difference as difference
from similarity.multilinear import fold_network as fold_network
from similarity.multilinear import interaction_tensor as interaction_tensor
from similarity.multilinear import lift as lift
from similarity.multilinear import lift_linear as lift_linear
from similarity.multilinear import network_depth as network_depth
from similarity.multilinear import validate_network as validate_network
from similarity.multilinear import validate_network_pair as validate_network_pair
from similarity.tensor_similarity import METHODS as TENSOR_METHODS
from similarity.tensor_similarity import METRICS as TENSOR_METRICS
from similarity.tensor_similarity import behavioral_similarity as behavioral_similarity
from similarity.tensor_similarity import similarity_matrix as similarity_matrix
from similarity.tensor_similarity import stack_networks as stack_networks
from similarity.tensor_similarity import tensor_inner as tensor_inner
from similarity.tensor_similarity import tensor_similarity as tensor_similarity
from similarity.tensor_similarity import weight_cosine as weight_cosine
from similarity.validate_numerics import monte_carlo_inner as monte_carlo_inner
from similarity.validate_numerics import quadrature_inner as quadrature_inner

# --- change-point segmentation of similarity matrices ---
from similarity.segmentation import SEGMENT_COSTS as SEGMENT_COSTS
from similarity.segmentation import Segmentation as Segmentation
from similarity.segmentation import change_points as change_points
from similarity.segmentation import segment_costs as segment_costs

# --- bilinear-attention transformers ---
from similarity.attention import ATTENTION_METHODS as ATTENTION_METHODS
from similarity.attention import AttentionLayer as AttentionLayer
from similarity.attention import AttentionNetwork as AttentionNetwork
from similarity.attention import apply_attention_layer as apply_attention_layer
from similarity.attention import apply_attention_network as apply_attention_network
from similarity.attention import attention_inner as attention_inner
from similarity.attention import attention_moments as attention_moments
from similarity.attention import attention_similarity as attention_similarity
from similarity.attention import attention_similarity_matrix as attention_similarity_matrix
from similarity.attention import bilinear_attention as bilinear_attention
from similarity.attention import validate_attention_network as validate_attention_network
from similarity.validate_numerics import attention_monte_carlo_inner as attention_monte_carlo_inner
from similarity.validate_numerics import attention_quadrature_inner as attention_quadrature_inner

# --- comparison grid ---
from similarity.grid import MOMENT_MEASURES as MOMENT_MEASURES
from similarity.grid import GridResult as GridResult
from similarity.grid import compare_grid as compare_grid
