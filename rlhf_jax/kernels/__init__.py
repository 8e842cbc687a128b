"""rlhf_jax.kernels: pure, jittable array functions every algorithm is built from.

Conventions:
  * Per-token arrays are `[batch, time]` with a 0/1 (or bool) `mask`, 1 on the
    tokens that count; per-sample arrays are `[batch]`.
  * Static options are keyword-only; bad options raise ValueError naming the
    option before anything is traced.
  * bfloat16 inputs are accepted; results are float32.
  * Per-token outputs are 0 where the mask is 0.
  * Every function's docstring gives its formula and source.
"""

from rlhf_jax.kernels.advantages import decoupled_gae
from rlhf_jax.kernels.baselines import discounted_returns
from rlhf_jax.kernels.advantages import gae
from rlhf_jax.kernels.baselines import group_advantages
from rlhf_jax.kernels.advantages import length_adaptive_lambda
from rlhf_jax.kernels.baselines import reinforce_pp_advantages
from rlhf_jax.kernels.baselines import reinforce_pp_baseline_advantages
from rlhf_jax.kernels.baselines import remax_advantages
from rlhf_jax.kernels.advantages import reverse_linear_recurrence
from rlhf_jax.kernels.baselines import rloo_advantages
from rlhf_jax.kernels.advantages import truncation_bootstrap_values
from rlhf_jax.kernels.aggregation import AGGREGATION_MODES
from rlhf_jax.kernels.aggregation import aggregate
from rlhf_jax.kernels.aggregation import aggregation_normalizer
from rlhf_jax.kernels.importance import ROLLOUT_CORRECTION_MODES
from rlhf_jax.kernels.importance import rollout_correction
from rlhf_jax.kernels.kl import KL_ESTIMATORS
from rlhf_jax.kernels.kl import adaptive_kl_coefficient
from rlhf_jax.kernels.kl import kl_penalty
from rlhf_jax.kernels.logprobs import entropy_from_logits
from rlhf_jax.kernels.logprobs import token_logprobs
from rlhf_jax.kernels.masking import last_valid_index
from rlhf_jax.kernels.masking import next_valid_values
from rlhf_jax.kernels.policy_losses import cispo_policy_loss
from rlhf_jax.kernels.policy_losses import entropy_loss
from rlhf_jax.kernels.policy_losses import gspo_policy_loss
from rlhf_jax.kernels.policy_losses import gspo_token_policy_loss
from rlhf_jax.kernels.policy_losses import positive_nll_loss
from rlhf_jax.kernels.policy_losses import ppo_policy_loss
from rlhf_jax.kernels.preference import DPO_KINDS
from rlhf_jax.kernels.preference import bradley_terry_loss
from rlhf_jax.kernels.preference import dpo_loss
from rlhf_jax.kernels.preference import position_debiased_preference
from rlhf_jax.kernels.q_learning import clipped_importance_weights
from rlhf_jax.kernels.q_learning import dqo_policy_loss
from rlhf_jax.kernels.q_learning import dqo_value_loss
from rlhf_jax.kernels.q_learning import soft_lambda_returns
from rlhf_jax.kernels.reward_shaping import kl_in_reward
from rlhf_jax.kernels.reward_shaping import overlong_penalty
from rlhf_jax.kernels.reward_shaping import place_at_last_token
from rlhf_jax.kernels.reward_shaping import prm_clip
from rlhf_jax.kernels.reward_shaping import prm_delta
from rlhf_jax.kernels.statistics import explained_variance
from rlhf_jax.kernels.statistics import masked_mean
from rlhf_jax.kernels.statistics import masked_sum
from rlhf_jax.kernels.statistics import masked_var
from rlhf_jax.kernels.statistics import masked_whiten
from rlhf_jax.kernels.value_losses import value_loss

__all__ = [
    "AGGREGATION_MODES", "DPO_KINDS", "KL_ESTIMATORS", "ROLLOUT_CORRECTION_MODES",
    "adaptive_kl_coefficient", "aggregate", "aggregation_normalizer", "bradley_terry_loss",
    "cispo_policy_loss", "clipped_importance_weights", "dqo_policy_loss", "dqo_value_loss",
    "soft_lambda_returns",
    "decoupled_gae", "discounted_returns", "dpo_loss", "entropy_from_logits",
    "entropy_loss", "explained_variance", "gae", "group_advantages", "gspo_policy_loss",
    "gspo_token_policy_loss", "kl_in_reward",
    "kl_penalty", "last_valid_index", "length_adaptive_lambda", "masked_mean",
    "masked_sum", "masked_var", "masked_whiten", "next_valid_values",
    "overlong_penalty", "place_at_last_token", "position_debiased_preference",
    "positive_nll_loss", "ppo_policy_loss", "prm_clip", "prm_delta",
    "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "rollout_correction",
    "remax_advantages", "reverse_linear_recurrence", "rloo_advantages",
    "token_logprobs", "truncation_bootstrap_values", "value_loss",
]
