"""Environments for the tests: importable by module path, as `env.factory` names them."""

import time

from rlhf_jax.envs import StepResult


class Countdown:
  """Counts the model's turns; its state (the count, the turns seen) lives on the object,
  so it must survive the trip to a worker and back."""

  def __init__(self, turns: int = 3):
    self.turns, self.seen = turns, []

  def reset(self, example):
    return f"count to {self.turns} ({example})"

  def step(self, action):
    self.seen.append(action)
    done = len(self.seen) >= self.turns
    return StepResult(observation=f" turn {len(self.seen)} of {self.turns}: {self.seen}",
                      reward=float(len(self.seen)), done=done)


class Raising(Countdown):
  def step(self, action):
    raise RuntimeError(f"the tool broke on {action!r}")


class Hanging(Countdown):
  def step(self, action):
    time.sleep(600)


class Malformed(Countdown):
  def step(self, action):
    return {"observation": "not a StepResult"}


class NaNReward(Countdown):
  def step(self, action):
    return StepResult(reward=float("nan"))


NOT_CALLABLE = 3
