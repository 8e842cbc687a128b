"""The parameter ↔ HF tensor table: for each of our parameters, its tensor name in an HF
checkpoint and the layout conversions both ways (`hf.checkpoint` loads and saves with it, `hf.peft`
names adapters by it)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from rlhf_jax.models.decoder_config import DecoderConfig


@dataclasses.dataclass(frozen=True)
class TensorMapping:
  """How one of our parameters is stored in an HF checkpoint."""
  path: tuple  # key path in the per-layer params dict: ("layers", i, ...) for layer i
  hf_name: str
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  # (start, stop, total): ours is rows start:stop of a fused HF tensor of `total` rows
  # (Phi-3's qkv_proj, gate_up_proj); the parts of one tensor are listed in row order.
  rows: tuple[int, int, int] | None = None
  # ours is [expert] of the array at `path`: one expert's tensor of a stacked [X, ...]
  # parameter (HF checkpoints store `mlp.experts.<j>.*` one expert at a time).
  expert: int | None = None
  # (part, parts): ours is columns part::parts of the HF tensor's last axis (gpt-oss's
  # `gate_up_proj`: gate in the even columns, up in the odd); the parts are listed in order.
  interleave: tuple[int, int] | None = None


def interleaved_part(part: int, parts: int) -> Callable[[np.ndarray], np.ndarray]:
  """HF → ours for one part of a tensor interleaved on its last axis."""
  return lambda w: np.ascontiguousarray(w[..., part::parts])


def interleave_parts(arrays: list[np.ndarray]) -> np.ndarray:
  """Ours → HF: the parts [..., F] joined as [..., parts·F], column c from part c % parts."""
  return np.stack(arrays, axis=-1).reshape(*arrays[0].shape[:-1], -1)


# Families whose checkpoints fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj`.
FUSED_PROJECTIONS = ("phi3",)


def _transpose(x):
  return np.ascontiguousarray(x.T)


def _same(x):
  return x


def tensor_mappings(config: DecoderConfig, head: str) -> list[TensorMapping]:
  """The full parameter ↔ HF tensor table for a model."""
  e = config.hidden_size
  mappings = [TensorMapping(("embed",), "model.embed_tokens.weight", _same, _same),
              TensorMapping(("final_norm", "weight"), "model.norm.weight", _same, _same)]
  for i in range(config.num_layers):
    mappings += _layer_mappings(config, f"model.layers.{i}.", ("layers", i))
    if config.sparse_layer(i) and config.architecture == "gpt_oss":
      mappings += _gpt_oss_expert_mappings(f"model.layers.{i}.mlp.", ("layers", i, "mlp"))
    elif config.sparse_layer(i):
      mappings += _expert_mappings(config, f"model.layers.{i}.mlp.", ("layers", i, "mlp"))
  if head == "lm" and not config.tie_embeddings:
    mappings.append(TensorMapping(("lm_head",), "lm_head.weight", _transpose, _transpose))
  if head == "scalar":
    # HF's *ForSequenceClassification / *ForTokenClassification with one label.
    mappings.append(TensorMapping(("scalar_head",), "score.weight", lambda w: w.reshape(e),
                                  lambda w: w.reshape(1, e)))
  return mappings


def _layer_mappings(config: DecoderConfig, hf: str, ours: tuple
                    ) -> list[TensorMapping]:
  """The tensors of one layer: HF names under `hf`, our paths under `ours`."""
  e, h, k, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
  f = config.intermediate_size
  fused = config.architecture in FUSED_PROJECTIONS

  def in_proj(heads):  # HF [heads*D, E] ↔ ours [E, heads, D]
    return (lambda w: np.ascontiguousarray(w.T.reshape(e, heads, d)),
            lambda w: np.ascontiguousarray(w.reshape(e, heads * d).T))

  mappings = []
  starts = np.cumsum([0, h * d, k * d, k * d])
  for j, (name, heads) in enumerate((("q", h), ("k", k), ("v", k))):
    rows = (int(starts[j]), int(starts[j + 1]), int(starts[-1])) if fused else None
    hf_name = hf + ("self_attn.qkv_proj.weight" if fused else f"self_attn.{name}_proj.weight")
    mappings.append(TensorMapping(ours + ("attention", f"{name}_proj"), hf_name,
                                  *in_proj(heads), rows=rows))
    if config.qkv_bias:
      mappings.append(TensorMapping(ours + ("attention", f"{name}_bias"),
                                    hf + f"self_attn.{name}_proj.bias",
                                    lambda b, n=heads: b.reshape(n, d), lambda b: b.reshape(-1)))
  if config.qk_norm == "head":
    mappings += [TensorMapping(ours + ("attention", f"{name}_norm", "weight"),
                               hf + f"self_attn.{name}_norm.weight", _same, _same)
                 for name in ("q", "k")]
  elif config.qk_norm == "projection":  # HF [heads*D] ↔ ours [heads, D]
    mappings += [TensorMapping(ours + ("attention", f"{name}_norm", "weight"),
                               hf + f"self_attn.{name}_norm.weight",
                               lambda w, n=heads: w.reshape(n, d), lambda w: w.reshape(-1))
                 for name, heads in (("q", h), ("k", k))]
  if config.norm_placement == "pre":
    norms = (("input_norm", "input_layernorm"), ("post_attention_norm",
                                                 "post_attention_layernorm"))
  elif config.norm_placement == "post":  # OLMo 2 names the norms of the outputs
    norms = (("attention_out_norm", "post_attention_layernorm"),
             ("mlp_out_norm", "post_feedforward_layernorm"))
  else:  # Gemma's four
    norms = (("input_norm", "input_layernorm"), ("attention_out_norm", "post_attention_layernorm"),
             ("mlp_in_norm", "pre_feedforward_layernorm"),
             ("mlp_out_norm", "post_feedforward_layernorm"))
  mappings += [TensorMapping(ours + (name, "weight"), hf + f"{hf_name}.weight", _same, _same)
               for name, hf_name in norms]
  mappings.append(TensorMapping(ours + ("attention", "o_proj"), hf + "self_attn.o_proj.weight",
                                lambda w: np.ascontiguousarray(w.T.reshape(h, d, e)),
                                lambda w: np.ascontiguousarray(w.reshape(h * d, e).T)))
  if config.attention_out_bias:
    mappings.append(TensorMapping(ours + ("attention", "o_bias"), hf + "self_attn.o_proj.bias",
                                  _same, _same))
  if config.attention_sinks:
    mappings.append(TensorMapping(ours + ("attention", "sinks"), hf + "self_attn.sinks",
                                  _same, _same))
  if config.sparse_layer(ours[1]):
    return mappings
  for j, name in enumerate(("gate", "up")):
    hf_name = hf + ("mlp.gate_up_proj.weight" if fused else f"mlp.{name}_proj.weight")
    mappings.append(TensorMapping(ours + ("mlp", f"{name}_proj"), hf_name, _transpose,
                                  _transpose, rows=(j * f, (j + 1) * f, 2 * f) if fused else None))
  mappings.append(TensorMapping(ours + ("mlp", "down_proj"), hf + "mlp.down_proj.weight",
                                _transpose, _transpose))
  return mappings


def _expert_mappings(config: DecoderConfig, hf: str, ours: tuple) -> list[TensorMapping]:
  """A mixture-of-experts MLP's tensors (Qwen3-MoE): the router `gate.weight` [X, E] ↔ ours
  [E, X], and each expert's `experts.<j>.{gate,up,down}_proj.weight` ↔ ours [j] of the
  stacked [X, E, F] / [X, F, E] projections, one projection's experts in a row."""
  mappings = [TensorMapping(ours + ("router",), hf + "gate.weight", _transpose, _transpose)]
  for name in ("gate", "up", "down"):
    mappings += [TensorMapping(ours + (f"{name}_proj",), hf + f"experts.{j}.{name}_proj.weight",
                               _transpose, _transpose, expert=j)
                 for j in range(config.num_experts)]
  return mappings


