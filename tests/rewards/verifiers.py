"""Verifiers for router tests. Module-level and light to import: the router runs them
in spawned worker processes, which import this module by name."""

import os
import time

from rlhf_jax.rewards.scorer import Judgement


def exact(response, answer):
  """Correct iff the response is the answer."""
  return Judgement(response == answer, "" if response == answer else "different")


def hangs(response, answer):
  time.sleep(60)
  return True


def raises(response, answer):
  raise KeyError("oops")


def kills_its_worker(response, answer):
  os._exit(3)


def returns_junk(response, answer):
  return ["not", "a", "verdict"]


def scaled(response, answer):
  """An explicit score: the response length."""
  return float(len(response))


def odd_length(response, answer):
  """Varied verdicts for an untrained model (trainer tests)."""
  return len(response) % 2 == 1
