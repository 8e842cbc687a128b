"""Rollout modes over whole responses: plain groups, and DAPO's dynamic sampling.

Both produce `prompts_per_step` groups of G scored samples per step. Dynamic
sampling (DAPO arXiv:2503.14476 §3.2) keeps only the groups with a learning signal and
over-samples to find them: by default those whose rewards are not all equal (verl's
std > 0: a group-relative advantage is zero on a group of equal rewards, whatever the
reward is made of), or, with signal 'accuracy', those whose correctness varies
(0 < #correct < G, the paper's rule; the verifier's verdict or a function's "acc"). Surplus qualified groups are discarded, as in verl's DAPO recipe, so every
trained row was sampled by the current policy; keeping them for later steps
(OpenRLHF's variant) is the `keep_surplus` option, whose stale rows `prepare`
corrects by decoupled PPO (docs/formulas.md#decoupled-ppo).
"""

from __future__ import annotations

import collections
from typing import Any

from rlhf_jax.data import PromptStream
from rlhf_jax.rollout.generation import Group
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import pack_groups
from rlhf_jax.rollout.base import StreamRollout


class NoSignalError(RuntimeError):
  """Dynamic sampling found no group with a learning signal for too many rounds."""


def has_signal(group: Group, signal: str) -> bool:
  """Whether dynamic sampling keeps `group`: the rewards of its samples that count
  (`Group.scored`) are not all equal (`signal` 'reward'), or their correctness varies
  ('accuracy')."""
  counts = group.scored or [True] * len(group.scores)
  if signal == "reward":
    return len({s for s, c in zip(group.scores, counts) if c}) > 1
  if signal == "accuracy":
    correct = [k for k, c in zip(group.correct, counts) if c]
    return 0 < sum(correct) < len(correct)
  raise ValueError(f"signal={signal!r}: must be 'reward' or 'accuracy'.")


class GroupRollout(StreamRollout):
  """`prompts_per_step` fresh groups per step (rollout.mode = "groups").

  Args:
    generator: samples and scores groups.
    stream: the resumable prompt stream.
    prompts_per_step: groups per step.
    response_length: R, the response cap (the batch's response columns).
  """

  def __init__(self, generator: GroupGenerator, stream: PromptStream, *,
               prompts_per_step: int, response_length: int):
    self.generator = generator
    self.stream = stream
    self.prompts_per_step = prompts_per_step
    self.response_length = response_length

  def next_groups(self) -> tuple[list[Group], dict[str, float]]:
    """The step's groups and the mode's metrics."""
    return self.generator.generate_groups(self.stream.take(self.prompts_per_step)), {}

  def collect(self) -> Rollouts:
    """Samples, scores and packs one step's rollouts."""
    groups, metrics = self.next_groups()
    rollouts = pack_groups(groups, prompt_length=self.generator.prompt_length,
                           response_length=self.response_length,
                           pad_id=self.generator.tokenizer.pad_id)
    rollouts.metrics.update(metrics)
    return rollouts

  def state(self) -> dict[str, Any]:
    """JSON-able state for checkpoints."""
    return {"stream": self.stream.state(), "generator": self.generator.state()}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.stream.restore(state["stream"])
    self.generator.restore(state["generator"])


