"""How far generation runs ahead of the learner, decided once (`rollout.max_staleness`).

    plan = LookAhead.of(config)            k, partial rollouts, the last step
    sampler = plan.sampler(raw, params)    k = 0: `raw`; k > 0: a VersionedSampler that
                                           keeps the k + 1 newest versions
    rollout = plan.rollout(mode, sampler, scorer)
                                           k = 0: the mode itself, each batch with its
                                           scorer metrics (SynchronousRollout); k > 0: a
                                           PipelinedRollout running k steps ahead, over
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

from rlhf_jax.config_errors import invalid
from rlhf_jax.rollout.generation import Rollouts
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

  def rollout(self, inner, sampler, scorer) -> SynchronousRollout | PipelinedRollout:
    """The rollout mode `inner` as this plan runs it: inline (`SynchronousRollout`, k = 0),
    or `steps` ahead over `sampler`, which must keep the versions this plan's jobs are
    pinned to (a sampler from `self.sampler`; the PipelinedRollout refuses another with a
    ValueError). Either way each batch takes the scorer's metrics of its own scoring."""
    if self.synchronous:
      return SynchronousRollout(inner, scorer)
    return PipelinedRollout(inner, sampler, scorer, max_staleness=self.steps,
                            last_step=self.last_step)


class SynchronousRollout:
  """k = 0: the rollout mode's own calls, inline, with each batch's scorer metrics.

  `collect` is the mode's `collect` plus the scorer's per-task figures of that batch
  (accuracy, failures, time), as a PipelinedRollout's job takes them; `restore` refuses
  a checkpoint of a run that generated ahead (its stored batches would be dropped).
  Everything else is the mode's.

  Args:
    inner: the rollout mode (with the sampler-side reference around it, if any).
    scorer: the inner rollout's scorer.
  """

  def __init__(self, inner, scorer):
    self.inner, self.scorer = inner, scorer

  def collect(self) -> Rollouts:
    """The mode's batch, with the scorer's metrics of its scoring."""
    rollouts = self.inner.collect()
    rollouts.metrics.update(self.scorer.pop_metrics())
    return rollouts

  def set_step(self, step: int) -> None:
    """The mode's."""
    self.inner.set_step(step)

  def pop_mix(self) -> dict[str, int]:
    """The mode's."""
    return self.inner.pop_mix()

  def state(self) -> dict[str, Any]:
    """The mode's (a run ahead may resume from it: PipelinedRollout.restore)."""
    return self.inner.state()

  def restore(self, state: dict[str, Any]) -> None:
    """The mode's `restore`; ConfigError naming rollout.max_staleness for a checkpoint
    holding batches generated ahead (a PipelinedRollout's `state`)."""
    if "pending" in state:
      invalid("rollout.max_staleness", 0, f"the checkpoint holds {len(state['pending'])} "
              "batches generated ahead; resume with the run's rollout.max_staleness > 0")
    self.inner.restore(state)

  def settle(self) -> None:
    """The mode's (nothing runs ahead of it here)."""
    self.inner.settle()

  def close(self) -> None:
    """The mode's."""
    self.inner.close()
