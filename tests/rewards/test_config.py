"""The `reward` section (rewards/config.py): its fields checked, one line naming the field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
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
