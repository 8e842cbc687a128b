"""HF `config.json` ↔ DecoderConfig, one family at a time.

A family is its HF class (`decoder_config.ARCHITECTURES`) plus the DecoderConfig options its
modelling code fixes (`FAMILY_OPTIONS`: biases, q/k norms, norm placement); what
config.json carries (shapes, RoPE, sliding windows) is read here. What we cannot
compute the way transformers does is refused with a one-line ValueError, and so is a
config.json outside sane bounds (`check_hf_bounds`: a non-finite number anywhere, a size
past any published model's), before anything loops over its layers or allocates.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rlhf_jax.models.decoder_config import ARCHITECTURES
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.decoder_config import LAYER_TYPES
from rlhf_jax.models.decoder_config import RopeScaling
from rlhf_jax.models.decoder_config import YarnScaling
from rlhf_jax.models.hf.gemma import GEMMA
from rlhf_jax.models.hf.gemma import gemma_fields_from_hf
from rlhf_jax.models.hf.gemma import gemma_to_hf
from rlhf_jax.models.hf.gpt_oss import gpt_oss_defaults
from rlhf_jax.models.hf.gpt_oss import gpt_oss_fields_from_hf
from rlhf_jax.models.hf.gpt_oss import gpt_oss_to_hf

# What each family fixes that config.json does not spell out (DecoderConfig fields).
FAMILY_OPTIONS = {
    "qwen2": dict(qkv_bias=True), "llama": {},
    "qwen3": dict(qk_norm="head", qkv_bias=False),
    "qwen3_moe": dict(qk_norm="head", qkv_bias=False),
    "gpt_oss": dict(attention_sinks=True, expert_biases=True, activation="clamped_swiglu",
                    normalize_expert_weights=True),
    "olmo2": dict(qk_norm="projection", norm_placement="post", qkv_bias=False),
    "phi3": dict(qkv_bias=False), "mistral": dict(qkv_bias=False),
    "gemma2": dict(norm_placement="sandwich", norm_offset=1.0, scale_embeddings=True,
                   qkv_bias=False),
    "gemma3_text": dict(qk_norm="head", norm_placement="sandwich", norm_offset=1.0,
                        scale_embeddings=True, qkv_bias=False),
}
# How config.json's `sliding_window` reaches the layers: per layer (`layer_types`, or
# `use_sliding_window` from `max_window_layers` on), or in every layer whenever set. The
# other families' HF code ignores the key.
WINDOW_BY_LAYER_TYPE = ("qwen2", "qwen3")
WINDOW_EVERY_LAYER = ("phi3", "mistral")
# Families whose HF code rotates only part of each head (`partial_rotary_factor`).
PARTIAL_ROTARY = ("phi3",)
# Mixture-of-experts architectures we do not have (refused by name; a config of another
# family with experts is refused too). Ours: `MOE_FAMILIES`.
MOE_ARCHITECTURES = ("Qwen2MoeForCausalLM", "DeepseekV3ForCausalLM",
                     "DeepseekV2ForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")
MOE_FAMILIES = ("qwen3_moe", "gpt_oss")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# Integer keys of config.json with their sane range (from 1; from 0 for the two window
# keys, whose 0 transformers writes for "none"): 8× past the largest published dense
# model (Llama 3.1 405B: 126 layers, width 16384, MLP 53248; Gemma 3's 262144-entry
# vocabulary). Beyond them a number is a typo or an attack (10,000,000 layers spun the
# trainer's loops silently), not a checkpoint; the safetensors headers bound the rest.
HF_INT_BOUNDS = {"vocab_size": 1 << 21, "hidden_size": 1 << 17, "num_hidden_layers": 1024,
                 "num_attention_heads": 1024, "num_key_value_heads": 1024,
                 "head_dim": 4096, "intermediate_size": 1 << 19,
                 "max_position_embeddings": 1 << 24, "sliding_window": 1 << 24,
                 "max_window_layers": 1 << 20, "num_experts": 4096, "num_local_experts": 4096,
                 "num_experts_per_tok": 4096, "moe_intermediate_size": 1 << 19,
                 "decoder_sparse_step": 1024}


def check_hf_bounds(hf: dict[str, Any]) -> None:
  """ValueError in one line naming the key when config.json has a non-finite number
  anywhere (`NaN`, `Infinity`: Python's json reads both), a shape key that is not an
  integer in 1..HF_INT_BOUNDS[key], a non-positive rope_theta or rms_norm_eps, or more
  key-value heads than heads."""
  _check_finite_json(hf, "")
  for key, high in HF_INT_BOUNDS.items():
    value = hf.get(key)
    if value is None and key not in ("vocab_size", "hidden_size", "num_hidden_layers",
                                     "num_attention_heads", "intermediate_size"):
      continue
    low = 0 if key in ("sliding_window", "max_window_layers") else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
      raise ValueError(f"config.json: {key}={value!r} must be an integer in {low}..{high}.")
  for key in ("rope_theta", "rms_norm_eps", "layer_norm_eps"):
    value = hf.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not value > 0):
      raise ValueError(f"config.json: {key}={value!r} must be a number > 0.")
  heads, kv_heads = hf["num_attention_heads"], hf.get("num_key_value_heads") or 0
  if kv_heads and heads % kv_heads:
    raise ValueError(f"config.json: num_key_value_heads={kv_heads} must divide "
                     f"num_attention_heads={heads}.")


def _check_finite_json(value: Any, path: str) -> None:
  """ValueError naming the first non-finite number in a parsed JSON value."""
  if isinstance(value, float) and not math.isfinite(value):
    raise ValueError(f"config.json: {path or 'the value'}={value!r} must be finite.")
  if isinstance(value, dict):
    for key, item in value.items():
      _check_finite_json(item, f"{path}.{key}" if path else str(key))
  elif isinstance(value, list):
    for index, item in enumerate(value):
      _check_finite_json(item, f"{path}[{index}]")


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | YarnScaling | None]:
  """rope_theta and scaling from transformers 5 `rope_parameters` or the legacy keys."""
  params = hf.get("rope_parameters") or {}
  legacy = hf.get("rope_scaling") or {}
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  rope_type = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
  if rope_type == "default":
    return float(theta), None
  if rope_type == "llama3":
    source = params if params.get("rope_type") == "llama3" else legacy
    return float(theta), RopeScaling(
        factor=float(source["factor"]), low_freq_factor=float(source["low_freq_factor"]),
        high_freq_factor=float(source["high_freq_factor"]),
        original_max_position_embeddings=int(source["original_max_position_embeddings"]))
  if rope_type == "yarn":
    return float(theta), _yarn_from_hf(params if params.get("rope_type") == "yarn" else legacy,
                                       hf)
  raise ValueError(f"config.json: rope_type={rope_type!r} is not supported; supported: "
                   "'default', 'llama3', 'yarn'.")


def _yarn_from_hf(source: dict[str, Any], hf: dict[str, Any]) -> YarnScaling:
  """YaRN's parameters as transformers reads them (its defaults: beta_fast 32, beta_slow 1,
  truncate true; the attention factor from factor, or mscale / mscale_all_dim)."""
  original = source.get("original_max_position_embeddings")
  if original is None:
    raise ValueError("config.json: rope_type='yarn' needs original_max_position_embeddings.")
  factor = source.get("factor")
  if factor is None and not hf.get("max_position_embeddings"):
    raise ValueError("config.json: rope_type='yarn' needs factor (or max_position_embeddings).")
  factor = float(hf["max_position_embeddings"] / original if factor is None else factor)

  def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attention = source.get("attention_factor")
  if attention is None:
    m, m_all = source.get("mscale"), source.get("mscale_all_dim")
    attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
  return YarnScaling(factor=factor, original_max_position_embeddings=int(original),
                     beta_fast=float(source.get("beta_fast") or 32),
                     beta_slow=float(source.get("beta_slow") or 1),
                     attention_factor=float(attention),
                     truncate=bool(source.get("truncate", True)))


def architecture_from_hf(hf: dict[str, Any]) -> str:
  """Our architecture name for a config.json; ValueError in one line for MoE and for
  families we do not have."""
  architectures = hf.get("architectures") or []
  model_type = hf.get("model_type")
  ours = {ARCHITECTURES[a] for a in MOE_FAMILIES}
  moe = [a for a in architectures
         if a not in ours and (a in MOE_ARCHITECTURES or "moe" in a.lower())]
  if not set(architectures) & ours and model_type not in MOE_FAMILIES and (
      moe or any(hf.get(key) for key in _EXPERT_KEYS)):
    name = moe[0] if moe else (architectures or [model_type])[0]
    raise ValueError(f"config.json: {name} is a mixture-of-experts model we do not have; "
                     f"supported: {', '.join(ARCHITECTURES[a] for a in MOE_FAMILIES)}.")
  by_class = {cls: arch for arch, cls in ARCHITECTURES.items()}
  known = [by_class[a] for a in architectures if a in by_class]
  if known:
    return known[0]
  if model_type in ARCHITECTURES:
    return model_type
  raise ValueError(
      f"config.json: architectures={architectures!r} (model_type={model_type!r}) is not "
      f"supported; supported: {', '.join(ARCHITECTURES.values())}.")


def config_from_hf(hf: dict[str, Any], **overrides) -> DecoderConfig:
  """A DecoderConfig from a parsed HF `config.json` (one of ARCHITECTURES).

  Args:
    hf: the parsed config.json.
    **overrides: DecoderConfig fields to set (e.g. dtype="bfloat16", remat=True,
      matmul_precision="highest"); fields config.json does not carry
      (remat, matmul_precision, ...) otherwise keep their defaults.
  Returns:
    The DecoderConfig.
  Raises:
    ValueError in one line naming what is not supported (an architecture, MoE, a
    rope type, sliding windows, biases, activations) or out of bounds (`check_hf_bounds`).
  """
  architecture = architecture_from_hf(hf)
  check_hf_bounds(hf)
  cls = ARCHITECTURES[architecture]
  if hf.get("mlp_bias"):
    raise ValueError("config.json: mlp_bias=true is not supported.")
  if FAMILY_OPTIONS[architecture].get("qkv_bias") is False and hf.get("attention_bias"):
    raise ValueError(f"config.json: attention_bias=true (q/k/v/o biases) is not supported "
                     f"for {cls}.")
  hidden_act = hf.get("hidden_act", "silu")
  if architecture == "gpt_oss":
    hf = gpt_oss_defaults(hf)
  if hidden_act != "silu" and architecture not in GEMMA:
    raise ValueError(f"config.json: hidden_act={hidden_act!r} is not supported; only 'silu'.")
  theta, scaling = (None, None) if architecture == "gemma3_text" else _rope_from_hf(hf)
  partial = float((hf.get("rope_parameters") or {}).get(
      "partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
  if partial != 1.0 and architecture not in PARTIAL_ROTARY:
    raise ValueError(f"config.json: partial_rotary_factor={partial} is not supported for "
                     f"{cls}.")
  num_heads = hf["num_attention_heads"]
  fields = dict(
      architecture=architecture,
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
      intermediate_size=hf["intermediate_size"],
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      rope_theta=theta,
      rope_scaling=scaling,
      partial_rotary_factor=partial,
      max_position_embeddings=hf.get("max_position_embeddings", 2048),
      qkv_bias=bool(hf.get("attention_bias", False)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
  )
  if architecture in GEMMA:
    fields.update(gemma_fields_from_hf(hf, architecture, _rope_from_hf))
  else:
    fields.update(_windows_from_hf(hf, architecture))
  if architecture == "qwen3_moe":
    fields.update(_experts_from_hf(hf))
  if architecture == "gpt_oss":
    fields.update(gpt_oss_fields_from_hf(hf))
  fields.update(FAMILY_OPTIONS[architecture])
  fields.update(overrides)
  return DecoderConfig(**fields)


def _experts_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
  """The expert fields of a Qwen3-MoE config.json: a layer's MLP is sparse unless it is in
  `mlp_only_layers` or `decoder_sparse_step` skips it ((layer + 1) % step != 0)."""
  experts = hf.get("num_experts") or hf.get("num_local_experts") or 0
  step = hf.get("decoder_sparse_step", 1) or 1
  layers = hf["num_hidden_layers"]
  only = hf.get("mlp_only_layers") or []
  if not isinstance(only, list) or any(not isinstance(i, int) for i in only):
    raise ValueError(f"config.json: mlp_only_layers={only!r} must be a list of layer indices.")
  dense = sorted({i for i in only if 0 <= i < layers}
                 | {i for i in range(layers) if (i + 1) % step})
  return dict(num_experts=experts, experts_per_token=hf.get("num_experts_per_tok", 0),
              expert_intermediate_size=hf.get("moe_intermediate_size", 0),
              normalize_expert_weights=bool(hf.get("norm_topk_prob", False)),
              dense_layers=tuple(dense) if experts else ())


def _layer_types_from_hf(hf: dict[str, Any]) -> list[str]:
  """config.json's `layer_types`, checked: one of LAYER_TYPES per layer."""
  types = hf["layer_types"]
  if (not isinstance(types, list) or len(types) != hf["num_hidden_layers"]
      or any(kind not in LAYER_TYPES for kind in types)):
    raise ValueError(f"config.json: layer_types={types!r} must list num_hidden_layers="
                     f"{hf['num_hidden_layers']} of {', '.join(LAYER_TYPES)}.")
  return types


