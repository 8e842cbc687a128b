"""Policy losses: PPO clip (asymmetric "clip-higher", dual clip), positive-example
NLL (VAPO) and the entropy bonus."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import aggregation
from rlhf_jax.kernels import statistics

# verl clamps the log-ratio before exp so that one stale token cannot overflow.
LOG_RATIO_CLAMP = 20.0


def ppo_policy_loss(logprobs: chex.Array, old_logprobs: chex.Array,
                    advantages: chex.Array, mask: chex.Array, *,
                    clip_low: float = 0.2, clip_high: float | None = None,
                    dual_clip: float | None = None,
                    agg: aggregation.AggregationMode = "token-mean",
                    agg_normalizer: chex.Array | float | None = None,
                    agg_horizon: float | None = None,
                    weights: chex.Array | None = None
                    ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """PPO's clipped surrogate with decoupled clip range and dual clip.

      ρ = exp(clamp(log π − log π_old, ±20))
      ℓ = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))       (PPO, arXiv:1707.06347 Eq. 7;
                                                              DAPO clip-higher, arXiv:2503.14476 Eq. 10)
      ℓ = min(ℓ, −A·c)  where A < 0                           (dual clip, Ye et al. arXiv:1912.09729 Eq. 5)
      loss = aggregate(w·ℓ, mask, mode=agg)                   (w: rollout-correction weights, 1 by default)

  Metrics (masked means over valid tokens):
    clip_frac_upper  A > 0 and ρ > 1 + ε_high (gradient cut by the upper clip)
    clip_frac_lower  A < 0 and ρ < 1 − ε_low  (gradient cut by the lower clip)
    dual_clip_frac   A < 0 and ρ > c          (gradient cut by the dual clip)
    ppo_kl           mean(log π_old − log π)  (k1; verl's `ppo_kl`)
    approx_kl        mean((ρ − 1) − log ρ)    (k3, ≥ 0)

  Args:
    logprobs: [B, T] log π_θ of the taken tokens (differentiated).
    old_logprobs: [B, T] log π_old (behaviour policy).
    advantages: [B, T] advantages (broadcast per-sample ones beforehand).
    mask: [B, T] 0/1.
    clip_low: ε_low ∈ [0, 1).
    clip_high: ε_high > 0; None means ε_low (symmetric PPO).
    dual_clip: c > 1, or None to disable (verl 3.0, DAPO script 10.0).
    agg: aggregation mode (see `aggregate`).
    agg_normalizer: optional global count for `aggregate`.
    agg_horizon: the constant L for seq-mean-token-sum-norm.
    weights: optional [B, T] per-token importance weights, constants
      (`rollout_correction`: TIS / masked IS); they scale ℓ after the clips,
      as verl scales pg_losses by its rollout IS weights.
  Returns:
    (loss, metrics): scalar float32 loss and a dict of scalar metrics.
  """
  v.check_range("clip_low", clip_low, low=0.0, high=1.0, high_inclusive=False)
  clip_high = clip_low if clip_high is None else clip_high
  v.check_range("clip_high", clip_high, low=0.0)
  if dual_clip is not None:
    v.check_range("dual_clip", dual_clip, low=1.0, low_inclusive=False)
  v.check_batch_time(logprobs, old_logprobs, advantages, mask,
                     names=("logprobs", "old_logprobs", "advantages", "mask"))
  for array, name in ((logprobs, "logprobs"), (old_logprobs, "old_logprobs"),
                      (advantages, "advantages")):
    v.check_floating(array, name)
  logprobs, old_logprobs, advantages, mask = v.as_float32(
      logprobs, old_logprobs, advantages, mask)

  log_ratio = jnp.clip(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  per_token = jnp.maximum(unclipped, clipped)
  negative = advantages < 0
  if dual_clip is not None:
    per_token = jnp.where(negative, jnp.minimum(per_token, -advantages * dual_clip),
                          per_token)
    dual_clipped = negative & (ratio > dual_clip)
  else:
    dual_clipped = jnp.zeros_like(negative)

  if weights is not None:
    v.check_batch_time(per_token, weights, names=("logprobs", "weights"))
    v.check_floating(weights, "weights")
    per_token = per_token * jax.lax.stop_gradient(jnp.asarray(weights, jnp.float32))
  loss = aggregation.aggregate(per_token, mask, mode=agg, normalizer=agg_normalizer,
                               horizon=agg_horizon)
  positive = advantages > 0
  metrics = {
      "clip_frac_upper": statistics.masked_mean(positive & (ratio > 1.0 + clip_high), mask),
      "clip_frac_lower": statistics.masked_mean(negative & (ratio < 1.0 - clip_low), mask),
      "dual_clip_frac": statistics.masked_mean(dual_clipped, mask),
      "ppo_kl": statistics.masked_mean(-log_ratio, mask),
      "approx_kl": statistics.masked_mean(ratio - 1.0 - log_ratio, mask),
  }
  return loss, metrics


def positive_nll_loss(logprobs: chex.Array, mask: chex.Array, is_positive: chex.Array, *,
                      normalizer: chex.Array | float | None = None) -> chex.Array:
  """VAPO's self-imitation term: token-mean NLL over correct samples only.

      L_NLL = −(1 / Σ_{o∈𝒯} |o|) Σ_{o∈𝒯} Σ_t log π_θ(a_t|s_t)   (VAPO arXiv:2504.05118 §4.4, Eq. 9)

  𝒯 is the set of positive (correct) samples; the total loss is L_PPO + μ·L_NLL
  with μ = 0.1. Zero when the batch has no positive sample.

  Args:
    logprobs: [B, T] log π_θ of the sampled tokens.
    mask: [B, T] 0/1.
    is_positive: [B] bool (or 0/1), whether each sample is correct.
    normalizer: optional global count of positive tokens (for split batches).
  Returns:
    Scalar float32 loss.
  """
  v.check_batch_time(logprobs, mask, names=("logprobs", "mask"))
  v.check_floating(logprobs, "logprobs")
  v.check_per_row(is_positive, "is_positive", logprobs.shape[0])
  positive_mask = jnp.asarray(mask, jnp.float32) * jnp.asarray(is_positive, jnp.float32)[:, None]
  return aggregation.aggregate(-jnp.asarray(logprobs, jnp.float32), positive_mask,
                               mode="token-mean", normalizer=normalizer)


def entropy_loss(entropy: chex.Array, mask: chex.Array, *,
                 agg: aggregation.AggregationMode = "token-mean",
                 agg_normalizer: chex.Array | float | None = None) -> chex.Array:
  """The entropy bonus as a loss to minimise: −aggregate(H, mask).

  Add `coef · entropy_loss` to the policy loss to encourage exploration
  (PPO, arXiv:1707.06347 Eq. 9, the c₂·S term).

  Args:
    entropy: [B, T] per-token entropies (`entropy_from_logits`).
    mask: [B, T] 0/1.
    agg: aggregation mode.
    agg_normalizer: optional global count.
  Returns:
    Scalar float32 (≤ 0 for non-negative entropies).
  """
  return -aggregation.aggregate(entropy, mask, mode=agg, normalizer=agg_normalizer)
