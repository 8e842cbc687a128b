"""Advantage estimators: GAE (decoupled and length-adaptive λ, Extended GAE),
group-normalised (GRPO, Dr. GRPO), RLOO, REINFORCE++ and ReMax.

Conventions (all kernels in this module):
  * Arrays are `[B, T]` (batch, response time) with a 0/1 `mask`; per-sample
    quantities are `[B]`.
  * Positions with mask 0 *inside* a row (tool/observation tokens, padding)
    are skipped: discounting counts valid steps only, and rewards placed at
    masked positions are ignored (as in verl's GAE loop).
  * Inputs may be bfloat16; everything is computed and returned in float32.
  * Outputs are 0 at masked positions.
"""

from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import masking
from rlhf_jax.kernels import statistics

RecurrenceMethod = Literal["auto", "associative", "scan"]
_RECURRENCE_METHODS = ("auto", "associative", "scan")


# --------------------------------------------------------------------------
# The one backward recurrence every return / advantage estimator here uses.
# --------------------------------------------------------------------------


def _resolve_method(method: str) -> str:
  """Validates `method` and turns "auto" into the backend's faster recurrence."""
  v.check_choice("method", method, _RECURRENCE_METHODS)
  if method == "auto":
    return "scan" if jax.default_backend() == "cpu" else "associative"
  return method


def reverse_linear_recurrence(increments: chex.Array, decay: chex.Array,
                              mask: chex.Array, *,
                              method: RecurrenceMethod = "auto") -> chex.Array:
  """Solves y_t = m_t·(b_t + a_t·y_{t+1}) + (1 − m_t)·y_{t+1}, y_T = 0, backwards in t.

  This is GAE's `lastgaelam` loop (b = TD error, a = γλ) and the discounted
  return (b = reward, a = γ); masked positions pass the carry through.
  `method="associative"` composes the affine maps y ↦ a·y + b with
  `lax.associative_scan` (O(log T) depth); `"scan"` is the sequential reverse
  `lax.scan`. Both give the same result up to float rounding. `"auto"` takes
  the scan on CPU (W4, B=64, T=8192: faster than the associative form and
  4x quicker to compile, `benchmarks/kernels.py`) and the associative form
  on GPU/TPU, where an 8192-step loop is bound by per-step launch cost.

  Args:
    increments: [B, T] b_t.
    decay: [B, T] (or broadcastable, e.g. [B, 1]) a_t.
    mask: [B, T] 0/1.
    method: "associative" or "scan".
  Returns:
    [B, T] float32 y_t (the carry value at every position, masked or not).
  """
  method = _resolve_method(method)
  increments, mask = v.as_float32(increments, mask)
  decay = jnp.broadcast_to(jnp.asarray(decay, jnp.float32), increments.shape)
  valid = mask > 0
  a = jnp.where(valid, decay, 1.0)
  b = jnp.where(valid, increments, 0.0)

  if method == "associative":
    def compose(later, earlier):
      # `later` covers times t+1.., `earlier` is time t: y_t = a_t·(a'·y + b') + b_t.
      a_later, b_later = later
      a_earlier, b_earlier = earlier
      return a_earlier * a_later, a_earlier * b_later + b_earlier

    _, y = jax.lax.associative_scan(compose, (a, b), reverse=True, axis=1)
    return y

  def step(carry, ab_t):
    a_t, b_t = ab_t
    carry = a_t * carry + b_t
    return carry, carry

  _, y_time_major = jax.lax.scan(step, jnp.zeros(a.shape[0], jnp.float32),
                                 (a.T, b.T), reverse=True)
  return y_time_major.T


def _as_row_array(x, name: str, batch: int) -> chex.Array:
  """A scalar or [B] option as a [B, 1] float32 column."""
  x = jnp.asarray(x, jnp.float32)
  if x.ndim == 0:
    return jnp.broadcast_to(x, (batch, 1))
  v.check_per_row(x, name, batch)
  return x[:, None]


