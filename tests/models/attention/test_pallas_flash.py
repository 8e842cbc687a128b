"""The Pallas flash kernel (interpret mode on CPU) against the XLA attention: outputs and
dq/dk/dv on real tokens for causal, left/right-padded, packed and hypothesis-drawn
layouts with G > 1; the options it refuses; the whole decoder through it (layer scan,
remat). Which kernel "auto" picks is tested in test_choice.py."""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.attention.pallas_flash import padded_length
from rlhf_jax.models.attention.pallas_flash import pallas_attention
from rlhf_jax.models.attention.xla import grouped_query_attention
from rlhf_jax.models.blocks import attention_mask

# Odd and not a block multiple: the kernel pads to 64 and slices back. G = 2.
B, T, N, K, D = 4, 37, 4, 2, 16


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal((B, T, n, D)), jnp.float32)
                        for n in (N, K, K, N))
  return q, k, v, cotangent


@functools.partial(jax.jit, static_argnames="impl")
def _value_and_grads(q, k, v, cotangent, token_mask, segment_ids, impl):
  """Output and (dq, dk, dv) of Σ out·cotangent over real query rows."""
  mask = attention_mask(jnp.broadcast_to(jnp.arange(T), (B, T)), token_mask, segment_ids, None)
  weight = cotangent * token_mask[:, :, None, None]

  def loss(q, k, v):
    out = grouped_query_attention(q, k, v, mask, impl=impl, token_mask=token_mask,
                                  segment_ids=segment_ids)
    return jnp.sum(out * weight), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


def _assert_matches(token_mask, segment_ids, seed=0):
  q, k, v, cotangent = _inputs(seed)
  token_mask = jnp.asarray(token_mask)
  segment_ids = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
  out_x, grads_x = _value_and_grads(q, k, v, cotangent, token_mask, segment_ids, "xla")
  out_p, grads_p = _value_and_grads(q, k, v, cotangent, token_mask, segment_ids, "pallas")
  real = np.asarray(token_mask)[:, :, None, None]
  np.testing.assert_allclose(np.where(real, out_p, 0), np.where(real, out_x, 0), atol=1e-5)
  # Padding queries: zero from the kernel, so nothing undefined flows on.
  assert not np.any(np.where(real, 0, out_p))
  for name, got, want in zip(("dq", "dk", "dv"), grads_p, grads_x):
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=name)


def _fixed_layout():
  """Row 0 full causal; row 1 left-padded by 6; row 2 right-padded after 25 tokens;
  row 3 three packed segments (9, 14, 8 tokens) then 6 of buffer padding."""
  token_mask = np.ones((B, T), bool)
  token_mask[1, :6] = False
  token_mask[2, 25:] = False
  token_mask[3, 31:] = False
  segments = np.ones((B, T), np.int32)
  segments[3] = np.repeat([5, 2, 7, 0], [9, 14, 8, 6])  # ids need not be ordered
  return token_mask, segments


def test_causal_padded_and_packed_rows_match_xla():
  token_mask, segments = _fixed_layout()
  _assert_matches(token_mask, segments)


def test_padded_rows_without_segment_ids_match_xla():
  token_mask, _ = _fixed_layout()
  _assert_matches(token_mask, None, seed=1)


@st.composite
def _layouts(draw):
  """Per row: left padding, 1-3 segments of drawn lengths, then right padding."""
  token_mask = np.zeros((B, T), bool)
  segments = np.zeros((B, T), np.int32)
  for row in range(B):
    start = draw(st.integers(0, 8))
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    for index, length in enumerate(lengths):
      end = min(T, start + length)
      token_mask[row, start:end] = True
      segments[row, start:end] = index + 1
      start = end
  return token_mask, segments


@settings(max_examples=4, deadline=None)
@given(_layouts(), st.integers(0, 3))
def test_drawn_layouts_match_xla(layout, seed):
  token_mask, segments = layout
  _assert_matches(token_mask, segments, seed)


def test_custom_scale_matches_xla():
  q, k, v, _ = _inputs(2)
  token_mask = jnp.ones((B, T), bool)
  mask = attention_mask(jnp.broadcast_to(jnp.arange(T), (B, T)), token_mask, None, None)
  want = grouped_query_attention(q, k, v, mask, scale=0.3)
  got = pallas_attention(q, k, v, scale=0.3)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_padded_length_is_a_whole_number_of_tiles():
  assert padded_length(37)[0] == 64
  assert padded_length(1023)[0] == 1024
  assert padded_length(1025)[0] == 1152
  assert padded_length(3)[0] == 16


@pytest.mark.parametrize("option, message", [
    (dict(softcap=50.0), "soft-cap"),
    (dict(window=8), "sliding window"),
])
def test_refuses_what_it_cannot_compute(option, message):
  q, k, v, _ = _inputs()
  with pytest.raises(ValueError, match=message):
    pallas_attention(q, k, v, **option)


def test_a_window_wider_than_the_sequence_is_no_window():
  q, k, v, _ = _inputs(3)
  np.testing.assert_array_equal(pallas_attention(q, k, v, window=T),
                                pallas_attention(q, k, v))


def test_decoder_log_probs_and_gradients_match_xla_under_scan_and_remat():
  """The whole model (layer scan, remat) on left-padded rows: log-probs and every
  parameter gradient as with the XLA attention."""
  from rlhf_jax import models
  from rlhf_jax.models.lm_head import rows_logprobs

  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)
  attention = jnp.asarray(np.arange(12)[None] >= np.array([[0], [3]]), jnp.int32)
  response = jnp.ones((2, 4)).at[1, 3].set(0)

  def value_and_grad(impl):
    config = models.DecoderConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=64, scan_layers=True, remat=True, attention_impl=impl)
    model, params = models.init_model(config)
    loss = lambda p: jnp.sum(rows_logprobs(model, p, tokens, attention, response))
    return jax.jit(jax.value_and_grad(loss))(params)

  (want, want_grads), (got, got_grads) = value_and_grad("xla"), value_and_grad("pallas")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, atol=1e-5)
