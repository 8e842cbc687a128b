"""models/functional.py: the model as a pure function of its parameter dict. The critic
made from a policy, a reward model's score, the casts of a forward (which leaves, once
each: counted in the lowered program), the parameters' logical axes, and a model's
runtime numerics changed without changing its parameter tree."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.models.functional import compute_params
from rlhf_jax.models.hf.metadata import CheckpointSource

CONFIG = models.DecoderConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
# The GEMM operands and q/k/v biases, read only in the compute dtype (the docstring of
# `compute_params`); the embedding, norms and scalar head stay in their own.
GEMM_OPERANDS = {"q_proj", "k_proj", "v_proj", "o_proj", "q_bias", "k_bias", "v_bias",
                 "gate_proj", "up_proj", "down_proj", "lm_head"}


def loss(model, params, tokens):
  """The mean next-token log-prob of `tokens` (a scalar to differentiate)."""
  logits, _ = model.apply(params, tokens)
  return jnp.mean(kernels.token_logprobs(logits[:, :-1], tokens[:, 1:]))


def test_an_unknown_head_is_refused():
  with pytest.raises(ValueError, match="head='value'"):
    models.init_model(CONFIG, head="value")


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
  model, params = models.init_model(config, abstract=True)  # lowered, never run
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


@pytest.mark.parametrize("head", ["lm", "scalar"])
def test_a_bf16_forward_casts_exactly_the_gemm_operands(head):
  config = CONFIG.replace(dtype="bfloat16")
  _, abstract = models.init_model(config, head=head, abstract=True)
  cast = jax.eval_shape(lambda p: compute_params(p, config), abstract)
  for path, leaf in jax.tree_util.tree_leaves_with_path(cast):
    name = path[-1].key
    want = jnp.bfloat16 if name in GEMM_OPERANDS else jnp.float32
    assert leaf.dtype == want, jax.tree_util.keystr(path)


def test_every_parameter_dimension_has_the_logical_axis_of_its_size():
  """Each dimension of each parameter is named by the axis of CONFIG that it spans (the
  sharding rules map these names to mesh axes); stacked layers lead with 'layers'."""
  model, abstract = models.init_model(CONFIG.replace(scan_layers=True), abstract=True)
  sizes = {"layers": 2, "vocab": 96, "embed": 32, "norm": 32, "heads": 4, "kv_heads": 2,
           "head_dim": 8, "mlp": 48}
  is_axes = lambda x: isinstance(x, tuple)
  axes = model.logical_axes()
  assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(abstract)
  for (path, leaf), names in zip(jax.tree_util.tree_leaves_with_path(abstract),
                                 jax.tree.leaves(axes, is_leaf=is_axes)):
    where = jax.tree_util.keystr(path)
    assert tuple(sizes[n] for n in names) == leaf.shape, where
    assert (names[0] == "layers") == (path[0].key == "layers"), where


def test_with_numerics_changes_how_a_model_computes_not_its_parameters():
  source = CheckpointSource(config={"model_type": "qwen2"}, generation_config=None,
                            dtype="bfloat16")
  model = dataclasses.replace(models.init_model(CONFIG, abstract=True)[0], source=source)
  assert models.with_numerics(model, dtype="float32") is model  # nothing changes
  sampler = models.with_numerics(model, dtype="bfloat16", matmul_precision="default",
                                 decode_attention="xla")
  assert (sampler.config.dtype, sampler.config.matmul_precision,
          sampler.config.decode_attention) == ("bfloat16", "default", "xla")
  assert sampler.config.replace(dtype="float32", matmul_precision="auto",
                                decode_attention="auto") == CONFIG
  assert sampler.source is source and sampler.head == model.head
  assert jax.tree.map(lambda x: (x.shape, x.dtype), sampler.abstract_params()) == (
      jax.tree.map(lambda x: (x.shape, x.dtype), model.abstract_params()))
  with pytest.raises(ValueError, match=r"^with_numerics: hidden_size, vocab_size not "
                     r"runtime fields; allowed: "):
    models.with_numerics(model, hidden_size=64, vocab_size=128)
