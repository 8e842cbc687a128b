"""Chunked log-probs from hidden states (models/lm_head.py) against a NumPy reference and
against the unchunked head, forward and backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import batch as batch_lib
from rlhf_jax.models import lm_head

jax.config.update("jax_numpy_rank_promotion", "raise")


def reference(hidden, head, targets):
  """log softmax(h·W)[target] and the entropy, in float64 NumPy from the formula."""
  logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
  logits -= logits.max(axis=-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
  picked = np.take_along_axis(log_probs, np.asarray(targets)[..., None], axis=-1)[..., 0]
  return picked, -(np.exp(log_probs) * log_probs).sum(axis=-1)


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_chunked_logprobs_and_entropy_match_the_formula(chunk):
  rng = np.random.default_rng(chunk)
  hidden = rng.normal(size=(3, 5, 16)).astype(np.float32)  # 15 tokens: 7 leaves a remainder
  head = rng.normal(size=(16, 40)).astype(np.float32)
  targets = rng.integers(0, 40, (3, 5))
  logprobs, entropy = lm_head.chunked_token_logprobs(
      jnp.asarray(hidden), jnp.asarray(head), jnp.asarray(targets), chunk=chunk,
      with_entropy=True, precision=jax.lax.Precision.HIGHEST)
  want_logprobs, want_entropy = reference(hidden, head, targets)
  np.testing.assert_allclose(logprobs, want_logprobs, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(entropy, want_entropy, atol=2e-5, rtol=1e-5)


def test_chunked_gradients_equal_the_unchunked_ones():
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 9, 16)), jnp.float32)
  head = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 40, (2, 9)))
  weights = jnp.asarray(rng.normal(size=(2, 9)), jnp.float32)

  def chunked(h, w):
    lp, ent = lm_head.chunked_token_logprobs(h, w, targets, chunk=4, with_entropy=True,
                                             precision=jax.lax.Precision.HIGHEST)
    return jnp.sum(weights * lp) + 0.3 * jnp.sum(ent)

  def plain(h, w):  # written with jax.nn, not our kernels
    log_probs = jax.nn.log_softmax(jnp.matmul(h, w, precision=jax.lax.Precision.HIGHEST))
    lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(weights * lp) - 0.3 * jnp.sum(jnp.exp(log_probs) * log_probs)

  got = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden, head)
  want = jax.jit(jax.grad(plain, argnums=(0, 1)))(hidden, head)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_a_bad_chunk_is_refused():
  with pytest.raises(ValueError, match="chunk=0"):
    lm_head.chunked_token_logprobs(jnp.zeros((2, 4)), jnp.zeros((4, 8)), jnp.zeros(2, int),
                                   chunk=0)


CONFIG = models.DecoderConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48,
                              tie_embeddings=True)


def rollout_batch(rng, rows=3, prompt=5, response=6):
  prompts = [list(rng.integers(3, 96, rng.integers(2, prompt + 1))) for _ in range(rows)]
  responses = [list(rng.integers(3, 96, rng.integers(1, response + 1))) for _ in range(rows)]
  zeros = [[0.0] * len(r) for r in responses]
  return batch_lib.as_device(batch_lib.build_rollout_batch(
      prompts, responses, zeros, [0.0] * rows, [False] * rows, list(range(rows)),
      prompt_length=prompt, response_length=response, pad_id=0))


@pytest.mark.parametrize("tie,softcap", [(True, None), (False, None), (True, 0.5)])
def test_response_logprobs_and_their_gradient_do_not_depend_on_the_chunk(tie, softcap):
  """softcap: Gemma 2's final logit soft-capping, which the chunks must apply too."""
  config = CONFIG.replace(tie_embeddings=tie, final_logit_softcapping=softcap)
  model, params = models.init_model(config, seed=3)
  chunked = models.with_numerics(model, logprob_chunk=5)
  batch = rollout_batch(np.random.default_rng(1))

  def loss(m, p):
    lp, ent = batch_lib.response_logprobs(m, p, batch, with_entropy=True)
    return jnp.sum(lp) + 0.1 * jnp.sum(ent), (lp, ent)

  (want, (want_lp, want_ent)), want_grad = jax.jit(jax.value_and_grad(
      lambda p: loss(model, p), has_aux=True))(params)
  (got, (got_lp, got_ent)), got_grad = jax.jit(jax.value_and_grad(
      lambda p: loss(chunked, p), has_aux=True))(params)
  np.testing.assert_allclose(got_lp, want_lp, atol=1e-5)
  np.testing.assert_allclose(got_ent, want_ent, atol=1e-5)
  assert np.all(np.asarray(got_lp)[np.asarray(batch.response_mask) == 0] == 0)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4),
               got_grad, want_grad)