def _windows_from_hf(hf: dict[str, Any], architecture: str) -> dict[str, Any]:
  """sliding_window and layer_types (None: every layer alike) as the family's HF code
  reads them: Qwen2/Qwen3 per layer (`layer_types`, else transformers 4's layers from
  `max_window_layers` on) and only with `use_sliding_window`; gpt-oss per layer; Qwen3-MoE
  in every layer with `use_sliding_window`; Phi-3 and Mistral in every layer whenever
  set; the other families' HF code ignores the key."""
  window = hf.get("sliding_window")
  if architecture == "qwen3_moe":
    return dict(sliding_window=window if hf.get("use_sliding_window") else None)
  if architecture in WINDOW_EVERY_LAYER:
    return dict(sliding_window=window)
  if architecture not in WINDOW_BY_LAYER_TYPE + ("gpt_oss",):
    return dict(sliding_window=None)
  if architecture in WINDOW_BY_LAYER_TYPE and not hf.get("use_sliding_window"):
    window = None  # transformers 5 drops the window (every layer full) without the flag
  if hf.get("layer_types") is not None:
    types = _layer_types_from_hf(hf)
  else:  # transformers 4: the layers from max_window_layers on slide
    first = hf.get("max_window_layers", 28)
    types = ["sliding_attention" if i >= first else "full_attention"
             for i in range(hf["num_hidden_layers"])]
  if window is None or set(types) == {"full_attention"}:
    return dict(sliding_window=None)
  if set(types) == {"sliding_attention"}:
    return dict(sliding_window=int(window))
  return dict(sliding_window=int(window), layer_types=tuple(types))


