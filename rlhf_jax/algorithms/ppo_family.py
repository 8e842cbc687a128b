"""The PPO family as configuration of shared kernels: `prepare` and the losses.

PPO, GRPO, Dr. GRPO, RLOO, REINFORCE++, DAPO, VC-PPO, VAPO and T-PPO differ only in
the `algorithm` section (algorithms/ppo_config.py). This module turns it into
  prepare      once per rollout batch, on device: reward shaping, rollout
               correction weights, advantages and returns, the KL controller;
  actor_loss   inside the jitted update: PPO clip + KL / entropy / NLL terms;
  critic_loss  the clipped value loss.
Nothing here loops, does I/O or holds state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax import kernels
from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import losses
from rlhf_jax.algorithms.ppo_config import uses_critic  # noqa: F401  (re-exported)
from rlhf_jax.algorithms.ppo_config import uses_reference  # noqa: F401
from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import TrainBatch


class Correction(NamedTuple):
  """What the behaviour correction sets per token ([B, R] each; `behaviour_correction`)."""
  old_logprobs: jax.Array  # π_old (π_prox of stale tokens)
  is_weights: jax.Array  # the importance weights w
  correction_mask: jax.Array  # 0 on the tokens the correction drops


class Normalizers(NamedTuple):
  """Global counts of a whole mini-batch, so a micro-batch's loss sums to the unsplit one."""
  agg: jax.Array  # `kernels.aggregation_normalizer` of the loss mask
  positive: jax.Array  # positive-sample tokens (VAPO's NLL term)
  tokens: jax.Array  # real tokens of the rows, prompts included (a MoE router's losses)


def shape_rewards(algorithm, batch: RolloutBatch) -> RolloutBatch:
  """DAPO's overlong punishment on finished rows' scores (Eq. 13), and the overlong
  filter (truncated rows leave the loss). Rows no reward scored (`batch.scored` False:
  `reward.unscored = "drop"`) leave the loss here, and their groups' statistics in the
  group estimators."""
  batch = batch.replace(response_mask=batch.response_mask * batch.scored[:, None])
  o = algorithm.overlong
  if o.penalty:
    penalty = kernels.overlong_penalty(batch.lengths, max_length=batch.response_length,
                                       buffer_length=o.buffer, factor=o.factor)
    batch = batch.replace(scores=batch.scores + penalty * batch.finished)
  if o.filter:
    batch = batch.replace(response_mask=batch.response_mask * ~batch.truncated[:, None])
  return batch


def process_rewards(algorithm, batch: RolloutBatch) -> jax.Array:
  """[B, R] the PRM's step rewards at step-end tokens, refined as
  `algorithm.process_reward.shaping` says (Gao et al., arXiv:2410.15115 §4: 'clip'
  r̃ = min(r − η, 0), 'delta' r̃_k = r_k − r_{k+1}, 'clip_delta' both, 'none' raw), times
  `coef`. Zeros when the batch has no step rewards."""
  p = algorithm.process_reward
  rewards, mask = batch.step_rewards, batch.step_mask
  if p.shaping in ("clip", "clip_delta"):
    rewards = kernels.prm_clip(rewards, mask, eta=p.eta)
  if p.shaping in ("delta", "clip_delta"):
    rewards = kernels.prm_delta(rewards, mask)
  return p.coef * rewards * mask


def token_rewards(algorithm, batch: TrainBatch, kl_coef: jax.Array | float) -> jax.Array:
  """[B, R] rewards: the score at the last token plus the shaped process rewards at
  step ends (`process_rewards`; Dai et al., arXiv:2410.17621), minus β·KL(π_old ‖ π_ref)
  per token when the KL is in the reward (InstructGPT; `kernels.kl_in_reward`)."""
  rewards = batch.token_rewards() + process_rewards(algorithm, batch)
  if algorithm.kl.placement == "reward":
    rewards, _ = kernels.kl_in_reward(rewards, batch.old_logprobs, batch.ref_logprobs,
                                      batch.response_mask, beta=kl_coef,
                                      estimator=algorithm.kl.estimator)
  return rewards


def rollout_kl(algorithm, batch: TrainBatch) -> jax.Array:
  """The batch's KL(π_old ‖ π_ref): per-sequence token means, averaged over
  sequences (what verl's adaptive controller observes)."""
  kl = kernels.kl_penalty(batch.old_logprobs, batch.ref_logprobs,
                          estimator=algorithm.kl.estimator)
  return kernels.aggregate(kl, batch.response_mask, mode="seq-mean-token-mean")


