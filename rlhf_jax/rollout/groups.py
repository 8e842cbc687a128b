"""Rollout modes over whole responses: plain groups, and DAPO's dynamic sampling.

Both produce `prompts_per_step` groups of G scored samples per step. Dynamic
sampling (DAPO arXiv:2503.14476 §3.2) keeps only groups whose correctness varies
(0 < #correct < G, the groups with a learning signal), over-samples to find
them, and keeps the surplus in a buffer for the next step.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from rlhf_jax.data import PromptStream
from rlhf_jax.rollout.generation import Group
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import pack_groups


class NoSignalError(RuntimeError):
  """Dynamic sampling found no group with varying correctness for too many rounds."""


class GroupRollout:
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
  whose correctness varies; rounds repeat until the step has `prompts_per_step`
  groups; the surplus waits in a buffer for the next step (verl's behaviour).

  Args:
    oversample: prompts per round, as a multiple of prompts_per_step (verl 3×).
    max_rounds: fruitless rounds in a row before `NoSignalError`.
    (others as GroupRollout)
  """

  def __init__(self, generator: GroupGenerator, stream: PromptStream, *,
               prompts_per_step: int, response_length: int, oversample: int,
               max_rounds: int):
    super().__init__(generator, stream, prompts_per_step=prompts_per_step,
                     response_length=response_length)
    self.oversample = oversample
    self.max_rounds = max_rounds
    self.buffer: collections.deque[Group] = collections.deque()

  def next_groups(self) -> tuple[list[Group], dict[str, float]]:
    wanted = self.prompts_per_step
    kept: list[Group] = []
    while self.buffer and len(kept) < wanted:
      kept.append(self.buffer.popleft())
    generated = qualified = rounds = fruitless = correct = samples = 0
    while len(kept) < wanted:
      groups = self.generator.generate_groups(self.stream.take(wanted * self.oversample))
      rounds += 1
      generated += len(groups)
      correct += sum(sum(g.correct) for g in groups)
      samples += sum(len(g.correct) for g in groups)
      good = [g for g in groups if 0 < sum(g.correct) < len(g.correct)]
      qualified += len(good)
      fruitless = 0 if good else fruitless + 1
      if fruitless >= self.max_rounds:
        raise NoSignalError(
            f"dynamic sampling: {fruitless} generation rounds in a row gave no group whose "
            f"correctness varies (rollout.dynamic.max_rounds={self.max_rounds}); the data is "
            "too easy or too hard for the policy.")
      kept.extend(good)
    self.buffer.extend(kept[wanted:])
    metrics = {"generation_rounds": float(rounds), "buffered_groups": float(len(self.buffer))}
    if generated:  # a step served from the buffer alone generated nothing
      metrics.update(accuracy_all_generated=correct / samples,
                     kept_groups_ratio=qualified / generated)
    return kept[:wanted], metrics

  def state(self) -> dict[str, Any]:
    return {**super().state(), "buffer": [dataclasses.asdict(g) for g in self.buffer]}

  def restore(self, state: dict[str, Any]) -> None:
    super().restore(state)
    self.buffer = collections.deque(Group.from_json(g) for g in state["buffer"])
