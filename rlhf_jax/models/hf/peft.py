"""HF PEFT LoRA adapters: `adapter_config.json` + `adapter_model.safetensors`.

The files `peft.PeftModel.from_pretrained(base, directory)` loads and
`PeftModel.save_pretrained` writes, for our `rlhf_jax.models.lora` adapters:

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]
    base_model.model.model.layers.{i}.mlp.gate_proj.lora_A.weight      ...
    base_model.model.score.weight                (a `modules_to_save` value head)

torch `Linear` layout: lora_A = our Aᵀ, lora_B = our Bᵀ, so PEFT's
ΔW = scale·B_peft@A_peft is our (scale·A@B)ᵀ, exactly as `hf.checkpoint` stores W.
Only plain LoRA is read: rsLoRA, DoRA, rank / alpha patterns, bias training,
fan_in_fan_out and layers_to_transform are refused with an error naming the key.
Needs the `hf` extra (safetensors).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.models import lora as lora_lib
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import Params
from rlhf_jax.models.hf import tensors as hf_tensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear layer but the output head
# adapter_config.json keys written with these values (plain LoRA) ...
_WRITTEN = {"use_rslora": False, "use_dora": False, "bias": "none", "fan_in_fan_out": False,
            "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
            "layers_pattern": None}
# ... and, with newer PEFT keys, the values a readable adapter must hold (absent is fine).
_PLAIN = {**_WRITTEN, "lora_bias": False, "target_parameters": None,
          "trainable_token_indices": None, "exclude_modules": None}
_TASK = {"lm": "CAUSAL_LM", "scalar": "SEQ_CLS"}


def _module_names(model: FunctionalModel) -> dict[tuple, tuple[str, Any, Any]]:
  """Our parameter path → (HF tensor name, to_ours, to_hf), from the `hf.tensors` table."""
  mappings = hf_tensors.tensor_mappings(model.config, model.head)
  if any(m.rows is not None for m in mappings):
    # A LoRA of HF's fused qkv_proj / gate_up_proj is not one per split projection.
    raise ValueError(f"PEFT adapters of architecture={model.config.architecture!r} are not "
                     "supported yet: its checkpoints fuse q/k/v and gate/up projections.")
  if any(m.expert is not None for m in mappings):
    raise ValueError(f"PEFT adapters of architecture={model.config.architecture!r} are not "
                     "supported yet: its experts are stacked projections.")
  table = {m.path: (m.hf_name, m.to_ours, m.to_hf) for m in mappings}
  if model.head == "scalar":
    table[("scalar_bias",)] = ("score.bias", lambda b: b.reshape(()), lambda b: b.reshape(1))
  return table


def _per_layer(path: tuple, lead: tuple[int, ...]) -> list[tuple[tuple, tuple]]:
  """[(per-layer path, index into the leading axes)]: the path itself for a per-layer
  dict; one path per layer (index inserted after "layers") for a stacked [L] kernel."""
  if not lead:
    return [(path, ())]
  if len(lead) != 1 or "layers" not in path:
    raise ValueError(f"adapter {'/'.join(map(str, path))}: leading axes {lead} are not "
                     "one stacked layer axis.")
  at = path.index("layers") + 1
  return [(path[:at] + (i,) + path[at:], (i,)) for i in range(lead[0])]


def _lora_tensors(model, path, entry) -> Iterator[tuple[str, str, tuple]]:
  """(PEFT name of lora_A, of lora_B, index into the leading axes) per layer of one
  adapter."""
  table = _module_names(model)
  lead = entry[lora_lib.LORA_A].shape[:-2]
  for layer_path, index in _per_layer(path, lead):
    if layer_path not in table:
      raise ValueError(f"adapter {'/'.join(map(str, layer_path))} has no HF name.")
    module = PREFIX + table[layer_path][0].removesuffix(".weight")
    yield module + ".lora_A.weight", module + ".lora_B.weight", index


def peft_tensors(model: FunctionalModel, adapters: Params) -> dict[str, np.ndarray]:
  """{PEFT tensor name: float32 host array in torch layout} for an adapter tree.

  Args:
    model: the base FunctionalModel (config and head).
    adapters: from `lora.init_adapters` / training.
  Returns:
    lora_A [r, in] and lora_B [out, r] per adapted kernel and layer, and each
    `modules_to_save` parameter under its HF name.
  """
  out = {}
  table = _module_names(model)
  for path, entry in lora_lib.adapter_entries(adapters):
    if not isinstance(entry, dict):
      if path not in table:
        raise ValueError(f"modules_to_save parameter {'/'.join(map(str, path))} has no HF "
                         "name.")
      out[PREFIX + table[path][0]] = np.ascontiguousarray(
          table[path][2](np.asarray(jax.device_get(entry), np.float32)))
      continue
    a = np.asarray(jax.device_get(entry[lora_lib.LORA_A]), np.float32)
    b = np.asarray(jax.device_get(entry[lora_lib.LORA_B]), np.float32)
    for name_a, name_b, index in _lora_tensors(model, path, entry):
      out[name_a] = np.ascontiguousarray(a[index].T)
      out[name_b] = np.ascontiguousarray(b[index].T)
  return out


def peft_config(model: FunctionalModel, lora: lora_lib.LoraConfig,
                base_model_name_or_path: str | None = None) -> dict[str, Any]:
  """The `adapter_config.json` dict of a plain LoRA adapter for `model`."""
  table = _module_names(model)
  saved = sorted({table[(name,)][0].rsplit(".", 1)[0].rsplit(".", 1)[-1]
                  for name in lora.modules_to_save if (name,) in table})
  return {"peft_type": "LORA", "task_type": _TASK[model.head], "r": lora.rank,
          "lora_alpha": lora.alpha, "target_modules": sorted(lora.targets),
          "lora_dropout": 0.0, "modules_to_save": saved or None,
          "base_model_name_or_path": base_model_name_or_path, "inference_mode": True,
          "init_lora_weights": True, **_WRITTEN}


def save_peft_adapter(directory: str, model: FunctionalModel, adapters: Params,
                      lora: lora_lib.LoraConfig, *,
                      base_model_name_or_path: str | None = None) -> None:
  """Writes `adapter_config.json` and `adapter_model.safetensors` (float32) that
  `peft.PeftModel.from_pretrained(base, directory)` loads.

  Args:
    directory: output directory (created).
    model: the base FunctionalModel (config and head).
    adapters: the adapter tree.
    lora: its LoraConfig.
    base_model_name_or_path: recorded in the config (optional).
  """
  from safetensors.numpy import save_file  # the `hf` extra

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(peft_config(model, lora, base_model_name_or_path), f, indent=2, sort_keys=True)
  save_file(peft_tensors(model, adapters), os.path.join(directory, WEIGHTS_FILE),
            metadata={"format": "pt"})


def lora_config_from_peft(config: dict[str, Any], head: str = "lm") -> lora_lib.LoraConfig:
  """A LoraConfig from a parsed `adapter_config.json`.

  Raises:
    ValueError: naming the key when the adapter is not plain LoRA on our
      projections (peft_type, use_rslora, use_dora, bias, rank_pattern, ...).
  """
  if config.get("peft_type") != "LORA":
    raise ValueError(f"{CONFIG_FILE}: peft_type={config.get('peft_type')!r} is not "
                     "supported; only 'LORA'.")
  for key, plain in _PLAIN.items():
    value = config.get(key, plain)
    if value != plain and not (value in (None, {}, []) and plain in (None, {})):
      raise ValueError(f"{CONFIG_FILE}: {key}={value!r} is not supported (plain LoRA needs "
                       f"{plain!r}).")
  targets = config.get("target_modules")
  if targets == ALL_LINEAR:
    targets = list(lora_lib.PROJECTIONS)
  if not isinstance(targets, (list, tuple)):
    raise ValueError(f"{CONFIG_FILE}: target_modules={targets!r} is not supported; list "
                     f"projection names ({', '.join(lora_lib.PROJECTIONS)}).")
  for name in targets:
    if name not in lora_lib.PROJECTIONS:
      raise ValueError(f"{CONFIG_FILE}: target_modules entry {name!r} is not supported; "
                       f"supported: {', '.join(lora_lib.PROJECTIONS)}.")
  saved = {"score": ("scalar_head",), "lm_head": ("lm_head",),
           "embed_tokens": ("embed",)}
  modules = []
  for name in config.get("modules_to_save") or ():
    if name not in saved or (name == "score") != (head == "scalar"):
      raise ValueError(f"{CONFIG_FILE}: modules_to_save entry {name!r} is not supported "
                       f"for a {head!r} head.")
    modules += saved[name]
  return lora_lib.LoraConfig(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                             targets=tuple(sorted(targets)), modules_to_save=tuple(modules))


def _read(tensors: dict, name: str, shape: tuple, directory: str) -> np.ndarray:
  if name not in tensors:
    raise ValueError(f"{directory}: tensor {name!r} is missing from {WEIGHTS_FILE}.")
  value = tensors.pop(name)
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"{directory}: tensor {name!r} has shape {tuple(value.shape)}; "
                     f"expected {tuple(shape)} (rank or model mismatch).")
  return value.astype(np.float32)


def load_peft_adapter(directory: str, model: FunctionalModel
                      ) -> tuple[lora_lib.LoraConfig, Params]:
  """Reads a PEFT LoRA adapter for `model` (our parameter layout, per-layer or stacked).

  Args:
    directory: holds adapter_config.json and adapter_model.safetensors.
    model: the base FunctionalModel the adapter was trained on.
  Returns:
    (lora config, float32 adapter tree) for `lora.merge` / `LoraModel`.
  Raises:
    ValueError naming the key or tensor on an unsupported config, a missing or
    unexpected tensor, or a shape (rank) mismatch; FileNotFoundError.
  """
  from safetensors.numpy import load_file  # the `hf` extra

  for name in (CONFIG_FILE, WEIGHTS_FILE):
    if not os.path.exists(os.path.join(directory, name)):
      raise FileNotFoundError(f"{os.path.join(directory, name)} does not exist.")
  with open(os.path.join(directory, CONFIG_FILE)) as f:
    lora = lora_config_from_peft(json.load(f), model.head)
  tensors = load_file(os.path.join(directory, WEIGHTS_FILE))
  if "scalar_head" in lora.modules_to_save and PREFIX + "score.bias" in tensors:
    # HF's score layer has no bias; ours (scalar_bias) travels with it when trained.
    lora = dataclasses.replace(lora, modules_to_save=lora.modules_to_save + ("scalar_bias",))
  abstract = jax.eval_shape(lambda p: lora_lib.init_adapters(model.config, p, lora),
                            model.abstract_params())
  table = _module_names(model)
  adapters: dict = {}
  for path, entry in lora_lib.adapter_entries(abstract):
    if not isinstance(entry, dict):
      raw = _read(tensors, PREFIX + table[path][0],
                  table[path][2](np.zeros(entry.shape, np.float32)).shape, directory)
      lora_lib.set_in(adapters, path, table[path][1](raw))
      continue
    a = np.zeros(entry[lora_lib.LORA_A].shape, np.float32)
    b = np.zeros(entry[lora_lib.LORA_B].shape, np.float32)
    for name_a, name_b, index in _lora_tensors(model, path, entry):
      a[index] = _read(tensors, name_a, a.shape[-2:][::-1], directory).T
      b[index] = _read(tensors, name_b, b.shape[-2:][::-1], directory).T
    lora_lib.set_in(adapters, path, {lora_lib.LORA_A: a, lora_lib.LORA_B: b})
  if tensors:
    raise ValueError(f"{directory}: unexpected tensors {sorted(tensors)[:5]} "
                     f"({len(tensors)} in all); the adapter does not match the model.")
  return lora, jax.tree.map(jnp.asarray, adapters)