def _check_gae_inputs(rewards, values, mask, gamma, lam_items, bootstrap_values):
  v.check_batch_time(rewards, values, mask, names=("rewards", "values", "mask"))
  v.check_floating(rewards, "rewards")
  v.check_floating(values, "values")
  v.check_range("gamma", gamma, low=0.0, high=1.0)
  for name, lam in lam_items:
    v.check_range(name, lam, low=0.0, high=1.0)
  batch = rewards.shape[0]
  if bootstrap_values is None:
    return jnp.zeros((batch,), jnp.float32)
  v.check_per_row(bootstrap_values, "bootstrap_values", batch)
  return jnp.asarray(bootstrap_values, jnp.float32)


def _gae_advantages(rewards, values, mask, *, gamma, decays, bootstrap_values, method):
  """Unmasked GAE advantages for K λ settings at once.

  Args:
    rewards, values, mask: [B, T].
    gamma: γ.
    decays: [B, K] γλ for each of K λ settings (K = 2 for decoupled GAE).
    bootstrap_values: [B].
    method: "auto", "scan" or "associative".
  Returns:
    [K, B, T] float32.
  """
  method = _resolve_method(method)
  rewards, values, mask = v.as_float32(rewards, values, mask)
  num_settings = decays.shape[1]

  if method == "scan":
    # verl's loop shape: carry (V at the next valid step, running advantage).
    # Carrying V avoids the next-valid gather, ~1.5x faster on CPU at W4's size.
    def step(carry, xs):
      next_value, running = carry
      reward_t, value_t, mask_t = xs
      delta = reward_t + gamma * next_value - value_t
      valid = mask_t > 0
      running = jnp.where(valid[:, None], delta[:, None] + decays * running, running)
      next_value = jnp.where(valid, value_t, next_value)
      return (next_value, running), running

    init = (bootstrap_values, jnp.zeros(decays.shape, jnp.float32))
    _, advantages = jax.lax.scan(step, init, (rewards.T, values.T, mask.T), reverse=True)
    return jnp.transpose(advantages, (2, 1, 0))  # [T, B, K] -> [K, B, T]

  next_values = masking.next_valid_values(values, mask, bootstrap_values)
  deltas = rewards + gamma * next_values - values
  stacked = reverse_linear_recurrence(
      jnp.tile(deltas, (num_settings, 1)), decays.T.reshape(-1, 1),
      jnp.tile(mask, (num_settings, 1)), method="associative")
  return stacked.reshape(num_settings, *deltas.shape)


def gae(rewards: chex.Array, values: chex.Array, mask: chex.Array, *,
        gamma: float, lam, bootstrap_values: chex.Array | None = None,
        method: RecurrenceMethod = "auto") -> tuple[chex.Array, chex.Array]:
  """Generalised Advantage Estimation over masked token sequences.

      δ_t = r_t + γ·V_{t'} − V_t          (t' = next valid position after t)
      A_t = δ_t + γλ·A_{t'}               R_t = A_t + V_t

  (Schulman et al. 2015, arXiv:1506.02438, Eq. 16). V after the last valid
  token is `bootstrap_values` (default 0: the response ended at EOS). For a
  response truncated before EOS, pass the value at the truncation point; with
  V(s_l) := V(s_{l−1}) this is T-PPO's Extended GAE (arXiv:2506.15050, Eq. 6).
  Masked positions inside a row are skipped: V and A carry across them
  (verl `compute_gae_advantage_return`). No whitening here: compose with
  `masked_whiten`.

  Args:
    rewards: [B, T] token-level rewards.
    values: [B, T] critic values V(s_t).
    mask: [B, T] 0/1, 1 on response tokens.
    gamma: discount γ ∈ [0, 1].
    lam: λ ∈ [0, 1], a scalar or a per-row [B] array (VAPO's length-adaptive λ).
    bootstrap_values: optional [B] V after the last valid token.
    method: "auto" (default), "scan" or "associative"; see
      `reverse_linear_recurrence`.
  Returns:
    (advantages, returns), both [B, T] float32, 0 where mask is 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv, ret = gae(jnp.array([[0., 0., 1.]]), jnp.zeros((1, 3)),
    ...                jnp.ones((1, 3)), gamma=1.0, lam=1.0)
    >>> ret.tolist()
    [[1.0, 1.0, 1.0]]
  """
  bootstrap_values = _check_gae_inputs(rewards, values, mask, gamma, [("lam", lam)],
                                       bootstrap_values)
  decays = gamma * _as_row_array(lam, "lam", rewards.shape[0])
  advantages = _gae_advantages(rewards, values, mask, gamma=gamma, decays=decays,
                               bootstrap_values=bootstrap_values, method=method)[0]
  mask32 = jnp.asarray(mask, jnp.float32)
  returns = (advantages + jnp.asarray(values, jnp.float32)) * mask32
  return advantages * mask32, returns


