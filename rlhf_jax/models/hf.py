"""Hugging Face checkpoints: `config.json` + `model.safetensors` (single or sharded).

One table maps each of our parameters to its HF tensor name and layout. Loading
streams one tensor at a time from the memory-mapped safetensors file, converts
it, and places it on its device (and sharding, when given), so the host never
holds a second full copy of the model. Saving writes a directory that
`transformers.AutoModelForCausalLM.from_pretrained` loads.

Needs the `hf` extra (safetensors).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Iterator

import jax
import numpy as np

from rlhf_jax.models import config as config_lib
from rlhf_jax.models import hf_config
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import Params
from rlhf_jax.models.functional import init_model
from rlhf_jax.models.layer_scan import is_stacked

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that hold nothing we need.
_IGNORABLE = (re.compile(r".*\.rotary_emb\.inv_freq$"),)


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


# Families whose checkpoints fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj`.
FUSED_PROJECTIONS = ("phi3",)


def _transpose(x):
  return np.ascontiguousarray(x.T)


def _same(x):
  return x


def tensor_mappings(config: config_lib.DecoderConfig, head: str) -> list[TensorMapping]:
  """The full parameter ↔ HF tensor table for a model."""
  e = config.hidden_size
  mappings = [TensorMapping(("embed",), "model.embed_tokens.weight", _same, _same),
              TensorMapping(("final_norm", "weight"), "model.norm.weight", _same, _same)]
  for i in range(config.num_layers):
    mappings += _layer_mappings(config, f"model.layers.{i}.", ("layers", i))
  if head == "lm" and not config.tie_embeddings:
    mappings.append(TensorMapping(("lm_head",), "lm_head.weight", _transpose, _transpose))
  if head == "scalar":
    # HF's *ForSequenceClassification / *ForTokenClassification with one label.
    mappings.append(TensorMapping(("scalar_head",), "score.weight", lambda w: w.reshape(e),
                                  lambda w: w.reshape(1, e)))
  return mappings


def _layer_mappings(config: config_lib.DecoderConfig, hf: str, ours: tuple
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
  else:  # OLMo 2 names the norms of the attention and MLP outputs
    norms = (("attention_out_norm", "post_attention_layernorm"),
             ("mlp_out_norm", "post_feedforward_layernorm"))
  mappings += [TensorMapping(ours + (name, "weight"), hf + f"{hf_name}.weight", _same, _same)
               for name, hf_name in norms]
  mappings.append(TensorMapping(ours + ("attention", "o_proj"), hf + "self_attn.o_proj.weight",
                                lambda w: np.ascontiguousarray(w.T.reshape(h, d, e)),
                                lambda w: np.ascontiguousarray(w.reshape(h * d, e).T)))
  for j, name in enumerate(("gate", "up")):
    hf_name = hf + ("mlp.gate_up_proj.weight" if fused else f"mlp.{name}_proj.weight")
    mappings.append(TensorMapping(ours + ("mlp", f"{name}_proj"), hf_name, _transpose,
                                  _transpose, rows=(j * f, (j + 1) * f, 2 * f) if fused else None))
  mappings.append(TensorMapping(ours + ("mlp", "down_proj"), hf + "mlp.down_proj.weight",
                                _transpose, _transpose))
  return mappings


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def _locate(path: tuple, stacked: bool) -> tuple[tuple, int | None]:
  """(key path of the array holding a mapping's tensor, its layer index in that array or
  None): ("layers", i, *rest) is ("layers", *rest)[i] when the layers are stacked."""
  if stacked and path[0] == "layers":
    return ("layers",) + tuple(path[2:]), path[1]
  return path, None


def _load_order(mappings: list[TensorMapping], stacked: bool) -> list[TensorMapping]:
  """Stacked: the layers of one array in a row, so the host holds one stacked array at a
  time (the last layer completes it)."""
  if not stacked:
    return mappings
  return sorted(mappings, key=lambda m: (m.path[0] == "layers", str(m.path[2:]),
                                         m.path[1] if m.path[0] == "layers" else 0))


class _CheckpointFiles:
  """Name → file lookup over a single or sharded safetensors checkpoint."""

  def __init__(self, directory: str):
    from safetensors import safe_open  # the `hf` extra

    self._safe_open = safe_open
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
      with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
      self.file_of = {name: os.path.join(directory, fname) for name, fname in weight_map.items()}
    elif os.path.exists(single_path):
      with safe_open(single_path, "numpy") as f:
        self.file_of = {name: single_path for name in f.keys()}
    else:
      raise FileNotFoundError(f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}.")
    self._open: dict[str, Any] = {}

  def names(self) -> set[str]:
    return set(self.file_of)

  def _handle(self, name: str):
    path = self.file_of[name]
    if path not in self._open:
      if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint shard {path} (holding {name}) is missing.")
      self._open[path] = self._safe_open(path, "numpy").__enter__()
    return self._open[path]

  def read(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Tensor `name`, or only its rows start:stop (read without the rest)."""
    if rows is None:
      return self._handle(name).get_tensor(name)
    return self._handle(name).get_slice(name)[rows[0]:rows[1]]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handle(name).get_slice(name).get_shape())

  def close(self):
    for handle in self._open.values():
      handle.__exit__(None, None, None)
    self._open.clear()


