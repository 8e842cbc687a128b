"""The LM head's precision with a bfloat16 model: the head GEMM accumulates and emits
float32 logits (`decoder.lm_logits`), so the chunked log-probs are those of the exact
logits of the bf16 hidden states and head, not of their bf16 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.models.chunked_head import chunked_token_logprobs
from rlhf_jax.models.decoder import lm_logits

jax.config.update("jax_numpy_rank_promotion", "raise")

EMBED, VOCAB, TOKENS = 64, 512, 48


def bf16_inputs(seed=0):
  """bf16 hidden states and head whose logits have a std of ~8 (|z| up to ~30, where a
  bf16 logit's spacing is 0.125-0.25), and the targets."""
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.normal(size=(TOKENS, EMBED)), jnp.bfloat16)
  head = jnp.asarray(rng.normal(size=(EMBED, VOCAB)), jnp.bfloat16)
  targets = jnp.asarray(rng.integers(0, VOCAB, TOKENS), jnp.int32)
  return hidden, head, targets


def reference(hidden, head, targets, softcap=None):
  """log-probs and entropy in float64 NumPy from the formula, on the exact values of
  the bf16 inputs."""
  logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
  if softcap is not None:
    logits = softcap * np.tanh(logits / softcap)
  logits -= logits.max(axis=-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
  picked = np.take_along_axis(log_probs, np.asarray(targets)[:, None], axis=-1)[:, 0]
  return picked, -(np.exp(log_probs) * log_probs).sum(axis=-1)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_bf16_chunked_logprobs_are_float32_accurate(softcap):
  """bf16 logits cost ~0.03 nats per log-prob (up to 0.1 here); float32 accumulation and
  output leave float32 rounding (measured over 5 seeds: mean 9.4e-3, max 6.0e-2 nats
  with bf16 logits; mean 1.1e-6, max 5.2e-6 with float32 ones)."""
  hidden, head, targets = bf16_inputs()
  logprobs, entropy = chunked_token_logprobs(hidden, head, targets, chunk=16,
                                             with_entropy=True, softcap=softcap)
  want_logprobs, want_entropy = reference(hidden, head, targets, softcap)
  assert logprobs.dtype == jnp.float32
  np.testing.assert_allclose(logprobs, want_logprobs, atol=5e-5, rtol=1e-5)
  np.testing.assert_allclose(entropy, want_entropy, atol=5e-5, rtol=1e-5)


def test_lm_logits_are_float32_for_bf16_inputs():
  """The sampler reads the same function (`DecoderLM.project`): float32 logits equal to
  the exact product of the bf16 operands to float32 rounding."""
  hidden, head, _ = bf16_inputs(1)
  logits = lm_logits(hidden, head, None)
  assert logits.dtype == jnp.float32
  exact = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
  np.testing.assert_allclose(logits, exact, atol=1e-4, rtol=1e-5)


def test_bf16_head_gradient_runs_bf16_gemms_and_matches_the_formula():
  """The backward's dh and dW GEMMs read bf16 operands (autodiff of a float32-emitting
  dot would upcast both to float32 GEMMs), and the gradients are those of the formula
  (float64 NumPy: dz = onehot − softmax(z), dh = dz·Wᵀ, dW = hᵀ·dz) to bf16 rounding."""
  hidden, head, targets = bf16_inputs(2)
  total = lambda h, w: jnp.sum(chunked_token_logprobs(h, w, targets, chunk=16))
  grad = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))
  dots = [line.split(":")[-1] for line in grad.lower(hidden, head).as_text().splitlines()
          if "stablehlo.dot_general" in line]
  operands = [dot.split("->")[0] for dot in dots]
  assert len(dots) == 4 and all("f32" not in o and o.count("bf16") == 2 for o in operands)
  _, (d_hidden, d_head) = grad(hidden, head)
  h64, w64 = np.asarray(hidden, np.float64), np.asarray(head, np.float64)
  logits = h64 @ w64
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  d_logits = np.eye(VOCAB)[np.asarray(targets)] - probs / probs.sum(-1, keepdims=True)
  for got, want in ((d_hidden, d_logits @ w64.T), (d_head, h64.T @ d_logits)):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-2, atol=2e-2)


CONFIG = models.DecoderConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48,
                              dtype="bfloat16")


@pytest.mark.parametrize("tie", [True, False])
def test_bf16_model_chunked_equals_unchunked_and_the_sampler_logits(tie):
  """A bf16 model: the chunked head, the unchunked head and the log-softmax of the
  logits a sampler reads (`model.apply`) give the same float32 log-probs."""
  config = CONFIG.replace(tie_embeddings=tie)
  model, params = models.init_model(config, seed=4)
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, 300, (2, 11)), jnp.int32)
  targets = tokens[:, 1:]

  def logprobs(module, tokens, chunk):  # as lm_head.token_logprobs does
    hidden, _ = module(tokens, apply_head=False)
    if chunk:
      return chunked_token_logprobs(hidden, module.lm_head_matrix(), targets, chunk=chunk,
                                    precision=module.config.precision)
    return kernels.token_logprobs(module.project(hidden), targets)

  apply = jax.jit(model.apply, static_argnames=("method", "chunk"))  # op by op: seconds
  chunked, unchunked = (apply(params, tokens[:, :-1], method=logprobs, chunk=chunk)
                        for chunk in (3, 0))
  logits, _ = apply(params, tokens[:, :-1])
  assert logits.dtype == chunked.dtype == jnp.float32
  sampler = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(chunked, unchunked, atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(chunked, sampler, atol=1e-5, rtol=1e-6)
