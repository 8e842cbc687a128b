"""Environments in killable worker processes, like the verifiers (sandbox/workers.py).

An environment's `reset` and `step` are user code: one that hangs, raises, returns
something malformed, floods its observation or its memory must end its own episode with a
recorded reason, never the run. Each call runs in a worker process of a `KillablePool`
within `env.timeout_s`; the environment object travels with the call and comes back with
its new state (so it must be picklable), which lets a killed worker take nothing with it
but the call it was running.

The worker cuts an observation to the characters the rollout allows it (`max_chars`, from
the row's remaining token budget) before it returns, so a 20 MB tool output costs the
trainer neither its pickling nor its tokenisation. Each worker leads a process group that
dies with it and has its memory watched (sandbox/worker_groups.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from rlhf_jax.envs.base import StepResult
from rlhf_jax.envs.base import load_factory
from rlhf_jax.sandbox import worker_groups
from rlhf_jax.sandbox.reward_values import finite_in_float32
from rlhf_jax.sandbox.workers import GroupPool


@dataclasses.dataclass
class Outcome:
  """One episode's call: the environment after it (None once failed), the call's result
  (the first observation of `start`, the StepResult of `step`; its observation cut to
  `max_chars`), why it failed ("" if it did not), the failure's kind (a short key for
  metrics: "timeout", "memory", "worker_died", "non_finite_reward", or the exception's
  class in snake case), and how many characters of the observation were cut."""
  env: Any
  result: Any
  failure: str = ""
  kind: str = ""
  cut: int = 0


class NonFiniteReward(ValueError):
  """A StepResult whose reward is not a number that stays finite in float32."""


def _cut(observation: str, max_chars: int | None) -> tuple[str, int]:
  """`observation` cut to `max_chars` characters, and how many were dropped."""
  if max_chars is None or len(observation) <= max_chars:
    return observation, 0
  return observation[:max(0, max_chars)], len(observation) - max(0, max_chars)


def _start(factory_path: str, example, max_chars: int | None = None) -> tuple[Any, str, int]:
  """Worker: a new environment from the factory, reset on `example`; its observation cut."""
  env = load_factory(factory_path)()
  observation = env.reset(example)
  if not isinstance(observation, str):
    raise TypeError(f"reset returned {type(observation).__name__}, not str")
  return (env, *_cut(observation, max_chars))


def _step(env, action: str, max_chars: int | None = None) -> tuple[Any, StepResult, int]:
  """Worker: one step of `env`, its result checked and its observation cut."""
  result = env.step(action)
  if not isinstance(result, StepResult):
    raise TypeError(f"step returned {type(result).__name__}, not rlhf_jax.envs.StepResult")
  for field in ("observation", "role"):
    if not isinstance(getattr(result, field), str):
      raise TypeError(f"StepResult.{field} is {type(getattr(result, field)).__name__}, "
                      "not str")
  if not finite_in_float32(result.reward):
    raise NonFiniteReward(f"StepResult.reward={result.reward!r} is not a number finite "
                          "in float32")
  observation, cut = _cut(result.observation, max_chars)
  return env, dataclasses.replace(result, observation=observation, reward=float(result.reward),
                                  done=bool(result.done)), cut


def _snake(name: str) -> str:
  return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class EnvironmentRunner:
  """Starts and steps many episodes' environments in worker processes.

  Args:
    factory_path: "package.module:callable" returning a new environment (`env.factory`);
      checked here, before any work.
    workers: worker processes.
    timeout_s: limit of one reset or step call.
    memory_mb: a worker's resident memory limit, with the processes its environment
      started (0: none); past it the worker is replaced and its call fails ("memory").
  """

  def __init__(self, factory_path: str, *, workers: int, timeout_s: float,
               memory_mb: int = 0):
    load_factory(factory_path)
    self.factory_path = factory_path
    self.memory_mb = memory_mb
    # Each worker imports the factory's module as it starts: a slow import is start-up,
    # never the first reset's time (`timeout_s` bounds the calls only).
    self.pool = GroupPool(workers, timeout_s, memory_mb=memory_mb,
                          initializer=(load_factory, (factory_path,)))

  @classmethod
  def from_config(cls, e) -> "EnvironmentRunner":
    """The runner of the `env` config section (envs/config.py)."""
    return cls(e.factory, workers=e.workers, timeout_s=e.timeout_s,
               memory_mb=e.worker_memory_mb)

  def start(self, examples: Sequence[Any], max_chars: Sequence[int] | None = None
            ) -> list[Outcome]:
    """Per example, a new environment and its first observation (cut to `max_chars[i]`
    characters; None: not cut)."""
    limits = [None] * len(examples) if max_chars is None else list(max_chars)
    return self._run([(_start, (self.factory_path, e, m)) for e, m in zip(examples, limits)])

  def step(self, envs: Sequence[Any], actions: Sequence[str],
           max_chars: Sequence[int] | None = None) -> list[Outcome]:
    """Per environment, its StepResult for the model's turn `actions[i]`, the observation
    cut to `max_chars[i]` characters (None: not cut)."""
    if len(envs) != len(actions):
      raise ValueError(f"{len(envs)} environments and {len(actions)} actions")
    limits = [None] * len(envs) if max_chars is None else list(max_chars)
    return self._run([(_step, (env, action, m))
                      for env, action, m in zip(envs, actions, limits)])

  def _run(self, calls) -> list[Outcome]:
    out = []
    for status, value in self.pool.map(calls):
      if status == "ok":
        out.append(Outcome(value[0], value[1], cut=value[2]))
      elif status == "timeout":
        out.append(Outcome(None, None, f"timeout after {self.pool.timeout_s:g} s", "timeout"))
      elif value.startswith(f"worker died (exit code {worker_groups.MEMORY_EXIT_CODE})"):
        out.append(Outcome(None, None, f"memory: the worker passed env.worker_memory_mb="
                           f"{self.memory_mb} MB", "memory"))
      elif value.startswith("worker died"):
        out.append(Outcome(None, None, value, "worker_died"))
      else:
        out.append(Outcome(None, None, value, _snake(value.partition(":")[0])))
    return out

  def close(self) -> None:
    """Stops the workers."""
    self.pool.close()
