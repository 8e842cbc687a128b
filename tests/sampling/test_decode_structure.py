"""The decode program as XLA:GPU would get it holds no conditional (issue: a decode step
with no host synchronisation). XLA:GPU runs a `stablehlo.case` / `stablehlo.if` as a
conditional thunk that copies its predicate to the host and waits for the stream to
drain, and it cuts CUDA-graph capture; a while loop with a known trip count does not.

The Qwen2.5-0.5B-shaped `generate[16]` program (128 slots × 640 cache, bf16, abstract
parameters: nothing allocated; 2 of its 24 layers, which lower alike) is lowered for CUDA
on CPU with the backend reported as a GPU while tracing (the kernel choices and the Pallas
decode kernel's Triton lowering read it). Before this test, at 24 layers: 25 conditionals
with decode_attention="xla" (one `lax.switch` per layer, one `lax.cond` in sampling), 1
with "pallas".
"""

import re

import jax
import pytest

from rlhf_jax import models
from rlhf_jax import sampling

LAYERS = 2  # of 24: each layer lowers alike, so 2 show a per-layer conditional as 24 do
QWEN_05B = dict(vocab_size=151936, hidden_size=896, num_layers=LAYERS, num_heads=14,
                num_kv_heads=2, head_dim=64, intermediate_size=4864, tie_embeddings=True,
                rope_theta=1e6, max_position_embeddings=32768, param_dtype="bfloat16",
                dtype="bfloat16")


def lowered_generate(monkeypatch, decode_attention: str, truncate: bool) -> str:
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  config = models.DecoderConfig(**QWEN_05B, decode_attention=decode_attention)
  model, params = models.init_model(config, abstract=True)
  engine = sampling.Engine(model, num_slots=128, cache_length=640)
  state = jax.eval_shape(engine.init_decode_state)
  traced = engine._generate.trace(params, state, 16, truncate)
  return traced.lower(lowering_platforms=("cuda",)).as_text()


# "auto" is the Pallas kernel on a GPU (one Triton call per layer); "xla" where it is forced.
@pytest.mark.parametrize("decode_attention,truncate", [("auto", False), ("auto", True),
                                                       ("xla", False)])
def test_the_decode_loop_holds_no_conditional(monkeypatch, decode_attention, truncate):
  text = lowered_generate(monkeypatch, decode_attention, truncate)
  assert text.count("stablehlo.while") == 1  # the 16-step scan (known trip count)
  conditionals = re.findall(r"stablehlo\.(?:case|if)\b", text)
  assert conditionals == [], len(conditionals)
  triton = text.count("__gpu$xla.gpu.triton")
  assert triton == (0 if decode_attention == "xla" else LAYERS), triton