def _check_family(config: DecoderConfig) -> None:
  """ValueError when `config` differs from what its architecture's HF class computes."""
  cls = ARCHITECTURES[config.architecture]
  fixed = dict(FAMILY_OPTIONS[config.architecture])
  fixed.setdefault("qk_norm", "none")
  fixed.setdefault("norm_placement", "pre")
  fixed.setdefault("norm_offset", 0.0)
  fixed.setdefault("scale_embeddings", False)
  if config.architecture not in GEMMA:
    fixed.setdefault("activation", "silu")  # gpt-oss's experts: its own (FAMILY_OPTIONS)
    fixed.update(query_pre_attn_scalar=None, final_logit_softcapping=None)
  if config.architecture not in GEMMA + WINDOW_BY_LAYER_TYPE + ("gpt_oss",):
    fixed["layer_types"] = None
  if config.architecture != "gpt_oss":
    fixed.update(attention_sinks=False, attention_out_bias=False, expert_biases=False)
  elif config.attention_out_bias != config.qkv_bias:  # one `attention_bias` for all four
    raise ValueError(f"{cls} checkpoints have attention_out_bias=qkv_bias "
                     f"(attention_bias); got {config.attention_out_bias} and "
                     f"{config.qkv_bias}.")
  if config.architecture != "gemma2":
    fixed["attn_logit_softcapping"] = None
  if config.architecture != "gemma3_text":
    fixed["rope_local_theta"] = None
  if config.architecture not in PARTIAL_ROTARY:
    fixed["partial_rotary_factor"] = 1.0
  windowed = WINDOW_BY_LAYER_TYPE + WINDOW_EVERY_LAYER + GEMMA + MOE_FAMILIES
  if config.architecture not in windowed:
    fixed["sliding_window"] = None
  if config.architecture not in MOE_FAMILIES:
    fixed["num_experts"] = 0
  for name, value in fixed.items():
    if getattr(config, name) != value:
      raise ValueError(f"{cls} checkpoints have {name}={value!r}; "
                       f"{name}={getattr(config, name)!r} cannot be saved as "
                       f"architecture={config.architecture!r}.")


