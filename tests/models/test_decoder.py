"""models/decoder.py: properties that need no reference implementation (remat, the bf16
compute, the scalar head and the positions a head reads). The decoder against
transformers is tests/models/test_hf_families.py and tests/models/hf/test_checkpoint.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models

CONFIG = models.DecoderConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)


def loss(model, params, tokens):
  logits, _ = model.apply(params, tokens)
  return jnp.mean(kernels.token_logprobs(logits[:, :-1], tokens[:, 1:]))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_remat_gives_the_same_gradient(policy):
  model, params = models.init_model(CONFIG, seed=1)
  remat_model, _ = models.init_model(CONFIG.replace(remat=True, remat_policy=policy), seed=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 96, (2, 7)), jnp.int32)
  plain = jax.grad(lambda p: loss(model, p, tokens))(params)
  remat = jax.grad(lambda p: loss(remat_model, p, tokens))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), plain, remat)


@pytest.mark.slow
def test_bfloat16_compute_is_close_to_float32():
  model, params = models.init_model(CONFIG, seed=2)
  bf16_model, _ = models.init_model(CONFIG.replace(dtype="bfloat16"), seed=2)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 96, (2, 9)), jnp.int32)
  full, _ = model.apply(params, tokens)
  half, _ = bf16_model.apply(params, tokens)
  assert half.dtype == jnp.float32  # the head emits float32 logits (lm_logits)
  np.testing.assert_allclose(np.asarray(half, np.float32), full, atol=0.05)


def test_scalar_head_and_num_last():
  critic, params = models.init_model(CONFIG, head="scalar")
  tokens = jnp.zeros((3, 6), jnp.int32)
  apply = jax.jit(critic.apply, static_argnames="num_last")  # op by op: seconds of compiles
  values, _ = apply(params, tokens)
  last, _ = apply(params, tokens, num_last=2)
  assert values.shape == (3, 6) and values.dtype == jnp.float32
  np.testing.assert_allclose(last, values[:, -2:], atol=1e-6)


@pytest.mark.parametrize("head", ["lm", "scalar"])
def test_head_positions_pick_one_position_per_row(head):
  model, params = models.init_model(CONFIG, head=head, seed=3)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 96, (3, 6)), jnp.int32)
  apply = jax.jit(model.apply, static_argnames="num_last")  # op by op: seconds of compiles
  every, _ = apply(params, tokens)
  at = jnp.asarray([5, 0, 3])
  picked, _ = apply(params, tokens, head_positions=at)
  np.testing.assert_allclose(picked, np.asarray(every)[np.arange(3), np.asarray(at)], atol=1e-6)
  with pytest.raises(ValueError, match="num_last and head_positions"):
    apply(params, tokens, num_last=2, head_positions=at)
