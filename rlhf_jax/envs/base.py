"""The `Environment` seam of multi-turn rollouts (`rollout.mode='multi_turn'`).

    env = factory()                       one new environment per sample (episode)
    observation = env.reset(example)      text appended after the prompt ("" for none)
    result = env.step(action)             action: the decoded text of the model's turn
                                          → StepResult(observation, reward, done)

The rollout keeps the episode's tokens itself (token-in/token-out): the model's tokens as
sampled, each observation tokenised once and appended; the environment sees text only.
Environments run in killable worker processes (envs/runner.py), so they must be picklable:
their state travels with each call.
"""

from __future__ import annotations

import dataclasses
import collections.abc
from typing import Any, Callable, Protocol, runtime_checkable

from rlhf_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What an environment returns for one model turn.

  Attributes:
    observation: text appended after the model's turn (a tool's output, a user's reply);
      "" for none.
    reward: this step's reward (summed into the episode's, or placed at the end of the
      model's turn: `env.reward_placement`).
    done: the episode ends here.
    info: anything JSON-able to log with the rollout (e.g. the tool calls made).
    role: "" appends `observation` as it is; a role ("tool", "user") renders it as a turn
      of that role with the tokenizer's chat template (`Tokenizer.turn_suffix`), which
      also closes the model's turn and opens the next.
  """
  observation: str = ""
  reward: float = 0.0
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  role: str = ""


@runtime_checkable
class Environment(Protocol):
  """What a multi-turn rollout needs of an environment (see the module docstring)."""

  def reset(self, example) -> str:
    """The first observation for `example` (a `rlhf_jax.data.Example`), appended after the
    prompt; may be ""."""

  def step(self, action: str) -> StepResult:
    """Takes the decoded text of the model's turn; returns the next observation, this
    step's reward and whether the episode ends."""


# `env.factory`: named by "package.module:callable" only, since each environment worker
# (a spawned process) loads it again, where a name registered in the parent is unknown.
ENVIRONMENTS: Registry[Callable] = Registry("environment factory", "env.factory",
                                            collections.abc.Callable, what="callable",
                                            by_name=False)


def load_factory(path: str, field: str = "env.factory") -> Callable[[], Environment]:
  """The callable named by "package.module:callable" (`ENVIRONMENTS.resolve`).

  Raises:
    ConfigError: naming `field`, for a malformed path, a module that does not import, or
      a missing or non-callable attribute.
  """
  return ENVIRONMENTS.resolve(path, field)
