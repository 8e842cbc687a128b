"""The Qwen2.5-0.5B-shaped bf16 training step (value_and_grad of the response log-probs),
lowered for CUDA on this CPU from abstract parameters: with attention_impl='cudnn' it
holds one cuDNN flash forward and one backward custom call per layer and no score-sized
dot; with 'xla' it has the [B, K, G·T, S] score dots that flash attention removes.

cuDNN's version and compute-capability checks ask the GPU; they are patched here only.
"""

from __future__ import annotations

import re

from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models.lm_head import rows_logprobs
from rlhf_jax.models.packing import PackedRows

ROWS, PROMPT, RESPONSE = 2, 256, 768     # 2 × 1024 tokens: an even length
LAYERS = 24
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 14, 2, 64, 151936
SCORE_ELEMENTS = ROWS * HEADS * (PROMPT + RESPONSE) ** 2  # B·K·G·T·S


def _lowered_step(impl: str, packed: bool = False) -> str:
  """StableHLO text of the step lowered for CUDA: padded rows, or (`packed`) the rows
  packed into ROWS buffers of PROMPT + RESPONSE tokens (segment ids)."""
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
