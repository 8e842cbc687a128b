"""The trainer's own sections and the rules across rooms (training/sections.py), called on
small configs: every float finite (nested tuples too), the train section's batch splits, and
the mesh's axes against the devices and the step's rows; each error one line naming the field.
(The whole config through validate_config: test_config.py; the sampler's sizes:
test_sampler_sizes.py.)"""

from __future__ import annotations

import math

import ml_collections
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import sections


@pytest.mark.parametrize("value, field", [
    (math.nan, "a.rate"), (math.inf, "a.rate"), ((1.0, -math.inf), "a.rate"),
    (((0.5,), (math.nan,)), "a.rate"),
])
def test_every_float_is_finite_nested_ones_too(value, field):
  config = ml_collections.ConfigDict({"a": {"rate": value, "name": "x"}, "seed": 3})
  with pytest.raises(ConfigError, match=rf"^config\.{field}: invalid value .*must be finite"):
    sections.check_finite(config)
  sections.check_finite(ml_collections.ConfigDict({"a": {"rate": (0.5, 2)}, "b": "nan"}))


def train_config(**train):
  fields = dict(steps=2, epochs=1, minibatches=2, micro_batches=2, checkpoint_every=1,
                log_every=1, eval_every=0, eval_samples=0, log_rollouts=0)
  return ml_collections.ConfigDict({"train": fields | train})


@pytest.mark.parametrize("train, message", [
    ({"minibatches": 3}, r"train\.minibatches: invalid value 3: must divide the 16 rollouts "
                         r"per step"),
    ({"micro_batches": 3}, r"train\.micro_batches: invalid value 3: must divide the 8 rows of "
                           r"a mini-batch"),
    ({"steps": 0}, r"train\.steps: invalid value 0: must be >= 1"),
    ({"eval_every": -1}, r"train\.eval_every: invalid value -1: must be >= 0"),
])
def test_the_train_sections_batch_splits(train, message):
  sections.validate_train(train_config(), rows=16)
  with pytest.raises(ConfigError, match=rf"^config\.{message}"):
    sections.validate_train(train_config(**train), rows=16)


def mesh_config(data, fsdp=1, tensor=1, prompts=4, group=4, expert=1):
  return ml_collections.ConfigDict({
      "mesh": {"data": data, "fsdp": fsdp, "expert": expert, "tensor": tensor},
      "rollout": {"prompts_per_step": prompts, "group_size": group}})


@pytest.mark.parametrize("mesh, devices, message", [
    (mesh_config(0), None, r"^config\.mesh\.data: invalid value 0: must be >= 1, or -1"),
    (mesh_config(-1, -1), None, r"^config\.mesh: invalid value .*at most one axis may be -1"),
    (mesh_config(4, 2), 4, r"^config\.mesh: invalid value .*data×fsdp×expert×tensor = 8 "
                           r"must be <= the 4 available devices"),
    (mesh_config(-1, 3), 8, r"^config\.mesh: invalid value .*not a multiple of 3"),
    (mesh_config(-1, prompts=3, group=2), 4, r"^config\.rollout\.prompts_per_step: invalid "
                                             r"value 3: the 6 rollouts per step .* must split "
                                             r"evenly over mesh data×fsdp×expert = 4"),
    (mesh_config(2, expert=-1, prompts=3, group=2), 8,
     r"^config\.rollout\.prompts_per_step: invalid value 3: .* data×fsdp×expert = 8"),
])
def test_the_mesh_against_the_devices_and_the_rows(mesh, devices, message):
  rows = mesh.rollout.prompts_per_step * mesh.rollout.group_size
  with pytest.raises(ConfigError, match=message):
    sections.validate_mesh(mesh, devices, rows=rows)


def test_a_mesh_that_fits():
  sections.validate_mesh(mesh_config(-1, 2), 8, rows=16)  # data = 4, rows split over 8
  sections.validate_mesh(mesh_config(2, 2, 2), None, rows=3)  # no devices: the sizes only
