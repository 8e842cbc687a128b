"""Policy losses: PPO clip (asymmetric "clip-higher", dual clip), GSPO's sequence-level
clip (and GSPO-token), CISPO's clipped stop-gradient IS weight, positive-example NLL
(VAPO) and the entropy bonus."""

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


def _policy_inputs(logprobs, old_logprobs, advantages, mask, weights):
  """Shape / dtype checks of the sequence-level kernels; float32 copies (weights: ones)."""
  v.check_batch_time(logprobs, old_logprobs, advantages, mask,
                     names=("logprobs", "old_logprobs", "advantages", "mask"))
  for array, name in ((logprobs, "logprobs"), (old_logprobs, "old_logprobs"),
                      (advantages, "advantages")):
    v.check_floating(array, name)
  if weights is None:
    weights = jnp.ones(jnp.shape(logprobs), jnp.float32)
  else:
    v.check_batch_time(logprobs, weights, names=("logprobs", "weights"))
    v.check_floating(weights, "weights")
  logprobs, old_logprobs, advantages, mask, weights = v.as_float32(
      logprobs, old_logprobs, advantages, mask, weights)
  return logprobs, old_logprobs, advantages, mask, jax.lax.stop_gradient(weights)


def _masked_log_ratio(logprobs: chex.Array, old_logprobs: chex.Array,
                      mask: chex.Array) -> chex.Array:
  """[B, T] clamp(log π − log π_old, ±20) on valid tokens, 0 elsewhere."""
  # where, not a product: padding may hold −inf log-probs (and −inf − −inf is NaN).
  log_ratio = jnp.clip(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.where(mask > 0, log_ratio, 0.0)


def _row_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
  """[B] the masked mean of each row of x [B, T]; 0 on a row without valid tokens."""
  total = jnp.sum(jnp.where(mask > 0, x, 0.0), axis=-1)
  return total / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


def _gspo(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, token_level,
          agg, agg_normalizer, agg_horizon, weights):
  """GSPO and GSPO-token (see `gspo_policy_loss`, `gspo_token_policy_loss`)."""
  v.check_range("clip_low", clip_low, low=0.0, high=1.0, high_inclusive=False)
  v.check_range("clip_high", clip_high, low=0.0)
  logprobs, old_logprobs, advantages, mask, weights = _policy_inputs(
      logprobs, old_logprobs, advantages, mask, weights)
  log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
  seq_log_ratio = _row_mean(log_ratio, mask)  # [B] log s_i
  if token_level:
    # Value s_i, gradient of the token's own log π: sg[s_i]·π/sg[π].
    own = jnp.where(mask > 0, logprobs - jax.lax.stop_gradient(logprobs), 0.0)
    ratio = jnp.exp(jax.lax.stop_gradient(seq_log_ratio)[:, None] + own)
    adv = advantages
  else:
    ratio = jnp.exp(seq_log_ratio)[:, None]  # [B, 1]
    adv = _row_mean(advantages, mask)[:, None]
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  per_sample = jnp.maximum(unclipped, clipped)
  # Sequence level: every token carries its sequence's loss, so seq-mean-token-mean
  # averages ℓ_i over sequences (the paper's 1/G Σ_i) with the usual global normalizer.
  per_token = jnp.broadcast_to(per_sample, logprobs.shape) * weights
  per_token = jnp.where(mask > 0, per_token, 0.0)
  loss = aggregation.aggregate(per_token, mask, mode=agg, normalizer=agg_normalizer,
                               horizon=agg_horizon)
  upper = (adv > 0) & (ratio > 1.0 + clip_high)
  lower = (adv < 0) & (ratio < 1.0 - clip_low)
  rows = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
  if token_level:
    upper_frac, lower_frac = (statistics.masked_mean(upper, mask),
                              statistics.masked_mean(lower, mask))
  else:
    row_count = jnp.maximum(jnp.sum(rows), 1.0)
    upper_frac, lower_frac = (jnp.sum(upper[:, 0] * rows) / row_count,
                              jnp.sum(lower[:, 0] * rows) / row_count)
  token_ratio = jnp.exp(log_ratio)
  metrics = {
      "clip_frac_upper": upper_frac,
      "clip_frac_lower": lower_frac,
      "seq_ratio_mean": jnp.sum(jnp.exp(seq_log_ratio) * rows) / jnp.maximum(jnp.sum(rows), 1.0),
      "ppo_kl": statistics.masked_mean(-log_ratio, mask),
      "approx_kl": statistics.masked_mean(token_ratio - 1.0 - log_ratio, mask),
  }
  return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def gspo_policy_loss(logprobs: chex.Array, old_logprobs: chex.Array,
                     advantages: chex.Array, mask: chex.Array, *,
                     clip_low: float = 3e-4, clip_high: float = 4e-4,
                     agg: aggregation.AggregationMode = "seq-mean-token-mean",
                     agg_normalizer: chex.Array | float | None = None,
                     agg_horizon: float | None = None,
                     weights: chex.Array | None = None
                     ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """GSPO: PPO's clip on a length-normalised sequence-level ratio.

      s_i = exp((1/|M_i|) Σ_{t∈M_i} clamp(log π − log π_old, ±20))
      ℓ_i = max(−A_i·s_i, −A_i·clip(s_i, 1 − ε_low, 1 + ε_high))
      loss = aggregate(w·ℓ_i broadcast over the tokens of i, mask, mode=agg)

  Group Sequence Policy Optimization, Zheng et al. arXiv:2507.18071 §4: whole
  sequences are kept or clipped, so ε is tiny (paper: 3e-4 / 4e-4). With
  agg='seq-mean-token-mean' the loss is (1/G) Σ_i ℓ_i (the paper's objective); the
  token modes weight a sequence by its token count. M_i is the row's mask: tokens the
  mask drops (tool tokens, a fresh token masked by correction.mode 'mis_*') leave s_i; a
  stale token that staleness.mode 'mis_token' rejects stays in the mask with weight 0. A_i is the masked row mean of
  `advantages` (exactly A_i for outcome advantages broadcast over the response; use
  `gspo_token_policy_loss` for per-token advantages). Rollout-correction weights w
  scale each token's share of ℓ_i, as verl's `compute_policy_loss_gspo` does: a
  sequence gets its tokens' mean weight under seq-mean-token-mean, and sequence-level
  weights (mis_sequence, constant along a row) scale ℓ_i exactly.

  Metrics: clip_frac_upper / clip_frac_lower (fractions of sequences with ≥ 1 valid
  token whose gradient the upper (A_i > 0, s_i > 1 + ε_high) / lower (A_i < 0,
  s_i < 1 − ε_low) clip cuts), seq_ratio_mean (mean s_i), ppo_kl and approx_kl (token
  k1 / k3 of π_old ‖ π, as `ppo_policy_loss`).

  Args:
    logprobs: [B, T] log π_θ of the taken tokens (differentiated).
    old_logprobs: [B, T] log π_old.
    advantages: [B, T] advantages (per-sample ones broadcast over the response).
    mask: [B, T] 0/1.
    clip_low: ε_low ∈ [0, 1).
    clip_high: ε_high ≥ 0.
    agg: aggregation mode (see `aggregate`).
    agg_normalizer: optional global count for `aggregate` (micro-batching splits rows,
      and s_i only reads its own row, so summed pieces equal the unsplit loss).
    agg_horizon: the constant L for seq-mean-token-sum-norm.
    weights: optional [B, T] constant per-token importance weights (rollout correction).
  Returns:
    (loss, metrics): scalar float32 loss and a dict of scalar metrics.
  """
  return _gspo(logprobs, old_logprobs, advantages, mask, clip_low=clip_low,
               clip_high=clip_high, token_level=False, agg=agg,
               agg_normalizer=agg_normalizer, agg_horizon=agg_horizon, weights=weights)


def gspo_token_policy_loss(logprobs: chex.Array, old_logprobs: chex.Array,
                           advantages: chex.Array, mask: chex.Array, *,
                           clip_low: float = 3e-4, clip_high: float = 4e-4,
                           agg: aggregation.AggregationMode = "seq-mean-token-mean",
                           agg_normalizer: chex.Array | float | None = None,
                           agg_horizon: float | None = None,
                           weights: chex.Array | None = None
                           ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """GSPO-token: GSPO's sequence ratio with per-token advantages.

      s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]      (value s_i, ∂ of log π_t)
      ℓ_{i,t} = max(−A_{i,t}·s_{i,t}, −A_{i,t}·clip(s_{i,t}, 1 − ε_low, 1 + ε_high))
      loss = aggregate(w·ℓ, mask, mode=agg)

  Zheng et al. arXiv:2507.18071 §4 (the paper's gradients, Eq. 11 and 18, coincide
  when A_{i,t} = A_i); verl's `compute_policy_loss_gspo`. With A_{i,t} = A_i it equals
  `gspo_policy_loss` in value, and in gradient when the weights w are constant along
  each row (none, mis_sequence), under every aggregation mode; per-token weights scale
  each token's own gradient here, the sequence's mean weight there. s_i as in
  `gspo_policy_loss`; clip fractions are over valid tokens (a token is clipped when
  its A_{i,t} has the sign the clip cuts); seq_ratio_mean, ppo_kl, approx_kl as there.

  Args:
    logprobs: [B, T] log π_θ of the taken tokens (differentiated).
    old_logprobs: [B, T] log π_old.
    advantages: [B, T] per-token advantages.
    mask: [B, T] 0/1.
    clip_low: ε_low ∈ [0, 1).
    clip_high: ε_high ≥ 0.
    agg: aggregation mode (see `aggregate`).
    agg_normalizer: optional global count for `aggregate`.
    agg_horizon: the constant L for seq-mean-token-sum-norm.
    weights: optional [B, T] constant per-token importance weights (rollout correction).
  Returns:
    (loss, metrics): scalar float32 loss and a dict of scalar metrics.
  """
  return _gspo(logprobs, old_logprobs, advantages, mask, clip_low=clip_low,
               clip_high=clip_high, token_level=True, agg=agg,
               agg_normalizer=agg_normalizer, agg_horizon=agg_horizon, weights=weights)


def cispo_policy_loss(logprobs: chex.Array, old_logprobs: chex.Array,
                      advantages: chex.Array, mask: chex.Array, *,
                      clip_high: float, clip_low: float | None = None,
                      agg: aggregation.AggregationMode = "token-mean",
                      agg_normalizer: chex.Array | float | None = None,
                      agg_horizon: float | None = None,
                      weights: chex.Array | None = None
                      ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio.

      r = exp(clamp(log π − log π_old, ±20)),  r̂ = clip(r, 1 − ε_low^IS, 1 + ε_high^IS)
      ℓ_t = −sg(r̂_t) · A_t · log π_θ(y_t)
      loss = aggregate(w·ℓ, mask, mode=agg)           (token-mean: the paper's 1/Σ|o_i|)

  MiniMax-M1, arXiv:2506.13585 §3.1 Eq. 4. No min(): every token keeps the gradient
  −r̂·A·∇log π, where PPO's clip zeroes it once ρ leaves the trust region (the
  low-probability "fork" tokens). The paper sets no lower bound (clip_low=None, or any
  ε_low ≥ 1) and tunes ε_high^IS only. Only the gradient is meaningful: the value is
  not a surrogate of the return.

  Metrics (masked means over valid tokens): clip_frac_upper (r > 1 + ε_high, weight
  capped), clip_frac_lower (r < 1 − ε_low, weight raised; 0 without a lower bound),
  is_weight_mean (mean r̂), ppo_kl and approx_kl as `ppo_policy_loss`.

  Args:
    logprobs: [B, T] log π_θ of the taken tokens (differentiated).
    old_logprobs: [B, T] log π_old.
    advantages: [B, T] advantages.
    mask: [B, T] 0/1.
    clip_high: ε_high^IS > 0 (the weight's cap is 1 + ε_high^IS).
    clip_low: ε_low^IS ≥ 0, or None for no lower bound.
    agg: aggregation mode (see `aggregate`).
    agg_normalizer: optional global count for `aggregate`.
    agg_horizon: the constant L for seq-mean-token-sum-norm.
    weights: optional [B, T] constant per-token importance weights (rollout correction),
      multiplied into ℓ like `ppo_policy_loss`'s.
  Returns:
    (loss, metrics): scalar float32 loss and a dict of scalar metrics.
  """
  v.check_range("clip_high", clip_high, low=0.0, low_inclusive=False)
  if clip_low is not None:
    v.check_range("clip_low", clip_low, low=0.0)
  logprobs, old_logprobs, advantages, mask, weights = _policy_inputs(
      logprobs, old_logprobs, advantages, mask, weights)
  log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
  ratio = jnp.exp(log_ratio)
  # r > 0, so a lower bound ≤ 0 is no bound.
  lower_bound = 0.0 if clip_low is None else 1.0 - clip_low
  is_weight = jax.lax.stop_gradient(jnp.clip(ratio, lower_bound, 1.0 + clip_high))
  per_token = jnp.where(mask > 0, -is_weight * advantages * logprobs * weights, 0.0)
  loss = aggregation.aggregate(per_token, mask, mode=agg, normalizer=agg_normalizer,
                               horizon=agg_horizon)
  metrics = {
      "clip_frac_upper": statistics.masked_mean(ratio > 1.0 + clip_high, mask),
      "clip_frac_lower": statistics.masked_mean(ratio < lower_bound, mask),
      "is_weight_mean": statistics.masked_mean(is_weight, mask),
      "ppo_kl": statistics.masked_mean(-log_ratio, mask),
      "approx_kl": statistics.masked_mean(ratio - 1.0 - log_ratio, mask),
  }
  return loss, jax.tree.map(jax.lax.stop_gradient, metrics)