def _gpt_oss_expert_mappings(hf: str, ours: tuple) -> list[TensorMapping]:
  """gpt-oss's MoE tensors, all experts in one tensor each: the router `router.weight`
  [X, E] ↔ ours [E, X] and its bias; `experts.gate_up_proj` [X, E, 2F] with gate in the
  even columns and up in the odd ↔ ours gate_proj and up_proj [X, E, F] (its bias [X, 2F]
  likewise); `experts.down_proj` [X, F, E] and its bias [X, E] as they are. Checkpoints
  storing them MXFP4 (`*_blocks` / `*_scales`) are dequantised on load (`hf.checkpoint`)."""
  mappings = [TensorMapping(ours + ("router",), hf + "router.weight", _transpose, _transpose),
              TensorMapping(ours + ("router_bias",), hf + "router.bias", _same, _same)]
  for suffix, kind in (("", "proj"), ("_bias", "bias")):
    mappings += [TensorMapping(ours + (f"{name}_{kind}",), hf + f"experts.gate_up_proj{suffix}",
                               interleaved_part(j, 2), _same, interleave=(j, 2))
                 for j, name in enumerate(("gate", "up"))]
    mappings.append(TensorMapping(ours + (f"down_{kind}",), hf + f"experts.down_proj{suffix}",
                                  _same, _same))
  return mappings


