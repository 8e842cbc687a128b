"""models/blocks.py: q/k/v as one GEMM and gate/up as one (`Attention.qkv`,
`MLP.gate_up`): the model's forward and gradients equal those of the unfused model,
written here with one einsum per projection, for every attention variant (biases, Qwen3 /
OLMo 2 q/k norms, post-norm, scanned layers, LoRA), and the lowered program holds 3 fewer
dots a layer. The attention mask against a loop over query and key written from its
definition, and RMSNorm against NumPy."""

from __future__ import annotations

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
  """Every parameter moved off its initial value (biases off 0, norms off 1); drawn with
  NumPy (jax.random op by op compiled a program per parameter shape)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: jnp.asarray(
      leaf + 0.05 * rng.standard_normal(leaf.shape), leaf.dtype), params)


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


def reference_mask(query_slots, key_valid, segment_ids, window):
  """[B, T, S] from the definition, one (query, key) pair at a time: a real key at or
  before the query's slot, of its segment, with fewer than `window` real tokens after it
  up to the query's slot; and a query always sees its own slot."""
  batch, time = query_slots.shape
  slots = key_valid.shape[1]
  out = np.zeros((batch, time, slots), bool)
  for b in range(batch):
    for t in range(time):
      q = query_slots[b, t]
      for s in range(slots):
        allowed = key_valid[b, s] and s <= q
        if segment_ids is not None:
          allowed = allowed and segment_ids[b, t] == segment_ids[b, s]
        if window is not None:
          allowed = allowed and sum(key_valid[b, s + 1:q + 1]) < window
        out[b, t, s] = allowed or s == q
  return out


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("packed", [False, True])
def test_attention_mask_follows_its_definition(window, packed):
  rng = np.random.default_rng(3 + (window or 0))
  batch, slots = 3, 12
  key_valid = rng.random((batch, slots)) < 0.7
  key_valid[1, :4] = False  # a left-padded row
  segment_ids = np.cumsum(rng.random((batch, slots)) < 0.25, axis=1) if packed else None
  query_slots = np.broadcast_to(np.arange(slots), (batch, slots))  # a full forward
  got = blocks.attention_mask(jnp.asarray(query_slots), jnp.asarray(key_valid),
                              None if segment_ids is None else jnp.asarray(segment_ids),
                              window)
  np.testing.assert_array_equal(got, reference_mask(query_slots, key_valid, segment_ids,
                                                    window))
  decode = np.asarray([[11], [7], [0]])  # one query each, as a decode step reads the cache
  got = blocks.attention_mask(jnp.asarray(decode), jnp.asarray(key_valid), None, window)
  np.testing.assert_array_equal(got, reference_mask(decode, key_valid, None, window))


@pytest.mark.parametrize("offset, shape", [(0.0, None), (1.0, None), (0.0, (4, 8))])
def test_rms_norm_against_numpy(offset, shape):
  """y = x / √(mean(x²) + eps) · (offset + w) over w's axes: [hidden] by default, or
  [heads, head_dim] for OLMo 2's norm of a whole projection."""
  config = CONFIG.replace(norm_offset=offset, rms_norm_eps=1e-5)
  norm = blocks.RMSNorm(config, shape)
  rng = np.random.default_rng(0)
  weight = rng.standard_normal(norm.weight.shape).astype(np.float32)
  norm.weight[...] = jnp.asarray(weight)
  x = rng.standard_normal((2, 5) + norm.weight.shape).astype(np.float32)
  axes = tuple(range(2, x.ndim))
  x64 = x.astype(np.float64)
  want = x64 / np.sqrt(np.mean(x64 ** 2, axis=axes, keepdims=True) + 1e-5) * (offset + weight)
  np.testing.assert_allclose(norm(jnp.asarray(x)), want, rtol=1e-5, atol=1e-6)
