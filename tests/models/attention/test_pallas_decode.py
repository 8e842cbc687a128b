"""The ragged Pallas decode-attention kernel (interpret mode) against a NumPy reference
written from the formula, and against `cached_attention`'s XLA path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.attention.cached import cached_attention
from rlhf_jax.models.attention.pallas_decode import decode_attention
from rlhf_jax.models.attention.pallas_decode import lengths_from_mask
from rlhf_jax.models.decoder_config import DecoderConfig

SLOTS, DIM, BLOCK = 64, 16, 16


def reference(q, keys, values, valid, lengths):
  """softmax(q·Kᵀ/√d + mask)·V in float64, one (row, head) at a time.

  q [B, N, D], keys [B, K, D, S], values [B, K, S, D], valid [B, S], lengths [B]."""
  q, keys, values = (np.asarray(x, np.float64) for x in (q, keys, values))
  batch, heads, dim = q.shape
  group = heads // keys.shape[1]
  out = np.zeros((batch, heads, dim))
  for b in range(batch):
    allowed = np.asarray(valid[b]) & (np.arange(keys.shape[3]) < lengths[b])
    for n in range(heads):
      scores = q[b, n] @ keys[b, n // group] / np.sqrt(dim)
      scores = np.where(allowed, scores, -np.inf)
      weights = np.exp(scores - scores.max())
      out[b, n] = (weights / weights.sum()) @ values[b, n // group]
  return out


def ragged_inputs(seed, kv_heads, group, dtype, batch=5):
  """Rows of lengths 1, full, mid, and two with left-padding holes in `valid`."""
  rng = np.random.default_rng(seed)
  heads = kv_heads * group
  q = rng.standard_normal((batch, heads, DIM))
  keys = rng.standard_normal((batch, kv_heads, DIM, SLOTS))
  values = rng.standard_normal((batch, kv_heads, SLOTS, DIM))
  lengths = np.array([1, SLOTS, 23, 40, 17])[:batch]
  valid = np.arange(SLOTS)[None, :] < lengths[:, None]
  valid[3, :9] = False  # a left-padded prompt: slots 0..8 are padding
  valid[4, 3:7] = False  # holes anywhere
  cast = lambda x: jnp.asarray(x, dtype)
  return cast(q), cast(keys), cast(values), jnp.asarray(valid), jnp.asarray(lengths)


@pytest.mark.parametrize("kv_heads,group,dtype,num_splits", [
    (2, 1, jnp.float32, None),     # group 1 (MHA), default splits: one per block
    (2, 3, jnp.float32, 1),        # GQA, one split: the whole row in one program
    (1, 4, jnp.float32, 3),        # MQA, uneven splits (4 blocks over 3 splits)
    (2, 3, jnp.bfloat16, 2),
])
def test_matches_the_numpy_reference(kv_heads, group, dtype, num_splits):
  q, keys, values, valid, lengths = ragged_inputs(0, kv_heads, group, dtype)
  run = jax.jit(lambda *a: decode_attention(*a, block_size=BLOCK, num_splits=num_splits,
                                            interpret=True))
  got = run(q, keys, values, valid, lengths)
  assert got.shape == q.shape and got.dtype == dtype
  # bfloat16: the probabilities enter P·V in bfloat16 (as on the XLA path) and the
  # output is rounded to bfloat16, ~2⁻⁸ relative each.
  tolerance = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             reference(q, keys, values, valid, lengths), atol=tolerance)


def test_lengths_default_to_the_last_valid_slot():
  q, keys, values, valid, lengths = ragged_inputs(1, 2, 2, jnp.float32)
  np.testing.assert_array_equal(lengths_from_mask(valid), lengths)
  got = decode_attention(q, keys, values, valid, block_size=BLOCK)
  np.testing.assert_allclose(got, reference(q, keys, values, valid, lengths), atol=1e-5)


def test_blocks_beyond_a_rows_length_are_never_loaded():
  """NaN in every whole block at or past a row's last used block: had the kernel loaded
  one, 0·NaN would poison that row's output."""
  q, keys, values, valid, lengths = ragged_inputs(2, 2, 2, jnp.float32)
  used_blocks = -(-np.asarray(lengths) // BLOCK)
  beyond = np.arange(SLOTS)[None, :] >= (used_blocks * BLOCK)[:, None]  # [B, S]
  keys = jnp.where(jnp.asarray(beyond)[:, None, None, :], jnp.nan, keys)
  values = jnp.where(jnp.asarray(beyond)[:, None, :, None], jnp.nan, values)
  for num_splits in (1, 4):
    got = decode_attention(q, keys, values, valid, lengths, block_size=BLOCK,
                           num_splits=num_splits)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got, reference(q, np.nan_to_num(keys),
                                              np.nan_to_num(values), valid, lengths),
                               atol=1e-5)


@pytest.mark.parametrize("dtype,gemma", [(jnp.float32, False), (jnp.bfloat16, False),
                                         (jnp.float32, True)])
