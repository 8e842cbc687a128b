"""Reward shaping: DAPO's overlong punishment, sequence scores to token rewards,
KL in the reward, and Gao et al.'s Clip / Delta refinement of process rewards."""

from __future__ import annotations

import chex
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import kl as kl_lib
from rlhf_jax.kernels import masking


def overlong_penalty(lengths: chex.Array, *, max_length: int, buffer_length: int,
                     factor: float = 1.0) -> chex.Array:
  """DAPO's soft overlong punishment, added to the correctness reward.

      R_len(y) = 0                                   |y| ≤ L_max − L_cache
               = ((L_max − L_cache) − |y|) / L_cache  L_max − L_cache < |y| ≤ L_max
               = −1                                  |y| > L_max
      (DAPO, arXiv:2503.14476 §3.4, Eq. 13), scaled by `factor`.

  Lengths are in *tokens* (tunix counts characters of the decoded text, which
  is a bug). verl's linear formula keeps falling past L_max; we clamp at −1
  as the paper does (generation normally cannot exceed L_max anyway).

  Args:
    lengths: [B] response lengths in tokens.
    max_length: L_max, the generation cap (paper 20,480).
    buffer_length: L_cache, the soft-punishment interval (paper 4,096),
      0 < L_cache ≤ L_max.
    factor: penalty scale (verl `penalty_factor`, default 1).
  Returns:
    [B] float32 penalties in [−factor, 0].
  """
  v.check_range("max_length", max_length, low=0, low_inclusive=False)
  v.check_range("buffer_length", buffer_length, low=0, low_inclusive=False,
                high=max_length)
  if jnp.ndim(lengths) != 1:
    raise ValueError(f"lengths must be a [batch] vector; got shape {jnp.shape(lengths)}.")
  expected = max_length - buffer_length
  lengths = jnp.asarray(lengths, jnp.float32)
  return factor * jnp.clip((expected - lengths) / buffer_length, -1.0, 0.0)


def place_at_last_token(scores: chex.Array, mask: chex.Array) -> chex.Array:
  """Token-level rewards with each sequence's score at its last valid token.

  r_{i,t} = R_i if t is the last position with mask 1 in row i, else 0 (the
  sparse outcome reward of the token MDP, docs/formulas.md#notation). Empty rows get
  no reward.

  Args:
    scores: [B] sequence scores.
    mask: [B, T] 0/1.
  Returns:
    [B, T] float32.
  """
  if jnp.ndim(mask) != 2:
    raise ValueError(f"mask must be [batch, time]; got shape {jnp.shape(mask)}.")
  v.check_per_row(scores, "scores", mask.shape[0])
  last = masking.last_valid_index(mask)
  at_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  return jnp.where(at_last, jnp.asarray(scores, jnp.float32)[:, None], 0.0)


def kl_in_reward(token_rewards: chex.Array, logprobs: chex.Array,
                 ref_logprobs: chex.Array, mask: chex.Array, *, beta,
                 estimator: str = "k1") -> tuple[chex.Array, chex.Array]:
  """InstructGPT-style KL penalty in the reward: r_t ← r_t − β·KL_t.

  KL_t is estimated from the rollout (old) log-probs against the reference
  (Ouyang et al., arXiv:2203.02155 Eq. 2; verl `apply_kl_penalty`, default k1).
  β may be traced (adaptive controller).

  Args:
    token_rewards: [B, T] rewards (e.g. from `place_at_last_token`).
    logprobs: [B, T] log π_old of the sampled tokens.
    ref_logprobs: [B, T] log π_ref.
    mask: [B, T] 0/1.
    beta: KL coefficient β ≥ 0.
    estimator: a `kl_penalty` estimator.
  Returns:
    (rewards, kl): [B, T] float32 penalised rewards and the per-token KL,
    both 0 where mask is 0.
  """
  v.check_batch_time(token_rewards, logprobs, ref_logprobs, mask,
                     names=("token_rewards", "logprobs", "ref_logprobs", "mask"))
  v.check_range("beta", beta, low=0.0)
  mask32 = jnp.asarray(mask, jnp.float32)
  kl = kl_lib.kl_penalty(logprobs, ref_logprobs, estimator=estimator) * mask32
  return (jnp.asarray(token_rewards, jnp.float32) - beta * kl) * mask32, kl


def _check_steps(step_rewards, step_mask):
  v.check_batch_time(step_rewards, step_mask, names=("step_rewards", "step_mask"))
  v.check_floating(step_rewards, "step_rewards")


def prm_clip(step_rewards: chex.Array, step_mask: chex.Array, *, eta: float) -> chex.Array:
  """Clip refinement of process rewards: r̃_k = min(r_k − η, 0).

  Every step reward becomes ≤ 0, so adding steps can never raise the return
  and the policy cannot farm the PRM by repeating steps (Gao et al.,
  arXiv:2410.15115 §4, "Clip mechanism").

  Args:
    step_rewards: [B, S] PRM scores r_p(q, p^(k)) at step ends (either one
      column per step, or token positions with step_mask marking step ends).
    step_mask: [B, S] 0/1, 1 where a step reward exists.
    eta: threshold η.
  Returns:
    [B, S] float32, 0 where step_mask is 0.
  """
  _check_steps(step_rewards, step_mask)
  shaped = jnp.minimum(jnp.asarray(step_rewards, jnp.float32) - eta, 0.0)
  return shaped * jnp.asarray(step_mask, jnp.float32)


def prm_delta(step_rewards: chex.Array, step_mask: chex.Array) -> chex.Array:
  """Delta refinement of process rewards: r̃_k = r_k − r_{k+1}, r̃_K = r_K.

  The return from step t telescopes to r_t, bounded by the PRM's range
  (Gao et al., arXiv:2410.15115 §4, "Delta mechanism"). Steps are the
  positions with step_mask 1, in order; "k+1" is the next such position.
  For Clip-Delta call `prm_delta(prm_clip(r, m, eta=η), m)`.

  Args:
    step_rewards: [B, S] PRM scores at step ends.
    step_mask: [B, S] 0/1.
  Returns:
    [B, S] float32, 0 where step_mask is 0.
  """
  _check_steps(step_rewards, step_mask)
  rewards = jnp.asarray(step_rewards, jnp.float32)
  following = masking.next_valid_values(rewards, step_mask,
                                        jnp.zeros(rewards.shape[0], jnp.float32))
  return (rewards - following) * jnp.asarray(step_mask, jnp.float32)
