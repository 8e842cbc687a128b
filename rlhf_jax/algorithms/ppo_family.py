"""The PPO family as configuration of shared kernels: advantages and losses.

PPO, GRPO, Dr. GRPO, RLOO, REINFORCE++, DAPO, VC-PPO and VAPO differ only in
the fields of an `algorithm` ConfigDict (configs/*.py); this module turns those
fields into the advantage estimate and the actor / critic losses. The trainer
calls `advantages_and_returns` once per rollout batch and `actor_loss` /
`critic_loss` inside its jitted update steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax import kernels
from rlhf_jax.algorithms.rollout import RolloutBatch

ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
CRITIC_ESTIMATORS = ("gae",)
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")


def uses_critic(algorithm) -> bool:
  """Whether the estimator needs a value model."""
  return algorithm.estimator in CRITIC_ESTIMATORS


def uses_reference(algorithm) -> bool:
  """Whether a reference policy is needed (KL as a loss or in the reward)."""
  return algorithm.kl_loss_coef > 0 or algorithm.kl_reward_coef > 0


def token_rewards(algorithm, batch: RolloutBatch, kl_reward_coef: float | None = None
                  ) -> jax.Array:
  """[B, R] rewards: the score at the last token, minus β·KL per token when the
  KL is in the reward (InstructGPT; `kernels.kl_in_reward`). β is
  `algorithm.kl_reward_coef` unless `kl_reward_coef` (the adaptive controller's
  current value) is given."""
  rewards = batch.token_rewards()
  beta = algorithm.kl_reward_coef if kl_reward_coef is None else kl_reward_coef
  if algorithm.kl_reward_coef > 0:
    rewards, _ = kernels.kl_in_reward(rewards, batch.old_logprobs, batch.ref_logprobs,
                                      batch.response_mask, beta=beta,
                                      estimator=algorithm.kl_estimator)
  return rewards


def rollout_kl(algorithm, batch: RolloutBatch) -> jax.Array:
  """The batch's KL(π_old ‖ π_ref): per-sequence token means, averaged over
  sequences (what verl's adaptive controller observes)."""
  kl = kernels.kl_penalty(batch.old_logprobs, batch.ref_logprobs,
                          estimator=algorithm.kl_estimator)
  return kernels.aggregate(kl, batch.response_mask, mode="seq-mean-token-mean")


def advantages_and_returns(algorithm, batch: RolloutBatch,
                           kl_reward_coef: float | None = None
                           ) -> tuple[jax.Array, jax.Array]:
  """Advantages [B, R] for the actor and returns [B, R] for the critic.

  gae: (decoupled) GAE with λ_actor (or VAPO's length-adaptive λ when
  `length_adaptive_alpha` > 0) and λ_critic; grpo / dr_grpo / rloo /
  reinforce_pp_baseline: group-relative outcome advantages broadcast over the
  response; reinforce_pp: batch-whitened discounted returns. Returns are zeros
  for critic-free estimators. Rows with `finished` False (T-PPO) bootstrap GAE
  from their last value (Extended GAE). `kl_reward_coef` overrides β of the
  in-reward KL (the adaptive controller's value).
  """
  mask = batch.response_mask
  rewards = token_rewards(algorithm, batch, kl_reward_coef)
  returns = jnp.zeros_like(mask)
  estimator = algorithm.estimator
  if estimator == "gae":
    actor_lam = algorithm.actor_lam
    if algorithm.length_adaptive_alpha > 0:
      actor_lam = kernels.length_adaptive_lambda(batch.lengths,
                                                 alpha=algorithm.length_adaptive_alpha)
    # Extended GAE (T-PPO): a response cut at a window's end bootstraps from its last value.
    bootstrap = kernels.truncation_bootstrap_values(batch.values, mask, batch.finished)
    advantages, returns = kernels.decoupled_gae(rewards, batch.values, mask,
                                                gamma=algorithm.gamma, actor_lam=actor_lam,
                                                critic_lam=algorithm.critic_lam,
                                                bootstrap_values=bootstrap)
  elif estimator in ("grpo", "dr_grpo"):
    per_sample = kernels.group_advantages(batch.scores, group_size=algorithm.group_size,
                                          normalize_by_std=estimator == "grpo")
    advantages = per_sample[:, None] * mask
  elif estimator == "rloo":
    advantages = kernels.rloo_advantages(batch.scores,
                                         group_size=algorithm.group_size)[:, None] * mask
  elif estimator == "reinforce_pp":
    advantages, _ = kernels.reinforce_pp_advantages(rewards, mask, gamma=algorithm.gamma)
  elif estimator == "reinforce_pp_baseline":
    advantages = kernels.reinforce_pp_baseline_advantages(batch.scores, mask,
                                                          group_size=algorithm.group_size)
  else:
    raise ValueError(f"algorithm.estimator={estimator!r}; allowed: {', '.join(ESTIMATORS)}.")
  if algorithm.whiten_advantages:
    advantages = kernels.masked_whiten(advantages, batch.policy_mask())
  return advantages, returns


def actor_loss(algorithm, logprobs: jax.Array, entropy: jax.Array, batch: RolloutBatch,
               advantages: jax.Array, normalizer: jax.Array
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO-clip (+ KL loss, entropy bonus, VAPO's positive-example NLL) of one mini-batch.

  Args:
    logprobs, entropy: [b, R] of the current policy.
    batch: the mini-batch (old and reference log-probs, masks, scores).
    advantages: [b, R].
    normalizer: the aggregation count of the whole mini-batch
      (`kernels.aggregation_normalizer`), so splitting it never changes the loss.
  Returns:
    (loss, metrics).
  """
  mask = batch.response_mask
  dual_clip = algorithm.dual_clip if algorithm.dual_clip > 0 else None
  # Dr. GRPO's constant: the response cap R (the mode's only use of a horizon).
  horizon = (float(batch.response_length) if algorithm.agg == "seq-mean-token-sum-norm"
             else None)
  loss, metrics = kernels.ppo_policy_loss(
      logprobs, batch.old_logprobs, advantages, mask, clip_low=algorithm.clip_low,
      clip_high=algorithm.clip_high, dual_clip=dual_clip, agg=algorithm.agg,
      agg_normalizer=normalizer, agg_horizon=horizon)
  metrics = dict(metrics, pg_loss=loss)
  if algorithm.kl_loss_coef > 0:
    kl = kernels.kl_penalty(logprobs, batch.ref_logprobs, estimator=algorithm.kl_estimator)
    kl_loss = kernels.aggregate(kl, mask, mode=algorithm.agg, normalizer=normalizer,
                                horizon=horizon)
    loss = loss + algorithm.kl_loss_coef * kl_loss
    metrics["kl_loss"] = kl_loss
  if algorithm.entropy_coef > 0:
    loss = loss + algorithm.entropy_coef * kernels.entropy_loss(
        entropy, mask, agg=algorithm.agg, agg_normalizer=normalizer)
  if algorithm.positive_nll_coef > 0:
    nll = kernels.positive_nll_loss(logprobs, mask, batch.scores > algorithm.positive_threshold)
    loss = loss + algorithm.positive_nll_coef * nll
    metrics["positive_nll"] = nll
  metrics["entropy"] = kernels.masked_mean(entropy, mask)
  return loss, metrics


def critic_loss(algorithm, values: jax.Array, batch: RolloutBatch, returns: jax.Array,
                normalizer: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value loss of one mini-batch (`kernels.value_loss`)."""
  clip = algorithm.value_clip if algorithm.value_clip > 0 else None
  loss, metrics = kernels.value_loss(values, batch.values, returns, batch.response_mask,
                                     clip=clip, agg=algorithm.agg, agg_normalizer=normalizer)
  metrics = dict(metrics, value_loss=loss,
                 explained_variance=kernels.explained_variance(values, returns,
                                                               batch.response_mask))
  return loss, metrics
