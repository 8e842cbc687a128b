"""Rollout modes as records (rollout/modes.py): the built-in records, the one reader of
`rollout.mode`, and a mode registered here — a replay of fixed groups with its own
evaluator — built and trained by the loop with no edit to the library."""

import functools
import re
import types

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import invalid
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.rollout import Group
from rlhf_jax.rollout import Rollouts
from rlhf_jax.rollout import pack_groups
from rlhf_jax.rollout import modes
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

# The replay's figures: a right and a wrong answer per prompt, alternating (G = 4).
SCORES = [1.0, 0.0, 1.0, 0.0]
EVAL_ACCURACY = 0.625  # what the replay's own evaluator reports


class Replay:
  """The same labelled groups every step (a `Rollout`, rollout/base.py): for each of the
  first `prompts_per_step` training prompts, G responses scored `SCORES`."""

  def __init__(self, c, parts):
    tokenizer, r = parts.policy.tokenizer, c.rollout
    groups = []
    for example in list(parts.examples)[:r.prompts_per_step]:
      texts = [str(example.answer) if score else "0" for score in SCORES]
      responses = [(tokenizer.encode(t) + [tokenizer.eos_id])[:r.max_new_tokens]
                   for t in texts]
      groups.append(Group(example, parts.policy.prompts.encode(example, "replay"), responses,
                          [[0.0] * len(x) for x in responses], list(SCORES),
                          [bool(s) for s in SCORES], [False] * len(SCORES),
                          [""] * len(SCORES)))
    self.rollouts = pack_groups(groups, prompt_length=c.data.prompt_length,
                                response_length=r.max_new_tokens, pad_id=tokenizer.pad_id)
    self.collected = 0

  def collect(self) -> Rollouts:
    self.collected += 1
    return self.rollouts

  def set_step(self, step):
    del step

  def pop_mix(self):
    return {}

  def state(self):
    return {"collected": self.collected}

  def restore(self, state):
    self.collected = state["collected"]

  def settle(self):
    pass

  def close(self):
    pass


BUILT = []  # the replays the mode built (the test reads their collect counts)


def build_replay(c, parts):
  BUILT.append(Replay(c, parts))
  return BUILT[-1]


def fixed_figures(held_out, *, samples, temperature, seed=0):
  del temperature, seed
  return {"accuracy": EVAL_ACCURACY, "response_length": 3.0, "prompts": float(len(held_out)),
          "samples_per_prompt": float(samples), "verifier_failures": 0.0, "pass@1": 0.5}


def replay_evaluator(c, parts, held_out, scorer):
  del c, parts, scorer
  return functools.partial(fixed_figures, held_out)


def never_right(response, answer):
  del response, answer
  return False


def check_replay(c):
  if c.rollout.group_size != len(SCORES):
    invalid("rollout.group_size", c.rollout.group_size, f"must be {len(SCORES)} for the replay")


REPLAY = modes.register_rollout_mode(modes.RolloutMode(
    name="replay", build=build_replay, allows_staleness=False, learners=("ppo",),
    evaluator=replay_evaluator, validate=check_replay))


def config(mode="groups", variant="arith"):
  c = base_config(variant)
  c.rollout.mode = mode
  c.algorithm.advantage.estimator = "grpo"
  c.rollout.group_size = len(SCORES)
  return c


# ------------------------------------------------------------------ the records


@pytest.mark.parametrize("name, environment, staleness, critic, fixed", [
    ("groups", False, True, False, False),
    ("dynamic", False, True, False, False),
    ("windows", False, False, True, False),  # T-PPO: windows in flight, Extended GAE
    ("multi_turn", True, True, False, False),
    ("offline", False, False, False, True),  # labelled groups from data.offline_file
])
def test_the_built_in_modes_say_what_they_need(name, environment, staleness, critic, fixed):
  mode = modes.rollout_mode(config(name))
  assert mode.name == name
  assert (mode.needs_environment, mode.allows_staleness, mode.needs_critic,
          mode.fixed_data) == (environment, staleness, critic, fixed)


def test_the_response_columns_are_the_modes():
  c = config("multi_turn")
  c.rollout.max_new_tokens, c.env.max_tokens = 32, 200
  assert modes.response_length(c) == 200  # the episode's row budget after the prompt
  c.rollout.mode = "groups"
  assert modes.response_length(c) == 32


def test_a_mode_is_found_by_name_or_by_module_path():
  assert modes.rollout_mode(config("replay")) is REPLAY
  assert modes.rollout_mode(config("tests.rollout.test_modes:REPLAY")) is REPLAY
  with pytest.raises(ConfigError, match=r"^config\.rollout\.mode: invalid value 'beam': "
                     "must be one of groups, dynamic, windows, multi_turn, offline, "):
    modes.rollout_mode(config("beam"))
  with pytest.raises(ConfigError, match=r"^config\.rollout\.mode: .*no RolloutMode "
                     "'fixed_figures'"):
    modes.rollout_mode(config("tests.rollout.test_modes:fixed_figures"))
  with pytest.raises(ConfigError, match=r"^config\.rollout\.mode: .*does not import"):
    modes.rollout_mode(config("tests.rollout.no_such_module:REPLAY"))


def test_a_built_in_is_never_replaced_and_a_users_name_is():
  with pytest.raises(ValueError, match="'groups' is a built-in rollout mode"):
    modes.register_rollout_mode(modes.RolloutMode(name="groups", build=build_replay))
  assert modes.register_rollout_mode(REPLAY) is REPLAY  # the same record again: no change
  other = modes.register_rollout_mode(modes.RolloutMode(name="replay", build=build_replay))
  try:  # a notebook cell run again replaces the user's record
    assert modes.MODES["replay"] is other
  finally:
    modes.register_rollout_mode(REPLAY)


