"""The run's inputs checked before any work (training/inputs.py): generated problems of a
built-in task, a data file's rows each with a task some scorer scores (the config's reward,
or a scorer handed to the trainer), a checkpoint's config.json of a family that loads, the
expert mesh axis against its experts; each error one line naming the field and the row.
(Other libraries' layouts: tests/data/test_layouts.py.)"""

from __future__ import annotations

import json

import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import inputs
from rlhf_jax.training.config import base_config
from tests.fakes import FakeScorer


def rows_file(tmp_path, *tasks):
  """A JSONL file of one row per task."""
  path = tmp_path / "rows.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "1", "task": task}) + "\n"
                          for i, task in enumerate(tasks)))
  return str(path)


def test_a_built_in_task_generates_its_problems():
  c = base_config("arith")
  c.data.num_train, c.data.num_eval = 5, 3
  train, held_out = inputs.load_examples(c)
  assert len(train) == 5 and len(held_out) == 3
  assert {e.task for e in train + held_out} == {"arith"}
  assert [e.prompt for e in held_out] != [e.prompt for e in train[:3]]  # other seeds
  assert inputs.load_examples(c) == (train, held_out)  # seeded by config.seed


def test_every_row_needs_a_scorer_for_its_task(tmp_path):
  c = base_config("arith")
  c.data.train_file = rows_file(tmp_path, "arith", "poetry")
  with pytest.raises(ConfigError, match=r"^config\.data\.train_file: .*rows\.jsonl:2: no scorer "
                                        r"for task 'poetry' \(known: .*arith") as error:
    inputs.load_examples(c)
  assert error.value.field == "data.train_file" and "\n" not in str(error.value)
  c.reward.function = "tests.rewards.reward_fns:solution_match"  # scores any task
  train, _ = inputs.load_examples(c)
  assert [e.task for e in train] == ["arith", "poetry"]


def test_a_scorer_handed_to_the_trainer_decides_the_tasks(tmp_path):
  c = base_config("arith")
  c.data.train_file = rows_file(tmp_path, "mine", "mine", "theirs")
  with pytest.raises(ConfigError, match=r"rows\.jsonl:3: the scorer handed to the trainer "
                                        r"refuses task 'theirs': no scorer for task 'theirs'"):
    inputs.load_examples(c, scorer=FakeScorer(tasks=["mine", "arith"]))
  train, held_out = inputs.load_examples(c, scorer=FakeScorer(tasks=["mine", "theirs", "arith"]))
  assert {e.task for e in held_out} == {"arith"}  # the generated held-out problems
  assert len(train) == 3


def test_a_checkpoint_family_is_checked_from_its_config_json(tmp_path):
  inputs.check_checkpoint_family(str(tmp_path))  # no config.json: nothing to check
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ConfigError, match=r"^config\.model\.checkpoint: .*config\.json is not "
                                        r"JSON"):
    inputs.check_checkpoint_family(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_family"}))
  with pytest.raises(ConfigError, match=rf"^config\.model\.checkpoint: {tmp_path}: "):
    inputs.check_checkpoint_family(str(tmp_path))


def test_the_expert_axis_is_checked_against_the_policy_before_any_work(tmp_path):
  c = base_config("arith")  # a built-in task: its warm start is a dense model
  c.mesh.expert = 2
  with pytest.raises(ConfigError, match=r"^config\.mesh\.expert: invalid value 2: must be 1 "
                                        r"for a dense model"):
    inputs.check_data(c, str(tmp_path / "run"))
  c = base_config("hf")  # a Qwen3-MoE checkpoint of 4 experts
  model, params = models.init_model(models.DecoderConfig(
      vocab_size=32, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
      intermediate_size=8, architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
      num_experts=4, experts_per_token=2, expert_intermediate_size=4), seed=0)
  models.save_hf_checkpoint(str(tmp_path / "moe"), model, params)
  models.build_character_tokenizer("abc").save(str(tmp_path / "moe"))
  c.model.checkpoint = str(tmp_path / "moe")
  c.mesh.expert = 3
  with pytest.raises(ConfigError, match=r"^config\.mesh\.expert: invalid value 3: must divide "
                                        r"the model's 4 experts"):
    inputs.check_data(c, str(tmp_path / "run"))
