"""`env.verifier=False`: the environment's rewards alone are the episode's reward, so a
multi-turn run needs no scorer for its rows' task, whatever the task is called."""

from __future__ import annotations

import json

import pytest

from rlhf_jax.analysis.rollouts import read_rollouts
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.tasks import arith
from rlhf_jax.training import inputs
from rlhf_jax.training import loop
from rlhf_jax.training import stages
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset
from tests.training.runs import records
from tests.training.runs import shrink


def rewarded_by_echo(tmp_path, *, verifier: bool):
  """The shrunken multi-turn config on rows of a task no scorer knows ('chatter'), with
  the Echo environment (reward: len(action) % 5 per turn, three turns)."""
  config = shrink(preset("grpo"))
  config.rollout.mode, config.env.workers = "multi_turn", 1
  config.rollout.max_new_tokens, config.env.max_tokens = 64, 96
  config.sampler.prompt_buckets = (64, 159)
  config.env.factory, config.env.verifier = "tests.envs.environments:Echo", verifier
  rows = tmp_path / "chatter.jsonl"
  rows.write_text("".join(json.dumps({"prompt": f"Say {i} things?\n", "answer": "",
                                      "task": "chatter"}) + "\n" for i in range(8)))
  config.data.train_file = config.data.eval_file = str(rows)
  return config


def test_a_task_no_scorer_knows_validates_when_the_environment_rewards(tmp_path):
  config = rewarded_by_echo(tmp_path, verifier=False)
  validate_config(config)
  inputs.check_data(config, str(tmp_path / "run"))


def test_with_the_verifier_the_data_check_names_the_way_out(tmp_path):
  config = rewarded_by_echo(tmp_path, verifier=True)
  validate_config(config)
  with pytest.raises(ConfigError, match=r"no scorer for task 'chatter'.*env\.verifier=False"):
    inputs.check_data(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_a_run_rewarded_by_the_environment_alone_trains(tmp_path):
  """No scorer is handed in: the trainer builds the config's own and never asks it."""
  config = rewarded_by_echo(tmp_path, verifier=False)
  config.train.log_rollouts = 4
  workdir = tmp_path / "run"
  stages.ensure_arith_warm_start(config, str(workdir), log=lambda line: None)
  summary = loop.Trainer(config, str(workdir), log=lambda line: None).run()
  assert summary["steps"] == 2
  decode = arith.tokenizer().decode
  for record in read_rollouts(str(workdir / "rollouts.jsonl")):
    actions = [decode(t["token_ids"]) for t in record["turns"] if t["role"] == "assistant"]
    # Echo's reward of each turn: the action's length in characters, mod 5.
    assert record["reward"] == pytest.approx(sum(len(a) % 5 for a in actions))
  assert all(r["env/failed_fraction"] == 0 for r in records(workdir)[1:])
