"""Environments in killable worker processes, like the verifiers (rewards/workers.py).

An environment's `reset` and `step` are user code: one that hangs, raises or returns
something malformed must end its own episode with a recorded reason, never the run. Each
call runs in a worker process of a `KillablePool` within `env.timeout_s`; the environment
object travels with the call and comes back with its new state (so it must be picklable),
which lets a killed worker take nothing with it but the call it was running.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from rlhf_jax.envs.base import StepResult
from rlhf_jax.envs.base import load_factory
from rlhf_jax.rewards.workers import KillablePool


@dataclasses.dataclass
class Outcome:
  """One episode's call: the environment after it (None once failed), the call's result
  (the first observation of `start`, the StepResult of `step`), and why it failed ("" if
  it did not)."""
  env: Any
  result: Any
  failure: str = ""


def _start(factory_path: str, example) -> tuple[Any, str]:
  """Worker: a new environment from the factory, reset on `example`."""
  env = load_factory(factory_path)()
  observation = env.reset(example)
  if not isinstance(observation, str):
    raise TypeError(f"reset returned {type(observation).__name__}, not str")
  return env, observation


def _step(env, action: str) -> tuple[Any, StepResult]:
  """Worker: one step of `env`, its result checked."""
  result = env.step(action)
  if not isinstance(result, StepResult):
    raise TypeError(f"step returned {type(result).__name__}, not rlhf_jax.envs.StepResult")
  for field in ("observation", "role"):
    if not isinstance(getattr(result, field), str):
      raise TypeError(f"StepResult.{field} is {type(getattr(result, field)).__name__}, "
                      "not str")
  if not isinstance(result.reward, (int, float)) or not math.isfinite(result.reward):
    raise TypeError(f"StepResult.reward={result.reward!r} is not a finite number")
  return env, dataclasses.replace(result, reward=float(result.reward), done=bool(result.done))


class EnvironmentRunner:
  """Starts and steps many episodes' environments in worker processes.

  Args:
    factory_path: "package.module:callable" returning a new environment (`env.factory`);
      checked here, before any work.
    workers: worker processes.
    timeout_s: limit of one reset or step call.
  """

  def __init__(self, factory_path: str, *, workers: int, timeout_s: float):
    load_factory(factory_path)
    self.factory_path = factory_path
    self.pool = KillablePool(workers, timeout_s)

  def start(self, examples: Sequence[Any]) -> list[Outcome]:
    """Per example, a new environment and its first observation."""
    return self._run([(_start, (self.factory_path, e)) for e in examples])

  def step(self, envs: Sequence[Any], actions: Sequence[str]) -> list[Outcome]:
    """Per environment, its StepResult for the model's turn `actions[i]`."""
    if len(envs) != len(actions):
      raise ValueError(f"{len(envs)} environments and {len(actions)} actions")
    return self._run([(_step, (env, action)) for env, action in zip(envs, actions)])

  def _run(self, calls) -> list[Outcome]:
    out = []
    for status, value in self.pool.map(calls):
      if status == "ok":
        out.append(Outcome(*value))
      elif status == "timeout":
        out.append(Outcome(None, None, f"timeout after {self.pool.timeout_s:g} s"))
      else:
        out.append(Outcome(None, None, value))
    return out

  def close(self) -> None:
    """Stops the workers."""
    self.pool.close()
