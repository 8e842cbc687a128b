"""The `reward` section (rewards/config.py): its fields checked, one line naming the field, and
the note on what the sandbox's memory bound covers."""

from __future__ import annotations

import logging

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rewards import config as reward_config
from rlhf_jax.sandbox import jobs as sandbox
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config


@pytest.mark.parametrize("field, value, message", [
    ("unscored", "drop_it", "must be one of zero, failure, drop"),
    ("function_timeout_s", 0.0, "must be > 0"),
    ("worker_memory_mb", -1, "must be an int >= 0"),
    ("max_failed_steps", -1, "must be >= 0"),
])
def test_the_function_fields_are_checked(field, value, message):
  c = base_config("arith")
  c.reward[field] = value
  with pytest.raises(ConfigError, match=f"config.reward.{field}: invalid value .*{message}"):
    validate_config(c)


def test_the_config_check_says_when_memory_is_bounded_per_process(monkeypatch, caplog):
  monkeypatch.setattr(reward_config, "memory_scope", lambda: ("process", "no cgroup here"))
  reward_config.memory_bound_note.cache_clear()
  note = reward_config.memory_bound_note(512)
  assert note == ("reward.sandbox.memory_mb=512 bounds each sandboxed process, not the job "
                  "(no cgroup here): a code job may use up to 512 MB × 8 processes "
                  "(docs/sandbox.md)")
  assert sandbox.Limits().max_processes == 8
  c = base_config("arith")
  with caplog.at_level(logging.WARNING):
    reward_config.validate_rule_rewards(c.reward)
  assert note in caplog.text
  monkeypatch.setattr(reward_config, "memory_scope", lambda: ("job", ""))
  reward_config.memory_bound_note.cache_clear()
  assert reward_config.memory_bound_note(512) == ""
  reward_config.memory_bound_note.cache_clear()
