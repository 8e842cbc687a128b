"""Sampler–trainer mismatch correction: truncated and masked importance sampling.

An inference engine's log-probs differ from the trainer's even for the same
weights (bf16 rollouts, other kernels), so a batch is slightly off-policy for the
trainer. With δ_t = log π_trainer(a_t) − log π_sampler(a_t) on the masked tokens,
r_t = exp(clip(δ_t, ±20)) and a threshold C > 1:

  none          w_t = 1
  tis           w_t = min(r_t, C)                          token-level truncated IS
  mis_token     keep_t = [1/C ≤ r_t ≤ C],  w_t = r_t·keep_t    token-level masked IS
  mis_sequence  R_i = exp(clip(Σ_t δ_t, ±20)),                  sequence-level masked IS
                keep_t = [1/C ≤ R_i ≤ C],  w_t = R_i·keep_t

TIS: Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training"; masked IS (untrusted tokens or sequences leave the loss instead of
being truncated): the follow-ups to it (Liu et al. 2025, "When speed kills
stability") and verl's rollout correction (`rollout_is` / `rollout_rs`).

The weights multiply the per-token policy loss (`ppo_policy_loss(weights=...)`);
`keep` removes dropped tokens from the loss mask (and its normalizer), as verl's rollout
rejection sampling drops them from its response mask. Decoupled PPO's stale tokens use
only the weights: a masked one keeps its place in the loss mask with w = 0, as AReaL's
behaviour mask does (`ppo_family.behaviour_correction`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import statistics

ROLLOUT_CORRECTION_MODES = ("none", "tis", "mis_token", "mis_sequence")
LOG_RATIO_CLAMP = 20.0


def rollout_correction(old_logprobs: chex.Array, sampler_logprobs: chex.Array,
                       mask: chex.Array, *, mode: str, threshold: float = 2.0
                       ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """Importance weights that correct the sampler–trainer mismatch (module docstring).

  Args:
    old_logprobs: [B, T] log π_trainer(a_t), the trainer's recomputation of the
      behaviour policy.
    sampler_logprobs: [B, T] log π_sampler(a_t), what the inference engine reported.
    mask: [B, T] 0/1, the sampled tokens.
    mode: "none", "tis", "mis_token" or "mis_sequence".
    threshold: C > 1 (verl's default 2.0).
  Returns:
    (weights, keep, metrics): weights [B, T] float32 (0 off the mask), keep
    [B, T] float32 (the mask minus dropped tokens), both constants (no
    gradient); metrics over the masked tokens: logprob_mismatch_max / _mean
    (|log π_trainer − log π_sampler|), logprob_mismatch_k3 (the mean k3 estimate of
    KL(π_sampler ‖ π_trainer), r − 1 − log r), is_ratio_min / _max (r_t; 1 when the
    mask is empty), is_ratio_mean, correction_clipped_frac (tis: r_t > C),
    correction_masked_frac (mis: 1 − Σkeep / Σmask); float32 scalars, 0 when
    the mask is empty unless stated.
  """
  v.check_choice("mode", mode, ROLLOUT_CORRECTION_MODES)
  v.check_range("threshold", threshold, low=1.0, low_inclusive=False)
  v.check_batch_time(old_logprobs, sampler_logprobs, mask,
                     names=("old_logprobs", "sampler_logprobs", "mask"))
  v.check_floating(old_logprobs, "old_logprobs")
  v.check_floating(sampler_logprobs, "sampler_logprobs")
  old, sampled, mask = v.as_float32(old_logprobs, sampler_logprobs, mask)
  old, sampled = jax.lax.stop_gradient(old), jax.lax.stop_gradient(sampled)
  # where, not a product: padding may carry −inf log-probs from the engine.
  diff = jnp.where(mask > 0, old - sampled, 0.0)
  ratio = jnp.exp(jnp.clip(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  clipped_frac = jnp.zeros((), jnp.float32)
  if mode == "none":
    weights, keep = mask, mask
  elif mode == "tis":
    weights, keep = jnp.minimum(ratio, threshold) * mask, mask
    clipped_frac = statistics.masked_mean(ratio > threshold, mask)
  elif mode == "mis_token":
    keep = mask * ((ratio >= 1.0 / threshold) & (ratio <= threshold))
    weights = ratio * keep
  else:
    sequence = jnp.exp(jnp.clip(jnp.sum(diff, axis=1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    trusted = (sequence >= 1.0 / threshold) & (sequence <= threshold)
    keep = mask * trusted[:, None]
    weights = sequence[:, None] * keep
  count = jnp.sum(mask)
  on_mask = mask > 0
  metrics = {
      "logprob_mismatch_max": jnp.max(jnp.abs(diff)),
      "logprob_mismatch_mean": statistics.masked_mean(jnp.abs(diff), mask),
      # k3 (Schulman's estimator) of KL(sampler ‖ trainer) at the sampled tokens: r − 1 − log r.
      "logprob_mismatch_k3": statistics.masked_mean(ratio - 1.0 - jnp.log(ratio), mask),
      "is_ratio_min": jnp.where(count > 0, jnp.min(jnp.where(on_mask, ratio, jnp.inf)), 1.0),
      "is_ratio_max": jnp.where(count > 0, jnp.max(jnp.where(on_mask, ratio, -jnp.inf)), 1.0),
      "is_ratio_mean": statistics.masked_mean(ratio, mask),
      "correction_clipped_frac": clipped_frac,
      "correction_masked_frac": jnp.where(count > 0,
                                          1.0 - jnp.sum(keep) / jnp.maximum(count, 1.0), 0.0),
  }
  return jax.lax.stop_gradient(weights), jax.lax.stop_gradient(keep), metrics