def test_cached_attention_pallas_matches_xla(dtype, gemma):
  """The decoder's decode mask (causal ∧ valid ∨ itself, [B, 1, S]) through both kernels;
  `gemma`: with a score scale and Gemma 2's soft-capping."""
  rng = np.random.default_rng(3)
  batch, kv_heads, group = 4, 2, 2
  q = jnp.asarray(rng.standard_normal((batch, 1, kv_heads * group, DIM)), dtype)
  keys = jnp.asarray(rng.standard_normal((batch, kv_heads, DIM, SLOTS)), dtype)
  values = jnp.asarray(rng.standard_normal((batch, kv_heads, SLOTS, DIM)), dtype)
  end = np.array([0, 63, 30, 12])  # this step's slot per row
  valid = np.arange(SLOTS)[None, :] <= end[:, None]
  valid[2, :5] = False  # left padding
  slot = np.arange(SLOTS)[None, :]
  mask = jnp.asarray(((slot <= end[:, None]) & valid) | (slot == end[:, None]))[:, None]
  num_used = jnp.int32(end.max() + 1)
  run = jax.jit(cached_attention, static_argnames=("kernel", "scale", "softcap"))
  scores = dict(scale=0.7, softcap=1.5) if gemma else {}
  xla = run(q, keys, values, mask, num_used, kernel="xla", **scores)
  pallas = run(q, keys, values, mask, num_used, kernel="pallas", **scores)
  if gemma:  # the options change the result
    assert np.max(np.abs(np.asarray(xla - run(q, keys, values, mask, num_used)))) > 0.1
  assert pallas.shape == xla.shape and pallas.dtype == xla.dtype
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(pallas, np.float32), np.asarray(xla, np.float32),
                             atol=tolerance)


def test_bad_arguments_are_rejected():
  q, keys, values, valid, _ = ragged_inputs(4, 2, 2, jnp.float32)
  with pytest.raises(ValueError, match="do not match"):
    decode_attention(q[:, :3], keys, values, valid)
  with pytest.raises(ValueError, match="kernel='triton'"):
    cached_attention(q[:, None], keys, values, valid[:, None], kernel="triton")
  with pytest.raises(ValueError, match="decode_attention='triton'"):
    DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=4, intermediate_size=8, decode_attention="triton")
  with pytest.raises(ValueError, match="multiple of 16"):
    decode_attention(q, keys[..., :40], values[:, :, :40], valid[:, :40], interpret=False)


def test_decoder_decode_steps_agree_across_kernels(monkeypatch):
  """A tiny DecoderLM: left-padded prefill into a 64-slot cache, then 3 decode steps,
  with every one-token cached attention forced onto the Pallas kernel vs the XLA path.
  (Forced with a wrapper, so it holds before and after the decoder passes
  `kernel=config.decode_attention`.)"""
  from rlhf_jax import models
  from rlhf_jax.models import blocks

  # head_dim 16: the smallest the Triton tiles take (on a GPU this runs the real kernel)
  config = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=16, intermediate_size=48)
  model, params = models.init_model(config, seed=5)
  rng = np.random.default_rng(6)
  prompt = jnp.asarray(rng.integers(0, 64, (3, 7)), jnp.int32)
  mask = jnp.asarray(np.arange(7)[None, :] >= np.array([0, 4, 2])[:, None])  # left padding
  steps = jnp.asarray(rng.integers(0, 64, (3, 3)), jnp.int32)

  def run():  # traced afresh per call, so the patch below takes effect
    prefill = jax.jit(lambda p, c: model.apply(p, prompt, attention_mask=mask, cache=c))
    _, cache = prefill(params, models.KVCache.create(config, 3, SLOTS))
    step = jax.jit(lambda p, tok, c: model.apply(p, tok, cache=c))
    outs = []
    for t in range(steps.shape[1]):
      logits, cache = step(params, steps[:, t:t + 1], cache)
      outs.append(np.asarray(logits))
    return np.concatenate(outs, axis=1)

  xla = run()
  original, decode_calls = blocks.cached_attention, []

  def pallas(q, *args, **kwargs):
    decode_calls.append(q.shape[1] == 1)
    return original(q, *args, **{**kwargs, "kernel": "pallas"})

  monkeypatch.setattr(blocks, "cached_attention", pallas)
  np.testing.assert_allclose(run(), xla, atol=2e-5)
  assert sum(decode_calls) == config.num_layers  # one traced decode step, every layer


def test_lowers_to_a_triton_kernel_for_a_gpu():
  """Lowered for CUDA from this host (no GPU needed): the kernel goes through Pallas'
  Triton lowering (tiles, ops, the bool/int8 mask) as one Triton custom call, at the
  Qwen2.5-0.5B decode shape (G = 7 query heads per KV head, padded to 16)."""
  batch, kv_heads, group, dim, slots = 4, 2, 7, 64, 640
  shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)
  args = (shape(batch, kv_heads * group, dim), shape(batch, kv_heads, dim, slots),
          shape(batch, kv_heads, slots, dim), shape(batch, slots, dtype=jnp.bool_))
  run = jax.jit(lambda *a: decode_attention(*a, interpret=False))
  try:
    text = run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  except (NotImplementedError, RuntimeError) as error:  # a jaxlib built without CUDA
    if "cuda" in str(error).lower() and "platform" in str(error).lower():
      pytest.skip(f"no CUDA lowering in this jaxlib: {error}")
    raise
  assert text.count("__gpu$xla.gpu.triton") == 1
