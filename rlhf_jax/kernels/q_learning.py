"""Soft Q-learning in the token MDP: DQO's targets and losses (Liu et al., "Enhancing
Multi-Step Reasoning Abilities of Language Models through Direct Q-Function
Optimization", arXiv:2410.09302; docs/formulas.md#dqo).

The LM is the Q-function up to a state baseline:

    Q_θ(s_h, a_h) = β·log π_θ(a_h|s_h)/π_ref(a_h|s_h) + V_φ(s_h)

which is the soft-optimal relation π* = π_ref·exp((Q* − V*)/β) read backwards, with
the soft Bellman equation Q*(s_h, a_h) = r_h + V*(s_{h+1}) and, for any action,
V*(s) = Q*(s, a) − β·log π*/π_ref(a|s).

Our reconstruction (the paper's full text was not available; docs/formulas.md#dqo marks the
details UNVERIFIED): the target of Q(s_h, a_h) is a λ-return over those relations,
with Retrace-style clipped importance weights c = min(ρ, c̄) on the multi-step
corrections so that samples of a behaviour policy μ (the SFT policy) train π_θ:

    G_h = r_h + γ·V(s_{h+1}) + γ·λ·c_{h+1}·(G_{h+1} − β·ℓ_{h+1} − V(s_{h+1})),   G_H = 0

(ℓ = log π_θ/π_ref, ρ = π_θ/μ). λ = 0 is one-step soft TD; λ = 1 with c ≡ 1 is the soft
Monte-Carlo return Σ_k r_k − β·Σ_{k>h} ℓ_k. Each side regresses on G with the other
side's term stop-gradded (the paper's two losses as summarised in §9):

    L_π(θ) = E_h[(β·ℓ_h + sg V(s_h) − G_h)²]
    L_V(φ) = E_h[(V(s_h) + sg β·ℓ_h − G_h)²]
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import aggregation
from rlhf_jax.kernels.advantages import reverse_linear_recurrence
from rlhf_jax.kernels.masking import next_valid_values


def clipped_importance_weights(logprobs: chex.Array, behaviour_logprobs: chex.Array,
                               mask: chex.Array, *, clip: float = 1.0) -> chex.Array:
  """c_h = min(π(a_h|s_h)/μ(a_h|s_h), c̄) on valid tokens, 0 elsewhere (Retrace's truncated
  trace, Munos et al. arXiv:1606.02647; DQO's clipped weights, §9).

  Args:
    logprobs: [B, T] log π.
    behaviour_logprobs: [B, T] log μ.
    mask: [B, T] 0/1.
    clip: c̄ > 0.
  Returns:
    [B, T] float32 weights (gradients stopped: they only weight targets).
  """
  v.check_range("clip", clip, low=0.0, low_inclusive=False)
  v.check_batch_time(logprobs, behaviour_logprobs, mask,
                     names=("logprobs", "behaviour_logprobs", "mask"))
  logprobs, behaviour_logprobs, mask = v.as_float32(logprobs, behaviour_logprobs, mask)
  ratio = jnp.exp(jnp.minimum(logprobs - behaviour_logprobs, 30.0))
  return jax.lax.stop_gradient(jnp.minimum(ratio, clip) * mask)


def soft_lambda_returns(rewards: chex.Array, values: chex.Array, log_ratio: chex.Array,
                        trace_weights: chex.Array, mask: chex.Array, *, beta: float,
                        lam: float, gamma: float = 1.0) -> chex.Array:
  """DQO's soft λ-return targets G_h for Q(s_h, a_h) (module docstring; our reconstruction):

      G_h = r_h + γ·V_{h+1} + γ·λ·c_{h+1}·(G_{h+1} − β·ℓ_{h+1} − V_{h+1})

  where "h+1" is the row's next valid token and V, ℓ, c are 0 past the last one
  (terminal state: no future). Computed by `reverse_linear_recurrence`.

  Args:
    rewards: [B, T] r_h (the outcome at the last token, plus process rewards).
    values: [B, T] V(s_h) before each token.
    log_ratio: [B, T] ℓ_h = log π_θ(a_h|s_h) − log π_ref(a_h|s_h).
    trace_weights: [B, T] c_h (`clipped_importance_weights`; ones on-policy).
    mask: [B, T] 0/1.
    beta: β > 0, the KL coefficient of the soft objective.
    lam: λ ∈ [0, 1].
    gamma: γ ∈ [0, 1].
  Returns:
    [B, T] float32 targets, 0 where the mask is 0 (gradients stopped).
  """
  v.check_range("beta", beta, low=0.0, low_inclusive=False)
  v.check_range("lam", lam, low=0.0, high=1.0)
  v.check_range("gamma", gamma, low=0.0, high=1.0)
  v.check_batch_time(rewards, values, log_ratio, trace_weights, mask,
                     names=("rewards", "values", "log_ratio", "trace_weights", "mask"))
  rewards, values, log_ratio, trace_weights, mask = jax.lax.stop_gradient(
      v.as_float32(rewards, values, log_ratio, trace_weights, mask))
  zeros = jnp.zeros(rewards.shape[0], jnp.float32)
  next_value = next_valid_values(values * mask, mask, zeros)
  next_soft = next_valid_values(beta * log_ratio * mask, mask, zeros)
  next_trace = next_valid_values(trace_weights * mask, mask, zeros)
  decay = gamma * lam * next_trace
  increments = rewards + gamma * next_value - decay * (next_soft + next_value)
  return reverse_linear_recurrence(increments, decay, mask) * mask


def dqo_policy_loss(log_ratio: chex.Array, values: chex.Array, targets: chex.Array,
                    mask: chex.Array, *, beta: float,
                    agg_normalizer: chex.Array | float | None = None
                    ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """L_π = token-mean of (β·ℓ_h + sg V(s_h) − G_h)² (module docstring): the LM fitted as
  the soft Q-function. Gradients reach `log_ratio` only.

  Args:
    log_ratio: [B, T] log π_θ − log π_ref (differentiated through π_θ).
    values: [B, T] V(s_h) (stop-gradded here).
    targets: [B, T] G_h (`soft_lambda_returns`).
    mask: [B, T] 0/1.
    beta: β > 0.
    agg_normalizer: the global token count (gradient accumulation); default Σ mask.
  Returns:
    (loss, metrics: q_mean, log_ratio_mean).
  """
  v.check_range("beta", beta, low=0.0, low_inclusive=False)
  v.check_batch_time(log_ratio, values, targets, mask,
                     names=("log_ratio", "values", "targets", "mask"))
  log_ratio, values, targets, mask = v.as_float32(log_ratio, values, targets, mask)
  q = beta * log_ratio + jax.lax.stop_gradient(values)
  loss = aggregation.aggregate(jnp.square(q - jax.lax.stop_gradient(targets)), mask,
                               mode="token-mean", normalizer=agg_normalizer)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  return loss, {"q_mean": jax.lax.stop_gradient(jnp.sum(q * mask) / count),
                "log_ratio_mean": jax.lax.stop_gradient(jnp.sum(log_ratio * mask) / count)}


def dqo_value_loss(values: chex.Array, log_ratio: chex.Array, targets: chex.Array,
                   mask: chex.Array, *, beta: float,
                   agg_normalizer: chex.Array | float | None = None
                   ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """L_V = token-mean of (V(s_h) + sg β·ℓ_h − G_h)² (module docstring): the state baseline
  fitted to the soft value G_h − β·ℓ_h. Gradients reach `values` only.

  Args:
    values: [B, T] V_φ(s_h) (differentiated).
    log_ratio: [B, T] log π_θ − log π_ref (stop-gradded here).
    targets: [B, T] G_h.
    mask: [B, T] 0/1.
    beta: β > 0.
    agg_normalizer: the global token count; default Σ mask.
  Returns:
    (loss, metrics: value_mean).
  """
  v.check_range("beta", beta, low=0.0, low_inclusive=False)
  v.check_batch_time(values, log_ratio, targets, mask,
                     names=("values", "log_ratio", "targets", "mask"))
  values, log_ratio, targets, mask = v.as_float32(values, log_ratio, targets, mask)
  residual = values + jax.lax.stop_gradient(beta * log_ratio - targets)
  loss = aggregation.aggregate(jnp.square(residual), mask, mode="token-mean",
                               normalizer=agg_normalizer)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  return loss, {"value_mean": jax.lax.stop_gradient(jnp.sum(values * mask) / count)}
