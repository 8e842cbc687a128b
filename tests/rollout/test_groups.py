"""DAPO's dynamic sampling (rollout/groups.py) without a model: scripted rounds of groups,
the kept surplus, the rounds that give up, and the reasons it says."""

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rollout import DynamicSamplingRollout
from rlhf_jax.rollout import Group
from rlhf_jax.rollout import NoSignalError
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config


def group(correct):
  n = len(correct)
  return Group(Example("q", "1", "arith"), [1], [[2]] * n, [[0.0]] * n,
               [1.0 if c else -1.0 for c in correct], list(correct), [False] * n, [""] * n)


class ScriptedGenerator:
  """Each call returns the next scripted round of groups (no model, no sampler)."""

  def __init__(self, rounds):
    self.rounds = list(rounds)

  def generate_groups(self, examples):
    return self.rounds.pop(0)


class NullStream:
  def take(self, count):
    return [None] * count


def dynamic(rounds, max_rounds=10, **options):
  return DynamicSamplingRollout(ScriptedGenerator(rounds), NullStream(), prompts_per_step=2,
                                response_length=4, oversample=3, max_rounds=max_rounds,
                                **options)


def test_dynamic_sampling_with_keep_surplus_keeps_groups_for_the_next_step():
  mixed, solved, failed = [True, False], [True, True], [False, False]
  rollout = dynamic([[group(solved), group(mixed)], [group(mixed), group(mixed)],
                     [group(failed), group(failed)]], keep_surplus=True)
  kept, metrics = rollout.next_groups()
  assert len(kept) == 2 and len(rollout.buffer) == 1
  assert metrics["kept_groups_ratio"] == 3 / 4 and metrics["generation_rounds"] == 2
  # The next step starts from the buffered group and needs one more.
  rollout.generator.rounds = [[group(failed), group(mixed)]]
  kept, _ = rollout.next_groups()
  assert len(kept) == 2 and not rollout.buffer


def test_dynamic_sampling_gives_up_after_fruitless_rounds():
  rollout = dynamic([[group([True, True])] * 2] * 3, max_rounds=3)
  with pytest.raises(NoSignalError, match=r"rollout\.dynamic\.max_rounds=3"):
    rollout.next_groups()


def scored_group(scores, correct):
  n = len(scores)
  return Group(Example("q", "1", "f"), [1], [[2]] * n, [[0.0]] * n, list(scores),
               list(correct), [False] * n, [""] * n)


def test_dynamic_sampling_keeps_groups_whose_rewards_vary_by_default():
  # accuracy + format functions: 1.5 / 1.0 / 0.5, none "correct" (no verifier, not full
  # marks everywhere): the rewards vary, so the groups carry a signal (verl's std > 0)
  varied, equal = scored_group([1.5, 0.5], [False, False]), scored_group([1.0, 1.0], [True, False])
  rollout = dynamic([[varied, equal, varied]])
  kept, _ = rollout.next_groups()
  assert kept == [varied, varied]
  # the paper's rule on correctness keeps only the group whose verdicts vary
  rollout = dynamic([[varied, equal, equal]], signal="accuracy")
  kept, _ = rollout.next_groups()
  assert kept == [equal, equal]


def test_dynamic_sampling_that_finds_nothing_because_every_reward_failed_says_why():
  n = 2
  failed = Group(Example("q", "1", "f"), [1], [[2]] * n, [[0.0]] * n, [-1.0] * n,
                 [False] * n, [False] * n, ["reward.function f: raised KeyError: 'answer'"] * n)
  rollout = dynamic([[failed] * 6] * 2, max_rounds=2)
  with pytest.raises(NoSignalError, match="24 of 24 samples' rewards failed, the first: "
                                          "reward.function f: raised KeyError: 'answer'"):
    rollout.next_groups()


def test_dynamic_sampling_signal_is_checked():
  with pytest.raises(ConfigError, match=r"config\.rollout\.dynamic\.signal: invalid value "
                                        "'std': must be one of reward, accuracy"):
    c = base_config("arith")
    c.rollout.dynamic.signal = "std"
    validate_config(c)
