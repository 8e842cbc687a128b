"""The PPO family's section (algorithms/ppo_config.py): `algorithm.policy_loss` validated per
kind (clips, dual clip, the estimators a sequence-level loss accepts), one line naming the
field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset


@pytest.mark.parametrize("name,overrides,match", [
    ("gspo", {"policy_loss.kind": "trpo"},
     r"config\.algorithm\.policy_loss\.kind: invalid value 'trpo': must be one of ppo, gspo, "
     r"gspo_token, cispo"),
    ("gspo", {"policy_loss.dual_clip": 3.0},
     r"config\.algorithm\.policy_loss\.dual_clip: invalid value 3\.0: must be None with "
     r"algorithm\.policy_loss\.kind='gspo'"),
    ("cispo", {"policy_loss.dual_clip": 3.0},
     r"config\.algorithm\.policy_loss\.dual_clip: invalid value 3\.0: must be None with "
     r"algorithm\.policy_loss\.kind='cispo'"),
    ("gspo", {"advantage.estimator": "gae"},
     r"config\.algorithm\.policy_loss\.kind: invalid value 'gspo': must be one of ppo, "
     r"gspo_token, cispo with "
     r"algorithm\.advantage\.estimator='gae'"),
    ("gspo", {"advantage.estimator": "reinforce_pp"},
     r"config\.algorithm\.policy_loss\.kind: invalid value 'gspo'"),
    ("gspo", {"policy_loss.clip_high": 0.0},
     r"config\.algorithm\.policy_loss\.clip_high: invalid value 0\.0: must be >= 0\.0003"),
    ("gspo", {"policy_loss.clip_low": 1.0},
     r"config\.algorithm\.policy_loss\.clip_low: invalid value 1\.0: must be in \[0, 1\)"),
    ("cispo", {"policy_loss.clip_high": 0.0},
     r"config\.algorithm\.policy_loss\.clip_high: invalid value 0\.0: must be > 0"),
    ("cispo", {"policy_loss.clip_low": -0.5},
     r"config\.algorithm\.policy_loss\.clip_low: invalid value -0\.5: must be >= 0"),
])
def test_validation_by_kind_names_the_field(name, overrides, match):
  config = preset(name)
  for field, value in overrides.items():
    section, key = field.split(".")
    config.algorithm[section][key] = value
  with pytest.raises(ConfigError, match=match):
    validate_config(config, num_devices=1)


@pytest.mark.parametrize("name,overrides", [
    ("gspo", {"policy_loss.kind": "gspo_token", "advantage.estimator": "gae"}),
    ("gspo", {"policy_loss.kind": "gspo_token"}),
    ("cispo", {"policy_loss.clip_low": 5.0}),  # ≥ 1: no lower bound
    ("cispo", {"policy_loss.positive_nll_coef": 0.1, "policy_loss.entropy_coef": 0.01}),
    ("gspo", {"correction.mode": "mis_sequence"}),
])
def test_valid_combinations_pass(name, overrides):
  config = preset(name)
  for field, value in overrides.items():
    section, key = field.split(".")
    config.algorithm[section][key] = value
  validate_config(config, num_devices=1)
