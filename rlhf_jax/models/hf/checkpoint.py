"""Hugging Face checkpoints: `config.json` + `model.safetensors` (single or sharded).

One table (`hf.tensors`) maps each of our parameters to its HF tensor name and layout. Loading
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
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import Params
from rlhf_jax.models.functional import init_model
from rlhf_jax.models.hf import config as hf_config
from rlhf_jax.models.hf import metadata as hf_metadata
from rlhf_jax.models.hf.mxfp4 import dequantize_mxfp4
from rlhf_jax.models.hf.tensors import TensorMapping
from rlhf_jax.models.hf.tensors import interleave_parts
from rlhf_jax.models.hf.tensors import tensor_mappings
from rlhf_jax.models.layer_scan import is_stacked

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that hold nothing we need.
_IGNORABLE = (re.compile(r".*\.rotary_emb\.inv_freq$"),)
# An MXFP4 tensor `name` is stored as `name_blocks` and `name_scales` (gpt-oss's experts).
MXFP4_PARTS = ("_blocks", "_scales")


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def _locate(mapping: TensorMapping, stacked: bool) -> tuple[tuple, tuple[int, ...]]:
  """(key path of the array holding a mapping's tensor, the tensor's index in that array):
  () for the whole array; ("layers", i, *rest) is ("layers", *rest)[i] when the layers are
  stacked; an expert's tensor is [expert] of its stacked projection, after the layer."""
  path, index = mapping.path, ()
  if stacked and path[0] == "layers":
    path, index = ("layers",) + tuple(path[2:]), (path[1],)
  if mapping.expert is not None:
    index += (mapping.expert,)
  return path, index


def _load_order(mappings: list[TensorMapping], stacked: bool) -> list[TensorMapping]:
  """Stacked: the layers of one array in a row, so the host holds one stacked array at a
  time (the last layer completes it)."""
  if not stacked:
    return mappings
  return sorted(mappings, key=lambda m: (m.path[0] == "layers", str(m.path[2:]),
                                         m.path[1] if m.path[0] == "layers" else 0,
                                         m.expert or 0))


