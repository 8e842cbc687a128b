"""Routes in the rollout batch: a completion's recorded experts sit at its response columns
(NOT_RECORDED elsewhere), and the policy's forwards replay them, padded or packed alike."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax.models import moe
from rlhf_jax.models import packing

CONFIG = models.DecoderConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=24,
                              architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
                              num_experts=6, experts_per_token=2, expert_intermediate_size=8,
                              normalize_expert_weights=True)
P, R = 6, 5


def _batch(routes):
  prompts, responses = [[3, 4, 5], [7, 8, 9, 10, 11, 12]], [[13, 14, 15, 16], [17, 18]]
  return batch_lib.build_rollout_batch(
      prompts, responses, [[0.0] * len(r) for r in responses], [1.0, 0.0], [False, False],
      [0, 0], prompt_length=P, response_length=R, pad_id=0, routes=routes)


def _forced(rng, count):
  return np.stack([np.stack([rng.permutation(6)[:2] for _ in range(2)])
                   for _ in range(count)]).astype(np.int8)


def test_routes_sit_at_the_response_columns_and_nothing_elsewhere():
  rng = np.random.default_rng(0)
  first = _forced(rng, 4)
  batch = _batch([first, None])
  assert batch.routes.shape == (2, P + R, 2, 2) and batch.routes.dtype == np.int8
  np.testing.assert_array_equal(batch.routes[0, P:P + 4], first)
  rest = np.ones((2, P + R), bool)
  rest[0, P:P + 4] = False
  assert (batch.routes[rest] == moe.NOT_RECORDED).all()
  assert _batch(None).routes is None


def test_routes_that_do_not_fit_their_response_name_the_row():
  with pytest.raises(ValueError, match=r"row 1: routes of shape \[3, 2, 2\] for a response "
                     r"of 2 tokens"):
    _batch([_forced(np.random.default_rng(1), 4), _forced(np.random.default_rng(2), 3)])


def test_the_forwards_replay_the_routes_padded_and_packed_alike():
  model, params = models.init_model(CONFIG, seed=1)
  for layer in range(2):
    params["layers"][layer]["mlp"]["router"] = params["layers"][layer]["mlp"]["router"] * 50
  rng = np.random.default_rng(3)
  batch = batch_lib.as_device(_batch([_forced(rng, 4), _forced(rng, 2)]))
  live = batch.replace(routes=None)
  # Every forward jitted: op by op, a MoE model's forward takes seconds on a CPU.
  forward = jax.jit(lambda b, packed=None, replay=True: batch_lib.response_logprobs(
      model, params, b, packed=packed, replay=replay), static_argnames="replay")
  replayed, unreplayed = np.asarray(forward(batch)), np.asarray(forward(live))
  assert np.abs(replayed - unreplayed).max() > 1e-3  # forced experts change the log-probs
  skipped = forward(batch, replay=False)
  np.testing.assert_allclose(skipped, unreplayed, rtol=1e-6, atol=1e-6)
  prompt_lengths = np.asarray(batch.attention_mask[:, :P].sum(1))
  plan = packing.batch_plan(prompt_lengths, np.asarray(batch.lengths), prompt_width=P,
                            response_width=R)
  packed = jax.tree.map(np.asarray, plan)
  np.testing.assert_allclose(forward(batch, packed), replayed, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(forward(live, packed), unreplayed, rtol=1e-5, atol=1e-5)
  # The record of a packed forward puts each token's routes back at its row's column.
  record = jax.jit(lambda packed=None: batch_lib.response_logprobs(
      model, params, live, packed=packed, with_router=True)[1].routes)
  real = np.asarray(live.attention_mask, bool)
  padded_routes, packed_routes = np.asarray(record()), np.asarray(record(packed))
  np.testing.assert_array_equal(packed_routes[real], padded_routes[real])
  assert (packed_routes[~real] == moe.NOT_RECORDED).all()


def test_the_learner_keeps_a_moe_policys_routes_and_refuses_r3_without_them():
  import types  # pylint: disable=import-outside-toplevel
  from rlhf_jax.algorithms.ppo_learner import PPOLearner  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(4)
  batch = _batch([_forced(rng, 4), _forced(rng, 2)])

  def learner(replay, experts=6):
    return types.SimpleNamespace(
        algorithm=types.SimpleNamespace(moe=types.SimpleNamespace(routing_replay=replay)),
        actor=types.SimpleNamespace(model=types.SimpleNamespace(
            config=types.SimpleNamespace(num_experts=experts))))

  # A MoE policy's prepare takes the sampler's routes under every mode (the flip rate);
  # a dense policy's never.
  assert PPOLearner._routes_to_replay(learner("off"), batch).routes is batch.routes
  assert PPOLearner._routes_to_replay(learner("off", experts=0), batch).routes is None
  assert PPOLearner._routes_to_replay(learner("R3"), batch).routes is batch.routes
  with pytest.raises(ValueError, match="routing_replay='R3': the rollout brought no routes"):
    PPOLearner._routes_to_replay(learner("R3"), batch.replace(routes=None))


def test_a_trainers_config_takes_routing_replay_not_the_servers_switch():
  from rlhf_jax.config_errors import ConfigError  # pylint: disable=import-outside-toplevel
  from rlhf_jax.training.config import base_config, validate_config  # pylint: disable=import-outside-toplevel
  config = base_config("arith")
  config.sampler.record_routes = True
  with pytest.raises(ConfigError, match="sampler.record_routes.*routing_replay='R3'"):
    validate_config(config)
  config = base_config("arith")
  config.algorithm.moe.routing_replay = "R1"
  with pytest.raises(ConfigError, match="algorithm.moe.routing_replay"):
    validate_config(config)
  config = base_config("arith")
  config.algorithm.moe.aux_loss_coef = -0.1
  with pytest.raises(ConfigError, match="algorithm.moe.aux_loss_coef"):
    validate_config(config)


def test_a_rollout_mode_without_the_samplers_routes_refuses_r3_and_takes_r2():
  from rlhf_jax.config_errors import ConfigError  # pylint: disable=import-outside-toplevel
  from rlhf_jax.training.config import validate_config  # pylint: disable=import-outside-toplevel
  from tests.training.runs import preset  # pylint: disable=import-outside-toplevel
  config = preset("tppo")  # rollout.mode='windows': responses continued across steps
  config.algorithm.moe.routing_replay = "R3"
  with pytest.raises(ConfigError, match=r"algorithm.moe.routing_replay: .*'R3': "
                     r"rollout.mode='windows' does not carry the sampler's routes"):
    validate_config(config)
  config.algorithm.moe.routing_replay = "R2"
  validate_config(config)
  config.algorithm.moe.measure_route_flips = True
  with pytest.raises(ConfigError, match="algorithm.moe.measure_route_flips"):
    validate_config(config)
