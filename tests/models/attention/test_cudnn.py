"""models/attention/cudnn.py: cuDNN's packed description of a layout (offsets, lengths per
segment) rebuilds the segments exactly, a NumPy emulation of cuDNN's packed causal mask
gives the decoder's [B, T, S] mask on real queries, what cuDNN cannot take is refused in
one line, and what it is given. A training step lowered for CUDA on this CPU holds one
cuDNN flash forward and one backward custom call per layer and no score-sized dot (with
'xla' it has the [B, K, G·T, S] score dots that flash attention removes); cuDNN's version
and compute-capability checks ask the GPU and are patched there only. The kernel's
numerics need a GPU: scripts/gpu_check.sh."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models import packing
from rlhf_jax.models.attention.cudnn import MAX_SEGMENTS
from rlhf_jax.models.attention.cudnn import cudnn_attention
from rlhf_jax.models.attention.cudnn import describable
from rlhf_jax.models.attention.cudnn import packed_description
from rlhf_jax.models.blocks import attention_mask
from rlhf_jax.models.lm_head import rows_logprobs
from rlhf_jax.models.packing import PackedRows

M = 4
# One program each (op by op, each example's first shapes compiled every op of its own).
_describe = jax.jit(packed_description, static_argnums=2)
_describable = jax.jit(describable, static_argnums=3)
_dense_mask = jax.jit(attention_mask, static_argnums=3)


def _rebuilt_segments(offsets, lengths):
  """[B, T] int: segment i + 1 on the tokens cuDNN's description puts in segment i."""
  batch = offsets.shape[0]
  rebuilt = np.zeros((batch, T), np.int32)
  for b in range(batch):
    for i, (start, length) in enumerate(zip(offsets[b, :-1], lengths[b])):
      if length >= 0:
        assert start >= 0
        assert not rebuilt[b, start:start + length].any(), "segments overlap"
        rebuilt[b, start:start + length] = i + 1
  return rebuilt


def _cudnn_mask(offsets, lengths):
  """[B, T, S] bool: cuDNN's PADDING_CAUSAL packed semantics (query t sees key s
  when both lie in one described segment [o, o + len) and s ≤ t)."""
  rebuilt = _rebuilt_segments(offsets, lengths)
  same = (rebuilt[:, :, None] == rebuilt[:, None, :]) & (rebuilt[:, :, None] > 0)
  return same & np.tril(np.ones((T, T), bool))[None]


T = 48


@st.composite
def _packed_layouts(draw):
  """A packed batch as packing.plan_rows lays it out: rows of drawn spans in buffers
  of T tokens (10: one shape for all examples), row + 1 as segment id, 0 on buffer
  padding."""
  count = draw(st.integers(1, 10))
  prompt, response = 12, 12
  prompts = np.asarray(draw(st.lists(st.integers(1, prompt), min_size=count,
                                     max_size=count)))
  responses = np.asarray(draw(st.lists(st.integers(1, response), min_size=count,
                                       max_size=count)))
  starts, ends = packing.row_spans(prompts, responses, prompt)
  plan = packing.plan_rows(list(range(count)), starts, ends, num_rows=count,
                           width=prompt + response, prompt_width=prompt,
                           response_width=response, capacity=T, buffers=10)
  segments = plan["segments"]
  return segments > 0, segments


@st.composite
def _padded_layouts(draw):
  """Three rows [left pad | real tokens | right pad], no segment ids (one shape for all
  examples: one compile)."""
  valid = np.zeros((3, T), bool)
  for row in range(3):
    start = draw(st.integers(0, T - 1))
    valid[row, start:draw(st.integers(start + 1, T))] = True
  return valid, None


