"""A PRM's step rewards through `prepare` into the PPO loss, against a NumPy reference
written from Gao et al.'s Clip / Delta formulas (arXiv:2410.15115 §4)."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax import batch as batch_lib

ETA = 0.4
COEF = 0.7
# Two responses; (column, PRM score) at their step ends, the last at the last token.
STEPS = [[(1, 0.9), (3, 0.2), (5, 0.6)], [(0, 0.3), (2, 0.8)]]
LENGTHS = [6, 3]
SCORES = [1.0, 0.0]


def reference_token_rewards(shaping):
  """[B, R] the outcome at the last token plus the shaped step rewards (NumPy)."""
  rewards = np.zeros((2, 8))
  for row, steps in enumerate(STEPS):
    r = np.asarray([s for _, s in steps])
    if shaping in ("clip", "clip_delta"):
      r = np.minimum(r - ETA, 0.0)  # r̃_k = min(r_k − η, 0)
    if shaping in ("delta", "clip_delta"):
      r = r - np.append(r[1:], 0.0)  # r̃_k = r_k − r_{k+1}, r̃_K = r_K
    for (column, _), value in zip(steps, r):
      rewards[row, column] += COEF * value
    rewards[row, LENGTHS[row] - 1] += SCORES[row]
  return rewards


def batch_and_algorithm(shaping):
  a = ppo_config.algorithm_config()
  a.advantage.estimator = "gae"
  a.advantage.gamma = a.advantage.actor_lam = a.advantage.critic_lam = 1.0
  a.process_reward.shaping, a.process_reward.eta, a.process_reward.coef = shaping, ETA, COEF
  batch = batch_lib.build_rollout_batch(
      [[1, 2], [3]], [[4] * n for n in LENGTHS], [[-0.5] * n for n in LENGTHS], SCORES,
      [False, False], [0, 1], prompt_length=2, response_length=8, pad_id=0,
      step_rewards=STEPS)
  return a, batch_lib.as_device(batch)


@pytest.mark.parametrize("shaping", ["none", "clip", "delta", "clip_delta"])
def test_shaped_step_rewards_reach_advantages_and_the_policy_loss(shaping):
  a, batch = batch_and_algorithm(shaping)
  prepared, _, _ = ppo_family.prepare(a, batch, old_logprobs=batch.sampler_logprobs,
                                      ref_logprobs=None,
                                      values=jnp.zeros_like(batch.sampler_logprobs),
                                      kl_coef=jnp.float32(0.0), correction="none",
                                      group_size=1)
  mask = np.asarray(batch.response_mask)
  rewards = reference_token_rewards(shaping)
  # γ = λ = 1 and V = 0: the advantage is the reward to go.
  to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1] * mask
  np.testing.assert_allclose(prepared.advantages, to_go, atol=1e-6)
  norm = ppo_family.normalizers(a, prepared)
  loss, _ = ppo_family.actor_loss(a, prepared.old_logprobs, jnp.zeros_like(mask), prepared,
                                  norm)
  # Ratio 1: the token-mean PPO loss is −mean(A) over response tokens.
  np.testing.assert_allclose(loss, -(to_go * mask).sum() / mask.sum(), rtol=1e-6)


def test_delta_return_from_a_step_telescopes_to_its_score():
  a, batch = batch_and_algorithm("delta")
  shaped = np.asarray(ppo_family.process_rewards(a, batch)) / COEF
  for row, steps in enumerate(STEPS):
    for column, score in steps:
      assert shaped[row, column:].sum() == pytest.approx(score, abs=1e-6)


def test_clip_never_rewards_a_step():
  a, batch = batch_and_algorithm("clip")
  assert np.all(np.asarray(ppo_family.process_rewards(a, batch)) <= 0.0)


def test_a_batch_without_step_rewards_is_unchanged_by_any_shaping():
  a, batch = batch_and_algorithm("clip_delta")
  batch = batch.replace(step_rewards=jnp.zeros_like(batch.step_rewards),
                        step_mask=jnp.zeros_like(batch.step_mask))
  np.testing.assert_array_equal(ppo_family.process_rewards(a, batch), 0.0)


def test_process_reward_metrics_read_the_raw_step_scores():
  from rlhf_jax.training.metrics import process_reward_metrics
  _, batch = batch_and_algorithm("delta")
  metrics = process_reward_metrics(batch)
  scores = [s for steps in STEPS for _, s in steps]
  assert metrics["process/step_score_mean"] == pytest.approx(np.mean(scores))
  assert metrics["process/last_step_score_mean"] == pytest.approx((0.6 + 0.8) / 2)
  assert metrics["process/steps_per_response"] == 2.5
  assert process_reward_metrics(batch.replace(step_mask=jnp.zeros_like(batch.step_mask))) == {}
