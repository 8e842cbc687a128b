"""A scorer handed to the trainer in Python (`Trainer(scorer=...)`, `training.run(scorer=
...)`, as benchmarks/grpo_step.py does) decides which tasks are scored: the data check
asks it, not the task registry, so a task of its own is no 'no scorer for task' error,
and a task it refuses is one line naming the row."""

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.training import inputs
from tests.training.runs import preset


def contains_answer(response, answer):
  return answer in response


ROWS = [("w3.jsonl:1", Example("1+1=", "2", "w3")), ("w3.jsonl:2", Example("2+2=", "4", "w3")),
        ("w3.jsonl:3", Example("3+3=", "6", "other"))]


def test_the_registry_alone_refuses_a_task_of_ones_own():
  with pytest.raises(ConfigError, match=r"config\.data\.train_file: w3\.jsonl:1: no scorer "
                     "for task 'w3'"):
    inputs.check_tasks(preset("grpo", "hf"), "train_file", ROWS[:2])


def test_a_python_scorer_counts_for_the_data_check():
  scorer = RewardRouter({"w3": contains_answer})
  inputs.check_tasks(preset("grpo", "hf"), "train_file", ROWS[:2], scorer=scorer)
  with pytest.raises(ConfigError) as caught:
    inputs.check_tasks(preset("grpo", "hf"), "train_file", ROWS, scorer=scorer)
  message = str(caught.value)
  assert message.startswith("config.data.train_file: w3.jsonl:3: the scorer handed to the "
                            "trainer refuses task 'other'")
  assert "\n" not in message
