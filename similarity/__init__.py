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
from funsim.similarity.cka import cka as cka
from funsim.similarity.cka import hsic as hsic
from funsim.similarity.cka import minibatch_cka as minibatch_cka
from funsim.similarity.cka import cka_init as cka_init
from funsim.similarity.cka import cka_accumulate as cka_accumulate
from funsim.similarity.cka import cka_merge as cka_merge
from funsim.similarity.cka import cka_finalize as cka_finalize
from funsim.similarity.cka import CKAState as CKAState
from funsim.similarity.cka import LinearStats as LinearStats
from funsim.similarity.cka import linear_stats as linear_stats
from funsim.similarity.cka import linear_hsic_cross as linear_hsic_cross
from funsim.similarity.cka import linear_cka_from_stats as linear_cka_from_stats
from funsim.similarity.cka import centre_features as centre_features
from funsim.similarity.cka import centre_gram as centre_gram
from funsim.similarity.cka import linear_gram as linear_gram
from funsim.similarity.cka import rbf_gram as rbf_gram
from funsim.similarity.rsa import rdm as rdm
from funsim.similarity.rsa import rsa as rsa
from funsim.similarity.rsa import rank_average as rank_average
from funsim.similarity.cca import cca as cca
from funsim.similarity.cca import cca_r2 as cca_r2
from funsim.similarity.cca import cca_mean as cca_mean
from funsim.similarity.cca import svcca as svcca
from funsim.similarity.cca import pwcca as pwcca
from funsim.similarity.shape import shape_distance as shape_distance
from funsim.similarity.shape import nbs as nbs
from funsim.similarity.shape import procrustes_distance as procrustes_distance
from funsim.similarity.shape import partial_whiten as partial_whiten
from funsim.similarity.regression import linear_regression_r2 as linear_regression_r2
from funsim.similarity.registry import Measure as Measure
from funsim.similarity.registry import DEGENERACIES as DEGENERACIES
from funsim.similarity.registry import INVARIANCES as INVARIANCES
from funsim.similarity.registry import measure as measure
from funsim.similarity.registry import list_measures as list_measures
from funsim.similarity.registry import register as register
from funsim.similarity.registry import register_family as register_family
from funsim.similarity.registry import make_measure as make_measure
from funsim.similarity.moments import LayerStats as LayerStats
from funsim.similarity.moments import MomentStats as MomentStats
from funsim.similarity.moments import MomentPair as MomentPair
from funsim.similarity.moments import FullMoments as FullMoments
from funsim.similarity.moments import LayerMoments as LayerMoments
from funsim.similarity.moments import PairMoments as PairMoments
from funsim.similarity.moments import split_weights as split_weights
from funsim.similarity.protocol import Core as Core

# --- stitching and usable information ---
from funsim.similarity.stitching import FAMILIES as FAMILIES
from funsim.similarity.stitching import HeldOutOverlapWarning as HeldOutOverlapWarning
from funsim.similarity.stitching import ReconstructionScore as ReconstructionScore
from funsim.similarity.stitching import Stitcher as Stitcher
from funsim.similarity.stitching import StitchingAsymmetry as StitchingAsymmetry
from funsim.similarity.stitching import apply_stitcher as apply_stitcher
from funsim.similarity.stitching import fit_stitcher as fit_stitcher
from funsim.similarity.stitching import fit_stitchers as fit_stitchers
from funsim.similarity.stitching import reconstruction_score as reconstruction_score
from funsim.similarity.stitching import stitching_asymmetry as stitching_asymmetry
from funsim.similarity.spatial import spatial_reconstruction_score as spatial_reconstruction_score
from funsim.similarity.spatial import spatial_score_table as spatial_score_table
from funsim.similarity.usable_info import V_FAMILIES as V_FAMILIES
from funsim.similarity.usable_info import PointwiseVInfo as PointwiseVInfo
from funsim.similarity.usable_info import VResult as VResult
from funsim.similarity.usable_info import conditional_v_information as conditional_v_information
from funsim.similarity.usable_info import pointwise_v_information as pointwise_v_information
from funsim.similarity.usable_info import v_entropy as v_entropy
from funsim.similarity.usable_info import v_information as v_information
from funsim.similarity.task_stitching import INITS as INITS
from funsim.similarity.task_stitching import LOSSES as LOSSES
from funsim.similarity.task_stitching import OPTIMIZERS as OPTIMIZERS
from funsim.similarity.task_stitching import StitchTraining as StitchTraining
from funsim.similarity.task_stitching import TrainedStitcher as TrainedStitcher
from funsim.similarity.task_stitching import TrainHistory as TrainHistory
from funsim.similarity.task_stitching import resize_spatial as resize_spatial
from funsim.similarity.task_stitching import stitch_representation as stitch_representation
from funsim.similarity.task_stitching import stitching_loss as stitching_loss
from funsim.similarity.task_stitching import train_stitcher as train_stitcher
from funsim.similarity.task_stitching import train_stitchers as train_stitchers
from funsim.similarity.stitched_eval import stitched_logits as stitched_logits

