"""The built-in tasks' records carry what the trainer reads of them (tasks/registry.py):
prompt prefix, levels, model shape, run rules, warm start and its check, reward data."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import arith_rewards
from rlhf_jax.tasks import get_task
from rlhf_jax.tasks import registry
from rlhf_jax.tasks import toolcalc


@pytest.mark.parametrize("name", ["arith", "toolcalc", "pycalc"])
def test_a_built_in_task_record_has_its_warm_start(name):
  task = get_task(name)
  assert task.warm_start
  tokenizer = task.tokenizer()
  # The prefix is special tokens of the task's own tokenizer (one id each, none unknown).
  ids = [tokenizer.backend.token_to_id(t) for t in task.prompt_prefix]
  assert task.prompt_prefix and None not in ids
  for level in task.levels:  # every level the record lists makes problems
    assert len(task.generate(0, 3, (level,), None)) == 3
  config = task.model_config(vocab_size=tokenizer.vocab_size, hidden_size=64, num_layers=2,
                             num_heads=4, max_positions=128)
  assert (config.num_heads * config.head_dim, config.num_kv_heads) == (64, 2)


def test_the_levels_are_the_task_modules_own():
  assert get_task("arith").levels == tuple(sorted(arith.LEVELS))
  assert get_task("toolcalc").levels == tuple(sorted(toolcalc.LEVELS))
  # A task without levels (or unknown) is checked against the arith task's.
  assert registry.task_levels("math") == tuple(sorted(arith.LEVELS))


def test_tasks_without_generator_have_no_warm_start():
  assert not get_task("math").warm_start and not get_task("code").warm_start


def test_toolcalc_refuses_an_arith_warm_start(tmp_path):
  arith.tokenizer().save(str(tmp_path / "arith"))
  with pytest.raises(ConfigError, match="model.checkpoint.*toolcalc's tool calls"):
    get_task("toolcalc").check_warm_start(str(tmp_path / "arith"))
  toolcalc.tokenizer().save(str(tmp_path / "toolcalc"))
  get_task("toolcalc").check_warm_start(str(tmp_path / "toolcalc"))


def test_the_reward_data_are_the_generators():
  data = get_task("arith").reward_data
  assert data("pairs", 3, 4) == list(arith_rewards.preference_pairs(3, 4))
  assert data("judged", 3, 4) == list(arith_rewards.judged_responses(3, 4))
  with pytest.raises(ValueError, match="reward data kind 'x'"):
    data("x", 0, 1)
