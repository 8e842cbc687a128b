"""DQO's section (algorithms/dqo.py): each `algorithm.dqo` field checked, and how it fits the
rollout and data sections (a cached reference needs fixed data, whole groups of the generated
offline data); every error one line naming the field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.config import validate_config


def dqo_preset():
  return sibling_preset("configs/dqo.py", "dqo", "arith")


def test_the_preset_passes():
  validate_config(dqo_preset())


@pytest.mark.parametrize("field, value, message", [
    ("beta", 0.0, r"must be > 0"),
    ("lam", 1.5, r"must be in \[0, 1\]"),
    ("gamma", -0.1, r"must be in \[0, 1\]"),
    ("trace_clip", 0.0, r"must be > 0"),
    ("reference", "frozen", r"must be one of cached, online"),
])
def test_each_field_is_checked(field, value, message):
  c = dqo_preset()
  c.algorithm.dqo[field] = value
  with pytest.raises(ConfigError, match=rf"^config\.algorithm\.dqo\.{field}: invalid value "
                                        rf"{value!r}: {message}") as error:
    validate_config(c)
  assert error.value.field == f"algorithm.dqo.{field}"


def test_the_run_fits_the_rollout_and_data_sections():
  c = dqo_preset()
  c.rollout.group_size = 4
  with pytest.raises(ConfigError, match=r"^config\.rollout\.group_size: invalid value 4: must "
                                        r"equal data\.offline_samples=8"):
    validate_config(c)
  c = dqo_preset()
  c.rollout.mode = "groups"
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.dqo\.reference: invalid value "
                                        r"'cached': must be 'online' unless rollout\.mode="
                                        r"'offline'"):
    validate_config(c)
