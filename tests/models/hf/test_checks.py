"""A checkpoint's config.json, safetensors headers and tokenizer are checked against sane
bounds and against each other before anything is built (checkpoint_checks.check_checkpoint_dir):
each bad one is a one-line ConfigError naming the file and the key or tensor, in well
under a second, where it spun, allocated or gave a traceback before."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import time

import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models.hf.checks import check_checkpoint_dir
from rlhf_jax.models.hf.checks import safetensors_shapes

WHERE = "config.model.checkpoint"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> pathlib.Path:
  """A 1-layer policy of the arith task, saved as an HF checkpoint."""
  from rlhf_jax import models
  from rlhf_jax.tasks import arith
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=128), seed=0)
  directory = tmp_path_factory.mktemp("bounds") / "ckpt"
  models.save_policy(str(directory), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  return directory


@pytest.fixture
def copy(checkpoint, tmp_path) -> pathlib.Path:
  target = tmp_path / "ckpt"
  shutil.copytree(checkpoint, target)
  return target


def refused(directory: pathlib.Path, match: str) -> str:
  """The one-line error of check_checkpoint_dir, checked to match and to come quickly."""
  start = time.thread_time()  # this thread's CPU seconds: other processes' load adds none
  with pytest.raises(ConfigError, match=match) as error:
    check_checkpoint_dir(str(directory), WHERE)
  assert time.thread_time() - start < 5
  message = str(error.value)
  assert message.startswith(f"{WHERE}: ") and "\n" not in message
  assert error.value.field == "model.checkpoint"  # the field it names, for callers to read
  return message


def edit_config(directory: pathlib.Path, **changes) -> None:
  path = directory / "config.json"
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(json.dumps(config))  # NaN / Infinity as Python's json writes them


def write_raw_safetensors(path: pathlib.Path, header: dict, data: bytes) -> None:
  """A safetensors file with exactly this header (no check of ours or the library's)."""
  text = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_the_good_checkpoint_passes(checkpoint):
  check_checkpoint_dir(str(checkpoint), WHERE)


@pytest.mark.parametrize("key,value,match", [
    ("num_hidden_layers", 10_000_000, "num_hidden_layers=10000000 must be an integer in 1..1024"),
    ("hidden_size", -16, "hidden_size=-16 must be an integer"),
    ("vocab_size", 2.5, "vocab_size=2.5 must be an integer"),
    ("rope_theta", float("nan"), "rope_theta=nan must be finite"),
    ("rms_norm_eps", float("inf"), "rms_norm_eps=inf must be finite"),
    ("rope_theta", 0, "rope_theta=0 must be a number > 0"),
    ("num_key_value_heads", 3, "num_key_value_heads=3 must divide num_attention_heads=2"),
])
def test_config_json_out_of_bounds_is_one_line(copy, key, value, match):
  edit_config(copy, **{key: value})
  refused(copy, match)


def test_a_non_finite_number_anywhere_in_config_json_is_named(copy):
  edit_config(copy, rope_scaling={"rope_type": "default", "factor": float("-inf")})
  refused(copy, r"rope_scaling.factor=-inf must be finite")


def test_deeply_nested_config_json_is_one_line(copy):
  (copy / "config.json").write_text("[" * 100_000 + "]" * 100_000)
  refused(copy, "config.json: JSON nested too deeply")


def test_the_config_must_fit_the_tensors(copy):
  edit_config(copy, hidden_size=32, head_dim=16)
  refused(copy, "config.json does not fit tensor 'model.embed_tokens.weight' of shape")
  # config.json lists a type per layer (layer_types): it says 3 layers throughout.
  edit_config(copy, hidden_size=16, head_dim=8, num_hidden_layers=3,
              layer_types=["full_attention"] * 3)
  refused(copy, r"num_hidden_layers=3, but the safetensors hold layers 0..0 \(1 of them\)")
  edit_config(copy, num_hidden_layers=1, layer_types=["full_attention"], intermediate_size=50)
  refused(copy, "config.json does not fit tensor 'model.layers.0.mlp.gate_proj.weight'")


def test_a_tokenizer_larger_than_the_embedding_is_refused(copy):
  path = copy / "tokenizer.json"
  tokenizer = json.loads(path.read_text())
  rows = json.loads((copy / "config.json").read_text())["vocab_size"]
  tokenizer["added_tokens"].append({"id": rows + 2_000_000, "content": "<|extra|>",
                                    "single_word": False, "lstrip": False, "rstrip": False,
                                    "normalized": False, "special": True})
  path.write_text(json.dumps(tokenizer))
  refused(copy, f"has {rows + 2_000_001} token ids, more than the {rows} rows of the "
                "model's embedding")


def tensor(dtype="F32", shape=(2, 2), offsets=(0, 16)):
  return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize("header,data,match", [
    ({"a": tensor(shape=(2, -2))}, 16, "tensor 'a' of the safetensors header has no sound"),
    ({"a": tensor(shape=(1 << 40, 1 << 40))}, 16,
     r"tensor 'a' of shape .* needs \d+ bytes; its data_offsets give 16"),
    ({"a": tensor(dtype="F128")}, 16, "tensor 'a' has dtype 'F128'; known: BOOL"),
    ({"a": tensor(dtype=["F32"])}, 16, "tensor 'a' of the safetensors header has no sound"),
    ({"a": tensor(offsets=(16, 0))}, 16, "tensor 'a' of the safetensors header has no sound"),
    ({"a": tensor(), "b": tensor(offsets=(8, 24))}, 24, "tensor 'b' starts at byte 8 of the "
                                                        "data, not 16"),
    ({"a": tensor(offsets=(8, 24))}, 24, "tensor 'a' starts at byte 8 of the data, not 0"),
    ({"a": tensor(shape=(True, 4))}, 16, "tensor 'a' of the safetensors header has no sound"),
])
def test_a_forged_safetensors_header_is_one_line(tmp_path, header, data, match):
  path = tmp_path / "model.safetensors"
  write_raw_safetensors(path, header, bytes(data))
  with pytest.raises(ConfigError, match=f"^x: {path}: {match}"):
    safetensors_shapes(str(path), "x")


def test_a_sound_header_gives_the_shapes_the_library_reads(tmp_path):
  from safetensors.numpy import save_file
  from safetensors import safe_open
  path = tmp_path / "model.safetensors"
  save_file({"a": np.zeros((3, 4), np.float32), "b": np.ones(5, np.int8),
             "c": np.zeros((0, 7), np.float16)}, str(path))
  with safe_open(str(path), "numpy") as f:
    expected = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
  assert safetensors_shapes(str(path), "x") == expected


def test_deeply_nested_safetensors_header_is_one_line(tmp_path):
  path = tmp_path / "model.safetensors"
  text = b"[" * 50_000 + b"]" * 50_000
  path.write_bytes(struct.pack("<Q", len(text)) + text)
  with pytest.raises(ConfigError, match="the safetensors header is not a JSON object"):
    safetensors_shapes(str(path), "x")


def set_pre_tokenizer_regex(directory: pathlib.Path, pattern: str) -> None:
  path = directory / "tokenizer.json"
  tokenizer = json.loads(path.read_text())
  tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
      tokenizer["pre_tokenizer"]]}
  path.write_text(json.dumps(tokenizer))


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(\w+\s?)+$", r"(\p{L}+)*\d"])
def test_a_pre_tokenizer_regex_that_backtracks_without_end_is_refused(copy, pattern):
  set_pre_tokenizer_regex(copy, pattern)
  message = refused(copy, "tokenizer.json: (the pre-tokenizer regex .* fails on|a pre-"
                          "tokenizer regex .* did not finish)")
  assert "panicked" not in message and len(message) < 400


