"""A tiny policy, a prepared rollout batch and its trained actor role, shared by the tests
of a role's update (tests/optim/test_roles.py), the PPO learner and the row packer."""

import jax
import numpy as np

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import ppo_learner as learner_lib
from rlhf_jax import optim
from tests.training.runs import preset


def tiny_model():
  """A one-layer decoder of 32 tokens (its module and parameters)."""
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  return models.init_model(config, seed=0)


def random_batch(rows=8, prompt=3, response=5, seed=0):
  """A prepared batch with ragged responses, stale old log-probs and random advantages."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, prompt)) for _ in range(rows)],
      [list(rng.integers(1, 32, n)) for n in lengths],
      [list(-rng.uniform(2, 4, n)) for n in lengths], list(rng.choice([-1.0, 1.0], rows)),
      [False] * rows, list(range(rows)), prompt_length=prompt, response_length=response,
      pad_id=0)
  batch = batch_lib.TrainBatch.from_rollout(
      batch, advantages=rng.normal(size=(rows, response)).astype(np.float32),
      is_weights=rng.uniform(0.5, 1.5, (rows, response)).astype(np.float32))
  return batch_lib.as_device(batch)


def actor(micro_batches, algorithm, minibatches=2, optimizer=None):
  """The PPO actor role of the tiny model, with GRPO's train section split as asked."""
  model, params = tiny_model()
  train = preset("grpo").train
  train.minibatches, train.micro_batches = minibatches, micro_batches
  optimizer = optimizer or optim.make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=1.0)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  return learner_lib.actor_role(model, params, optimizer, mesh, algorithm, train)
