"""models/moe/routing.py against a NumPy reference written from the formulas, and against
transformers' own Qwen3-MoE router."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.moe import routing


def _softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


def _reference_route(logits, k, normalize):
  p = _softmax(logits.astype(np.float64))
  experts = np.argsort(-p, axis=-1, kind="stable")[:, :k]
  weights = np.take_along_axis(p, experts, axis=-1)
  if normalize:
    weights = weights / weights.sum(axis=-1, keepdims=True)
  return experts, weights


@pytest.mark.parametrize("normalize", [True, False])
def test_top_k_routes_and_weights_match_the_formula(normalize):
  logits = np.random.default_rng(0).normal(size=(13, 6)).astype(np.float32)
  routes = routing.route(jnp.asarray(logits), 2, normalize=normalize)
  experts, weights = _reference_route(logits, 2, normalize)
  np.testing.assert_array_equal(routes.experts, experts)
  np.testing.assert_allclose(routes.weights, weights, rtol=1e-6, atol=1e-7)
  assert routes.experts.dtype == jnp.int32 and routes.weights.dtype == jnp.float32


def test_gpt_oss_softmax_over_the_top_k_logits_is_the_renormalised_top_k():
  logits = np.random.default_rng(1).normal(size=(9, 8)).astype(np.float32)
  routes = routing.route(jnp.asarray(logits), 4, normalize=True)
  top = np.sort(logits, axis=-1)[:, ::-1][:, :4]
  np.testing.assert_allclose(routes.weights, _softmax(top.astype(np.float64)), rtol=1e-6)


def test_a_replayed_choice_keeps_its_experts_and_takes_live_weights_with_a_gradient():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(5, 6)), jnp.float32)
  replay = jnp.asarray([[5, 0], [1, 2], [3, 4], [0, 5], [2, 1]])
  routes = routing.route(logits, 2, normalize=True, replay=replay)
  np.testing.assert_array_equal(routes.experts, replay)
  p = _softmax(np.asarray(logits, np.float64))
  chosen = np.take_along_axis(p, np.asarray(replay), axis=-1)
  np.testing.assert_allclose(routes.weights, chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)
  grad = jax.grad(lambda z: (routing.route(z, 2, normalize=False, replay=replay).weights
                             * jnp.arange(2.0)[None, :]).sum())(logits)
  assert np.abs(np.asarray(grad)).sum() > 0


def test_the_weights_take_the_logits_dtype_after_a_float32_softmax():
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(4, 5)), jnp.bfloat16)
  routes = routing.route(logits, 2, normalize=False)
  assert routes.weights.dtype == jnp.bfloat16
  _, weights = _reference_route(np.asarray(logits.astype(jnp.float32)), 2, False)
  np.testing.assert_array_equal(routes.weights, jnp.asarray(weights, jnp.float32).astype(
      jnp.bfloat16))


def test_expert_load_counts_valid_tokens_only():
  experts = jnp.asarray([[0, 1], [1, 2], [1, 0]])
  np.testing.assert_array_equal(routing.expert_load(experts, 4), [2, 3, 1, 0])
  np.testing.assert_array_equal(routing.expert_load(experts, 4, jnp.asarray([1, 0, 1])),
                                [2, 2, 0, 0])


def test_load_balancing_loss_matches_the_switch_formula_and_is_one_when_uniform():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(10, 4)).astype(np.float32)
  valid = np.array([1] * 7 + [0] * 3)
  experts, _ = _reference_route(logits, 2, False)
  p = _softmax(logits.astype(np.float64))
  fraction = np.stack([((experts == x) * valid[:, None]).sum() for x in range(4)]) / (7 * 2)
  mean_prob = (p * valid[:, None]).sum(0) / 7
  got = routing.load_balancing_loss(jnp.asarray(logits), jnp.asarray(experts), jnp.asarray(valid))
  np.testing.assert_allclose(got, 4 * (fraction * mean_prob).sum(), rtol=1e-5)
  uniform = routing.load_balancing_loss(jnp.zeros((4, 4)), jnp.asarray([[0], [1], [2], [3]]))
  np.testing.assert_allclose(uniform, 1.0, rtol=1e-6)


def test_router_z_loss_is_the_mean_squared_logsumexp_over_valid_tokens():
  logits = np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32)
  valid = np.array([1, 1, 0, 1, 0, 1])
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  np.testing.assert_allclose(routing.router_z_loss(jnp.asarray(logits), jnp.asarray(valid)),
                             (lse ** 2 * valid).sum() / valid.sum(), rtol=1e-5)


def test_routes_equal_transformers_qwen3_moe_router():
  torch = pytest.importorskip("torch")
  qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
  from transformers import Qwen3MoeConfig  # pylint: disable=import-outside-toplevel
  for normalize in (True, False):
    config = Qwen3MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=3,
                            norm_topk_prob=normalize)
    router = qwen3_moe.Qwen3MoeTopKRouter(config)
    torch.manual_seed(0)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(11, 16)
    _, weights, experts = router(x)
    logits = x.numpy() @ router.weight.detach().numpy().T
    routes = routing.route(jnp.asarray(logits), 3, normalize=normalize)
    np.testing.assert_array_equal(routes.experts, experts.numpy())
    np.testing.assert_allclose(routes.weights, weights.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_route_flip_rate_counts_tokens_whose_expert_set_differs_per_layer():
  # [tokens=4, layers=2, k=2]; the same set in another order is no flip
  a = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 4]], [[4, 5], [0, 5]], [[0, 2], [-1, -1]]])
  b = np.array([[[1, 0], [2, 4]], [[1, 2], [3, 4]], [[4, 3], [0, 5]], [[0, 3], [-1, -1]]])
  rate = routing.route_flip_rate(jnp.asarray(a), jnp.asarray(b))
  # layer 0: tokens 2 and 3 flip (of 4); layer 1: token 0 flips (of 3 recorded)
  np.testing.assert_allclose(rate, [2 / 4, 1 / 3], rtol=1e-6)
  only_first_two = routing.route_flip_rate(jnp.asarray(a), jnp.asarray(b),
                                           jnp.asarray([1, 1, 0, 0]))
  np.testing.assert_allclose(only_first_two, [0.0, 1 / 2], rtol=1e-6)


def test_a_forwards_record_gives_each_layers_losses_and_load_as_the_formulas():
  """`layer_record` sums per layer, `record_losses` turns them into the Switch loss, the
  z-loss and max/mean load, averaged over the sparse layers (a NumPy loop over layers)."""
  rng = np.random.default_rng(7)
  layers, n, x, k = 3, 12, 5, 2
  logits = rng.normal(size=(layers, n, x)).astype(np.float32) * 2
  valid = rng.random(n) < 0.75
  sparse = np.array([True, False, True])
  records = []
  for layer in range(layers):
    routes = routing.route(jnp.asarray(logits[layer]), k, normalize=True)
    records.append(routing.layer_record(jnp.asarray(logits[layer]), routes, k,
                                        jnp.asarray(valid), jnp.int8))
  stacked = routing.RouterRecord(*(jnp.stack(field) for field in zip(*records)))
  got = routing.record_losses(stacked, jnp.asarray(sparse))
  balance, z, imbalance = [], [], []
  for layer in np.flatnonzero(sparse):
    p = _softmax(logits[layer])[valid]
    top = np.argsort(-p, axis=-1)[:, :k]
    counts = np.bincount(top.ravel(), minlength=x).astype(np.float64)
    balance.append(x * np.sum(counts / (valid.sum() * k) * p.mean(axis=0)))
    lse = np.log(np.exp(logits[layer][valid]).sum(-1))
    z.append(np.mean(lse ** 2))
    imbalance.append(counts.max() / counts.mean())
  np.testing.assert_allclose(got["load_balancing"], np.mean(balance), rtol=1e-5)
  np.testing.assert_allclose(got["z"], np.mean(z), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(got["load_imbalance"])[sparse], imbalance, rtol=1e-5)
  assert np.asarray(got["load_imbalance"])[1] == 0
  np.testing.assert_array_equal(np.asarray(stacked.live), np.asarray(stacked.routes))
