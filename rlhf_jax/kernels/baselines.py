"""Critic-free advantage estimators: group-normalised (GRPO, Dr. GRPO), RLOO,
REINFORCE++ (and its group baseline) and ReMax, with the discounted returns they use.

Conventions as in `advantages.py`: `[B, T]` arrays with a 0/1 `mask`, per-sample
quantities `[B]`, float32 out, 0 at masked positions.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import statistics
from rlhf_jax.kernels.advantages import reverse_linear_recurrence


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


def _group_valid(valid: chex.Array | None, grouped: chex.Array) -> chex.Array:
  """[N/G, G] float32 membership: 1 for rows that count in their group's statistics."""
  if valid is None:
    return jnp.ones_like(grouped)
  if jnp.shape(valid) != (grouped.size,):
    raise ValueError(f"valid must be a [batch] vector of {grouped.size} entries; got shape "
                     f"{jnp.shape(valid)}.")
  return jnp.asarray(valid, jnp.float32).reshape(grouped.shape)


def group_advantages(scores: chex.Array, *, group_size: int,
                     normalize_by_std: bool = True, eps: float = 1e-6,
                     valid: chex.Array | None = None) -> chex.Array:
  """Group-normalised outcome advantages (GRPO; Dr. GRPO without the std).

      A_i = (R_i − mean_G R) / (std_G R + eps)     (GRPO, arXiv:2402.03300 §4.1.2)
      A_i = R_i − mean_G R                          (Dr. GRPO, arXiv:2503.20783 §3)

  std is the sample std (Bessel), as in verl/tunix. A group of one sample has
  mean 0 and std 1 (verl's convention), so its advantage is its score.

  With `valid`, the statistics of a group are taken over its valid members only
  (n of them): a row that no reward scored leaves its group (`reward.unscored =
  "drop"`). Its own advantage is 0; a group left with one valid member has advantage
  0 for it (its own mean), one with none is all 0.

  Args:
    scores: [N] per-sample rewards, N = groups × group_size, each group's
      samples contiguous.
    group_size: G, samples per prompt.
    normalize_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
    eps: added to the std.
    valid: optional [N] bool/0-1, the rows that count (default: all).
  Returns:
    [N] float32 advantages (broadcast over tokens by the caller).
  """
  grouped = _grouped(scores, group_size)
  if group_size == 1:  # mean 0, std 1: the advantage is the score
    return (grouped * _group_valid(valid, grouped)).reshape(-1)
  if valid is None:
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)
    centred = grouped - mean
    if normalize_by_std:
      centred = centred / (std + eps)
    return centred.reshape(-1)
  member = _group_valid(valid, grouped)
  count = jnp.sum(member, axis=1, keepdims=True)
  mean = jnp.sum(grouped * member, axis=1, keepdims=True) / jnp.maximum(count, 1.0)
  centred = (grouped - mean) * member
  if normalize_by_std:
    variance = jnp.sum(centred ** 2, axis=1, keepdims=True) / jnp.maximum(count - 1.0, 1.0)
    centred = centred / (jnp.sqrt(variance) + eps)
  return centred.reshape(-1)


def rloo_advantages(scores: chex.Array, *, group_size: int,
                    valid: chex.Array | None = None) -> chex.Array:
  """REINFORCE leave-one-out advantages (Ahmadian et al., arXiv:2402.14740 Eq. 5).

      A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j = G/(G−1)·(R_i − mean_G R)

  With `valid`, G and the sum run over the group's valid members (a row no reward
  scored leaves its group: `reward.unscored = "drop"`); an invalid row, or the only
  valid one of its group, gets 0.

  Args:
    scores: [N] per-sample rewards in contiguous groups.
    group_size: G ≥ 2 (a single sample has no leave-one-out baseline).
    valid: optional [N] bool/0-1, the rows that count (default: all).
  Returns:
    [N] float32 advantages.
  """
  if isinstance(group_size, int) and group_size < 2:
    raise ValueError(f"group_size={group_size!r} must be >= 2 for RLOO.")
  grouped = _grouped(scores, group_size)
  if valid is None:
    baseline = (jnp.sum(grouped, axis=1, keepdims=True) - grouped) / (group_size - 1)
    return (grouped - baseline).reshape(-1)
  member = _group_valid(valid, grouped)
  others = jnp.sum(member, axis=1, keepdims=True) - 1.0
  baseline = (jnp.sum(grouped * member, axis=1, keepdims=True) - grouped) / jnp.maximum(
      others, 1.0)
  return ((grouped - baseline) * member * (others >= 1.0)).reshape(-1)


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
                                     group_size: int, valid: chex.Array | None = None
                                     ) -> chex.Array:
  """REINFORCE++-baseline: group-mean baseline, then global whitening.

      A_{i,t} = whiten_batch(R_i − mean_G R) broadcast over response tokens

  (arXiv:2501.03262 v2 §3.2; verl `compute_reinforce_plus_plus_baseline_outcome_advantage`).

  Args:
    scores: [B] per-sample rewards in contiguous groups.
    mask: [B, T] 0/1.
    group_size: G.
    valid: optional [B] bool/0-1, the rows that count in the group means (a row no
      reward scored: `reward.unscored = "drop"`; its mask should be 0 too).
  Returns:
    [B, T] float32 advantages, 0 where mask is 0.
  """
  centred = group_advantages(scores, group_size=group_size, normalize_by_std=False,
                             valid=valid)
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