def decoupled_gae(rewards: chex.Array, values: chex.Array, mask: chex.Array, *,
                  gamma: float, actor_lam, critic_lam=1.0,
                  bootstrap_values: chex.Array | None = None,
                  method: RecurrenceMethod = "auto"
                  ) -> tuple[chex.Array, chex.Array]:
  """GAE with separate λ for the policy advantages and for the critic targets.

      A^actor = GAE(r, V; γ, λ_actor)      R^critic = GAE(r, V; γ, λ_critic) + V

  VC-PPO (arXiv:2503.01491 §4): λ_critic = 1 gives unbiased Monte-Carlo value
  targets, λ_actor = 0.95 keeps the policy gradient's variance low. VAPO
  (arXiv:2504.05118 §4.2) passes a per-row λ_actor from `length_adaptive_lambda`.
  Both recurrences run in one pass over the sequence.

  Args:
    rewards: [B, T] as in `gae`.
    values: [B, T] as in `gae`.
    mask: [B, T] as in `gae`.
    gamma: discount γ.
    actor_lam: λ for advantages, scalar or [B].
    critic_lam: λ for value targets, scalar or [B] (default 1.0).
    bootstrap_values: optional [B] value after the last valid token.
    method: recurrence implementation.
  Returns:
    (advantages, returns): [B, T] float32 policy advantages (λ_actor) and
    critic targets (λ_critic); 0 where mask is 0.
  """
  bootstrap_values = _check_gae_inputs(
      rewards, values, mask, gamma, [("actor_lam", actor_lam), ("critic_lam", critic_lam)],
      bootstrap_values)
  batch = rewards.shape[0]
  decays = gamma * jnp.concatenate([_as_row_array(actor_lam, "actor_lam", batch),
                                    _as_row_array(critic_lam, "critic_lam", batch)], axis=1)
  actor, critic = _gae_advantages(rewards, values, mask, gamma=gamma, decays=decays,
                                  bootstrap_values=bootstrap_values, method=method)
  mask32 = jnp.asarray(mask, jnp.float32)
  returns = (critic + jnp.asarray(values, jnp.float32)) * mask32
  return actor * mask32, returns


def truncation_bootstrap_values(values: chex.Array, mask: chex.Array,
                                finished: chex.Array) -> chex.Array:
  """T-PPO's Extended GAE bootstrap: V after each row's last valid token.

  A finished response (stop token or cap) has no successor state: 0. An
  unfinished one (cut at the end of a generation window, length l) gets
  V(s_l) := V(s_{l−1}), its own last value (T-PPO, arXiv:2506.15050, Eq. 6;
  ALGORITHMS.md §5). With γ = 1 and no token reward, the last δ is then 0, and
  the row's advantages come only from value differences. Pass the result as
  `bootstrap_values` to `gae` / `decoupled_gae`.

  Args:
    values: [B, T] critic values V(s_t).
    mask: [B, T] 0/1 response mask.
    finished: [B] bool, the response ended.
  Returns:
    [B] float32 (0 for finished or empty rows).
  """
  v.check_batch_time(values, mask, names=("values", "mask"))
  if jnp.shape(finished) != (values.shape[0],):
    raise ValueError(f"finished must have shape ({values.shape[0]},); got "
                     f"{jnp.shape(finished)}.")
  last = masking.last_valid_index(mask)
  value = jnp.take_along_axis(jnp.asarray(values, jnp.float32),
                              jnp.maximum(last, 0)[:, None], axis=1)[:, 0]
  return jnp.where(jnp.asarray(finished, bool) | (last < 0), 0.0, value)


