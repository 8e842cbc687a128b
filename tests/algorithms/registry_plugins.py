"""Estimators and policy losses outside the library, named as "tests.algorithms.
registry_plugins:<name>" by tests/algorithms/test_estimators.py, test_losses.py and
tests/launch/test_extending.py (what a user's own module looks like)."""

import jax.numpy as jnp

from rlhf_jax import kernels
from rlhf_jax.algorithms.estimators import Estimator

# The constant advantage of `constant_advantage`: seen in the loss's logged metric.
CONSTANT = 0.25


def ppo_copy(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg,
             agg_normalizer, agg_horizon, weights):
  """PPO's clipped surrogate without dual clip: the built-in 'ppo' exactly."""
  return kernels.ppo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=clip_low,
                                 clip_high=clip_high, agg=agg, agg_normalizer=agg_normalizer,
                                 agg_horizon=agg_horizon, weights=weights)


def unclipped(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg,
              agg_normalizer, agg_horizon, weights):
  """The importance-weighted policy gradient with no clip: −w·A·π_θ/π_old per token,
  aggregated as `agg` says; logs the mean advantage it was given ("plugin/advantage_mean")."""
  del clip_low, clip_high
  ratio = jnp.exp(logprobs - old_logprobs)
  per_token = -weights * advantages * ratio
  loss = kernels.aggregate(per_token, mask, mode=agg, normalizer=agg_normalizer,
                           horizon=agg_horizon)
  return loss, {"plugin/advantage_mean": kernels.masked_mean(advantages, mask)}


def score_minus_half(batch, token_rewards, algorithm, *, group_size):
  """A(i, t) = score_i − 0.5 on every response token; no returns."""
  del token_rewards, algorithm, group_size
  return (batch.scores - 0.5)[:, None] * batch.response_mask, None


def constant_advantage(batch, token_rewards, algorithm, *, group_size):
  """A = CONSTANT on every response token, whatever the scores."""
  del token_rewards, algorithm, group_size
  return CONSTANT * batch.response_mask, None


def _group_max_gap(batch, token_rewards, algorithm, *, group_size):
  del token_rewards, algorithm
  scores = batch.scores.reshape(-1, group_size)
  gap = scores - jnp.max(scores, axis=1, keepdims=True)
  return gap.reshape(-1)[:, None] * batch.response_mask, None


# A record with capabilities: a baseline from the group (rollout.group_size >= 2).
GROUP_MAX_GAP = Estimator("group_max_gap", _group_max_gap, group_based=True)


def too_few_arguments(logprobs, old_logprobs):
  """Not a policy loss: refused when the config is validated."""
  return jnp.sum(logprobs - old_logprobs), {}


NOT_A_FUNCTION = 3
