"""What an HF checkpoint holds besides the tensors we model: its config.json keys (token
ids, dtype, the keys transformers keeps), its generation_config.json and its tensors'
dtype. `load_hf_checkpoint` keeps them on the model (`FunctionalModel.source`) so that an
export writes the checkpoint back as it came, config.json key for key, with our tensors.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from rlhf_jax.models.decoder_config import ARCHITECTURES
from rlhf_jax.models.decoder_config import DTYPES
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.hf import config as hf_config

GENERATION_CONFIG_FILE = "generation_config.json"
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
# safetensors dtype names → ours (others, e.g. FP8, export as the model's param_dtype).
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointSource:
  """The parts of a loaded HF checkpoint that an export carries over.

  Attributes:
    config: the parsed config.json, as read.
    generation_config: the parsed generation_config.json, or None (the checkpoint has none).
    dtype: the dtype its tensors are stored in ("bfloat16", ...), or None when not one of
      `decoder_config.DTYPES`.
  """
  config: Mapping[str, Any]
  generation_config: Mapping[str, Any] | None
  dtype: str | None


def read_json(path: str) -> dict[str, Any] | None:
  """The parsed JSON file at `path`, or None when there is none."""
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def read_source(directory: str, config: Mapping[str, Any], tensor_dtype: str
                ) -> CheckpointSource:
  """The CheckpointSource of `directory`, given its parsed config.json and the
  safetensors dtype name of its tensors ("BF16", ...)."""
  generation = read_json(os.path.join(directory, GENERATION_CONFIG_FILE))
  return CheckpointSource(config=dict(config), generation_config=generation,
                          dtype=SAFETENSORS_DTYPES.get(tensor_dtype))


def tokenizer_ids(tokenizer, vocab_size: int) -> dict[str, int | None]:
  """bos/eos/pad token ids of a `models.Tokenizer` (None when it has no BOS, or an id lies
  outside the model's vocabulary, which transformers refuses)."""
  bos = None if tokenizer.bos_token is None else tokenizer.backend.token_to_id(
      tokenizer.bos_token)
  ids = {"bos_token_id": bos, "eos_token_id": tokenizer.eos_id,
         "pad_token_id": tokenizer.pad_id}
  return {key: i if i is not None and i < vocab_size else None for key, i in ids.items()}


def export_dtype(model, dtype: str | None) -> str:
  """The dtype an export stores tensors in: `dtype` when given, else the source
  checkpoint's, else the model's param_dtype."""
  if dtype is not None:
    if dtype not in DTYPES:
      raise ValueError(f"save_hf_checkpoint: dtype={dtype!r}; allowed: "
                       f"{', '.join(DTYPES)}.")
    return dtype
  source = _same_family_source(model)
  if source is not None and source.dtype is not None:
    return source.dtype
  return model.config.param_dtype


def _same_family_source(model) -> CheckpointSource | None:
  """The model's source checkpoint when it is of the model's architecture (its keys
  then belong to the config we write), else None."""
  source = getattr(model, "source", None)
  if source is None:
    return None
  try:
    architecture = hf_config.architecture_from_hf(source.config)
  except ValueError:
    return None
  return source if architecture == model.config.architecture else None


def export_config(model, dtype: str, token_ids: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
  """The config.json of an export. A model that is still its source checkpoint's
  architecture (`describes`: training changes weights, not shapes) writes the source's
  config.json back as it was, every key and value (`max_window_layers`, keys of newer
  transformers, keys of the authors' own), with two exceptions that change what the file
  says: the dtype keys it has (`torch_dtype`, `dtype`) name the export `dtype` when the
  tensors are stored in another dtype than the source's, and a scalar head is written as
  *ForSequenceClassification. A model whose config differs from its source's gets the
  source's keys with ours over them (shapes, RoPE, windows: `config_to_hf`); one without a
  source gets ours and `token_ids` (or null: transformers' family defaults can lie
  outside a small vocabulary)."""
  source = _same_family_source(model)
  if source is not None and describes(source, model.config):
    written = dict(source.config)
    if dtype != source.dtype:
      written.update({key: dtype for key in ("torch_dtype", "dtype") if key in written})
  else:
    written = {} if source is None else dict(source.config)
    written.update(hf_config.config_to_hf(model.config))
    if source is None:
      written.update({key: (token_ids or {}).get(key) for key in TOKEN_KEYS})
    written["dtype"] = written["torch_dtype"] = dtype
  # Tensors are written bf16/float32, never MXFP4 (gpt-oss's published experts): the
  # source's quantisation no longer describes them.
  written.pop("quantization_config", None)
  if model.head == "scalar":  # transformers rebuilds the labels from num_labels
    written.pop("id2label", None)
    written.pop("label2id", None)
    base = ARCHITECTURES[model.config.architecture].replace("ForCausalLM", "")
    written["architectures"] = [base + "ForSequenceClassification"]
    written["num_labels"] = 1
  return written


def describes(source: CheckpointSource, config: DecoderConfig) -> bool:
  """Whether the source's config.json describes the model of `config`: both written as
  `config_to_hf` writes a model (every key that shapes the parameters or the forward), the
  parameter dtype aside (an export names its own)."""
  try:
    theirs = hf_config.config_to_hf(hf_config.config_from_hf(source.config))
  except ValueError:
    return False
  ours = hf_config.config_to_hf(config)
  for written in (theirs, ours):
    written.pop("torch_dtype", None)
    written.pop("dtype", None)
  return theirs == ours


def export_generation_config(model, written: Mapping[str, Any]) -> dict[str, Any] | None:
  """generation_config.json of an export: the source's when it had one, else the token
  ids of the written config.json (eos a list where it is one); None when there are none."""
  source = _same_family_source(model)
  if source is not None and source.generation_config is not None:
    return dict(source.generation_config)
  ids = {key: written[key] for key in TOKEN_KEYS if written.get(key) is not None}
  return ids or None


def write_metadata(directory: str, model, dtype: str,
                   token_ids: Mapping[str, Any] | None = None) -> None:
  """Writes config.json and generation_config.json (or removes a stale one)."""
  written = export_config(model, dtype, token_ids)
  _write_json(os.path.join(directory, "config.json"), written)
  generation = export_generation_config(model, written)
  path = os.path.join(directory, GENERATION_CONFIG_FILE)
  if generation is not None:
    _write_json(path, generation)
  elif os.path.exists(path):
    os.remove(path)


def _write_json(path: str, value: Mapping[str, Any]) -> None:
  # transformers' own layout, so a file it wrote comes back byte for byte.
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
