"""A run from start to end (training/stages.py), up to the work: `run` and `warm_start` check
everything and stop with `validate_only`, write nothing, refuse to train a warm start over
one, and say what `--overwrite` removes and what it keeps; a supervised start's rows checked
first. (The stages themselves run in the launchers' end-to-end tests.)"""

from __future__ import annotations

import json

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import stages
from rlhf_jax.training.config import sibling_preset
from tests.training.runs import preset


def test_validate_only_checks_and_writes_nothing(tmp_path):
  lines = []
  assert stages.run(preset("grpo"), str(tmp_path / "run"), validate_only=True,
                    log=lines.append) is None
  assert lines == ["config ok"] and not (tmp_path / "run").exists()
  assert stages.warm_start(preset("grpo"), str(tmp_path / "sft_run"), validate_only=True) is None
  assert not (tmp_path / "sft_run").exists()


def chats(path, *lines):
  """A JSONL file of one conversation per line (and any raw `lines` after them)."""
  path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": "hello"}]}) + "\n"
                  + "".join(line + "\n" for line in lines))
  return str(path)


def test_a_supervised_warm_start_is_not_trained_over_one(tmp_path):
  c = sibling_preset("configs/sft.py", "sft", "hf")
  c.sft.train_file = chats(tmp_path / "chats.jsonl")
  (tmp_path / "sft").mkdir()
  with pytest.raises(ConfigError, match=rf"^--workdir: {tmp_path}/sft exists; pass --overwrite"):
    stages.warm_start(c, str(tmp_path))


def test_overwrite_removes_what_the_run_wrote_and_keeps_the_given_paths(tmp_path):
  c = preset("dpo")  # a built-in task's run: its warm start and its labelled samples
  assert stages._warm_start_outputs(c) == ("sft", "offline.jsonl")  # pylint: disable=protected-access
  data = tmp_path / "pairs.jsonl"
  data.write_text("")
  c.model.checkpoint, c.data.offline_file = str(tmp_path), str(data)
  assert stages._warm_start_outputs(c) == ()  # pylint: disable=protected-access
  paths = stages._config_paths(c)  # pylint: disable=protected-access
  assert paths["model.checkpoint"] == str(tmp_path) and paths["data.offline_file"] == str(data)
  assert all(isinstance(v, str) for v in paths.values())
  c.data.task = ""  # one's own data: the sft/ is launch/sft.py's, and it stays
  assert stages._warm_start_outputs(c) == ()  # pylint: disable=protected-access


def test_supervised_rows_are_checked_before_anything_is_tokenised(tmp_path):
  c = sibling_preset("configs/sft.py", "sft", "hf")
  rows = chats(tmp_path / "chats.jsonl", "{not json")
  c.sft.train_file = rows
  with pytest.raises(ConfigError, match=rf"^config\.sft\.train_file: {rows}:2"):
    stages.supervised_inputs(c)
  c.sft.train_file = chats(tmp_path / "good.jsonl")
  assert [where for where, _ in stages.supervised_inputs(c)] == [f"{tmp_path}/good.jsonl:1"]
  assert stages.sampler_positions(c) > 0
