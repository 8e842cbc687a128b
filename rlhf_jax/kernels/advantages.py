"""Critic-based advantage estimators: GAE (decoupled and length-adaptive λ, Extended
GAE) over a reverse linear recurrence. The critic-free ones (GRPO, RLOO, REINFORCE++,
ReMax) are in `baselines.py`.

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
  docs/formulas.md#t-ppo). With γ = 1 and no token reward, the last δ is then 0, and
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
