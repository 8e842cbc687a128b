"""The trainer's config: one schema for every preset, built and checked from a table of
sections.

Each section is declared once, by the module that owns it, as a `registry.Section`: its
fields with their defaults and help, its check, and the sections its check reads. The
table `SECTIONS` (at the end of this module) lists them: models/config.py `model`,
data/config.py `data`, algorithms/sft.py `sft`, tasks/registry.py the task fields,
rollout/config.py `rollout` and rollout/modes.py the mode's rules, envs/config.py `env`,
sampling/config.py `sampler`, rewards/config.py `reward` and `critic`,
algorithms/ppo_config.py `algorithm`, optim/optimizer.py `optimizer`,
parallel/distributed.py `distributed`, training/loggers.py the loggers' `train` fields.
This module owns the root's fields, `train`, `mesh`, the learners' fields, and the rules
that span rooms which cannot import each other.

configs/{ppo,grpo,dapo,vcppo,vapo,tppo}.py start from `base_config(preset)` (task-neutral;
`arith`: with the built-in task's overlay, training/overlays.py) and change fields.
`validate_config`, which every launcher (and `training.run`) calls first, runs every check
in dependency order before anything loads, trains or compiles. Every error is a one-line
`ConfigError`, `config.<full.path>: invalid value <v>: <allowed values or range>`.
"""

from __future__ import annotations

import ml_collections

from rlhf_jax import parallel
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import sft as sft_lib
from rlhf_jax.algorithms.registry import LEARNERS
from rlhf_jax.data import config as data_config_lib
from rlhf_jax.data.sources import parse_columns
from rlhf_jax.envs import config as env_config_lib
from rlhf_jax.models import config as model_section
from rlhf_jax.optim import optimizer as optimizer_lib
from rlhf_jax.registry import Checking
from rlhf_jax.registry import build_config
from rlhf_jax.registry import check_config
from rlhf_jax.rewards import config as reward_config_lib
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import registry as task_registry
from rlhf_jax.training import loggers as loggers_lib
from rlhf_jax.training import sections
from rlhf_jax.training.overlays import arith_overlay

__all__ = ["PRESET_BASES", "LEARNERS", "base_config", "sibling_preset", "validate_config",
           "parse_columns"]  # parse_columns: data/sources.py's, re-exported

# What a preset is built on (`configs/<preset>.py:<base>`): 'hf', the task-neutral config
# (one's checkpoint and data files), or 'arith', the same with the built-in task's overlay.
PRESET_BASES = ("arith", "hf")


def base_config(preset: str = "hf") -> ml_collections.ConfigDict:
  """Every field with its default, built from the section table (`SECTIONS`): task-neutral,
  one's own checkpoint and data; `preset` 'arith' applies the built-in task's overlay
  (overlays.arith_overlay). Presets override the `algorithm` and `rollout` sections."""
  if preset not in PRESET_BASES:
    raise ValueError(f"config preset base {preset!r}; allowed: {', '.join(PRESET_BASES)}.")
  c = build_config(SECTIONS)
  if preset == "arith":
    arith_overlay(c)
  return c


def sibling_preset(preset_file: str, name: str, base: str) -> ml_collections.ConfigDict:
  """`get_config(base)` of configs/<name>.py beside `preset_file` (a preset built on
  another, e.g. Pairwise-PPO on PPO), loaded by path: presets are files, not a package."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.abspath(preset_file)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"rlhf_jax_preset_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(base)


def validate_config(c: ml_collections.ConfigDict, num_devices: int | None = None, *,
                    labelling: bool = False, supervised: bool = False) -> None:
  """Checks every field of a trainer config; launchers call this first, before the
  warm start, labelling, loading or compiling (the Trainer checks again, cheaply).

  Every section of the table (`SECTIONS`) runs its check, in dependency order
  (`registry.check_order`): a section's check runs after those of the sections it reads.
  With `num_devices` the mesh is checked against the devices too. `labelling`: the run
  writes `data.offline_file` (launch/label_samples.py) instead of reading it;
  `supervised`: SFT on one's own data (launch/sft.py without `data.task`), which needs
  `sft.train_file`, not an RL prompt file or a checkpoint. Raises ConfigError: one line,
  `config.<full.path>: invalid value <v>: <allowed values or range>`.
  """
  check_config(c, SECTIONS, Checking(num_devices=num_devices, labelling=labelling,
                                     supervised=supervised))


# The section table: every section of the trainer's config, declared by the module that owns
# it, in the order the config shows them; the rules that span rooms which cannot import each
# other come last. `base_config` builds the config from it, `validate_config` checks it in
# dependency order, scripts/config_reference.py writes docs/config_reference.md from it.
SECTIONS = (
    sections.FINITE,
    sections.RUN,
    model_section.SECTION,
    data_config_lib.SECTION,
    sft_lib.SECTION,
    task_registry.SECTION,
    rollout_config_lib.SECTION,
    env_config_lib.SECTION,
    sampler_config_lib.SECTION,
    reward_config_lib.SECTION,
    rollout_modes.SECTION,
    ppo_config.SECTION,
    sections.LEARNER,
    reward_config_lib.CRITIC_SECTION,
    optimizer_lib.SECTION,
    sections.TRAIN,
    loggers_lib.SECTION,
    sections.MESH,
    parallel.distributed.SECTION,
) + sections.RULES
SECTIONS += (sections.across_sections(tuple(s.name for s in SECTIONS)),)
