"""Stacked layers (scan_layers=True) sharded by the rules tables: the forward, the gradient
and a cached decode step equal single-device ones, and the layer axis stays unsplit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import parallel

CONFIG = models.DecoderConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=16, intermediate_size=128,
                              scan_layers=True)


def loss(model, params, tokens):
  """Mean next-token NLL."""
  logits, _ = model.apply(params, tokens)
  return -jnp.mean(kernels.token_logprobs(logits[:, :-1], tokens[:, 1:]))


def decode(model, params, tokens):
  """Prefill `tokens` into a 24-slot cache, then one decode step: its logits [B, V]."""
  cache = models.KVCache.create(model.config, tokens.shape[0], 24)
  logits, cache = model.apply(params, tokens, cache=cache, num_last=1)
  step = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
  return model.apply(params, step, cache=cache, num_last=1)[0][:, 0]


@pytest.mark.slow  # ~11 s of compiles
def test_sharded_scan_matches_single_device():
  model, params = models.init_model(CONFIG, seed=0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (8, 12)), jnp.int32)
  grad = jax.jit(jax.value_and_grad(lambda p, t: loss(model, p, t)))
  generate = jax.jit(lambda p, t: decode(model, p, t))
  expected_loss, expected_grads = grad(params, tokens)
  expected_logits = generate(params, tokens)
  mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
  for rules in (parallel.TRAIN_RULES, parallel.GENERATE_RULES):
    shardings = parallel.param_shardings(params, model.logical_axes(), mesh, rules)
    spec = shardings["layers"]["mlp"]["up_proj"].spec
    assert spec[0] is None and spec[2] == "tensor"  # [L, E, F]: the layer axis unsplit
    sharded = parallel.shard_params(params, shardings)
    batch = jax.device_put(tokens, parallel.batch_sharding(mesh))
    with jax.set_mesh(mesh):
      value, grads = grad(sharded, batch)
      logits = generate(sharded, batch)
    np.testing.assert_allclose(value, expected_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads,
                 expected_grads)
    np.testing.assert_allclose(logits, expected_logits, atol=1e-5)
