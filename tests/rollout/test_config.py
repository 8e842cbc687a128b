"""The `rollout` section (rollout/config.py): every field checked whatever the mode, the rules
between staleness, partial rollouts and the kept surplus, and the training SamplingParams it
makes; every error one line naming the field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rollout import config as rollout_config


def section(**fields):
  """The section's defaults with dotted `fields` set ("dynamic__max_age" for dynamic.max_age)."""
  r = rollout_config.rollout_config(prompts_per_step=4, max_new_tokens=16)
  for name, value in fields.items():
    *groups, leaf = name.split("__")
    target = r
    for group in groups:
      target = target[group]
    target[leaf] = value
  return r


def test_the_defaults_pass():
  rollout_config.validate_rollout_config(section())


@pytest.mark.parametrize("fields, field, message", [
    ({"group_size": 0}, "group_size", "must be >= 1"),
    ({"temperature": -0.5}, "temperature", "must be >= 0"),
    ({"top_p": 0.0}, "top_p", "must be in"),
    ({"top_k": -1}, "top_k", "must be >= 0"),
    ({"fire_temperature": 0.0}, "fire_temperature", "must be > 0"),
    ({"dynamic__oversample": 0}, "dynamic.oversample", "must be >= 1"),
    ({"dynamic__signal": "std"}, "dynamic.signal", "must be one of reward, accuracy"),
    ({"windows__window_tokens": 0}, "windows.window_tokens", "must be >= 1"),
    ({"max_staleness": -1}, "max_staleness", r"must be an int >= 0 \(0: synchronous\)"),
    ({"dynamic__keep_surplus": True, "dynamic__max_age": 0}, "dynamic.max_age",
     "must be >= 1 with rollout.dynamic.keep_surplus"),
    ({"max_staleness": 2, "dynamic__keep_surplus": True, "dynamic__max_age": 2},
     "dynamic.max_age", r"must be > rollout\.max_staleness=2 with keep_surplus"),
    ({"partial_rollouts": True}, "partial_rollouts", r"needs rollout\.max_staleness >= 1"),
])
def test_each_bad_setting_names_its_field(fields, field, message):
  with pytest.raises(ConfigError, match=rf"^config\.rollout\.{field}: invalid value .*{message}") \
      as error:
    rollout_config.validate_rollout_config(section(**fields))
  assert error.value.field == f"rollout.{field}" and "\n" not in str(error.value)


def test_sampling_params_of_the_section():
  params = rollout_config.sampling_params(
      section(group_size=4, temperature=0.7, top_p=0.9, top_k=5), (2, 3))
  assert (params.n, params.temperature, params.top_p, params.top_k) == (4, 0.7, 0.9, 5)
  assert params.max_new_tokens == 16 and tuple(params.stop_token_ids) == (2, 3)
  assert params.fire is None
  fired = rollout_config.sampling_params(section(fire=True, fire_top_k=8), ())
  assert (fired.fire.temperature, fired.fire.top_k) == (30.0, 8)
