"""A learner family registered from outside the library (here, this test module) gets its
`algorithm.<section>` in the config, is validated through its spec, and its rollout modes
and features gate the rest of the config (algorithms/registry.py, training/config.py)."""

from __future__ import annotations

import ml_collections
import pytest

from rlhf_jax.algorithms import registry
from rlhf_jax.algorithms.registry import LearnerSpec
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config


def toy_section() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.rate = 0.5  # in (0, 1]
  s.pairs_per_prompt = 1
  return s


def check_toy_section(s) -> None:
  check_range("algorithm.toy.rate", s.rate, low=0, high=1, low_open=True)


def validate_toy(c, *, fixed_data: bool) -> None:
  if c.algorithm.toy.pairs_per_prompt > c.rollout.group_size:
    invalid("algorithm.toy.pairs_per_prompt", c.algorithm.toy.pairs_per_prompt,
            f"must be <= rollout.group_size={c.rollout.group_size}")


def toy_factory(c, model, params, mesh):
  return ("toy learner", c.algorithm.toy.rate, model, params, mesh)


@pytest.fixture(name="toy")
def fixture_toy():
  spec = registry.register_learner(LearnerSpec(
      name="toy", factory=toy_factory, section="toy", default_section=toy_section,
      check_section=check_toy_section, validate=validate_toy, rollout_modes=("groups",)))
  yield spec
  registry.LEARNERS.unregister("toy")


def toy_config(**train) -> ml_collections.ConfigDict:
  c = base_config("arith")
  c.algorithm.learner = "toy"
  c.train.update(train)
  return c


def test_a_registered_learner_is_configured_and_built(toy):
  c = toy_config()
  assert c.algorithm.toy.rate == 0.5  # its section, from its default_section
  validate_config(c)
  assert registry.learner_spec(c) is toy
  assert registry.build_learner(c, "model", "params", "mesh") == (
      "toy learner", 0.5, "model", "params", "mesh")


def test_a_bad_field_of_its_section_is_one_line_naming_it(toy):
  c = toy_config()
  c.algorithm.toy.rate = 1.5
  with pytest.raises(ConfigError) as error:
    validate_config(c)
  assert str(error.value).startswith("config.algorithm.toy.rate: invalid value 1.5")
  assert "\n" not in str(error.value)
  c = toy_config()
  c.algorithm.toy.pairs_per_prompt = 100  # its run rule, through spec.validate
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.toy\.pairs_per_prompt: invalid "
                     r"value 100: must be <= rollout\.group_size"):
    validate_config(c)


def test_its_section_is_checked_when_another_learner_is_picked(toy):
  c = base_config("arith")  # learner 'ppo': a typo in another section is still an error
  c.algorithm.toy.rate = 0.0
  with pytest.raises(ConfigError, match=r"config\.algorithm\.toy\.rate: invalid value 0\.0"):
    validate_config(c)


def test_its_rollout_modes_and_features_gate_the_config(toy):
  c = toy_config()
  c.rollout.mode = "dynamic"  # not among its rollout_modes
  with pytest.raises(ConfigError, match=r"config\.rollout\.mode: invalid value 'dynamic': "
                     r"must be one of groups for algorithm\.learner='toy'"):
    validate_config(c)
  with pytest.raises(ConfigError, match=r"config\.train\.packing: invalid value True: must be "
                     r"False for algorithm\.learner='toy'"):
    validate_config(toy_config(packing=True))  # packing: not among its features
  c = toy_config()
  c.rollout.max_staleness = 1
  with pytest.raises(ConfigError, match=r"config\.rollout\.max_staleness: invalid value 1: "
                     r"must be 0 for algorithm\.learner='toy'"):
    validate_config(c)


def test_a_feature_it_declares_is_allowed():
  registry.register_learner("toy_packed", toy_factory, packing=True)  # name + factory
  try:
    c = base_config("arith")
    c.algorithm.learner = "toy_packed"
    c.train.packing = True
    validate_config(c)
    assert not registry.learner_spec("toy_packed").lora
    again = registry.register_learner("toy_packed", toy_factory)  # a cell run again
    assert registry.learner_spec("toy_packed") is again and not again.packing
    with pytest.raises(ValueError, match="'ppo' is a built-in learner"):
      registry.register_learner("ppo", toy_factory)
  finally:
    registry.LEARNERS.unregister("toy_packed")


def test_a_config_built_before_registration_names_the_missing_section():
  c = base_config("arith")
  registry.register_learner(LearnerSpec(name="late", factory=toy_factory, section="late",
                                        default_section=toy_section,
                                        check_section=check_toy_section))
  try:
    c.algorithm.learner = "late"
    with pytest.raises(ConfigError, match=r"^config\.algorithm\.late: .*register the learner "
                       r"before base_config"):
      validate_config(c)
  finally:
    registry.LEARNERS.unregister("late")


def test_an_unknown_learner_lists_the_registered_ones():
  with pytest.raises(ConfigError, match=r"config\.algorithm\.learner: invalid value 'kto': "
                     r"must be one of ppo, dpo, dqo"):
    registry.learner_spec("kto")
