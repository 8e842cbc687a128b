"""The `env` section (envs/config.py): each field checked whatever the mode, what a run of
episodes needs of the other sections, and `env.turn_end` as one token; every error one line
naming the field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.envs import config as env_config
from rlhf_jax.tasks import arith
from rlhf_jax.training.config import base_config

FACTORY = "tests.envs.environments:Countdown"


def episodes_config(**env):
  """The arith base with an environment and `env` fields set."""
  c = base_config("arith")
  c.env.factory = FACTORY
  for name, value in env.items():
    c.env[name] = value
  return c


def test_the_defaults_pass():
  c = episodes_config()
  env_config.check_env_section(c, None)
  env_config.validate_episodes(c, reads_token_rewards=False)


@pytest.mark.parametrize("field, value, message", [
    ("max_turns", 0, "must be an int >= 1"),
    ("max_tokens", -3, "must be an int >= 1"),
    ("workers", 0, "must be an int >= 1"),
    ("max_chars_per_token", -1, "must be an int >= 1"),
    ("worker_memory_mb", -1, r"must be an int >= 0 \(0: no limit\)"),
    ("timeout_s", 0.0, "must be > 0"),
    ("reward_placement", "step", "must be one of sum, turn"),
])
def test_each_field_is_checked(field, value, message):
  with pytest.raises(ConfigError, match=rf"^config\.env\.{field}: invalid value .*{message}") \
      as error:
    env_config.check_env_section(episodes_config(**{field: value}), None)
  assert error.value.field == f"env.{field}"


def test_what_episodes_need_of_the_other_sections():
  with pytest.raises(ConfigError, match=r"^config\.env\.factory: .*needs an environment"):
    env_config.validate_episodes(episodes_config(factory=""), reads_token_rewards=True)
  c = episodes_config(max_tokens=8)
  c.rollout.max_new_tokens = 9
  with pytest.raises(ConfigError, match=r"^config\.rollout\.max_new_tokens: invalid value 9: "
                                        r"must be <= env\.max_tokens=8"):
    env_config.validate_episodes(c, reads_token_rewards=True)
  c = episodes_config(reward_placement="turn")
  c.algorithm.process_reward.shaping = "delta"
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.process_reward\.shaping: "
                                        r"invalid value 'delta': must be 'none'"):
    env_config.validate_episodes(c, reads_token_rewards=True)
  c.algorithm.process_reward.shaping = "none"
  env_config.validate_episodes(c, reads_token_rewards=True)
  with pytest.raises(ConfigError, match=r"^config\.env\.reward_placement: .*per-token rewards"):
    env_config.validate_episodes(c, reads_token_rewards=False)
  c = episodes_config(verifier=False)
  c.reward.function = "tests.rewards.reward_fns:solution_match"
  with pytest.raises(ConfigError, match=r"^config\.reward\.function: .*would never be called"):
    env_config.validate_episodes(c, reads_token_rewards=False)


def test_turn_end_is_one_token_of_the_tokenizer():
  tokenizer = arith.tokenizer()
  e = episodes_config().env
  assert env_config.turn_end_id(e, tokenizer) is None
  e.turn_end = "\n"
  assert env_config.turn_end_id(e, tokenizer) == tokenizer.encode("\n")[0]
  e.turn_end = "Answer"
  assert len(tokenizer.encode("Answer")) > 1
  with pytest.raises(ConfigError, match=r"^config\.env\.turn_end: invalid value 'Answer': "
                                        r"must be one token"):
    env_config.turn_end_id(e, tokenizer)
