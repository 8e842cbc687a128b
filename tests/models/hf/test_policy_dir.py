"""models/hf/policy_dir.py: a policy directory holds an HF checkpoint, its tokenizer and
its prompt format. What `save_policy` writes (the files, the prefix tokens, the dtype of
the tensors) and what `load_prompt_prefix` reads back: the ids the saved tokenizer.json
gives the prefix tokens, [] without a prompt format, and a token the tokenizer lacks named
with the file."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models.hf.policy_dir import PROMPT_FORMAT_FILE
from rlhf_jax.tasks import arith

PREFIX = ["<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """(directory, tokenizer, model, params): a 1-layer arith policy saved with PREFIX."""
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=64), seed=0)
  directory = tmp_path_factory.mktemp("policy")
  models.save_policy(str(directory), model, params, tokenizer, PREFIX)
  return directory, tokenizer, model, params


def vocabulary(directory: pathlib.Path) -> dict[str, int]:
  """Token → id as the saved tokenizer.json lists them (its model's and added tokens)."""
  tokenizer = json.loads((directory / "tokenizer.json").read_text())
  ids = dict(tokenizer["model"]["vocab"])
  ids.update({t["content"]: t["id"] for t in tokenizer["added_tokens"]})
  return ids


def test_the_directory_holds_checkpoint_tokenizer_and_prompt_format(policy):
  directory, _, model, params = policy
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          PROMPT_FORMAT_FILE} <= {p.name for p in directory.iterdir()}
  assert json.loads((directory / PROMPT_FORMAT_FILE).read_text()) == {"prefix_tokens": PREFIX}
  loaded, loaded_params = models.load_hf_checkpoint(str(directory))
  assert loaded.config == model.config
  jax.tree.map(np.testing.assert_array_equal, loaded_params, params)


def test_the_prefix_reads_back_as_the_saved_tokenizers_ids(policy):
  directory, _, _, _ = policy
  reloaded = models.Tokenizer.from_directory(str(directory))
  ids = vocabulary(directory)
  assert models.load_prompt_prefix(str(directory), reloaded) == [ids[t] for t in PREFIX]


def test_without_a_prompt_format_the_prefix_is_empty(policy, tmp_path):
  _, tokenizer, model, params = policy
  models.save_hf_checkpoint(str(tmp_path), model, params)
  assert models.load_prompt_prefix(str(tmp_path), tokenizer) == []


def test_a_prefix_token_the_tokenizer_lacks_is_named_with_the_file(policy, tmp_path):
  _, tokenizer, model, params = policy
  models.save_policy(str(tmp_path), model, params, tokenizer, ["<|im_start|>", "<|nope|>"])
  path = tmp_path / PROMPT_FORMAT_FILE
  with pytest.raises(ValueError, match=rf"^{path}: prefix tokens .*'<\|nope\|>'.* are not "
                     "all in the tokenizer"):
    models.load_prompt_prefix(str(tmp_path), tokenizer)


def test_the_tensors_are_stored_in_the_dtype_asked_for(policy, tmp_path):
  _, tokenizer, model, params = policy
  models.save_policy(str(tmp_path), model, params, tokenizer, PREFIX, dtype="bfloat16")
  raw = (tmp_path / "model.safetensors").read_bytes()  # the header, read by hand
  length = int.from_bytes(raw[:8], "little")
  entries = json.loads(raw[8:8 + length])
  assert {e["dtype"] for name, e in entries.items() if name != "__metadata__"} == {"BF16"}
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
