"""Rollout batches and PPO-family algorithm sections shared by the estimator and
policy-loss table tests (test_estimators.py, test_losses.py)."""

from __future__ import annotations
import jax.numpy as jnp
import numpy as np

from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family

PLUGINS = "tests.algorithms.registry_plugins"
G = 4  # rows per group


def rollouts(rows=8, response_length=6, seed=0):
  """Ragged whole responses in groups of G, scores in {0, 0.3, 1}, critic values,
  π_θ near π_old, correction weights and a reference."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response_length + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [[1, 2]] * rows, [[3] * n for n in lengths],
      [list(-rng.uniform(0.1, 2.0, n)) for n in lengths],
      list(rng.choice([0.0, 0.3, 1.0], rows)), [False] * rows, [i // G for i in range(rows)],
      prompt_length=2, response_length=response_length, pad_id=0)
  batch = batch_lib.as_device(batch)
  mask = np.asarray(batch.response_mask)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  batch = batch_lib.TrainBatch.from_rollout(
      batch, values=f32(rng.uniform(-1, 1, mask.shape) * mask),
      is_weights=f32(rng.uniform(0.5, 1.5, mask.shape) * mask),
      ref_logprobs=f32(-rng.uniform(0.1, 2.0, mask.shape) * mask))
  logprobs = f32(batch.old_logprobs + rng.uniform(-0.4, 0.4, mask.shape) * mask)
  return batch, logprobs


def algorithm(estimator="grpo", kind="ppo"):
  """A PPO-family algorithm section with the given estimator and policy-loss kind."""
  a = ppo_config.algorithm_config()
  a.advantage.estimator, a.policy_loss.kind = estimator, kind
  a.advantage.gamma, a.advantage.actor_lam, a.advantage.critic_lam = 0.9, 0.8, 1.0
  a.policy_loss.agg = "seq-mean-token-mean"
  return a


def advantages(a, batch):
  """(advantages, returns) of `batch` under the algorithm section `a`."""
  return ppo_family.advantages_and_returns(a, batch, 0.0, group_size=G)