def length_adaptive_lambda(lengths: chex.Array, *, alpha: float = 0.05) -> chex.Array:
  """VAPO's per-sequence λ = 1 − 1/(α·l), clamped into [0, 1).

  The effective GAE horizon 1/(1 − λ) then equals α·l (VAPO, arXiv:2504.05118
  §4.2, α = 0.05 in the paper). For l ≤ 1/α the formula gives λ ≤ 0 (and
  −∞ at l = 0); the paper is silent, we clamp to 0 (one-step TD). The upper
  end is below 1 for every finite length and stays there in float32 via
  the clamp to the largest float32 below 1.

  Args:
    lengths: [B] response lengths in tokens (int or float).
    alpha: α > 0.
  Returns:
    [B] float32 λ.
  """
  v.check_range("alpha", alpha, low=0.0, low_inclusive=False)
  if jnp.ndim(lengths) != 1:
    raise ValueError(f"lengths must be a [batch] vector; got shape {jnp.shape(lengths)}.")
  lengths = jnp.asarray(lengths, jnp.float32)
  lam = 1.0 - 1.0 / jnp.maximum(alpha * lengths, 1e-30)
  return jnp.clip(lam, 0.0, jnp.nextafter(jnp.float32(1.0), jnp.float32(0.0)))


# --------------------------------------------------------------------------
# Critic-free estimators.
# --------------------------------------------------------------------------


def _grouped(scores: chex.Array, group_size: int, name: str = "scores") -> chex.Array:
  if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
    raise ValueError(f"group_size={group_size!r} must be a positive int.")
  if jnp.ndim(scores) != 1:
    raise ValueError(f"{name} must be a [batch] vector; got shape {jnp.shape(scores)}.")
  v.check_floating(scores, name)
  if scores.shape[0] % group_size:
    raise ValueError(f"{name} has {scores.shape[0]} entries, not a multiple of "
                     f"group_size={group_size} (groups must be contiguous and full).")
  return jnp.asarray(scores, jnp.float32).reshape(-1, group_size)


def group_advantages(scores: chex.Array, *, group_size: int,
                     normalize_by_std: bool = True, eps: float = 1e-6) -> chex.Array:
  """Group-normalised outcome advantages (GRPO; Dr. GRPO without the std).

      A_i = (R_i − mean_G R) / (std_G R + eps)     (GRPO, arXiv:2402.03300 §4.1.2)
      A_i = R_i − mean_G R                          (Dr. GRPO, arXiv:2503.20783 §3)

  std is the sample std (Bessel), as in verl/tunix. A group of one sample has
  mean 0 and std 1 (verl's convention), so its advantage is its score.

  Args:
    scores: [N] per-sample rewards, N = groups × group_size, each group's
      samples contiguous.
    group_size: G, samples per prompt.
    normalize_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
    eps: added to the std.
  Returns:
    [N] float32 advantages (broadcast over tokens by the caller).
  """
  grouped = _grouped(scores, group_size)
  if group_size == 1:
    mean, std = jnp.zeros_like(grouped), jnp.ones_like(grouped)
  else:
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)
  centred = grouped - mean
  if normalize_by_std:
    centred = centred / (std + eps)
  return centred.reshape(-1)


def rloo_advantages(scores: chex.Array, *, group_size: int) -> chex.Array:
  """REINFORCE leave-one-out advantages (Ahmadian et al., arXiv:2402.14740 Eq. 5).

      A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j = G/(G−1)·(R_i − mean_G R)

  Args:
    scores: [N] per-sample rewards in contiguous groups.
    group_size: G ≥ 2 (a single sample has no leave-one-out baseline).
  Returns:
    [N] float32 advantages.
  """
  if isinstance(group_size, int) and group_size < 2:
    raise ValueError(f"group_size={group_size!r} must be >= 2 for RLOO.")
  grouped = _grouped(scores, group_size)
  baseline = (jnp.sum(grouped, axis=1, keepdims=True) - grouped) / (group_size - 1)
  return (grouped - baseline).reshape(-1)


