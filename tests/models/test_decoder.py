"""Decoder properties that need no reference implementation."""

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
  every, _ = model.apply(params, tokens)
  at = jnp.asarray([5, 0, 3])
  picked, _ = model.apply(params, tokens, head_positions=at)
  np.testing.assert_allclose(picked, np.asarray(every)[np.arange(3), np.asarray(at)], atol=1e-6)
  with pytest.raises(ValueError, match="num_last and head_positions"):
    model.apply(params, tokens, num_last=2, head_positions=at)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
    CONFIG.replace(num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match="remat_policy='sometimes'"):
    CONFIG.replace(remat_policy="sometimes")
  with pytest.raises(ValueError, match="dtype='float8'"):
    CONFIG.replace(dtype="float8")
  with pytest.raises(ValueError, match="head='value'"):
    models.init_model(CONFIG, head="value")


def test_num_params_matches_the_arrays():
  for config in (CONFIG, CONFIG.replace(tie_embeddings=True, qkv_bias=False)):
    _, params = models.init_model(config)
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params()


def test_critic_from_policy_shares_the_backbone_and_starts_at_zero():
  policy, params = models.init_model(CONFIG, seed=3)
  critic, critic_params = models.critic_from_policy(policy, params)
  assert "lm_head" not in critic_params
  assert critic_params["layers"][1]["mlp"]["up_proj"] is params["layers"][1]["mlp"]["up_proj"]
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 96, (2, 5)), jnp.int32)
  values, _ = jax.jit(critic.apply)(critic_params, tokens)  # op by op: seconds of compiles
  np.testing.assert_array_equal(values, 0.0)


def test_score_at_last_token():
  values = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
  mask = jnp.array([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
  np.testing.assert_array_equal(models.score_at_last_token(values, mask), [2.0, 7.0, 0.0])


def converts(config, shape) -> int:
  """`convert` ops on arrays of `shape` in the lowered gradient program of a bf16 model
  with float32 parameters."""
  model, params = models.init_model(config)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 96, (2, 9)), jnp.int32)
  text = jax.jit(jax.grad(lambda p: loss(model, p, tokens))).lower(params).as_text()
  typed = "tensor<" + "x".join(map(str, shape)) + "x"
  return sum("stablehlo.convert" in line and typed in line for line in text.splitlines())


@pytest.mark.parametrize("tie", [False, True])
def test_embedding_rows_are_gathered_before_the_cast(tie):
  """The [V, E] table is never cast for the gather (its backward scatter-adds float32
  rows); tied, the head casts it once and its cotangent comes back once (was 2 and 4)."""
  config = CONFIG.replace(dtype="bfloat16", tie_embeddings=tie)
  assert converts(config, (96, 32)) == (2 if tie else 0)


@pytest.mark.parametrize("scan", [False, True])
def test_kernels_are_cast_once_per_forward(scan):
  """A rematerialised layer reads kernels cast before it, so its backward does not recast
  them: gate and up of 2 layers, one cast forward and one cotangent back each (was 12
  with the recasts); stacked, the whole [L, E, F] kernels are cast outside the scan and
  no [E, F] slice is cast inside (was 6)."""
  config = CONFIG.replace(dtype="bfloat16", remat=True, scan_layers=scan)
  if scan:
    assert (converts(config, (2, 32, 48)), converts(config, (32, 48))) == (4, 0)
  else:
    assert converts(config, (32, 48)) == 2 * 2 * 2
