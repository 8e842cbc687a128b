"""q/k/v as one GEMM and gate/up as one (`blocks.Attention.qkv`, `blocks.MLP.gate_up`):
the model's forward and gradients equal those of the unfused model, written here with
one einsum per projection, for every attention variant (biases, Qwen3 / OLMo 2 q/k
norms, post-norm, scanned layers, LoRA), and the lowered program holds 3 fewer dots a
layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.models import blocks
from rlhf_jax.models import lora as lora_lib

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
VARIANTS = {
    "qwen2_bias": dict(qkv_bias=True),
    "llama": dict(qkv_bias=False),
    "qwen3_head_norm": dict(qkv_bias=False, qk_norm="head"),
    "olmo2_projection_norm": dict(qkv_bias=False, qk_norm="projection",
                                  norm_placement="post"),
    "scanned_gqa4": dict(num_kv_heads=1, scan_layers=True),
    "mha_geglu": dict(num_kv_heads=4, activation="gelu_pytorch_tanh"),
}


def unfused_qkv(self, x):
  """The reference: three einsums on the [E, H, D] kernels, each with its bias."""
  dtype, precision = self.config.jnp_dtype, self.config.precision
  out = []
  for kernel, bias in ((self.q_proj, "q_bias"), (self.k_proj, "k_bias"),
                       (self.v_proj, "v_bias")):
    y = jnp.einsum("bte,ehd->bthd", x, kernel[...].astype(dtype), precision=precision)
    if self.config.qkv_bias:
      y = y + getattr(self, bias)[...].astype(dtype)[None, None]
    out.append(y)
  return tuple(out)


def unfused_gate_up(self, x):
  dtype, precision = self.config.jnp_dtype, self.config.precision
  return tuple(jnp.einsum("...e,ef->...f", x, kernel[...].astype(dtype), precision=precision)
               for kernel in (self.gate_proj, self.up_proj))


@pytest.fixture
def unfused(monkeypatch):
  """Within the block: the model runs the reference projections."""
  def patch():
    monkeypatch.setattr(blocks.Attention, "qkv", unfused_qkv)
    monkeypatch.setattr(blocks.MLP, "gate_up", unfused_gate_up)
  return patch


def perturbed(params, seed):
  """Every parameter moved off its initial value (biases off 0, norms off 1)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [leaf + 0.05 * jax.random.normal(key, leaf.shape)
                                   for leaf, key in zip(leaves, keys)])


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
MASK = jnp.asarray(np.arange(9)[None, :] >= np.array([[0], [3]]))  # row 1 left-padded


def value_and_grad(model, params):
  def loss(p):
    logits, _ = model.apply(p, TOKENS, attention_mask=MASK)
    return jnp.sum(kernels.token_logprobs(logits[:, :-1], TOKENS[:, 1:]) * MASK[:, 1:]), logits
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def assert_same(got, want):
  (got_loss, got_logits), got_grad = got
  (want_loss, want_logits), want_grad = want
  np.testing.assert_allclose(got_logits, want_logits, atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  # The gradients sum over 16 tokens through the norms (OLMo 2's post-norm amplifies):
  # float32 rounding of the two summation orders reaches ~1e-5 at |g| ~ 0.5 (in float64
  # the two agree to 4e-15).
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5),
               got_grad, want_grad)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_equals_unfused_forward_and_gradients(variant, unfused):
  model, params = models.init_model(CONFIG.replace(**VARIANTS[variant]), seed=1)
  params = perturbed(params, 2)
  fused = value_and_grad(model, params)
  unfused()
  assert_same(fused, value_and_grad(model, params))


def test_fused_equals_unfused_with_lora(unfused):
  """LoRA merges its adapters into q_proj, k_proj, ... before the forward; the fused
  GEMM reads the merged kernels."""
  model, params = models.init_model(CONFIG, seed=3)
  lora_model = lora_lib.LoraModel(model, lora_lib.LoraConfig(rank=2, alpha=4.0))
  trained = lora_model.init_params(perturbed(params, 4), seed=5)
  trained = {**trained, lora_lib.ADAPTERS: perturbed(trained[lora_lib.ADAPTERS], 6)}
  fused = value_and_grad(lora_model, trained)
  unfused()
  assert_same(fused, value_and_grad(lora_model, trained))


def test_fused_decode_equals_unfused(unfused):
  """The KV-cache path (prefill, then one decode step) projects through the same GEMMs."""
  model, params = models.init_model(CONFIG, seed=7)
  params = perturbed(params, 8)

  def decode(p):
    cache = models.KVCache.create(model.config, 2, 16)
    logits, cache = model.apply(p, TOKENS, attention_mask=MASK, cache=cache,
                                head_positions=jnp.full((2,), 8))
    step, _ = model.apply(p, jnp.argmax(logits, -1)[:, None].astype(jnp.int32), cache=cache,
                          head_positions=jnp.zeros((2,), jnp.int32))
    return logits, step

  fused = jax.jit(decode)(params)
  unfused()
  for got, want in zip(fused, jax.jit(decode)(params)):
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)


def dots(model, params, grad: bool) -> int:
  """dot_general ops in the lowered program of the forward (or its gradient)."""
  def logits_sum(p):
    return jnp.sum(model.apply(p, TOKENS, attention_mask=MASK)[0])
  fn = jax.grad(logits_sum) if grad else logits_sum
  return jax.jit(fn).lower(params).as_text().count("stablehlo.dot_general")


@pytest.mark.parametrize("grad", [False, True])
def test_three_fewer_gemms_a_layer(grad, unfused):
  """q/k/v: 3 → 1, gate/up: 2 → 1 in the forward (7 → 4 projection GEMMs); the backward
  has two GEMMs (dx, dW) for each forward one."""
  model, params = models.init_model(CONFIG.replace(num_layers=1), seed=0)
  fused = dots(model, params, grad)
  unfused()
  assert dots(model, params, grad) - fused == 3 * (3 if grad else 1)


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_fused_kernels_split_like_their_parts(shards):
  """Tensor parallelism splits heads, kv_heads and mlp into `shards` contiguous blocks:
  block j of a fused kernel must be the fusion of block j of its parts (each device
  fuses its own columns; no data moves between devices)."""
  rng = np.random.default_rng(shards)
  e, h, k, d, f = 3, 8, 4, 2, 12
  q, kk, v = (jnp.asarray(rng.normal(size=(e, n, d))) for n in (h, k, k))
  gate, up = (jnp.asarray(rng.normal(size=(e, f))) for _ in range(2))
  block = lambda x, j, axis: jnp.split(x, shards, axis=axis)[j]
  for j in range(shards):
    np.testing.assert_array_equal(
        block(blocks.join_per_kv_head(q, kk, v), j, 1),
        blocks.join_per_kv_head(block(q, j, 1), block(kk, j, 1), block(v, j, 1)))
    np.testing.assert_array_equal(block(blocks.interleave_columns(gate, up), j, 1),
                                  blocks.interleave_columns(block(gate, j, 1),
                                                            block(up, j, 1)))
