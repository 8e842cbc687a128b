"""Groups made by hand (no sampler): a new prompt per group, its samples' correctness and
policy version; shared by the dynamic-sampling and pipelining tests."""

import itertools

from rlhf_jax.data import Example
from rlhf_jax.rollout import Group

PROMPTS = itertools.count()


def group(correct, version=0):
  """A group of a new prompt (groups compare by content)."""
  n = len(correct)
  return Group(Example(f"q{next(PROMPTS)}", "1", "arith"), [1], [[2]] * n, [[0.0]] * n,
               [1.0 if c else -1.0 for c in correct], list(correct), [False] * n, [""] * n,
               versions=[[version]] * n)


MIXED, SOLVED = [True, False], [True, True]
