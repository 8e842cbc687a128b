"""No dead ends between settings: the last of repeated flags wins, tuples
included; a peer's field name (TRL, verl, OpenRLHF) gets our field's in "did you mean";
`train.eval_every=0` turns evaluation off. In-process through `cli.parse_flags`, as every
launcher parses its flags."""

from __future__ import annotations

import re

import pytest


from rlhf_jax.config_errors import PEER_NAMES
from rlhf_jax.config_errors import UNKNOWN_FIELD
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import validate_config
from tests.training.runs import parse
from tests.training.runs import preset

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
GRPO = "configs/grpo.py:arith"


@pytest.mark.parametrize("first, last, expected", [
    ("(64,)", "(112,)", (112,)),
    ("64,80", "112", (112,)),
    ("(64, 80)", "(96, 112, 128)", (96, 112, 128)),
])
def test_the_last_of_repeated_tuple_flags_wins(first, last, expected):
  config = parse(GRPO, f"--config.sampler.prompt_buckets={first}",
                 f"--config.sampler.prompt_buckets={last}")
  assert config.sampler.prompt_buckets == expected


def test_the_last_of_repeated_flags_wins_in_every_form():
  config = parse(GRPO, "--config.train.steps=3", "--config.rollout.group_size", "2",
                 "--config.train.steps", "7", "--config.rollout.group_size=6",
                 "--config.model.scan_layers", "--noconfig.model.scan_layers")
  assert (config.train.steps, config.rollout.group_size) == (7, 6)
  assert config.model.scan_layers is False
  once = parse(GRPO, "--config.sampler.prompt_buckets=(64,)")  # a flag given once: as before
  assert once.sampler.prompt_buckets == (64,)


def test_every_peer_name_points_at_a_field_of_the_grpo_preset():
  """The table cannot rot: each entry names a field the grpo preset has."""
  for variant in ("arith", "hf"):
    config = preset("grpo", variant)
    for peer, (ours, whose, _) in PEER_NAMES.items():
      node = config
      for part in ours.split("."):
        assert part in node, (peer, ours)
        node = node[part]
      assert not hasattr(node, "keys"), (peer, ours)  # a field, not a section
      assert whose.endswith("'s"), peer


@pytest.mark.parametrize("override, unknown, hint", [
    ("num_generations=8", "num_generations", "'config.rollout.group_size' (TRL's "
     "num_generations)"),
    ("algorithm.beta=0.04", "algorithm.beta", "'config.algorithm.kl.coef' (TRL's beta)"),
    ("rollout.n=8", "rollout.n", "'config.rollout.group_size' (verl's rollout.n)"),
    ("actor_rollout_ref.rollout.n=8", "actor_rollout_ref",
     "'config.rollout.group_size' (verl's rollout.n)"),
    ("data.train_batch_size=64", "data.train_batch_size",
     "'config.rollout.prompts_per_step' (verl's train_batch_size)"),
    ("ppo_mini_batch_size=16", "ppo_mini_batch_size", "'config.train.minibatches' (verl's "
     "ppo_mini_batch_size; ours is a count: rollout.prompts_per_step / ppo_mini_batch_size)"),
    ("n_samples_per_prompt=4", "n_samples_per_prompt",
     "'config.rollout.group_size' (OpenRLHF's n_samples_per_prompt)"),
])
def test_a_peers_field_name_gets_ours(override, unknown, hint):
  with pytest.raises(ConfigError) as error:
    parse(GRPO, f"--config.{override}")
  assert str(error.value) == f"config.{unknown}: {UNKNOWN_FIELD}; did you mean {hint}?"
  assert error.value.field == unknown


@pytest.mark.parametrize("override, hint", [
    ("temperature=0.7", "'config.rollout.temperature'"),
    ("train.group_size=8", "'config.rollout.group_size'"),
    ("model.seed=3", "'config.seed'"),
])
def test_a_field_of_another_section_is_named(override, hint):
  with pytest.raises(ConfigError, match=f"; did you mean {re.escape(hint)}\\?$"):
    parse(GRPO, f"--config.{override}")


def test_a_typo_still_gets_the_close_matches():
  with pytest.raises(ConfigError, match=r"did you mean 'group_size'\?$"):
    parse(GRPO, "--config.rollout.group_sise=8")


def test_eval_every_0_turns_evaluation_off():
  """(A run with it evaluates nothing: tests/training/test_changed_config.py.)"""
  config = parse(GRPO, "--config.train.eval_every=0")
  assert config.train.eval_samples > 0  # the sampled evaluation is off with the rest
  validate_config(config, num_devices=1)
  config.train.eval_every = -1
  with pytest.raises(ConfigError, match=r"^config\.train\.eval_every: invalid value -1: must "
                     r"be >= 0 \(0: no held-out evaluation\)$"):
    validate_config(config, num_devices=1)


@pytest.mark.slow
def test_a_peers_name_on_the_command_line_is_one_line_naming_ours(tmp_path):
  """End to end: launch/train.py in a fresh process, as a TRL user types it."""
  from tests.launch.runs import run  # pylint: disable=import-outside-toplevel
  result = run("train.py", "--config=configs/grpo.py:arith", f"--workdir={tmp_path}",
               "--config.num_generations=8", timeout=120)
  assert result.returncode == 2 and not result.stdout.strip()
  assert result.stderr.strip().splitlines() == [
      "error: config.num_generations: unknown field; did you mean "
      "'config.rollout.group_size' (TRL's num_generations)?"]