def advantages_and_returns(algorithm, batch: TrainBatch, kl_coef: jax.Array | float, *,
                           group_size: int) -> tuple[jax.Array, jax.Array]:
  """Advantages [B, R] for the actor and returns [B, R] for the critic of `batch` (its
  π_old, π_ref, values and correction set; its own advantages and returns unread), from
  the record of `algorithm.advantage.estimator` (algorithms/estimators.py: gae, grpo,
  dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, registered or "module:name"), then
  whitened over the batch when `advantage.whiten`. Returns are zeros for critic-free
  estimators.
  """
  mask = batch.response_mask
  rewards = token_rewards(algorithm, batch, kl_coef)
  record = estimators.estimator(algorithm.advantage.estimator)
  advantages, returns = record.fn(batch, rewards, algorithm, group_size=group_size)
  if returns is None:
    returns = jnp.zeros_like(mask)
  if algorithm.advantage.whiten:
    advantages = kernels.masked_whiten(advantages, batch.policy_mask())
  return advantages, returns


def behaviour_correction(algorithm, batch: RolloutBatch, trainer_logprobs: jax.Array, *,
                         correction: str, version: jax.Array | int | None
                         ) -> tuple[Correction, dict[str, jax.Array]]:
  """π_old, importance weights and kept tokens of every sampled token (decoupled PPO for
  stale tokens: Hilton et al. arXiv:2110.00641, AReaL arXiv:2505.24298;
  docs/formulas.md#decoupled-ppo).

  A sampled token is fresh when its `token_versions` entry equals `version` (the policy
  whose weights `trainer_logprobs` were computed with), else stale
  (`RolloutBatch.stale_mask`; a partial rollout's tokens after a mid-sample swap are
  fresh: the sampler recomputed their KV cache under the new weights). Per token:

    fresh, correction 'none':  π_old = π_sampler,  w = 1       (PPO, exactly)
    fresh, correction c:       π_old = π_trainer,  w = c(π_trainer / π_sampler)
    stale:                     π_old = π_prox = π_trainer,  w = s(π_prox / π_behav)

  A stale token that s = 'mis_token' masks keeps its place in the loss mask with w = 0
  (AReaL: it still counts in the token-mean's denominator); a fresh token that c masks
  leaves the mask and the denominator (verl's rollout rejection sampling).

  with π_behav = π_sampler (the sampler's log-probs of its own version) and c, s the
  `kernels.rollout_correction` modes of `algorithm.correction` and `algorithm.staleness`
  (s: TIS truncation at C, or masked outside [1/C, C]). The objective per token is then
  w · min(r A, clip(r, 1 − ε_low, 1 + ε_high) A) with r = π_θ / π_old. A stale weight
  already holds any sampler–trainer mismatch (π_behav is the sampler's own number), so a
  token gets one weight, never the product of both. `version` None: every token is fresh.

  Args:
    batch: the rollout: [B, R] `sampler_logprobs`, `token_versions`, and the masks.
    trainer_logprobs: [B, R] the trainer's log-probs under the current weights (0 off
      the response).
    correction: the rollout-correction mode in force.
    version: the current policy version (a scalar), or None.
  Returns:
    (the Correction: π_old, the weights and the kept tokens; metrics: the
    correction's over fresh tokens, logprob_mismatch_* included, and staleness/*).
  """
  sampled = batch.sampled_mask()
  if version is None:
    stale = jnp.zeros(sampled.shape, bool)
    lag = jnp.zeros(sampled.shape, jnp.int32)
  else:
    lag = jnp.asarray(version, jnp.int32) - batch.token_versions
    stale = batch.stale_mask(version) > 0
  stale_mask = sampled * stale
  fresh_mask = sampled - stale_mask
  weights, keep, metrics = kernels.rollout_correction(
      trainer_logprobs, batch.sampler_logprobs, fresh_mask, mode=correction,
      threshold=algorithm.correction.threshold)
  s = algorithm.staleness
  stale_weights, stale_keep, stale_metrics = kernels.rollout_correction(
      trainer_logprobs, batch.sampler_logprobs, stale_mask, mode=s.mode, threshold=s.cap)
  # AReaL's behaviour mask: a stale token whose w leaves the trust region gets w = 0 but
  # stays in the loss mask, so the aggregation normalizer still counts it and the kept
  # tokens' gradients are not scaled up by N / N_kept (AReaL ppo_actor_loss_fn:
  # Σ w·ℓ / loss_mask_count). Fresh tokens that correction 'mis_*' drops leave the mask
  # and the normalizer instead, as verl's rollout rejection sampling drops them from
  # response_mask.
  stale_keep = stale_mask
  # Without a correction a fresh token keeps the sampler's π_old: equal to the trainer's
  # up to float rounding, which must not become a weight ≠ 1.
  use_trainer = stale if correction == "none" else jnp.ones(stale.shape, bool)
  old = jnp.where(use_trainer, trainer_logprobs, batch.sampler_logprobs)
  return (Correction(old, weights + stale_weights, keep + stale_keep),
          {**metrics, **staleness_metrics(lag, sampled, stale_mask, stale_metrics)})