def discounted_returns(token_rewards: chex.Array, mask: chex.Array, *,
                       gamma: float) -> chex.Array:
  """G_t = Σ_{s ≥ t, valid} γ^{k(s)} r_s, k counting valid steps from t.

  Args:
    token_rewards: [B, T] rewards.
    mask: [B, T] 0/1.
    gamma: discount γ ∈ [0, 1].
  Returns:
    [B, T] float32 returns, 0 where mask is 0.
  """
  v.check_batch_time(token_rewards, mask, names=("token_rewards", "mask"))
  v.check_floating(token_rewards, "token_rewards")
  v.check_range("gamma", gamma, low=0.0, high=1.0)
  returns = reverse_linear_recurrence(token_rewards, jnp.float32(gamma), mask)
  return returns * jnp.asarray(mask, jnp.float32)


def reinforce_pp_advantages(token_rewards: chex.Array, mask: chex.Array, *,
                            gamma: float) -> tuple[chex.Array, chex.Array]:
  """REINFORCE++ (Hu, arXiv:2501.03262 §3): batch-whitened discounted returns.

      G_t = Σ_{s ≥ t} γ^{s−t} r_s,   A = masked_whiten(G) over the whole batch

  `token_rewards` normally holds −β·KL_t on every token plus the score at the
  last one (`kl_in_reward` + `place_at_last_token`). Interior masked positions
  are skipped (the return carries across them); verl instead restarts the
  return at every masked position, which only differs for multi-turn masks.

  Args:
    token_rewards: [B, T] rewards.
    mask: [B, T] 0/1.
    gamma: discount γ.
  Returns:
    (advantages, returns), [B, T] float32, 0 where mask is 0.
  """
  returns = discounted_returns(token_rewards, mask, gamma=gamma)
  return statistics.masked_whiten(returns, mask), returns


def reinforce_pp_baseline_advantages(scores: chex.Array, mask: chex.Array, *,
                                     group_size: int) -> chex.Array:
  """REINFORCE++-baseline: group-mean baseline, then global whitening.

      A_{i,t} = whiten_batch(R_i − mean_G R) broadcast over response tokens

  (arXiv:2501.03262 v2 §3.2; verl `compute_reinforce_plus_plus_baseline_outcome_advantage`).

  Args:
    scores: [B] per-sample rewards in contiguous groups.
    mask: [B, T] 0/1.
    group_size: G.
  Returns:
    [B, T] float32 advantages, 0 where mask is 0.
  """
  centred = group_advantages(scores, group_size=group_size, normalize_by_std=False)
  if jnp.ndim(mask) != 2 or mask.shape[0] != centred.shape[0]:
    raise ValueError(f"mask must be [batch, time] with batch={centred.shape[0]}; "
                     f"got shape {jnp.shape(mask)}.")
  per_token = centred[:, None] * jnp.asarray(mask, jnp.float32)
  return statistics.masked_whiten(per_token, mask)


def remax_advantages(token_rewards: chex.Array, baseline_scores: chex.Array,
                     mask: chex.Array) -> tuple[chex.Array, chex.Array]:
  """ReMax (Li et al., arXiv:2310.10505 Alg. 1): greedy-response baseline.

      G_t = Σ_{s ≥ t} r_s,   A_t = G_t − R(x, ŷ_greedy)

  Args:
    token_rewards: [B, T] rewards of the sampled responses.
    baseline_scores: [B] reward of the greedy response for the same prompt.
    mask: [B, T] 0/1.
  Returns:
    (advantages, returns), [B, T] float32, 0 where mask is 0.
  """
  returns = discounted_returns(token_rewards, mask, gamma=1.0)
  v.check_per_row(baseline_scores, "baseline_scores", returns.shape[0])
  baseline = jnp.asarray(baseline_scores, jnp.float32)[:, None]
  return (returns - baseline) * jnp.asarray(mask, jnp.float32), returns