def _check(valid, segments):
  offsets, lengths, runs = (np.asarray(x) for x in _describe(
      jnp.asarray(valid), None if segments is None else jnp.asarray(segments), M))
  assert np.asarray(_describable(jnp.asarray(valid), None if segments is None
                                 else jnp.asarray(segments), jnp.asarray(runs), M)).all()
  assert (offsets[:, -1] == -1).all()
  rebuilt = _rebuilt_segments(offsets, lengths)
  original = valid.astype(np.int32) if segments is None else segments
  # Exactly the same tokens in segments, and the same partition of them.
  np.testing.assert_array_equal(rebuilt > 0, valid)
  for b in range(valid.shape[0]):
    pairs = {(int(o), int(r)) for o, r in zip(original[b], rebuilt[b]) if r > 0}
    assert len({o for o, _ in pairs}) == len(pairs) == len({r for _, r in pairs})
  dense = np.asarray(_dense_mask(jnp.broadcast_to(jnp.arange(T), valid.shape),
                                 jnp.asarray(valid),
                                 None if segments is None else jnp.asarray(segments), None))
  emulated = _cudnn_mask(offsets, lengths)
  np.testing.assert_array_equal(emulated[valid], dense[valid])  # real query rows


@settings(max_examples=25, deadline=None)
@given(_packed_layouts())
def test_packed_description_rebuilds_the_segments(layout):
  _, segments = layout
  segments = np.where(segments > M, 0, segments)  # rows 0..M-1 only: within the bound M
  _check(segments > 0, segments)


@settings(max_examples=25, deadline=None)
@given(_padded_layouts())
def test_padded_rows_are_one_segment_each(layout):
  _check(*layout)


def test_what_the_description_cannot_hold_is_flagged():
  valid = np.ones((3, T), bool)
  segments = np.ones((3, T), np.int32)
  segments[0, 20:] = 2                       # two segments: fine
  valid[1, 10:12] = False                    # one id split by padding
  segments[2] = np.arange(T) // 8 + 1        # 6 segments > M = 4
  valid, segments = jnp.asarray(valid), jnp.asarray(segments)
  runs = _describe(valid, segments, M)[2]
  np.testing.assert_array_equal(describable(valid, segments, runs, M), [True, False, False])


@pytest.mark.parametrize("dtype, time, dim, reason", [
    (jnp.float32, 16, 64, "bfloat16 or float16, got float32"),
    (jnp.bfloat16, 15, 64, "even sequence length, got 15"),
    (jnp.bfloat16, 16, 12, "multiple of 8, got 12"),
    (jnp.bfloat16, 16, 512, "head_dim <= 256"),
])
def test_cudnn_refuses_in_one_line(dtype, time, dim, reason):
  q = jnp.zeros((1, time, 2, dim), dtype)
  with pytest.raises(ValueError, match=reason) as raised:
    cudnn_attention(q, q, q)
  assert "\n" not in str(raised.value)