def staleness_metrics(lag: jax.Array, sampled: jax.Array, stale_mask: jax.Array,
                      stale: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """staleness/*: the fraction of sampled tokens that are stale, their version lag (mean
  over all sampled tokens, fresh ones at 0; max), the fraction of rows whose tokens span
  versions (partial rollouts), |log π_prox − log π_behav| over stale
  tokens (mean, max), and the behaviour weights' range and clip / mask rates (`stale`:
  the metrics of `kernels.rollout_correction` over the stale tokens)."""
  count = jnp.maximum(jnp.sum(sampled), 1.0)
  # A row whose sampled tokens span versions was a partial rollout (weights swapped
  # mid-sample).
  row_lag_max = jnp.max(jnp.where(sampled > 0, lag, jnp.iinfo(jnp.int32).min), axis=-1)
  row_lag_min = jnp.min(jnp.where(sampled > 0, lag, jnp.iinfo(jnp.int32).max), axis=-1)
  rows = jnp.any(sampled > 0, axis=-1)
  mixed = rows & (row_lag_max != row_lag_min)
  return {
      "staleness/stale_token_fraction": jnp.sum(stale_mask) / count,
      "staleness/mixed_version_row_fraction":
          jnp.sum(mixed) / jnp.maximum(jnp.sum(rows), 1),
      "staleness/mean_version_lag": jnp.sum(lag * sampled) / count,
      "staleness/max_version_lag": jnp.max(jnp.where(sampled > 0, lag, 0)).astype(jnp.float32),
      "staleness/stale_logprob_gap": stale["logprob_mismatch_mean"],
      "staleness/stale_logprob_gap_max": stale["logprob_mismatch_max"],
      "staleness/weight_min": stale["is_ratio_min"],
      "staleness/weight_max": stale["is_ratio_max"],
      "staleness/weight_clipped_frac": stale["correction_clipped_frac"],
      "staleness/weight_masked_frac": stale["correction_masked_frac"],
  }


def prepare(algorithm, batch: RolloutBatch, *, old_logprobs: jax.Array,
            ref_logprobs: jax.Array | None, values: jax.Array | None, kl_coef: jax.Array,
            correction: str, group_size: int, version: jax.Array | int | None = None
            ) -> tuple[TrainBatch, jax.Array, dict[str, jax.Array]]:
  """Everything between the sampler's output and the first update, as one pure function.

  Args:
    batch: the packed rollouts (sampler log-probs in `sampler_logprobs`, the policy
      version of each token in `token_versions`).
    old_logprobs: [B, R] the trainer's log-probs of the response tokens under the
      current weights (its own forward at the start of this step): π_old of fresh
      tokens, π_prox of stale ones.
    ref_logprobs: [B, R] the trainer's reference forward, or None: the rollout's
      (`batch.ref_logprobs`), else zeros (no reference).
    values: [B, R] or None (no critic).
    kl_coef: β as a device scalar.
    correction: the rollout-correction mode in force ('none', 'tis', 'mis_token',
      'mis_sequence'; `kernels.rollout_correction`).
    group_size: G (rows of a group are adjacent).
    version: the current policy version (the training step), a scalar; tokens of
      another version are stale. None: every token is fresh.
  Returns:
    (the TrainBatch: the shaped rollout with π_old, reference log-probs, values,
    importance weights (`behaviour_correction`), advantages and returns; the next β;
    metrics: the sampler–trainer mismatch and the correction's clip / mask rates over fresh
    sampled tokens, staleness/* over stale ones, rollout KL).
  """
  rollout = shape_rewards(algorithm, batch)
  trainer_logprobs = old_logprobs * rollout.response_mask
  corrected, metrics = behaviour_correction(algorithm, rollout, trainer_logprobs,
                                            correction=correction, version=version)
  batch = TrainBatch.from_rollout(rollout, ref_logprobs=ref_logprobs, values=values,
                                  **corrected._asdict())
  advantages, returns = advantages_and_returns(algorithm, batch, kl_coef,
                                               group_size=group_size)
  batch = batch.replace(advantages=advantages, returns=returns)
  metrics = dict(metrics)
  next_kl_coef = kl_coef
  if algorithm.kl.placement == "reward":
    observed = rollout_kl(algorithm, batch)
    metrics.update(kl_reward_coef=kl_coef, rollout_kl=observed)
    if algorithm.kl.controller == "adaptive":
      next_kl_coef = kernels.adaptive_kl_coefficient(
          kl_coef, observed, target=algorithm.kl.target, horizon=algorithm.kl.horizon,
          n_steps=batch.tokens.shape[0])
  return batch, next_kl_coef, metrics


def normalizers(algorithm, batch: TrainBatch) -> Normalizers:
  """The actor's global counts over a whole mini-batch."""
  mask = batch.policy_mask()
  positive = mask * (batch.scores > algorithm.policy_loss.positive_threshold)[:, None]
  return Normalizers(agg=kernels.aggregation_normalizer(mask, mode=algorithm.policy_loss.agg),
                     positive=jnp.sum(positive),
                     tokens=jnp.sum(batch.attention_mask, dtype=jnp.float32))


def critic_normalizers(algorithm, batch: TrainBatch) -> Normalizers:
  """The critic's global counts over a whole mini-batch."""
  mask = batch.value_mask()
  return Normalizers(agg=kernels.aggregation_normalizer(mask, mode=algorithm.policy_loss.agg),
                     positive=jnp.sum(mask),
                     tokens=jnp.sum(batch.attention_mask, dtype=jnp.float32))


def actor_loss(algorithm, logprobs: jax.Array, entropy: jax.Array, batch: TrainBatch,
               norm: Normalizers) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The surrogate of `policy_loss.kind` (algorithms/losses.py: PPO-clip, GSPO, GSPO-token,
  CISPO, registered or "module:name"), weighted
  by the rollout correction (+ KL loss, entropy bonus, VAPO's positive-example NLL) of
  one (micro-)batch.

  Every kind aggregates with `policy_loss.agg` and the mini-batch's global count;
  micro-batches split rows and GSPO's sequence ratio reads only its own row, so the
  summed pieces equal the unsplit loss for every kind.

  Args:
    logprobs: [b, R] of the current policy.
    entropy: [b, R] of the current policy.
    batch: the (micro-)batch: old / reference log-probs, advantages, weights, masks.
    norm: the whole mini-batch's counts, so splitting it never changes the loss.
  Returns:
    (loss, metrics).
  """
  p = algorithm.policy_loss
  mask = batch.policy_mask()
  # Dr. GRPO's constant: the response cap R (the mode's only use of a horizon).
  horizon = float(batch.response_length) if p.agg == "seq-mean-token-sum-norm" else None
  surrogate = losses.policy_loss(p.kind)
  options = {name: p[name] for name in surrogate.options}  # PPO's dual_clip
  loss, metrics = surrogate.fn(logprobs, batch.old_logprobs, batch.advantages, mask,
                               clip_low=p.clip_low, clip_high=p.clip_high, agg=p.agg,
                               agg_normalizer=norm.agg, agg_horizon=horizon,
                               weights=batch.is_weights, **options)
  metrics = dict(metrics, pg_loss=loss)
  if algorithm.kl.placement == "loss":
    kl = kernels.kl_penalty(logprobs, batch.ref_logprobs, estimator=algorithm.kl.estimator)
    kl_loss = kernels.aggregate(kl, mask, mode=p.agg, normalizer=norm.agg, horizon=horizon)
    loss = loss + algorithm.kl.coef * kl_loss
    metrics["kl_loss"] = kl_loss
  if p.entropy_coef > 0:
    loss = loss + p.entropy_coef * kernels.entropy_loss(entropy, mask, agg=p.agg,
                                                        agg_normalizer=norm.agg)
  if p.positive_nll_coef > 0:
    nll = kernels.positive_nll_loss(logprobs, mask, batch.scores > p.positive_threshold,
                                    normalizer=norm.positive)
    loss = loss + p.positive_nll_coef * nll
    metrics["positive_nll"] = nll
  metrics["entropy"] = kernels.masked_mean(entropy, mask)
  # |log π − log π_old| as this forward sees it: drift within the step, and with π_old
  # reused from the sampler (`reuses_sampler_logprobs`), the sampler–trainer mismatch.
  gap = jnp.abs(jax.lax.stop_gradient(logprobs) - batch.old_logprobs) * mask
  metrics.update(update_logprob_gap_max=jnp.max(gap),
                 update_logprob_gap_mean=kernels.masked_mean(gap, mask))
  return loss, metrics


def critic_loss(algorithm, values: jax.Array, batch: TrainBatch, norm: Normalizers
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value loss of one (micro-)batch on finished responses (`kernels.value_loss`)."""
  mask = batch.value_mask()
  loss, metrics = kernels.value_loss(values, batch.values, batch.returns, mask,
                                     clip=algorithm.value.clip, agg=algorithm.policy_loss.agg,
                                     agg_normalizer=norm.agg)
  return loss, dict(metrics, value_loss=loss,
                    explained_variance=kernels.explained_variance(values, batch.returns, mask))
