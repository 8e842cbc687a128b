"""Routes through the decoder: a forward records each token's experts per layer
(`with_routes`), and replays given ones (`replay_routes`): a replayed forward equals one whose
router is forced to those experts, the router still gets a gradient, and positions without
records (NOT_RECORDED: prompt, padding) are routed live."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models import moe
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.functional import init_model

K, X, L = 2, 6, 3


def _config(**changes):
  fields = dict(vocab_size=40, hidden_size=16, num_layers=L, num_heads=2, num_kv_heads=1,
                head_dim=8, intermediate_size=24, architecture="qwen3_moe", qk_norm="head",
                qkv_bias=False, num_experts=X, experts_per_token=K,
                expert_intermediate_size=8, normalize_expert_weights=True, dense_layers=(1,))
  fields.update(changes)
  return DecoderConfig(**fields)


@pytest.fixture(scope="module")
def model():
  model, params = init_model(_config(), seed=3)
  # Larger router weights than the init's 0.02: distinct probabilities, no near-ties.
  for layer in (0, 2):
    router = params["layers"][layer]["mlp"]["router"]
    params["layers"][layer]["mlp"]["router"] = router * 50.0
  apply = jax.jit(functools.partial(model.apply, with_routes=True))
  return model, params, apply


TOKENS = jnp.asarray(np.random.default_rng(0).integers(1, 40, (2, 7)), jnp.int32)


def test_routes_have_one_row_per_token_and_layer_and_dense_layers_record_nothing(model):
  _, params, apply = model
  logits, _, routes = apply(params, TOKENS)
  assert routes.shape == (2, 7, L, K) and routes.dtype == jnp.int8
  routes = np.asarray(routes)
  assert (routes[:, :, 1] == moe.NOT_RECORDED).all()
  sparse = routes[:, :, [0, 2]]
  assert ((sparse >= 0) & (sparse < X)).all()
  assert (sparse[..., 0] != sparse[..., 1]).all()  # k distinct experts


def test_replaying_the_recorded_routes_changes_nothing(model):
  _, params, apply = model
  logits, _, routes = apply(params, TOKENS)
  replayed, _, again = apply(params, TOKENS, replay_routes=routes)
  np.testing.assert_array_equal(again, routes)
  np.testing.assert_allclose(replayed, logits, rtol=1e-6, atol=1e-6)


def test_a_replayed_forward_equals_the_router_forced_to_those_experts(model, monkeypatch):
  """The reference forces each sparse layer's router: logits off the replayed experts set
  to -1e9, so its own top-k is the replayed set, with the live probabilities renormalised
  over it (normalize_expert_weights), which is what replay computes."""
  model_, params, apply = model
  rng = np.random.default_rng(1)
  forced = np.stack([rng.permutation(X)[:K] for _ in range(2 * 7 * L)]).reshape(2, 7, L, K)
  forced[:, :, 1] = moe.NOT_RECORDED
  replayed, _, routes = apply(params, TOKENS, replay_routes=jnp.asarray(forced, jnp.int8))
  np.testing.assert_array_equal(np.asarray(routes)[:, :, [0, 2]], forced[:, :, [0, 2]])
  live, _, live_routes = apply(params, TOKENS)
  assert not np.array_equal(np.asarray(live_routes), forced)
  assert np.abs(np.asarray(replayed) - np.asarray(live)).max() > 1e-3

  original = moe.route
  per_layer = iter([forced[:, :, 0].reshape(-1, K), forced[:, :, 2].reshape(-1, K)])

  def forced_route(logits, top_k, *, normalize, replay=None):
    del replay
    allowed = jax.nn.one_hot(jnp.asarray(next(per_layer)), X).sum(axis=1) > 0
    return original(jnp.where(allowed, logits, -1e9), top_k, normalize=normalize)

  import rlhf_jax.models.blocks as blocks  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(blocks, "route", forced_route)
  reference = model_.apply(params, TOKENS)[0]  # unjitted: the layers run in order
  np.testing.assert_allclose(replayed, reference, rtol=1e-5, atol=1e-5)


def test_the_router_gets_a_gradient_through_a_replayed_forward(model):
  model_, params, _ = model
  _, _, routes = model_.apply(params, TOKENS, with_routes=True)

  def loss(p):
    logits = model_.apply(p, TOKENS, replay_routes=routes)[0]
    return jnp.sum(jax.nn.log_softmax(logits)[..., 3])

  grads = jax.jit(jax.grad(loss))(params)
  for layer in (0, 2):
    assert np.abs(np.asarray(grads["layers"][layer]["mlp"]["router"])).sum() > 0


def test_positions_without_records_are_routed_live(model):
  """A prompt's and a padding position's rows hold NOT_RECORDED: they take the live
  router's experts, and only the recorded positions replay."""
  _, params, apply = model
  mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], jnp.int32)
  live, _, live_routes = apply(params, TOKENS, attention_mask=mask)
  rng = np.random.default_rng(2)
  replay = np.full((2, 7, L, K), moe.NOT_RECORDED, np.int8)
  responses = np.zeros((2, 7), bool)
  responses[:, 5:] = True  # the "response" tokens: recorded by a sampler
  for b, t in zip(*np.nonzero(responses)):
    for layer in (0, 2):
      replay[b, t, layer] = rng.permutation(X)[:K]
  _, _, routes = apply(params, TOKENS, attention_mask=mask, replay_routes=jnp.asarray(replay))
  routes, live_routes = np.asarray(routes), np.asarray(live_routes)
  np.testing.assert_array_equal(routes[~responses], live_routes[~responses])
  np.testing.assert_array_equal(routes[responses][:, [0, 2]], replay[responses][:, [0, 2]])


@pytest.mark.parametrize("remat", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_scanned_layers_record_and_replay_as_the_loop(remat):
  config = _config(dense_layers=(), remat=remat)
  loop, params = init_model(config, seed=4)
  scan, _ = init_model(config.replace(scan_layers=True), seed=4)
  from rlhf_jax.models import layer_scan  # pylint: disable=import-outside-toplevel
  stacked = layer_scan.stack_layer_params(params)
  logits, _, routes = loop.apply(params, TOKENS, with_routes=True)
  scanned, _, scanned_routes = scan.apply(stacked, TOKENS, with_routes=True)
  np.testing.assert_array_equal(scanned_routes, routes)
  np.testing.assert_allclose(scanned, logits, rtol=1e-5, atol=1e-5)
  replay = jnp.flip(routes, axis=-1)
  replayed = scan.apply(stacked, TOKENS, replay_routes=replay)[0]
  np.testing.assert_allclose(replayed, loop.apply(params, TOKENS, replay_routes=replay)[0],
                             rtol=1e-5, atol=1e-5)


def test_routes_need_experts():
  model, params = init_model(_config(architecture="qwen3", num_experts=0), seed=0)
  with pytest.raises(ValueError, match="need a mixture-of-experts model"):
    model.apply(params, TOKENS, with_routes=True)