class _CheckpointFiles:
  """Name → file lookup over a single or sharded safetensors checkpoint."""

  def __init__(self, directory: str):
    from safetensors import SafetensorError  # the `hf` extra
    from safetensors import safe_open

    def opened(path: str):
      """safe_open of `path`; a truncated or corrupt file is a ValueError naming it."""
      try:
        return safe_open(path, "numpy")
      except SafetensorError as error:  # its message names no file
        raise ValueError(f"{path}: not a readable safetensors file ({error}).") from None

    self._safe_open = opened
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
      weight_map = _read_json(index_path)["weight_map"]
      self.file_of = {name: os.path.join(directory, fname) for name, fname in weight_map.items()}
    elif os.path.exists(single_path):
      with opened(single_path) as f:
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
      self._open[path] = self._safe_open(path).__enter__()
    return self._open[path]

  def read(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Tensor `name`, or only its rows start:stop (read without the rest)."""
    if rows is None:
      return self._handle(name).get_tensor(name)
    return self._handle(name).get_slice(name)[rows[0]:rows[1]]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handle(name).get_slice(name).get_shape())

  def dtype(self, name: str) -> str:
    """The safetensors dtype name of tensor `name` ("BF16", "F32", ...)."""
    return self._handle(name).get_slice(name).get_dtype()

  def close(self):
    for handle in self._open.values():
      handle.__exit__(None, None, None)
    self._open.clear()


def _read_json(path: str) -> Any:
  """The JSON of `path`; a malformed file is a ValueError naming it and the line."""
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as error:  # its message names no file
      raise ValueError(f"{path}:{error.lineno}: not JSON ({error.msg}).") from None


def _read_config_json(directory: str) -> dict[str, Any]:
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist (not an HF checkpoint directory?).")
  return _read_json(path)


def read_hf_config(directory: str, **overrides) -> DecoderConfig:
  """DecoderConfig from `directory/config.json`; overrides set fields (dtype, remat...)."""
  return hf_config.config_from_hf(_read_config_json(directory), **overrides)


def _read_tensor(files: _CheckpointFiles, available: set[str], mapping: TensorMapping,
                 shape: tuple, directory: str, missing_head: str) -> np.ndarray:
  """One tensor of the checkpoint in our layout, checked against our `shape` (zeros for a
  missing scalar head with missing_head="zeros")."""
  if mapping.hf_name not in available:
    if mapping.path == ("scalar_head",) and missing_head == "zeros":
      return np.zeros(shape, np.float32)
    if all(mapping.hf_name + part in available for part in MXFP4_PARTS):
      return _read_mxfp4(files, mapping, shape, directory)
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


def _read_mxfp4(files: _CheckpointFiles, mapping: TensorMapping, shape: tuple,
                directory: str) -> np.ndarray:
  """An MXFP4 tensor (blocks [X, out, G, 16], scales [X, out, G]) dequantised to float32,
  [X, out, in] turned into the [X, in, out] of its bf16 form, in our layout."""
  blocks, scales = (files.read(mapping.hf_name + part) for part in MXFP4_PARTS)
  try:
    array = mapping.to_ours(np.swapaxes(dequantize_mxfp4(blocks, scales), -1, -2))
  except ValueError as error:
    raise ValueError(f"{directory}: MXFP4 tensor {mapping.hf_name!r} (blocks "
                     f"{blocks.shape}, scales {scales.shape}): {error}") from None
  if array.shape != shape:
    raise ValueError(f"{directory}: MXFP4 tensor {mapping.hf_name!r} has blocks "
                     f"{blocks.shape}; expected ones that map to {shape}.")
  return array


def _check_unexpected(directory: str, available: set[str], mappings: list[TensorMapping],
                      extra_head: bool) -> None:
  """Raises ValueError naming the checkpoint's tensors that no mapping reads.
  `extra_head`: an `lm_head.weight` is tolerated (tied embeddings: some exporters
  store the head anyway; a scalar head: a critic drops the LM head)."""
  used = {m.hf_name + part for m in mappings for part in ("",) + MXFP4_PARTS} | {"score.bias"}
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
  """Loads an HF checkpoint of one of `decoder_config.ARCHITECTURES` into our parameters.

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
    (model, params); `model.source` keeps what an export writes back (config.json's
    other keys, generation_config.json, the tensors' dtype: `hf_metadata`).
  Raises:
    ValueError naming the tensor on a missing tensor, a shape mismatch, or an
    unexpected tensor; FileNotFoundError for missing files.
  """
  if missing_head not in ("error", "zeros"):
    raise ValueError(f"missing_head={missing_head!r}; allowed: 'error', 'zeros'.")
  source_config = _read_config_json(directory)
  config = hf_config.config_from_hf(source_config, **config_overrides)
  model, abstract = init_model(config, head=head, abstract=True)
  files = _CheckpointFiles(directory)
  embed = "model.embed_tokens.weight"
  model = dataclasses.replace(model, source=hf_metadata.read_source(
      directory, source_config, files.dtype(embed) if embed in files.names() else ""))
  mappings = tensor_mappings(config, head)
  params = jax.tree.map(lambda _: None, abstract)
  try:
    available = files.names()
    # Arrays filled part by part (stacked layers, experts): [array, parts still to read].
    pending: dict[tuple, list] = {}
    for mapping in _load_order(mappings, config.scan_layers):
      path, index = _locate(mapping, config.scan_layers)
      target = _get(abstract, path)
      shape = target.shape[len(index):]
      array = _read_tensor(files, available, mapping, shape, directory, missing_head)
      array = array.astype(target.dtype, copy=False)
      if index:
        entry = pending.setdefault(path, [np.empty(target.shape, target.dtype),
                                          int(np.prod(target.shape[:len(index)]))])
        entry[0][index] = array
        entry[1] -= 1
        if entry[1]:
          continue
        array = pending.pop(path)[0]
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
    path, index = _locate(mapping, stacked)
    array = _get(params, path)
    array = array[index] if index else array
    array = mapping.to_hf(np.asarray(jax.device_get(array)))
    if mapping.interleave is not None:  # gpt-oss's gate_up: the parts' columns interleaved
      parts.append(array)
      if mapping.interleave[0] == mapping.interleave[1] - 1:
        yield mapping.hf_name, interleave_parts(parts)
        parts = []
      continue
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
                       dtype: str | None = None, token_ids: dict[str, Any] | None = None,
                       max_shard_bytes: int = 4 << 30) -> None:
  """Writes config.json, generation_config.json and safetensors that `transformers` loads.

  A model loaded by `load_hf_checkpoint` writes its source checkpoint back with our
  tensors: config.json key for key and generation_config.json as they were, the tensors in
  the source's dtype (`hf_metadata.export_config` lists what changes config.json: another
  `dtype`, a scalar head).

  Args:
    directory: output directory (created).
    model: the FunctionalModel (for the config, head and source checkpoint).
    params: the parameters.
    dtype: "float32", "bfloat16" or "float16" to store the tensors in; None: the
      source checkpoint's dtype, else the model's param_dtype.
    token_ids: bos/eos/pad token ids ({"eos_token_id": ...}) for a model without a
      source checkpoint (`save_policy` passes its tokenizer's); else null.
    max_shard_bytes: split into model-0000i-of-0000n.safetensors files with
      an index when the weights exceed this size.
  """
  from safetensors.numpy import save_file  # the `hf` extra

  os.makedirs(directory, exist_ok=True)
  dtype = hf_metadata.export_dtype(model, dtype)
  hf_metadata.write_metadata(directory, model, dtype, token_ids)

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
    array = array.astype(jnp.dtype(dtype), copy=False)
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