# --- multilinear networks and tensor similarity ---
from funsim.similarity.multilinear import BilinearLayer as BilinearLayer
from funsim.similarity.multilinear import LinearLayer as LinearLayer
from funsim.similarity.multilinear import Node as Node
from funsim.similarity.multilinear import apply_layer as apply_layer
from funsim.similarity.multilinear import apply_network as apply_network
from funsim.similarity.multilinear import difference as difference
from funsim.similarity.multilinear import fold_network as fold_network
from funsim.similarity.multilinear import interaction_tensor as interaction_tensor
from funsim.similarity.multilinear import lift as lift
from funsim.similarity.multilinear import lift_linear as lift_linear
from funsim.similarity.multilinear import network_depth as network_depth
from funsim.similarity.multilinear import validate_network as validate_network
from funsim.similarity.multilinear import validate_network_pair as validate_network_pair
from funsim.similarity.tensor_similarity import METHODS as TENSOR_METHODS
from funsim.similarity.tensor_similarity import METRICS as TENSOR_METRICS
from funsim.similarity.tensor_similarity import behavioural_similarity as behavioural_similarity
from funsim.similarity.tensor_similarity import behavioral_similarity as behavioral_similarity  # deprecated spelling
from funsim.similarity.tensor_similarity import similarity_matrix as similarity_matrix
from funsim.similarity.tensor_similarity import stack_networks as stack_networks
from funsim.similarity.tensor_similarity import tensor_inner as tensor_inner
from funsim.similarity.tensor_similarity import tensor_similarity as tensor_similarity
from funsim.similarity.tensor_similarity import weight_cosine as weight_cosine
from funsim.similarity.estimators import monte_carlo_inner as monte_carlo_inner
from funsim.similarity.estimators import quadrature_inner as quadrature_inner

# --- change-point segmentation of similarity matrices ---
from funsim.similarity.segmentation import SEGMENT_COSTS as SEGMENT_COSTS
from funsim.similarity.segmentation import Segmentation as Segmentation
from funsim.similarity.segmentation import change_points as change_points
from funsim.similarity.segmentation import segment_costs as segment_costs

# --- bilinear-attention transformers ---
from funsim.similarity.attention import ATTENTION_METHODS as ATTENTION_METHODS
from funsim.similarity.attention import AttentionLayer as AttentionLayer
from funsim.similarity.attention import AttentionNetwork as AttentionNetwork
from funsim.similarity.attention import apply_attention_layer as apply_attention_layer
from funsim.similarity.attention import apply_attention_network as apply_attention_network
from funsim.similarity.attention import attention_inner as attention_inner
from funsim.similarity.attention import attention_moments as attention_moments
from funsim.similarity.attention import attention_similarity as attention_similarity
from funsim.similarity.attention import attention_similarity_matrix as attention_similarity_matrix
from funsim.similarity.attention import stack_attention_networks as stack_attention_networks
from funsim.similarity.attention import bilinear_attention as bilinear_attention
from funsim.similarity.attention import validate_attention_network as validate_attention_network
from funsim.similarity.estimators import attention_monte_carlo_inner as attention_monte_carlo_inner
from funsim.similarity.estimators import attention_quadrature_inner as attention_quadrature_inner

# --- comparison grid ---
from funsim.similarity.grid import MOMENT_MEASURES as MOMENT_MEASURES
from funsim.similarity.grid import GridResult as GridResult
from funsim.similarity.grid import UndefinedCellWarning as UndefinedCellWarning
from funsim.similarity._validate import PrecisionWarning as PrecisionWarning
from funsim.similarity.grid import compare_grid as compare_grid

# --- checkpoint x checkpoint matrices of a training run ---
from funsim.similarity.checkpoints import CHECKPOINT_METRICS as CHECKPOINT_METRICS
from funsim.similarity.checkpoints import tensor_matrices as tensor_matrices
from funsim.similarity.checkpoints import tensor_similarity_to as tensor_similarity_to
from funsim.similarity.checkpoints import monte_carlo_matrices as monte_carlo_matrices
from funsim.similarity.checkpoints import normalise_gram as normalise_gram
from funsim.similarity.checkpoints import weight_cosine_matrix as weight_cosine_matrix
from funsim.similarity.checkpoints import network_outputs as network_outputs
from funsim.similarity.checkpoints import behavioural_matrix as behavioural_matrix
from funsim.similarity.checkpoints import behavioral_matrix as behavioral_matrix  # deprecated spelling
from funsim.similarity.checkpoints import cka_matrix as cka_matrix
from funsim.similarity.checkpoints import checkpoint_matrices as checkpoint_matrices
from funsim.similarity.checkpoints import block_summary as block_summary
from funsim.similarity.checkpoints import block_gap as block_gap