def read_hf_config(directory: str, **overrides) -> config_lib.DecoderConfig:
  """DecoderConfig from `directory/config.json`; overrides set fields (dtype, remat...)."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist (not an HF checkpoint directory?).")
  with open(path) as f:
    return hf_config.config_from_hf(json.load(f), **overrides)


def _read_tensor(files: _CheckpointFiles, available: set[str], mapping: TensorMapping,
                 shape: tuple, directory: str, missing_head: str) -> np.ndarray:
  """One tensor of the checkpoint in our layout, checked against our `shape` (zeros for a
  missing scalar head with missing_head="zeros")."""
  if mapping.hf_name not in available:
    if mapping.path == ("scalar_head",) and missing_head == "zeros":
      return np.zeros(shape, np.float32)
    raise ValueError(f"{directory}: tensor {mapping.hf_name!r} is missing from the "
                     "checkpoint.")
  if mapping.rows is not None and files.shape(mapping.hf_name)[:1] != mapping.rows[2:]:
    raise ValueError(f"{directory}: fused tensor {mapping.hf_name!r} has shape "
                     f"{files.shape(mapping.hf_name)}; expected {mapping.rows[2]} rows.")
  raw = files.read(mapping.hf_name, None if mapping.rows is None else mapping.rows[:2])
  try:
    array = mapping.to_ours(raw)
  except ValueError as error:
    raise ValueError(f"{directory}: tensor {mapping.hf_name!r} has shape {raw.shape}, "
                     f"which does not fit our {shape}.") from error
  if array.shape != shape:
    raise ValueError(f"{directory}: tensor {mapping.hf_name!r} has shape {raw.shape}; "
                     f"expected one that maps to {shape}.")
  return array


def _check_unexpected(directory: str, available: set[str], mappings: list[TensorMapping],
                      extra_head: bool) -> None:
  """Raises ValueError naming the checkpoint's tensors that no mapping reads.
  `extra_head`: an `lm_head.weight` is tolerated (tied embeddings: some exporters
  store the head anyway; a scalar head: a critic drops the LM head)."""
  used = {m.hf_name for m in mappings} | {"score.bias"}
  if extra_head:
    used.add("lm_head.weight")
  unexpected = sorted(n for n in available - used
                      if not any(p.match(n) for p in _IGNORABLE))
  if unexpected:
    raise ValueError(f"{directory}: unexpected tensors {unexpected[:5]}"
                     f"{' ...' if len(unexpected) > 5 else ''} ({len(unexpected)} in all); "
                     "the checkpoint does not match config.json's architecture.")


def load_hf_checkpoint(directory: str, *, head: str = "lm", shardings: Params | None = None,
                       missing_head: str = "error", **config_overrides
                       ) -> tuple[FunctionalModel, Params]:
  """Loads an HF checkpoint of one of `config.ARCHITECTURES` into our parameters.

  Args:
    directory: holds config.json and model.safetensors (or a sharded
      model.safetensors.index.json with its shards).
    head: "lm", or "scalar" for a critic / reward model. A scalar head reads
      `score.weight` (HF *ForSequenceClassification with one label).
    shardings: optional params-shaped dict of `jax.sharding.Sharding`; each
      tensor goes straight onto its sharding.
    missing_head: "error", or "zeros" to start a scalar head at 0 when the
      checkpoint has none (a critic initialised from a policy).
    **config_overrides: DecoderConfig fields (e.g. dtype="bfloat16",
      param_dtype="bfloat16", remat=True; scan_layers=True loads the layers
      stacked, one [L, ...] array at a time on the host).
  Returns:
    (model, params).
  Raises:
    ValueError naming the tensor on a missing tensor, a shape mismatch, or an
    unexpected tensor; FileNotFoundError for missing files.
  """
  if missing_head not in ("error", "zeros"):
    raise ValueError(f"missing_head={missing_head!r}; allowed: 'error', 'zeros'.")
  config = read_hf_config(directory, **config_overrides)
  model, abstract = init_model(config, head=head, abstract=True)
  files = _CheckpointFiles(directory)
  mappings = tensor_mappings(config, head)
  params = jax.tree.map(lambda _: None, abstract)
  try:
    available = files.names()
    pending: dict[tuple, np.ndarray] = {}  # stacked layers: arrays being filled
    for mapping in _load_order(mappings, config.scan_layers):
      path, layer = _locate(mapping.path, config.scan_layers)
      target = _get(abstract, path)
      shape = target.shape if layer is None else target.shape[1:]
      array = _read_tensor(files, available, mapping, shape, directory, missing_head)
      array = array.astype(target.dtype, copy=False)
      if layer is not None:
        pending.setdefault(path, np.empty(target.shape, target.dtype))[layer] = array
        if layer < target.shape[0] - 1:
          continue
        array = pending.pop(path)
      sharding = None if shardings is None else _get(shardings, path)
      _set(params, path, jax.device_put(array, sharding))
      del array
    if head == "scalar":
      bias = files.read("score.bias").reshape(()) if "score.bias" in available else np.zeros(())
      sharding = None if shardings is None else shardings["scalar_bias"]
      params["scalar_bias"] = jax.device_put(bias.astype(abstract["scalar_bias"].dtype), sharding)
    _check_unexpected(directory, available, mappings,
                      extra_head=config.tie_embeddings or head == "scalar")
  finally:
    files.close()
  return model, params


def iter_hf_tensors(model: FunctionalModel, params: Params) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, host array) pairs, one at a time; params in either layer layout
  (`DecoderConfig.scan_layers`)."""
  stacked = is_stacked(params)
  parts = []  # of a fused tensor, in row order
  for mapping in tensor_mappings(model.config, model.head):
    path, layer = _locate(mapping.path, stacked)
    array = _get(params, path)
    array = array if layer is None else array[layer]
    array = mapping.to_hf(np.asarray(jax.device_get(array)))
    if mapping.rows is None:
      yield mapping.hf_name, array
      continue
    parts.append(array)
    if mapping.rows[1] == mapping.rows[2]:
      yield mapping.hf_name, np.concatenate(parts, axis=0)
      parts = []
  if model.head == "scalar":
    yield "score.bias", np.asarray(jax.device_get(params["scalar_bias"])).reshape(1)