def _layer_of(name: str) -> int | None:
  """The layer index of an HF tensor name ("model.layers.3.mlp..." → 3), or None."""
  parts = name.split(".")
  if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
    return int(parts[2])
  return None


def check_header_shapes(config: DecoderConfig, shapes: dict[str, tuple[int, ...]]
                        ) -> None:
  """ValueError in one line when a checkpoint's tensors (HF name → shape, as its
  safetensors headers give them) do not fit `config`: a layer past `config.num_layers`
  or fewer layers than it, a tensor of the table whose shape does not map to ours, or a
  layer's tensor whose shape differs from layer 0's.

  Read before anything is built: our shapes are abstract (`init_model(abstract=True)`),
  and the table's layout conversions run on zero-byte arrays of the header's shapes
  (NumPy's 'V0' dtype), so a 405B checkpoint is checked without allocating it. A scalar
  head is assumed when the checkpoint has `score.weight` (a reward model or critic). A
  missing tensor is left to the loader, which names it.
  """
  from rlhf_jax.models.functional import init_model  # pylint: disable=import-outside-toplevel
  layers = {_layer_of(name) for name in shapes} - {None}
  if layers and (max(layers) >= config.num_layers or len(layers) < config.num_layers):
    raise ValueError(f"config.json: num_hidden_layers={config.num_layers}, but the "
                     f"safetensors hold layers 0..{max(layers)} ({len(layers)} of them).")
  for name, shape in shapes.items():  # every layer has layer 0's shapes
    layer = _layer_of(name)
    first = name.replace(f"model.layers.{layer}.", "model.layers.0.", 1)
    if layer and first in shapes and tuple(shapes[first]) != tuple(shape):
      raise ValueError(f"tensor {name!r} has shape {tuple(shape)}, layer 0's "
                       f"{tuple(shapes[first])}.")
  head = "scalar" if "score.weight" in shapes else "lm"
  one_layer = dataclasses.replace(config, num_layers=1, scan_layers=False,
                                  layer_types=config.layer_types and config.layer_types[:1],
                                  dense_layers=tuple(i for i in config.dense_layers if i == 0))
  _, abstract = init_model(one_layer, head=head, abstract=True)
  for mapping in tensor_mappings(one_layer, head):
    if mapping.hf_name not in shapes:
      continue
    ours = abstract
    for key in mapping.path:
      ours = ours[key]
    if mapping.expert is not None:  # one expert of the stacked [X, ...] array
      ours = jax.ShapeDtypeStruct(ours.shape[1:], ours.dtype)
    shape = tuple(shapes[mapping.hf_name])
    if mapping.rows is not None:
      if shape[:1] != mapping.rows[2:]:
        raise ValueError(f"config.json does not fit tensor {mapping.hf_name!r} of shape "
                         f"{shape}: the config gives it {mapping.rows[2]} rows.")
      shape = (mapping.rows[1] - mapping.rows[0],) + shape[1:]
    try:
      mapped = mapping.to_ours(np.broadcast_to(np.zeros((), "V0"), shape)).shape
    except ValueError:  # a reshape that does not fit
      mapped = None
    if mapped != tuple(ours.shape):
      raise ValueError(f"config.json does not fit tensor {mapping.hf_name!r} of shape "
                       f"{shape}: the config's model has {tuple(ours.shape)} there "
                       f"(hidden_size={config.hidden_size}, vocab_size={config.vocab_size}).")