class DynamicSamplingRollout(GroupRollout):
  """DAPO's dynamic sampling (rollout.mode = "dynamic").

  Each round samples `oversample × prompts_per_step` prompts and keeps the groups
  with a learning signal (`has_signal`); rounds repeat until the step has `prompts_per_step`
  groups. By default the surplus qualified groups of the last round are discarded:
  verl's `batch = batch[:train_batch_size · n]` (recipe/dapo), so every trained group
  is on-policy. With `keep_surplus` the surplus waits in a buffer for later steps
  (OpenRLHF's variant): those groups were sampled by an older policy (their rows
  carry its version, and `prepare` corrects them by decoupled PPO), and a buffered
  group more than `max_age` policy versions old is dropped unused.

  Args:
    oversample: prompts per round, as a multiple of prompts_per_step (verl 3×).
    max_rounds: fruitless rounds in a row before `NoSignalError`.
    keep_surplus: keep surplus groups for later steps (False: discard, verl).
    max_age: with keep_surplus, the oldest a buffered group may be when it is used,
      in policy versions (1: only the previous step's surplus).
    signal: 'reward' (rewards not all equal; verl) or 'accuracy' (correctness varies).

  The other arguments are GroupRollout's.
  """

  def __init__(self, generator: GroupGenerator, stream: PromptStream, *,
               prompts_per_step: int, response_length: int, oversample: int,
               max_rounds: int, keep_surplus: bool = False, max_age: int = 1,
               signal: str = "reward"):
    super().__init__(generator, stream, prompts_per_step=prompts_per_step,
                     response_length=response_length)
    self.oversample = oversample
    self.max_rounds = max_rounds
    self.keep_surplus = keep_surplus
    self.max_age = max_age
    if signal not in ("reward", "accuracy"):
      raise ValueError(f"signal={signal!r}: must be 'reward' or 'accuracy'.")
    self.signal = signal
    self.buffer: collections.deque[Group] = collections.deque()
    self.version = 0  # the policy version sampling now: the training step

  def set_step(self, step: int) -> None:
    """The training step, which is also the sampler's policy version (the loop pushes
    the weights learned in step s − 1 as version s): buffered groups age against it."""
    self.version = step
    super().set_step(step)

  def take_buffered(self, wanted: int) -> tuple[list[Group], dict[str, float]]:
    """Up to `wanted` buffered groups, oldest first, after dropping those older than
    `max_age` versions; and the buffer's metrics."""
    fresh_enough = [g for g in self.buffer if self.version - g.version <= self.max_age]
    expired = len(self.buffer) - len(fresh_enough)
    reused, rest = fresh_enough[:wanted], fresh_enough[wanted:]
    self.buffer = collections.deque(rest)
    ages = [self.version - g.version for g in reused]
    return reused, {"expired_groups": float(expired), "reused_groups": float(len(reused)),
                    "reused_group_age_mean": float(sum(ages) / len(ages)) if ages else 0.0,
                    "reused_group_age_max": float(max(ages, default=0))}

  def next_groups(self) -> tuple[list[Group], dict[str, float]]:
    wanted = self.prompts_per_step
    kept, metrics = self.take_buffered(wanted)
    generated = qualified = rounds = fruitless = correct = samples = failed = 0
    first_failure = ""
    while len(kept) < wanted:
      groups = self.generator.generate_groups(self.stream.take(wanted * self.oversample))
      # Without set_step (a caller other than the loop) the newest sample tells the version.
      self.version = max([self.version] + [g.version for g in groups])
      rounds += 1
      generated += len(groups)
      correct += sum(sum(g.correct) for g in groups)
      samples += sum(len(g.correct) for g in groups)
      reasons = [f for g in groups for f in g.failures if f]
      failed += len(reasons)
      first_failure = first_failure or (reasons[0] if reasons else "")
      good = [g for g in groups if has_signal(g, self.signal)]
      qualified += len(good)
      fruitless = 0 if good else fruitless + 1
      if fruitless >= self.max_rounds:
        raise NoSignalError(
            f"dynamic sampling: {fruitless} generation rounds in a row gave no group whose "
            f"{'rewards' if self.signal == 'reward' else 'correctness'} varied "
            f"(rollout.dynamic.signal={self.signal!r}, rollout.dynamic.max_rounds="
            f"{self.max_rounds}); "
            + (f"{failed} of {samples} samples' rewards failed, the first: {first_failure[:300]}"
               if failed else "the data is too easy or too hard for the policy."))
      kept.extend(good)
    surplus = kept[wanted:]
    if self.keep_surplus:
      self.buffer.extend(surplus)
    metrics.update(generation_rounds=float(rounds), buffered_groups=float(len(self.buffer)),
                   discarded_surplus_groups=0.0 if self.keep_surplus else float(len(surplus)))
    if generated:  # a step served from the buffer alone generated nothing
      metrics.update(accuracy_all_generated=correct / samples,
                     kept_groups_ratio=qualified / generated)
    return kept[:wanted], metrics

  def state(self) -> dict[str, Any]:
    """JSON-able state: GroupRollout's and the buffered groups (with their versions)."""
    return {**super().state(), "buffer": [g.to_json() for g in self.buffer]}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    super().restore(state)
    self.buffer = collections.deque(Group.from_json(g) for g in state["buffer"])