def config_to_hf(config: DecoderConfig) -> dict[str, Any]:
  """The HF `config.json` dict that `transformers` loads back into the same model.

  Runtime numerics that are not part of the checkpoint (compute dtype, remat,
  matmul_precision, logprob_chunk) are not written, nor token ids (an export takes them
  from its source checkpoint or tokenizer: `hf.metadata.export_config`).
  Raises:
    ValueError when the config is not one its architecture's HF class can hold
    (e.g. Qwen2 without q/k/v bias).
  """
  _check_family(config)
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
  if config.architecture in PARTIAL_ROTARY:
    rope["partial_rotary_factor"] = config.partial_rotary_factor
  if config.rope_scaling is not None:
    kind = "yarn" if isinstance(config.rope_scaling, YarnScaling) else "llama3"
    rope.update(rope_type=kind, **dataclasses.asdict(config.rope_scaling))
  hf = {
      "architectures": [ARCHITECTURES[config.architecture]],
      "model_type": config.architecture,
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "intermediate_size": config.intermediate_size,
      "rms_norm_eps": config.rms_norm_eps,
      "rope_parameters": rope,
      "rope_theta": config.rope_theta,
      "max_position_embeddings": config.max_position_embeddings,
      "tie_word_embeddings": config.tie_embeddings,
      "hidden_act": "silu",
      "torch_dtype": config.param_dtype,
      "dtype": config.param_dtype,
  }
  if config.rope_scaling is not None:
    hf["rope_scaling"] = dict(rope)
  if config.architecture != "qwen2":
    hf["attention_bias"] = config.qkv_bias
    hf["mlp_bias"] = False
  window = config.sliding_window
  types = list(config.layer_types or ["full_attention" if window is None else
                                      "sliding_attention"] * config.num_layers)
  if config.architecture in WINDOW_BY_LAYER_TYPE:
    # transformers 4 slides the layers from max_window_layers on (exact when the sliding
    # layers are the last ones); transformers 5 reads layer_types.
    first = types.index("sliding_attention") if window is not None else config.num_layers
    hf.update(use_sliding_window=window is not None, sliding_window=window,
              max_window_layers=first, layer_types=types)
  elif config.architecture in WINDOW_EVERY_LAYER:
    hf["sliding_window"] = window
  elif config.architecture in GEMMA:
    hf.update(gemma_to_hf(config, rope))
  if config.architecture == "gpt_oss":
    hf.update(gpt_oss_to_hf(config, types))
  if config.architecture == "qwen3_moe":
    hf.update(num_experts=config.num_experts, num_experts_per_tok=config.experts_per_token,
              moe_intermediate_size=config.expert_intermediate_size,
              norm_topk_prob=config.normalize_expert_weights, decoder_sparse_step=1,
              mlp_only_layers=list(config.dense_layers),
              use_sliding_window=config.sliding_window is not None,
              sliding_window=config.sliding_window)
  return hf
