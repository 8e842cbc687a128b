"""How far generation runs ahead of the learner, decided once (`rollout.max_staleness`).

    plan = LookAhead.of(config)            k, partial rollouts, the last step
    sampler = plan.sampler(raw, params)    k = 0: `raw`; k > 0: a VersionedSampler that
                                           keeps the k + 1 newest versions
    rollout = plan.rollout(mode, sampler, scorer)
                                           a PipelinedRollout running k steps ahead, over
                                           the sampler this plan built (refused otherwise)

The versioned sampler and the look-ahead rollout must agree on k: a sampler keeping
fewer than k + 1 versions drops the weights a job in flight was pinned to. Both are
built here from one k, and the rest of the run (the multi-process and fleet rules of
training/) asks the plan whether generation is synchronous rather than reading the
config again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlhf_jax.rollout.pipelined import PipelinedRollout
from rlhf_jax.sampling.protocol import PreparesParams
from rlhf_jax.sampling.versioned import VersionedSampler


@dataclasses.dataclass(frozen=True)
class LookAhead:
  """Generation up to `steps` policy versions ahead of the learner (module docstring).

  Attributes:
    steps: k ≥ 0 (`rollout.max_staleness`); 0 is the synchronous loop.
    partial: new weights reach the samples in flight (`rollout.partial_rollouts`).
    last_step: no job is submitted for this step or later (`train.steps`).
  """
  steps: int = 0
  partial: bool = False
  last_step: int | None = None

  def __post_init__(self):
    if not isinstance(self.steps, int) or self.steps < 0:
      raise ValueError(f"LookAhead.steps={self.steps!r} must be an int >= 0.")
    if self.partial and not self.steps:
      raise ValueError("LookAhead.partial needs steps >= 1 (weights change in flight only "
                       "while generation runs ahead).")

  @classmethod
  def of(cls, c) -> LookAhead:
    """The plan of a run's config (`rollout.max_staleness`, `rollout.partial_rollouts`,
    `train.steps`); the config's validation has checked the values."""
    return cls(steps=c.rollout.max_staleness, partial=bool(c.rollout.partial_rollouts),
               last_step=c.train.steps)

  @property
  def synchronous(self) -> bool:
    """Whether each batch is generated inline, by the newest weights (k = 0)."""
    return not self.steps

  @property
  def keep(self) -> int:
    """Weight versions a sampler keeps: the newest and the k older ones a job in flight
    may be pinned to."""
    return self.steps + 1

  def sampler(self, inner, params: Any, *, version: int = 0):
    """`inner` (synchronous), else a VersionedSampler over it keeping `keep` versions,
    starting from `params` as `version` (prepared first when `inner` PreparesParams:
    a job of several processes keeps local copies, a server host ones)."""
    if self.synchronous:
      return inner
    if isinstance(inner, PreparesParams):
      params = inner.prepare_params(params)
    return VersionedSampler(inner, params, version=version, keep=self.keep,
                            partial=self.partial)

  def rollout(self, inner, sampler, scorer) -> PipelinedRollout:
    """The rollout mode `inner` run `steps` ahead over `sampler`, which must keep the
    versions this plan's jobs are pinned to (a sampler from `self.sampler`; the
    PipelinedRollout refuses another with a ValueError); each job takes the scorer's
    metrics."""
    return PipelinedRollout(inner, None if self.synchronous else sampler, scorer,
                            max_staleness=self.steps, last_step=self.last_step)