def test_cudnn_refuses_softcap():
  q = jnp.zeros((1, 16, 2, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="soft-cap"):
    cudnn_attention(q, q, q, softcap=50.0)


@pytest.mark.parametrize("layout, key_heads", [("causal", 2), ("padded", 8), ("packed", 8)])
def test_what_cudnn_is_given(monkeypatch, layout, key_heads):
  """Plain causal rows go in as they are (cuDNN does GQA); padded and packed rows take
  the packed form, whose kv offsets jax scales by the query's heads (before
  github.com/jax-ml/jax/pull/39521), so K/V are repeated to N heads; padding queries come back 0."""
  from rlhf_jax.models.attention import cudnn as module
  seen = {}

  def spy(q, k, v, **kwargs):
    seen.update(kwargs, key_shape=k.shape)
    return jnp.ones_like(q)

  monkeypatch.setattr(module.cudnn_fa, "dot_product_attention", spy)
  q = jnp.zeros((2, 16, 8, 64), jnp.bfloat16)
  k = jnp.zeros((2, 16, 2, 64), jnp.bfloat16)
  valid = jnp.arange(16)[None, :] >= jnp.asarray([[0], [5]])  # row 1 left-padded
  layouts = {"causal": {}, "padded": dict(token_mask=valid),
             "packed": dict(token_mask=valid, segment_ids=(jnp.arange(16) // 8)[None] + 0 * valid)}
  out = cudnn_attention(q, k, k, **layouts[layout])
  assert seen["key_shape"] == (2, 16, key_heads, 64)
  if layout == "causal":
    assert seen["mask_type"] == module.cudnn_fa.MaskType.CAUSAL and "q_offsets" not in seen
    return
  assert seen["mask_type"] == module.cudnn_fa.MaskType.PADDING_CAUSAL
  np.testing.assert_array_equal(np.asarray(out[1, :5], np.float32), 0)
  np.testing.assert_array_equal(np.asarray(out[1, 5:], np.float32), 1)
  want = [[0, -1, -1], [5, -1, -1]] if layout == "padded" else [[0, 8, -1], [5, 8, -1]]
  np.testing.assert_array_equal(seen["q_offsets"][:, :3], want)
  assert seen["q_offsets"].shape[1] == (3 if layout == "padded" else MAX_SEGMENTS + 1)


# ---------------------------------------------------------------- the lowered training step

ROWS, PROMPT, RESPONSE = 2, 256, 768     # 2 × 1024 tokens: an even length
LAYERS = 2  # Qwen2.5-0.5B's layers (24 of them) are alike: two show the count per layer
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 14, 2, 64, 151936
SCORE_ELEMENTS = ROWS * HEADS * (PROMPT + RESPONSE) ** 2  # B·K·G·T·S


def _lowered_step(impl: str, packed: bool = False) -> str:
  """StableHLO text of the Qwen2.5-0.5B-shaped bf16 training step (value_and_grad of the
  response log-probs) lowered for CUDA from abstract parameters: padded rows, or
  (`packed`) the rows packed into ROWS buffers of PROMPT + RESPONSE tokens (segment ids)."""
  config = models.DecoderConfig(
      vocab_size=VOCAB, hidden_size=896, num_layers=LAYERS, num_heads=HEADS,
      num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=4864, rope_theta=1e6,
      max_position_embeddings=32768, tie_embeddings=True, dtype="bfloat16",
      param_dtype="float32", logprob_chunk=1024, attention_impl=impl)
  model, params = models.init_model(config, abstract=True)
  width = PROMPT + RESPONSE
  tokens = jax.ShapeDtypeStruct((ROWS, width), jnp.int32)
  response_mask = jax.ShapeDtypeStruct((ROWS, RESPONSE), jnp.float32)

  buffer = jax.ShapeDtypeStruct((ROWS, width), jnp.int32)
  plan = PackedRows(source=buffer, positions=buffer, segments=buffer,
                    response_index=jax.ShapeDtypeStruct((ROWS, RESPONSE), jnp.int32))

  def step(params, tokens, response_mask, plan):
    attention_mask = jnp.ones_like(tokens)  # traced: the padded (token_mask) path

    def loss(params):
      return -jnp.sum(rows_logprobs(model, params, tokens, attention_mask, response_mask,
                                    packed=plan if packed else None))

    return jax.value_and_grad(loss)(params)

  return jax.jit(step).trace(params, tokens, response_mask, plan).lower(
      lowering_platforms=("cuda",)).as_text()


def _score_sized_dots(text: str) -> int:
  """dot_generals whose result has at least B·K·G·T·S elements, the LM head's
  [chunk, V] logits and [V, E] weight gradients aside."""
  count = 0
  for result in re.findall(r"stablehlo\.dot_general[^\n]*->\s*tensor<([0-9x]+)x\w+>", text):
    dims = [int(n) for n in result.split("x")]
    if VOCAB not in dims and np.prod(dims) >= SCORE_ELEMENTS:
      count += 1
  return count


@pytest.fixture
def patched_cudnn(monkeypatch):
  """cuDNN 9.10 on a Hopper GPU, as far as JAX's checks can tell."""
  monkeypatch.setattr(cudnn_fa, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn_fa, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(cudnn_fa, "is_cuda_compute_capability_equal", lambda capability: False)


@pytest.mark.parametrize("packed", [False, True])
def test_cudnn_step_has_one_flash_call_each_way_per_layer_and_no_score_dots(
    patched_cudnn, packed):
  text = _lowered_step("cudnn", packed)
  calls = re.findall(r"custom_call @(__cudnn\$fmha\w*)", text)
  forward = [c for c in calls if not c.endswith("Backward")]
  backward = [c for c in calls if c.endswith("Backward")]
  assert (len(forward), len(backward)) == (LAYERS, LAYERS), sorted(set(calls))
  assert _score_sized_dots(text) == 0


def test_xla_step_has_score_sized_dots():
  text = _lowered_step("xla")
  assert "__cudnn$fmha" not in text
  # Forward: scores and P·V's input; backward: dP (and more), per layer.
  assert _score_sized_dots(text) >= 2 * LAYERS
