"""The built-in `pycalc` task: arith word problems answered by a Python program.

The problems are arith's (tasks/arith.py); the response is a tiny program that must
leave the result in `x`, e.g. `x=47+385`. The code verifier runs it in the sandbox
(rewards/code.py) against the example's `answer`, the test `assert x == 432`, in its safe
default mode: the program runs in one sandbox and the test in a trusted harness in
another, which receives `x` as plain data, so the program can neither see the expected
value nor forge the verdict (docs/sandbox.md).
So an RL run calls the sandbox once per sample: hundreds of times per step, with
whatever programs the policy writes. The program needs no characters beyond arith's
alphabet, so the task shares its tokenizer and tiny model.
"""

from __future__ import annotations

from rlhf_jax.tasks import arith

TASK = "pycalc"


def program(problem: arith.Problem) -> str:
  """The demonstration: one assignment of the problem's expression to `x`."""
  return f"x={problem.a}{problem.op}{problem.b}"


def tests(value: int) -> str:
  """The test a program must pass: its `x` equals the problem's answer."""
  return f"assert x == {value}"


def examples(seed: int, count: int, levels: tuple[int, ...] = (1, 2, 3),
             weights: tuple[float, ...] | None = None) -> list:
  """`count` generated problems as `rlhf_jax.data.Example`s (answer = the test)."""
  from rlhf_jax.data import Example
  out = []
  for problem in arith.generate(seed, count, levels, weights):
    record = problem.to_json()
    out.append(Example(prompt=problem.prompt, answer=tests(problem.answer), task=TASK,
                       metadata={**record["metadata"], "value": problem.answer,
                                 "solution": program(problem)}))
  return out
