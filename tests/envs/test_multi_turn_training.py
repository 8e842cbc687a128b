"""rollout.mode='multi_turn' in the Trainer (GRPO on a shrunken arith config) and the
`env` section's refusals."""

import json
import subprocess
import sys

import numpy as np
import pytest

from rlhf_jax.analysis.rollouts import read_rollouts
from rlhf_jax.analysis.rollouts import rollouts_table
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset
from tests.training.runs import make_trainer
from tests.training.runs import records
from tests.training.runs import shrink


def multi_turn(name="grpo"):
  config = shrink(preset(name))
  config.rollout.mode, config.env.factory = "multi_turn", "tests.envs.environments:Recheck"
  config.rollout.max_new_tokens, config.env.max_tokens = 64, 96
  config.sampler.prompt_buckets = (64, 159)
  config.env.workers = 1
  return config


@pytest.mark.slow
def test_grpo_trains_on_multi_turn_episodes(tmp_path):
  config = multi_turn()
  config.train.log_rollouts = 3
  summary = make_trainer(config, tmp_path).run()
  assert summary["steps"] == 2
  logged = read_rollouts(str(tmp_path / "rollouts.jsonl"))
  assert [r["step"] for r in logged] == [1, 1, 1, 2, 2, 2]
  for record in logged:
    assert set(record) == {"step", "reward", "token_ids", "loss_mask", "turns", "failure"}
    assert record["failure"] == ""  # nothing failed: the environment checks every answer
    assert len(record["loss_mask"]) == len(record["token_ids"])
    turn_ids = [t for turn in record["turns"] for t in turn["token_ids"]]
    assert record["token_ids"][-len(turn_ids):] == turn_ids
    assert record["loss_mask"] == [0] * (len(record["token_ids"]) - len(turn_ids)) + [
        int(turn["role"] == "assistant") for turn in record["turns"] for _ in turn["token_ids"]]
    assert record["turns"][0]["role"] == "assistant"
    json.dumps(record)
  assert any(len(r["turns"]) == 3 for r in logged)  # assistant, environment, assistant
  assert rollouts_table(logged).count("\n") == 2 + len(logged)
  shown = subprocess.run([sys.executable, "launch/rollouts.py", f"--workdir={tmp_path}",
                          "--step=2"], capture_output=True, text=True, check=True).stdout
  assert shown == rollouts_table(logged[3:])
  start = records(tmp_path)[0]  # held-out accuracy of whole greedy episodes
  assert start["step"] == 0 and 1 <= start["eval_turns"] <= 2
  assert 0 <= start["eval_accuracy"] <= 1
  for record in records(tmp_path)[1:]:
    assert 1 <= record["env/turns_mean"] <= 2 and record["env/failed_fraction"] == 0
    if record["env/turns_mean"] > 1:  # second turns continued their kept KV caches
      assert record["env/reused_tokens"] > 0
    # The sampler's log-probs of the model's tokens are the trainer's over the whole row.
    assert record["logprob_mismatch_max"] < 1e-5
    assert np.isfinite(record["reward_mean"]) and np.isfinite(record["grad_norm"])


@pytest.mark.parametrize("change, field", [
    ({"env.factory": ""}, "env.factory"),
    ({"env.factory": "tests.envs.environments:Absent"}, "env.factory"),
    ({"env.reward_placement": "turn"}, "env.reward_placement"),
    ({"env.max_turns": 0}, "env.max_turns"),
    ({"env.worker_memory_mb": -1}, "env.worker_memory_mb"),
    ({"env.max_chars_per_token": 0}, "env.max_chars_per_token"),
    ({"rollout.max_new_tokens": 97}, "rollout.max_new_tokens"),
    ({"sampler.prompt_buckets": (64, 128)}, "sampler.prompt_buckets"),
    ({"sampler.cache_length": 150, "sampler.prompt_buckets": (64, 149)}, "sampler.cache_length"),
])
def test_the_env_section_refuses_what_cannot_run(change, field):
  config = multi_turn()
  validate_config(config)
  config.update_from_flattened_dict(change)
  with pytest.raises(ConfigError, match=f"config.{field}"):
    validate_config(config)


@pytest.mark.slow
@pytest.mark.parametrize("partial", [False, True])
def test_multi_turn_episodes_generated_one_step_ahead(tmp_path, partial):
  """rollout.max_staleness = 1: each step's episodes (every turn) are sampled by the
  previous version while the learner updates; evaluation waits for them. With partial
  rollouts new weights reach the turns in flight, each token keeping its version."""
  config = multi_turn()
  config.rollout.max_staleness, config.train.steps = 1, 3
  if partial:
    config.rollout.partial_rollouts, config.sampler.update_policy = True, "swap_now"
  summary = make_trainer(config, tmp_path).run()
  assert summary["steps"] == 3
  logged = records(tmp_path)
  assert logged[0]["step"] == 0 and "eval_turns" in logged[0]
  steps = [r for r in logged if "reward_mean" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  assert steps[0]["staleness/stale_token_fraction"] == 0
  for record in steps[1:]:
    if partial:  # where the weights switch follows the threads' timing: the bound holds
      assert 0 <= record["staleness/stale_token_fraction"] <= 1
      assert record["staleness/max_version_lag"] <= 1
    else:
      assert record["staleness/stale_token_fraction"] == 1
      assert record["staleness/max_version_lag"] == 1
    assert np.isfinite(record["loss"]) and record["env/failed_fraction"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo", "dapo"])
def test_the_ppo_and_dapo_presets_train_on_multi_turn_episodes(tmp_path, name):
  """PPO's critic and GAE run over the model's tokens only (observations masked); DAPO's
  clip-higher, token-mean loss and overlong shaping take whole episodes."""
  config = multi_turn(name)
  summary = make_trainer(config, tmp_path).run()
  assert summary["steps"] == 2
  for record in records(tmp_path)[1:]:
    assert np.isfinite(record["loss"]) and np.isfinite(record["grad_norm"])
    assert record["logprob_mismatch_max"] < 1e-5 and record["env/failed_fraction"] == 0
    if name == "ppo":
      assert np.isfinite(record["critic_loss"])
