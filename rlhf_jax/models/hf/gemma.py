"""Gemma 2 and Gemma 3 (text) `config.json` keys ↔ DecoderConfig fields (`hf.config` reads
and writes the keys every family shares).

What transformers' Gemma2Config / Gemma3TextConfig default when a key is absent is the
default here too: alternating sliding layers (Gemma 2) or five sliding to one global
(Gemma 3's `sliding_window_pattern` = 6), query_pre_attn_scalar 256, soft-capping at 50
(attention) and 30 (logits) for Gemma 2 and none for Gemma 3, RoPE bases 10⁶ (global)
and 10⁴ (sliding) for Gemma 3, tied embeddings.
"""

from __future__ import annotations

from typing import Any, Callable

from rlhf_jax.models.decoder_config import DecoderConfig

GEMMA = ("gemma2", "gemma3_text")
# Sliding-window layer pattern when config.json has no layer_types (every n-th is global).
DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6}
_DEFAULTS = {"gemma2": dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
             "gemma3_text": dict(attn_logit_softcapping=None, final_logit_softcapping=None)}


def _optional_float(value) -> float | None:
  return None if value is None else float(value)


def _int_if_whole(value: float | None):
  return int(value) if value is not None and float(value).is_integer() else value


def layer_types_from_hf(hf: dict[str, Any], architecture: str) -> tuple[str, ...]:
  """Each layer's type: config.json's `layer_types`, else its `sliding_window_pattern`."""
  types = hf.get("layer_types")
  if types is None:
    pattern = hf.get("sliding_window_pattern") or DEFAULT_PATTERN[architecture]
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
             for i in range(hf["num_hidden_layers"])]
  return tuple(types)


def _rope_from_hf(hf: dict[str, Any], shared_rope: Callable) -> tuple[float, Any, float]:
  """Gemma 3's (global θ, global scaling, sliding θ): transformers 5's per-layer-type
  `rope_parameters`, or the legacy rope_theta / rope_scaling / rope_local_base_freq."""
  params = hf.get("rope_parameters") or {}
  if "full_attention" in params or "sliding_attention" in params:
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
  else:
    full = dict(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta", 1e6))
    local = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
  full.setdefault("rope_theta", 1e6)
  if local.get("rope_type", "default") != "default":
    raise ValueError(f"config.json: sliding layers' rope_type={local['rope_type']!r} is not "
                     "supported; only 'default'.")
  theta, scaling = shared_rope({"rope_parameters": full})
  return theta, scaling, float(local.get("rope_theta", 1e4))


def gemma_fields_from_hf(hf: dict[str, Any], architecture: str, shared_rope: Callable
                         ) -> dict[str, Any]:
  """The DecoderConfig fields of a Gemma config.json that `hf.config` does not read
  (`shared_rope`: its reader of one rope_parameters dict)."""
  if hf.get("use_bidirectional_attention"):
    raise ValueError("config.json: use_bidirectional_attention=true is not supported.")
  activation = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
  if activation not in ("gelu_pytorch_tanh", "silu"):
    raise ValueError(f"config.json: hidden_activation={activation!r} is not supported; "
                     "supported: 'gelu_pytorch_tanh', 'silu'.")
  defaults = _DEFAULTS[architecture]
  fields = dict(
      activation=activation,
      sliding_window=hf.get("sliding_window", 4096),
      layer_types=layer_types_from_hf(hf, architecture),
      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
      final_logit_softcapping=_optional_float(hf.get(
          "final_logit_softcapping", defaults["final_logit_softcapping"])),
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
  if architecture == "gemma2":
    fields["attn_logit_softcapping"] = _optional_float(hf.get(
        "attn_logit_softcapping", defaults["attn_logit_softcapping"]))
  else:  # Gemma 3's attention never caps, whatever its config says
    theta, scaling, local = _rope_from_hf(hf, shared_rope)
    fields.update(rope_theta=theta, rope_scaling=scaling, rope_local_theta=local)
  if "sliding_attention" not in fields["layer_types"]:
    fields["sliding_window"] = None
  return fields


def gemma_to_hf(config: DecoderConfig, rope: dict[str, Any]) -> dict[str, Any]:
  """The Gemma keys of config.json (`rope`: the global layers' rope_parameters)."""
  types = config.layer_types or tuple(
      ["full_attention" if config.sliding_window is None else "sliding_attention"]
      * config.num_layers)
  hf = {"hidden_activation": config.activation, "hidden_act": config.activation,
        # transformers' Gemma configs take an int (a float fails their validation).
        "query_pre_attn_scalar": _int_if_whole(config.query_pre_attn_scalar),
        "final_logit_softcapping": config.final_logit_softcapping,
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "sliding_window": config.sliding_window, "layer_types": list(types)}
  if config.architecture == "gemma3_text":
    local = config.rope_theta if config.rope_local_theta is None else config.rope_local_theta
    hf["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
        "rope_type": "default", "rope_theta": local}}
  return hf