@pytest.mark.parametrize("where, field", [
    ("config.reward.rm.checkpoint", "reward.rm.checkpoint"),
    ("config.model.checkpoint (<workdir>/sft)", "model.checkpoint"),
    ("--checkpoint=DIR", None),  # a launcher's flag is no config field
])
def test_each_refusal_carries_the_field_its_where_names(tmp_path, where, field):
  (tmp_path / "config.json").write_text("[1]")  # JSON, but not an object
  with pytest.raises(ConfigError) as error:
    check_checkpoint_dir(str(tmp_path), where)
  assert str(error.value) == f"{where}: {tmp_path / 'config.json'} is not a JSON object"
  assert error.value.field == field
  with pytest.raises(ConfigError) as error:
    check_checkpoint_dir(str(tmp_path / "absent"), where)
  assert error.value.field == field


def test_a_sound_regex_of_ones_own_passes_the_probe(copy):
  # Qwen2's pattern with one change (so not a known one): probed, and it finishes
  set_pre_tokenizer_regex(copy, r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,2}|\s+(?!\S)|\s+")
  check_checkpoint_dir(str(copy), WHERE)


@pytest.mark.slow
def test_every_family_saved_by_transformers_fits_its_config(tmp_path):
  """The header check reads each family's real layout (fused Phi-3 projections, OLMo 2's
  projection norms, Gemma's four norms, tied and untied heads) as the loader does: a
  transformers checkpoint passes, and one layer's tensor of another width is named."""
  from tests.models.hf_fixtures import FAMILIES
  from tests.models.hf_fixtures import save_family_model
  for family in FAMILIES:
    directory = tmp_path / family
    save_family_model(directory, family)
    check_checkpoint_dir(str(directory), WHERE, tokenizer=False)
  config = json.loads((tmp_path / "phi3" / "config.json").read_text())
  config["intermediate_size"] = 96
  (tmp_path / "phi3" / "config.json").write_text(json.dumps(config))
  with pytest.raises(ConfigError, match="'model.layers.0.mlp.gate_up_proj.weight' of shape "
                                        r"\(160, 48\): the config gives it 192 rows"):
    check_checkpoint_dir(str(tmp_path / "phi3"), WHERE, tokenizer=False)
