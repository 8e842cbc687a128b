"""Sharded forward and PPO gradients equal single-device ones; FSDP memory; resharding."""

import functools

import jax
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import parallel

CONFIG = models.DecoderConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=16, intermediate_size=128,
                              tie_embeddings=False)
MESHES = {"data2_fsdp2_tensor2": dict(data=2, fsdp=2, tensor=2),
          "fsdp8": dict(data=1, fsdp=8, tensor=1),
          "data4_tensor2": dict(data=4, fsdp=1, tensor=2)}


@pytest.fixture(scope="module")
def setup():
  model, params = models.init_model(CONFIG, seed=0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CONFIG.vocab_size, (8, 16)).astype(np.int32)
  mask = np.ones((8, 15), np.float32)
  mask[:, :5] = 0  # prompt
  mask[3, 12:] = 0
  batch = dict(tokens=tokens, mask=mask,
               old_logprobs=-rng.uniform(4, 6, (8, 15)).astype(np.float32),
               advantages=rng.standard_normal((8, 15)).astype(np.float32))
  return model, params, batch


def ppo_loss(model, params, batch):
  logits, _ = model.apply(params, batch["tokens"])
  logprobs = kernels.token_logprobs(logits[:, :-1], batch["tokens"][:, 1:])
  loss, _ = kernels.ppo_policy_loss(logprobs, batch["old_logprobs"], batch["advantages"],
                                    batch["mask"], clip_low=0.2, clip_high=0.28)
  return loss


def reference(model, params, batch):
  logits = jax.jit(lambda p, t: model.apply(p, t)[0])(params, batch["tokens"])
  grads = jax.jit(jax.grad(functools.partial(ppo_loss, model)))(params, batch)
  return logits, grads


@pytest.mark.parametrize("layout", list(MESHES))
def test_sharded_forward_and_gradient_match_single_device(setup, layout):
  model, params, batch = setup
  expected_logits, expected_grads = reference(model, params, batch)
  mesh = parallel.make_mesh(**MESHES[layout])
  shardings = parallel.param_shardings(params, model.logical_axes(), mesh,
                                       parallel.TRAIN_RULES)
  sharded = parallel.shard_params(params, shardings)
  batch_sharded = jax.device_put(batch, parallel.batch_sharding(mesh))
  with jax.set_mesh(mesh):
    logits = jax.jit(lambda p, t: model.apply(p, t)[0])(sharded, batch_sharded["tokens"])
    grads = jax.jit(jax.grad(functools.partial(ppo_loss, model)),
                    out_shardings=shardings)(sharded, batch_sharded)
  np.testing.assert_allclose(logits, expected_logits, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, expected_grads)
  # The gradient really is laid out like the parameters.
  assert grads["layers"][0]["mlp"]["gate_proj"].sharding.is_equivalent_to(
      shardings["layers"][0]["mlp"]["gate_proj"], 2)


def test_fsdp8_splits_parameter_bytes(setup):
  model, params, _ = setup
  mesh = parallel.make_mesh(data=1, fsdp=8, tensor=1)
  shardings = parallel.param_shardings(params, model.logical_axes(), mesh)
  sharded = parallel.shard_params(params, shardings)
  total = sum(x.nbytes for x in jax.tree.leaves(params))
  # Stated overhead: parameters without an `embed` axis (norm weights, q/k/v biases) are not
  # split by FSDP and stay whole on every device.
  axes = jax.tree.leaves(model.logical_axes(), is_leaf=lambda x: isinstance(x, tuple))
  replicated = sum(x.nbytes for x, names in zip(jax.tree.leaves(params), axes)
                   if "embed" not in names)
  assert replicated < 0.01 * total
  device = jax.devices()[0]
  per_device = sum(shard.data.nbytes for x in jax.tree.leaves(sharded)
                   for shard in x.addressable_shards if shard.device == device)
  assert per_device <= total / 8 + replicated, (per_device, total, replicated)


def test_reshard_between_train_and_generate_layouts_is_bit_exact(setup):
  model, params, _ = setup
  mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
  axes = model.logical_axes()
  train = parallel.param_shardings(params, axes, mesh, parallel.TRAIN_RULES)
  generate = parallel.param_shardings(params, axes, mesh, parallel.GENERATE_RULES)
  in_train = parallel.shard_params(params, train)
  in_generate = parallel.reshard(in_train, generate)
  for leaf, sharding in zip(jax.tree.leaves(in_generate), jax.tree.leaves(generate)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
  jax.tree.map(np.testing.assert_array_equal, in_generate, params)
  back = parallel.reshard(in_generate, train, donate=True)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_indivisible_dimension_is_named(setup):
  model, params, _ = setup
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=8)
  with pytest.raises(ValueError, match=r"parameter layers/0/attention/k_bias .*'kv_heads' → 'tensor'.* does not divide into 8"):
    parallel.param_shardings(params, model.logical_axes(), mesh)


def test_checkpoint_loads_straight_onto_its_sharding(setup, tmp_path):
  pytest.importorskip("safetensors")
  model, params, _ = setup
  models.save_hf_checkpoint(str(tmp_path), model, params)
  mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
  shardings = parallel.param_shardings(params, model.logical_axes(), mesh)
  _, loaded = models.load_hf_checkpoint(str(tmp_path), shardings=shardings)
  for leaf, sharding in zip(jax.tree.leaves(loaded), jax.tree.leaves(shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
