"""Routing replay and the router's losses in the PPO learner (`algorithm.moe`): R2's updates
replay the routes of the π_old forward, R3's the sampler's, `moe/route_flip_rate` compares
the sampler's routes with the trainer's live router, the auxiliary losses enter the actor's
loss with their weights, and a dense policy refuses every MoE option naming the field."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms.ppo_learner import PPOLearner
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models import moe
from tests.training.runs import preset

# Three layers, the middle one dense (mlp_only_layers), 6 experts, 2 per token.
CONFIG = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=24,
                              architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
                              num_experts=6, experts_per_token=2, expert_intermediate_size=8,
                              normalize_expert_weights=True, dense_layers=(1,))
P, R, ROWS = 3, 5, 8
SPARSE = [0, 2]


@pytest.fixture(scope="module", name="policy")
def _policy():
  model, params = models.init_model(CONFIG, seed=0)
  for layer in SPARSE:  # confident routers: a forced expert changes the log-probs visibly
    mlp = params["layers"][layer]["mlp"]
    mlp["router"] = mlp["router"] * 20
  return model, params


def _learner(policy, **moe_options):
  c = preset("grpo")
  c.train.minibatches, c.train.epochs = 2, 1
  c.algorithm.kl.coef = 0.0
  for name, value in moe_options.items():
    c.algorithm.moe[name] = value
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  return PPOLearner.from_config(c, *policy, mesh)


def _batch(policy, sampler_routes: bool, seed=0):
  """Rows whose sampler log-probs are the policy's own; with `sampler_routes`, random
  experts recorded at every response token (a sampler that routed otherwise)."""
  model, params = policy
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, R + 1, ROWS)
  routes = None
  if sampler_routes:
    routes = [np.stack([np.stack([rng.permutation(6)[:2] for _ in range(3)])
                        for _ in range(n)]).astype(np.int8) for n in lengths]
    for row in routes:
      row[:, 1] = moe.NOT_RECORDED  # the dense layer routes nothing
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, P)) for _ in range(ROWS)],
      [list(rng.integers(1, 32, n)) for n in lengths], [[0.0] * n for n in lengths],
      list(rng.choice([-1.0, 1.0], ROWS)), [False] * ROWS, [0] * ROWS,
      prompt_length=P, response_length=R, pad_id=0, routes=routes)
  batch = batch_lib.as_device(batch)
  return batch.replace(sampler_logprobs=batch_lib.response_logprobs(model, params, batch,
                                                                    replay=False))


def _live_routes(policy, batch):
  model, params = policy
  _, _, routes = model.apply(params, batch.tokens, attention_mask=batch.attention_mask,
                             with_routes=True)
  return np.asarray(routes)


def _prepare(learner, batch):
  batch = learner._routes_to_replay(batch)  # pylint: disable=protected-access
  prepared, _, metrics = learner._prepare(  # pylint: disable=protected-access
      learner.actor.params, learner.params_of("reference"), learner.params_of("critic"),
      learner.kl_coef, jnp.int32(0), batch, None)
  return prepared, {k: np.asarray(v) for k, v in metrics.items()}


def _flip_rate(sampler, trainer):
  """Per sparse layer, the share of recorded tokens whose expert sets differ (a loop)."""
  rates = []
  for layer in SPARSE:
    flips = counted = 0
    for row in range(sampler.shape[0]):
      for t in range(sampler.shape[1]):
        if (sampler[row, t, layer] < 0).any():
          continue
        counted += 1
        flips += set(sampler[row, t, layer]) != set(trainer[row, t, layer])
    rates.append(flips / counted)
  return rates


@pytest.mark.slow
def test_r3_replays_the_samplers_routes_and_logs_how_often_they_flip(policy):
  batch = _batch(policy, sampler_routes=True)
  prepared, metrics = _prepare(_learner(policy, routing_replay="R3"), batch)
  np.testing.assert_array_equal(prepared.routes, batch.routes)
  rates = _flip_rate(np.asarray(batch.routes), _live_routes(policy, batch))
  assert 0 < np.mean(rates) < 1  # random routes: most flip, not all
  np.testing.assert_allclose(metrics["moe/route_flip_rate"], np.mean(rates), rtol=1e-6)
  np.testing.assert_allclose(metrics["moe/route_flip_rate_max"], np.max(rates), rtol=1e-6)
  # The trainer's π_old forward is the one with the sampler's experts, not the live
  # router's: its mismatch with the (live-routed) sampler log-probs is the replay's.
  model, params = policy
  replayed = np.asarray(batch_lib.response_logprobs(model, params, batch))
  gap = np.abs(replayed - np.asarray(batch.sampler_logprobs)).max()
  assert gap > 1e-3
  np.testing.assert_allclose(metrics["logprob_mismatch_max"], gap, rtol=1e-4)


@pytest.mark.slow
def test_r2_replays_the_old_policys_own_routes_and_off_replays_nothing(policy):
  batch = _batch(policy, sampler_routes=True)
  live = _live_routes(policy, batch)
  real = np.asarray(batch.attention_mask, bool)
  prepared, metrics = _prepare(_learner(policy, routing_replay="R2"), batch)
  np.testing.assert_array_equal(np.asarray(prepared.routes)[real], live[real])
  # the flip rate is measured under every mode the sampler's routes reach
  np.testing.assert_allclose(metrics["moe/route_flip_rate"],
                             np.mean(_flip_rate(np.asarray(batch.routes), live)), rtol=1e-6)
  assert metrics["logprob_mismatch_max"] < 1e-5  # live routing, as the sampler's was
  prepared, metrics = _prepare(_learner(policy), batch)
  assert prepared.routes is None and "moe/route_flip_rate" in metrics
  prepared, metrics = _prepare(_learner(policy, routing_replay="R2"),
                               _batch(policy, sampler_routes=False))
  assert prepared.routes is not None and "moe/route_flip_rate" not in metrics


@pytest.mark.slow
def test_the_router_losses_enter_the_actor_loss_with_their_weights(policy):
  batch = _batch(policy, sampler_routes=False)
  learner = _learner(policy, aux_loss_coef=0.0)
  prepared, _ = _prepare(learner, batch)
  norm = learner.actor.normalizer_fn(prepared)
  params = learner.actor.params
  base, metrics = learner.actor.loss_fn(params, prepared, norm)
  for coef in ("aux_loss_coef", "z_loss_coef"):
    weighted = _learner(policy, **{coef: 0.5})
    loss, _ = weighted.actor.loss_fn(params, prepared, norm)
    term = metrics["moe/load_balancing_loss" if coef == "aux_loss_coef" else "moe/z_loss"]
    np.testing.assert_allclose(loss, base + 0.5 * term, rtol=1e-5)
  assert float(metrics["moe/load_balancing_loss"]) >= 1.0 - 1e-5  # 1 only when even
  assert float(metrics["moe/load_imbalance_max"]) >= 1.0
  # the aux loss reaches the router: its gradient differs from the plain loss's
  grad = lambda learner: jax.grad(lambda p: learner.actor.loss_fn(p, prepared, norm)[0])(
      params)["layers"][0]["mlp"]["router"]
  assert np.abs(np.asarray(grad(_learner(policy, aux_loss_coef=1.0)))
                - np.asarray(grad(learner))).max() > 1e-6


@pytest.mark.parametrize("field,value", [("routing_replay", "R3"), ("aux_loss_coef", 0.1),
                                         ("measure_route_flips", True)])
def test_a_dense_policy_refuses_the_moe_options_naming_the_field(field, value):
  dense = models.init_model(models.DecoderConfig(
      vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
      intermediate_size=24), seed=0)
  with pytest.raises(ConfigError, match=f"algorithm.moe.{field}.*no experts"):
    _learner(dense, **{field: value})
