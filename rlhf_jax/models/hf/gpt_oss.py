"""gpt-oss (`GptOssForCausalLM`) `config.json` keys ↔ DecoderConfig fields (`hf.config` reads
and writes the keys every family shares).

What transformers' GptOssConfig defaults when a key is absent is the default here too:
layers alternating sliding then full (window 128), YaRN RoPE (factor 32 over 4096 positions,
untruncated, θ = 150000), head_dim 64, q/k/v/o biases. `intermediate_size` is the experts'
width (gpt-oss has no dense MLP). Checkpoints whose experts are MXFP4 (as published) carry
a `quantization_config` of method "mxfp4": their experts are dequantised on load
(`hf.checkpoint`), and exports are plain bf16/float32 without it.
"""

from __future__ import annotations

from typing import Any

from rlhf_jax.models.decoder_config import DecoderConfig

# transformers' GptOssConfig default RoPE.
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
# The clamped SwiGLU's sigmoid gain: transformers' MXFP4 experts fix it at this value.
SWIGLU_ALPHA = 1.702


def gpt_oss_defaults(hf: dict[str, Any]) -> dict[str, Any]:
  """A gpt-oss config.json with transformers' GptOssConfig defaults filled in; ValueError
  in one line for a quantisation other than MXFP4 or another SwiGLU gain."""
  quantization = hf.get("quantization_config")
  if quantization is not None and (not isinstance(quantization, dict)
                                   or quantization.get("quant_method") != "mxfp4"):
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    raise ValueError(f"config.json: quantization_config.quant_method={method!r} is not "
                     "supported for GptOssForCausalLM; only 'mxfp4' (dequantised on load).")
  if hf.get("swiglu_alpha", SWIGLU_ALPHA) != SWIGLU_ALPHA:
    raise ValueError(f"config.json: swiglu_alpha={hf['swiglu_alpha']!r} is not supported; "
                     f"only {SWIGLU_ALPHA} (gpt-oss's).")
  hf = dict(hf)
  if hf.get("layer_types") is None:
    hf["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                         for i in range(hf["num_hidden_layers"])]
  if "sliding_window" not in hf:
    hf["sliding_window"] = 128
  hf.setdefault("head_dim", 64)
  hf.setdefault("rms_norm_eps", 1e-5)
  hf.setdefault("attention_bias", True)
  if not hf.get("rope_parameters") and not hf.get("rope_scaling"):
    hf["rope_parameters"] = dict(GPT_OSS_ROPE, rope_theta=hf.get("rope_theta", 150000.0))
  return hf


def gpt_oss_fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
  """gpt-oss's expert and bias fields of a config.json (after `gpt_oss_defaults`): every
  layer sparse, `intermediate_size` the experts' width, q/k/v/o biases with
  `attention_bias`, the clamped SwiGLU's limit (top-k then a softmax over the k is the
  renormalised top-k: `FAMILY_OPTIONS`)."""
  experts = hf.get("num_local_experts") or hf.get("num_experts") or 0
  if experts < 1:
    raise ValueError(f"config.json: num_local_experts={experts!r} must be ≥ 1 for "
                     "GptOssForCausalLM.")
  return dict(num_experts=experts, experts_per_token=hf.get("num_experts_per_tok", 4),
              expert_intermediate_size=hf["intermediate_size"],
              qkv_bias=bool(hf["attention_bias"]), attention_out_bias=bool(hf["attention_bias"]),
              swiglu_limit=float(hf.get("swiglu_limit", 7.0)))


def gpt_oss_to_hf(config: DecoderConfig, layer_types: list[str]) -> dict[str, Any]:
  """The gpt-oss keys of config.json (`layer_types`: every layer's, written out)."""
  return dict(num_local_experts=config.num_experts, num_experts_per_tok=config.experts_per_token,
              intermediate_size=config.expert_intermediate_size,
              sliding_window=config.sliding_window, layer_types=layer_types,
              swiglu_alpha=SWIGLU_ALPHA, swiglu_limit=config.swiglu_limit)
