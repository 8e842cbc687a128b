"""The `Rollout` seam: how a step's training rows are produced.

    rollouts = rollout.collect()      sample (any Sampler) and score (any Scorer), or read
    rollout.set_step(step)            the data's phase (a curriculum) for the next collect
    rollout.pop_mix()                 tasks drawn since the last call (for metrics)
    rollout.state() / restore(state)  JSON-able: data position, buffers, samples in flight
    rollout.settle()                  finish generation running ahead (rollout/pipelined.py)
    rollout.close()                   stop it at the end of a run

Modes: plain groups, DAPO's dynamic sampling, T-PPO's windows, multi-turn episodes,
offline data, or a registered one (rollout/modes.py: each mode's record builds it). The
data position and the curriculum phase live behind this seam, so the loop never touches
the stream.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rlhf_jax.rollout.generation import Rollouts


@runtime_checkable
class Rollout(Protocol):
  """What the loop needs of a rollout mode (see the module docstring)."""

  def collect(self) -> Rollouts:
    """One step's packed rows (`Rollouts.batch`) with their host metrics."""

  def set_step(self, step: int) -> None:
    """Tells the data source the training step (a curriculum's phase)."""

  def pop_mix(self) -> dict[str, int]:
    """Examples drawn per task since the last call."""

  def state(self) -> dict[str, Any]:
    """JSON-able state for checkpoints."""

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""

  def settle(self) -> None:
    """Returns once no generation runs in the background (before evaluation)."""

  def close(self) -> None:
    """Stops what runs in the background (the end of a run)."""


class StreamRollout:
  """`set_step` and `pop_mix` of a rollout that draws from `self.stream` (a
  PromptStream or CurriculumStream)."""

  stream: Any

  def set_step(self, step: int) -> None:
    """Forwards the training step to the stream (a curriculum's phase)."""
    self.stream.set_step(step)

  def pop_mix(self) -> dict[str, int]:
    """The stream's examples drawn per task since the last call."""
    return self.stream.pop_mix()

  def settle(self) -> None:
    """Nothing runs in the background: generation happens inside `collect`."""

  def close(self) -> None:
    """Nothing runs in the background."""