@pytest.mark.parametrize("mode, field, changes", [
    ("windows", "rollout.max_staleness", {"max_staleness": 1}),
    ("offline", "rollout.max_staleness", {"max_staleness": 1}),
    ("replay", "rollout.max_staleness", {"max_staleness": 1}),
    ("dynamic", "rollout.group_size", {"group_size": 1}),
    ("replay", "rollout.group_size", {"group_size": 2}),  # the registered mode's own rule
])
def test_a_modes_rules_name_the_field(mode, field, changes):
  c = config(mode)
  for key, value in changes.items():
    c.rollout[key] = value
  with pytest.raises(ConfigError, match="^" + re.escape(f"config.{field}: invalid value")):
    modes.validate_mode(c)


def test_the_whole_validation_accepts_a_registered_mode_and_asks_its_record():
  validate_config(config("replay"), num_devices=1)
  validate_config(config("tests.rollout.test_modes:REPLAY"), num_devices=1)
  c = config("replay")
  c.rollout.max_staleness = 1
  with pytest.raises(ConfigError, match=r"config\.rollout\.max_staleness: invalid value 1: "
                     "must be 0 for rollout.mode='replay'"):
    validate_config(c, num_devices=1)


# ------------------------------------------------------------------ through the loop


def test_the_run_builds_a_registered_mode_and_takes_its_evaluator():
  """training/build.py builds the replay through its record (no model: the arith task's
  tokenizer, no sampler) and evaluates with the record's evaluator."""
  from rlhf_jax.tasks import arith
  from rlhf_jax.training import build
  from rlhf_jax.training import inputs
  c = config("replay")
  c.rollout.prompts_per_step, c.rollout.max_new_tokens = 2, 8
  c.data.num_train, c.data.num_eval = 4, 3
  tokenizer = arith.tokenizer()
  prefix = [tokenizer.backend.token_to_id(t) for t in arith.PROMPT_PREFIX]
  policy = types.SimpleNamespace(tokenizer=tokenizer,
                                 prompts=build.prompt_format(c, tokenizer, prefix))
  train, held_out = inputs.load_examples(c)
  scorer = RewardRouter({"arith": never_right}, correct_score=1.0, wrong_score=0.0)
  parts = build.rollout_parts(c, policy, None, scorer, train)
  BUILT.clear()
  rollout = build.build_rollout(c, parts)
  first, second = rollout.collect(), rollout.collect()
  assert len(BUILT) == 1 and BUILT[0].collected == 2
  assert first.batch.scores.tolist() == second.batch.scores.tolist() == SCORES * 2
  assert first.correct == [True, False, True, False] * 2
  figures = build.build_evaluator(c, parts, held_out, scorer)(samples=1, temperature=0.0)
  assert figures["accuracy"] == EVAL_ACCURACY and figures["prompts"] == 3


@pytest.mark.slow
def test_a_registered_mode_trains_through_the_loop_with_its_own_evaluator(tmp_path):
  from rlhf_jax.training import loop
  from rlhf_jax.training import stages
  c = config("replay")
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.sft.steps, c.sft.batch_size = 3, 8
  c.data.num_train, c.data.num_eval = 16, 4
  c.rollout.prompts_per_step, c.rollout.max_new_tokens = 2, 64  # the demonstrations fit
  c.sampler.num_slots, c.sampler.cache_length, c.sampler.warmup = 4, 64 + 64, False
  c.train.steps, c.train.eval_every, c.train.loggers = 2, 2, ""
  stages.ensure_arith_warm_start(c, str(tmp_path), log=lambda line: None)
  BUILT.clear()
  # Never called in training: the replay's groups come scored.
  scorer = RewardRouter({"arith": never_right}, correct_score=1.0, wrong_score=0.0)
  summary = loop.Trainer(c, str(tmp_path), log=lambda line: None, scorer=scorer).run()
  assert len(BUILT) == 1 and BUILT[0].collected == 2  # one replay, one batch per step
  assert summary["steps"] == 2
  # Held-out accuracy is the mode's evaluator's, before and after training.
  assert summary["eval_accuracy_start"] == summary["eval_accuracy_end"] == EVAL_ACCURACY


def test_dynamic_sampling_reads_only_the_samples_that_count():
  from rlhf_jax.data import Example
  from rlhf_jax.rollout.generation import Group
  from rlhf_jax.rollout.groups import has_signal

  def group(scores, correct, scored=None):
    n = len(scores)
    return Group(example=Example("q", "a", "t"), prompt_ids=[1], responses=[[2]] * n,
                 logprobs=[[0.0]] * n, scores=scores, correct=correct,
                 truncated=[False] * n, failures=[""] * n, scored=scored)

  # A dropped sample's stand-in 0 is no signal: the scored ones are all 1.
  assert has_signal(group([1.0, 0.0, 1.0], [True, False, True]), "reward")
  assert not has_signal(group([1.0, 0.0, 1.0], [True, False, True], [True, False, True]),
                        "reward")
  assert not has_signal(group([1.0, 0.0, 1.0], [True, False, True], [True, False, True]),
                        "accuracy")
  assert has_signal(group([1.0, 0.0, 0.5], [True, False, False], [True, False, True]),
                    "reward")
  assert not has_signal(group([1.0, 0.0], [True, False], [False, False]), "accuracy")


def test_packed_groups_carry_which_samples_count():
  from tests.rollout.scripted_groups import group
  from rlhf_jax.rollout.generation import pack_groups
  kept, dropped = group([True, False]), group([True, True])
  dropped.scored = [False, True]
  batch = pack_groups([kept, dropped], prompt_length=2, response_length=3, pad_id=0).batch
  assert batch.scored.tolist() == [True, True, False, True]
