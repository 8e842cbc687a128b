"""Rollout modes as records: `rollout_mode(c)` is the one place that reads `rollout.mode`.

A `RolloutMode` says how the mode builds its rollout (`build(c, parts) -> Rollout`, from
the run's `RolloutParts`), its batch's response columns, what it needs (an environment, a
critic), whether generation may run ahead of the learner, whether it trains on fixed data
(no sampling), how held-out evaluation runs for it, and its own rules. The rest of the
library asks the record (`rollout_mode(c).needs_environment`, ...), never the mode's name
(tests/test_layout.py).

Built-in: "groups", "dynamic" (DAPO), "windows" (T-PPO), "multi_turn" (episodes with the
`env` section's environment) and "offline" (labelled groups from a file). A new mode is
`register_rollout_mode(RolloutMode(name=..., build=...))` from any module imported before
the config is validated, or `rollout.mode = "package.module:NAME"` naming a RolloutMode.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import ml_collections

from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import unfit
from rlhf_jax.data import CurriculumStream
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.data import parse_curriculum
from rlhf_jax.data import read_labelled
from rlhf_jax.envs import EnvironmentRunner
from rlhf_jax.envs.config import turn_end_id
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Registry
from rlhf_jax.registry import Section
from rlhf_jax.rollout.base import Rollout
from rlhf_jax.rollout.config import sampling_params
from rlhf_jax.rollout.evaluation import evaluate_episodes
from rlhf_jax.rollout.evaluation import evaluate_policy
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.groups import DynamicSamplingRollout
from rlhf_jax.rollout.groups import GroupRollout
from rlhf_jax.rollout.multi_turn import MultiTurnRollout
from rlhf_jax.rollout.offline import encode_groups
from rlhf_jax.rollout.offline import offline_rollout
from rlhf_jax.rollout.windows import WindowRollout

Evaluate = Callable[..., dict[str, float]]  # evaluate(samples=, temperature=, seed=) -> figures


@dataclasses.dataclass
class RolloutParts:
  """The run's pieces a mode builds its rollout and its evaluator from.

  Attributes:
    policy: the starting policy: `model`, `params`, `tokenizer`, `prompts` (the run's
      PromptFormat) — training/build.py's `Policy`.
    sampler: the run's sampler (a mode on fixed data leaves it alone).
    scorer: the training scorer.
    examples: the training prompts (the stream's data).
    step_end_ids: the PRM's step-end tokens (`reward.process`), or None.
    pairs: the learner reads chosen/rejected pairs (its registry spec's `pairs`).
    offline_path: the labelled data file (mode 'offline').
    log: progress lines.
  """
  policy: Any
  sampler: Any
  scorer: Any
  examples: Sequence[Example] = ()
  step_end_ids: frozenset[int] | None = None
  pairs: bool = False
  offline_path: str = ""
  log: Callable[[str], None] = print
  _generator: GroupGenerator | None = dataclasses.field(default=None, init=False, repr=False)
  _runner: EnvironmentRunner | None = dataclasses.field(default=None, init=False, repr=False)

  def generator(self, c: ml_collections.ConfigDict) -> GroupGenerator:
    """The one GroupGenerator of the run (training sampling of the `rollout` section):
    the rollout and the evaluator share it."""
    if self._generator is None:
      stop = (self.policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
      self._generator = GroupGenerator(self.sampler, self.scorer, self.policy.prompts,
                                       sampling=sampling_params(c.rollout, stop), seed=c.seed,
                                       step_end_ids=self.step_end_ids)
    return self._generator

  def stream(self, c: ml_collections.ConfigDict):
    """A resumable stream of `examples`: `data.curriculum`'s phases, or one seeded order."""
    if c.data.curriculum:
      return CurriculumStream(list(self.examples), parse_curriculum(c.data.curriculum),
                              seed=c.seed, shuffle=c.data.shuffle)
    return PromptStream(list(self.examples), seed=c.seed, shuffle=c.data.shuffle)

  def environments(self, c: ml_collections.ConfigDict) -> EnvironmentRunner:
    """The one set of environment workers (`env` section): training episodes and
    evaluation episodes run on it."""
    if self._runner is None:
      self._runner = EnvironmentRunner.from_config(c.env)
    return self._runner

  def close(self) -> None:
    """Stops the environment workers, if any were started (a rollout's `close` does too)."""
    if self._runner is not None:
      self._runner.close()


def new_tokens(c: ml_collections.ConfigDict) -> int:
  """R = `rollout.max_new_tokens` (a mode whose responses are one sample each)."""
  return c.rollout.max_new_tokens


def per_sample_evaluator(c: ml_collections.ConfigDict, parts: RolloutParts,
                         held_out: Sequence[Example], scorer) -> Evaluate:
  """One response per sample (`evaluate_policy`) from the run's sampler, capped at
  `rollout.max_new_tokens`."""
  return functools.partial(evaluate_policy, parts.sampler, parts.policy.prompts, held_out,
                           scorer, max_new_tokens=c.rollout.max_new_tokens)


@dataclasses.dataclass(frozen=True)
class RolloutMode:
  """A rollout mode (module docstring).

  Attributes:
    name: its `rollout.mode`.
    build: `(c, parts: RolloutParts) -> Rollout` (rollout/base.py), the mode's own rollout
      (the run adds the sampler-side reference and the look-ahead around it).
    response_length: `c -> R`, the batch's response columns.
    needs_environment: episodes with the `env` section's environment (whose episode rules
      then apply: envs/config.py).
    allows_staleness: generation may run ahead of the learner (`rollout.max_staleness`).
    needs_critic: its advantages need a critic (T-PPO's Extended GAE).
    fixed_data: it trains on the labelled groups of `data.offline_file` (or the warm
      start's, labelled first: training/stages.py), sampling nothing: no look-ahead, no
      reference from the sampler, and the learners' offline rules apply (DPO, DQO).
    filters_groups: it keeps only the groups whose rewards (or correctness) vary, as
      dynamic sampling does: a reward that every group varies in (pure distillation's
      per-token teacher term) leaves it nothing to filter.
    drops_unscored: its rows come from scored groups of whole responses
      (`generation.pack_groups`), so a sample no reward function scored can leave
      training (`reward.unscored = "drop"`).
    carries_routes: its rows bring the sampler's recorded experts of a mixture-of-experts
      policy (`RolloutBatch.routes`), which routing replay R3 and the route flip rate read
      (`algorithm.moe`).
    learners: learners that train from it besides those whose registry spec lists it.
    evaluator: `(c, parts, held_out, scorer) -> evaluate(samples=, temperature=, seed=)`.
    check_data: `(c, prompts, *, pairs) -> None`: the files it reads, checked before any
      work (ConfigError naming the field), or None.
    validate: `c -> None`: its own rules (ConfigError naming the field), or None.
  """
  name: str
  build: Callable[[ml_collections.ConfigDict, RolloutParts], Rollout]
  response_length: Callable[[ml_collections.ConfigDict], int] = new_tokens
  needs_environment: bool = False
  allows_staleness: bool = True
  needs_critic: bool = False
  fixed_data: bool = False
  filters_groups: bool = False
  drops_unscored: bool = False
  carries_routes: bool = False
  learners: tuple[str, ...] = ()
  evaluator: Callable[..., Evaluate] = per_sample_evaluator
  check_data: Callable[..., None] | None = None
  validate: Callable[[ml_collections.ConfigDict], None] | None = None


# The table of `rollout.mode` (a name, or "package.module:NAME" of a RolloutMode).
MODES: Registry[RolloutMode] = Registry("rollout mode", "rollout.mode", RolloutMode,
                                        what="RolloutMode")


def register_rollout_mode(mode: RolloutMode) -> RolloutMode:
  """Makes `rollout.mode = mode.name` run `mode` (`MODES.register`). As for every registry,
  registering a name again replaces it (re-running a notebook cell); the built-in modes
  cannot be replaced."""
  if not isinstance(mode, RolloutMode):
    raise TypeError(f"register_rollout_mode takes a RolloutMode, not {type(mode).__name__}")
  return MODES.register(mode.name, mode)


def rollout_mode(c: ml_collections.ConfigDict) -> RolloutMode:
  """The record of `c.rollout.mode`: a registered name, or "package.module:NAME" naming a
  RolloutMode (imported here: `MODES.resolve`). ConfigError naming `rollout.mode`
  otherwise."""
  return MODES.resolve(c.rollout.mode)


def rewarded_by_environment(c: ml_collections.ConfigDict) -> bool:
  """Whether the environment's rewards alone are the episode's reward: a mode that runs
  episodes (`needs_environment`) with `env.verifier=False`. No task scorer is then ever
  called, so a row of any task name needs none: the one rule the data check
  (training/inputs.check_tasks), the trainer and the `env` section's checks follow."""
  return rollout_mode(c).needs_environment and not c.env.verifier


def response_length(c: ml_collections.ConfigDict) -> int:
  """R, the batch's response columns of the run's mode."""
  return rollout_mode(c).response_length(c)


def check_mode_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The rollout mode's rules in the trainer's config (`validate_mode`)."""
  del checking
  validate_mode(c)


# A rule, after the sections a built-in mode's `validate` reads.
SECTION = Section("rollout mode", check=check_mode_section, after=("rollout", "reward"))


def validate_mode(c: ml_collections.ConfigDict) -> None:
  """The mode's rules (ConfigError naming the field): staleness only where generation may
  run ahead, then the mode's own `validate`."""
  mode = rollout_mode(c)
  if c.rollout.max_staleness and not mode.allows_staleness:
    ahead = ", ".join(m.name for m in MODES.values() if m.allows_staleness)
    invalid("rollout.max_staleness", c.rollout.max_staleness, f"must be 0 for rollout.mode="
            f"{mode.name!r} (generation ahead of the learner: modes {ahead})")
  if mode.validate is not None:
    mode.validate(c)


# ---------------------------------------------------------------- the built-in modes

def _groups(c, parts: RolloutParts) -> Rollout:
  return GroupRollout(parts.generator(c), parts.stream(c),
                      prompts_per_step=c.rollout.prompts_per_step,
                      response_length=c.rollout.max_new_tokens)


def _dynamic(c, parts: RolloutParts) -> Rollout:
  r = c.rollout
  return DynamicSamplingRollout(parts.generator(c), parts.stream(c),
                                prompts_per_step=r.prompts_per_step,
                                response_length=r.max_new_tokens,
                                oversample=r.dynamic.oversample,
                                max_rounds=r.dynamic.max_rounds,
                                keep_surplus=r.dynamic.keep_surplus,
                                max_age=r.dynamic.max_age,
                                signal=r.dynamic.signal)


def _validate_dynamic(c) -> None:
  if c.rollout.group_size < 2:
    invalid("rollout.group_size", c.rollout.group_size, "must be >= 2 for rollout.mode="
            "'dynamic' (it keeps groups whose rewards or correctness vary)")


def _windows(c, parts: RolloutParts) -> Rollout:
  r = c.rollout
  return WindowRollout(parts.generator(c), parts.stream(c), prompts_per_step=r.prompts_per_step,
                       group_size=r.group_size, window_tokens=r.windows.window_tokens,
                       response_length=r.max_new_tokens)


def _validate_windows(c) -> None:
  # The prompt buckets a continued response needs (prompt + tokens so far) are fitted with
  # the sampler's other sizes: training/config.py's fit_sampler_sizes.
  if c.reward.process.checkpoint:
    invalid("reward.process.checkpoint", c.reward.process.checkpoint, "must be empty with "
            "rollout.mode='windows' (not supported)")


def _episodes(c, parts: RolloutParts, stream) -> MultiTurnRollout:
  """Episodes over the run's generator and environment workers (`stream`: None for
  evaluation, which runs given examples)."""
  r, env = c.rollout, c.env
  generator = parts.generator(c)
  return MultiTurnRollout(
      generator, stream, parts.environments(c), prompts_per_step=r.prompts_per_step,
      group_size=r.group_size, max_turns=env.max_turns, max_tokens=env.max_tokens,
      reward_placement=env.reward_placement, verifier=env.verifier,
      turn_end_id=turn_end_id(env, generator.tokenizer), failure_score=c.reward.failure_score,
      max_chars_per_token=env.max_chars_per_token)


def _episode_evaluator(c, parts: RolloutParts, held_out: Sequence[Example], scorer
                       ) -> Evaluate:
  """Whole episodes with the run's environment and limits (`evaluate_episodes`), on the
  training rollout's environment workers."""
  return functools.partial(evaluate_episodes, _episodes(c, parts, None), held_out, scorer)


def _offline(c, parts: RolloutParts) -> Rollout:
  return offline_rollout(c, parts.policy, parts.offline_path, log=parts.log, pairs=parts.pairs)


def _check_offline_file(c, prompts, *, pairs: bool) -> None:
  """Every labelled group of `data.offline_file` encodes (when given; the arith warm start
  writes one otherwise)."""
  if not c.data.offline_file:
    return
  try:
    encode_groups(read_labelled(c.data.offline_file), prompts,
                  response_length=c.rollout.max_new_tokens, group_size=c.rollout.group_size,
                  pairs=pairs)
  except (OSError, ValueError) as error:
    unfit("data.offline_file", str(error))


register_rollout_mode(RolloutMode(name="groups", build=_groups, drops_unscored=True,
                                  carries_routes=True))
register_rollout_mode(RolloutMode(name="dynamic", build=_dynamic, validate=_validate_dynamic,
                                  filters_groups=True, drops_unscored=True,
                                  carries_routes=True))
register_rollout_mode(RolloutMode(name="windows", build=_windows, allows_staleness=False,
                                  needs_critic=True, validate=_validate_windows))
register_rollout_mode(RolloutMode(
    name="multi_turn", build=lambda c, parts: _episodes(c, parts, parts.stream(c)),
    response_length=lambda c: c.env.max_tokens, needs_environment=True,
    evaluator=_episode_evaluator, carries_routes=True))
register_rollout_mode(RolloutMode(name="offline", build=_offline, allows_staleness=False,
                                  fixed_data=True, check_data=_check_offline_file))
for _mode in tuple(MODES.values()):  # the five above: the library's own, never replaced
  MODES.register(_mode.name, _mode, built_in=True)
BUILT_IN = MODES.built_ins()