def test_chunking_shrinks_the_compiled_temporaries():
  """XLA's memory analysis of the loss's gradient: with a 4k vocabulary the [B, R, V]
  float32 logits and their cotangent dominate the unchunked program's temporaries."""
  config = CONFIG.replace(vocab_size=4096)
  model, params = models.init_model(config, abstract=True)  # compiled, never run
  batch = rollout_batch(np.random.default_rng(2), rows=8, prompt=8, response=64)

  def temp_bytes(m):
    grad = jax.jit(jax.grad(lambda p: jnp.sum(batch_lib.response_logprobs(m, p, batch))))
    return grad.lower(params).compile().memory_analysis().temp_size_in_bytes

  logits_bytes = 8 * 64 * 4096 * 4
  unchunked = temp_bytes(model)
  chunked = temp_bytes(models.with_numerics(model, logprob_chunk=64))
  assert unchunked > logits_bytes  # the unchunked program holds the full logits
  assert chunked < unchunked - logits_bytes / 2


def old_forward(model, params, batch, chunk=0, head="lm"):
  """The forward as it was before even lengths, written from `DecoderLM.__call__`: the
  rows without their last token ([B, P + R − 1]), the head on the last R states."""
  response = batch.response_length
  hidden, _ = model.apply(params, batch.tokens[:, :-1], num_last=response, apply_head=False,
                          attention_mask=batch.attention_mask[:, :-1])
  mask = batch.response_mask
  if head == "scalar":
    return model.apply(params, hidden, method=lambda m, h: m.project(h)) * mask
  targets = batch.tokens[:, -response:]
  if chunk:
    lp, ent = model.apply(params, hidden, method=lambda m, h: lm_head.chunked_token_logprobs(
        h, m.lm_head_matrix(), targets, chunk=chunk, with_entropy=True,
        precision=m.config.precision))
  else:
    logits = model.apply(params, hidden, method=lambda m, h: m.project(h))
    lp, ent = kernels.token_logprobs(logits, targets), kernels.entropy_from_logits(logits)
  return lp * mask, ent * mask


def new_forward(model, params, batch, chunk=0, head="lm"):
  if head == "scalar":
    return batch_lib.response_values(model, params, batch)
  return batch_lib.response_logprobs(models.with_numerics(model, logprob_chunk=chunk), params,
                                     batch, with_entropy=True)


@pytest.mark.parametrize("head,chunk", [("lm", 0), ("lm", 5), ("scalar", 0)])
def test_even_length_forward_equals_the_old_one_and_so_do_its_gradients(head, chunk):
  """The forward on all P + R tokens (P + R even here, the old one odd) gives the old
  log-probs, entropy, values and parameter gradients, in float32."""
  model, params = models.init_model(CONFIG.replace(tie_embeddings=False), seed=5, head=head)
  batch = rollout_batch(np.random.default_rng(3), rows=4, prompt=5, response=7)
  weights = jnp.asarray(np.random.default_rng(4).normal(size=(4, 7)), jnp.float32)

  def loss(forward, p):
    out = forward(model, p, batch, chunk=chunk, head=head)
    outs = (out,) if head == "scalar" else out
    return sum(jnp.sum(weights * x) * (i + 1) for i, x in enumerate(outs)), out

  (_, want), want_grad = jax.jit(jax.value_and_grad(
      lambda p: loss(old_forward, p), has_aux=True))(params)
  (_, got), got_grad = jax.jit(jax.value_and_grad(
      lambda p: loss(new_forward, p), has_aux=True))(params)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6),
               got, want)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6),
               got_grad, want_grad)


def test_the_forwards_run_on_whole_rows(monkeypatch):
  """Padded rows: the forward sees all P + R tokens (even here; it was P + R − 1)."""
  seen = []
  call = models.DecoderLM.__call__

  def recording(self, tokens, **kwargs):
    seen.append(tokens.shape)
    return call(self, tokens, **kwargs)

  monkeypatch.setattr(models.DecoderLM, "__call__", recording)
  batch = rollout_batch(np.random.default_rng(0), rows=2, prompt=5, response=7)
  for head in ("lm", "scalar"):
    model, params = models.init_model(CONFIG, head=head, abstract=True)
    # Traced, not run: the shapes are what is asked (run op by op it took 3-10 s).
    jax.eval_shape(lambda p, m=model, h=head: new_forward(m, p, batch, head=h), params)
  assert seen == [(2, 12), (2, 12)]