def save_hf_checkpoint(directory: str, model: FunctionalModel, params: Params, *,
                       max_shard_bytes: int = 4 << 30) -> None:
  """Writes config.json and safetensors that `transformers` loads.

  Args:
    directory: output directory (created).
    model: the FunctionalModel (for the config and head).
    params: the parameters.
    max_shard_bytes: split into model-0000i-of-0000n.safetensors files with
      an index when the weights exceed this size.
  """
  from safetensors.numpy import save_file  # the `hf` extra

  os.makedirs(directory, exist_ok=True)
  written = hf_config.config_to_hf(model.config)
  if model.head == "scalar":
    base = config_lib.ARCHITECTURES[model.config.architecture].replace("ForCausalLM", "")
    written["architectures"] = [base + "ForSequenceClassification"]
    written["num_labels"] = 1
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(written, f, indent=2, sort_keys=True)

  # Drop any stale layout from an earlier save into the same directory.
  for stale in os.listdir(directory):
    if stale.endswith((".safetensors", ".safetensors.tmp")) or stale == INDEX_FILE:
      os.remove(os.path.join(directory, stale))
  # Stream: hold one shard on the host at a time; final names need the shard count, so
  # shards are written under temporary names and renamed at the end.
  metadata = {"format": "pt"}
  written: list[tuple[str, list[str]]] = []
  shard: dict[str, np.ndarray] = {}
  shard_bytes, total = 0, 0

  def flush():
    temporary = os.path.join(directory, f".shard-{len(written):05d}.safetensors.tmp")
    save_file(shard, temporary, metadata=metadata)
    written.append((temporary, list(shard)))

  for name, array in iter_hf_tensors(model, params):
    if shard and shard_bytes + array.nbytes > max_shard_bytes:
      flush()
      shard, shard_bytes = {}, 0
    shard[name] = array
    shard_bytes += array.nbytes
    total += array.nbytes
  flush()
  if len(written) == 1:
    os.replace(written[0][0], os.path.join(directory, SINGLE_FILE))
    return
  weight_map = {}
  for i, (temporary, names) in enumerate(written):
    fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
    os.replace(temporary, os.path.join(directory, fname))
    weight_map.update({name: fname for name in names})
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
              sort_keys=True)
