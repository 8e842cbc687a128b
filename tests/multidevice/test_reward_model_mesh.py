"""Reward models on a mesh: a frozen RM / PRM sharded like the reference scores the same
as on one device, with rows split over (data, fsdp)."""

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.data import Example
from rlhf_jax.rewards import prm as prm_lib
from rlhf_jax.rewards.reward_model import RewardModelScorer
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.tasks import arith
from rlhf_jax.optim.roles import FrozenRole


@pytest.mark.slow  # ~5 s of compiles
def test_rm_and_prm_on_a_mesh_equal_one_device():
  tokenizer = arith.tokenizer()
  config = arith.model_config(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=1,
                              num_heads=4, max_positions=64)
  policy, params = models.init_model(config, seed=0)
  model, params = models.critic_from_policy(policy, params)
  params = dict(params, scalar_head=jax.random.normal(jax.random.key(0), (32,)))
  layout = ScoringLayout(tokenizer, (), prompt_length=16, response_length=16)
  mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
  sharded = parallel.shard_params(params, parallel.param_shardings(
      params, model.logical_axes(), mesh))
  examples = [Example(f"{i}+{i}?\n", str(2 * i), "arith") for i in range(11)]
  responses = [f"{i}\nAnswer: {2 * i}" for i in range(11)]
  local = RewardModelScorer(FrozenRole(model, params), layout, batch_size=8)
  meshed = RewardModelScorer(FrozenRole(model, sharded), layout, batch_size=8, mesh=mesh)
  np.testing.assert_allclose(meshed.score(examples, responses).scores,
                             local.score(examples, responses).scores, atol=1e-5)
  newline = prm_lib.step_end_token_ids(tokenizer)
  prompts = [e.prompt for e in examples]
  local_steps, _ = prm_lib.ProcessRewardModel(FrozenRole(model, params), layout, newline,
                                              batch_size=8).step_scores(prompts, responses)
  mesh_steps, _ = prm_lib.ProcessRewardModel(FrozenRole(model, sharded), layout, newline,
                                             batch_size=8, mesh=mesh).step_scores(
                                                 prompts, responses)
  for a, b in zip(local_steps, mesh_steps):
    np.testing.assert_allclose(a, b, atol=1e-5)
