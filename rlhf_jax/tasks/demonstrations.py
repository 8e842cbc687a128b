"""The warm-start demonstrations of the arith and pycalc tasks: `make_batch(step)` for
`algorithms.sft.run_sft`, fresh problems every step (toolcalc's multi-turn ones are in
tasks/toolcalc.py). The task table (tasks/registry.py) names each task's."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlhf_jax.tasks import arith
from rlhf_jax.tasks import pycalc


def arith_sft_batches(tokenizer, *, seed: int, batch_size: int, levels, weights,
                      prompt_prefix: Sequence[int], prompt_length: int, response_length: int,
                      direct_fraction: float = 0.0, slip_rate: float = 0.0,
                      task: str = arith.TASK):
  """`make_batch(step)` for run_sft: fresh arith problems every step (never the eval set's
  seeds, which the caller keeps apart).

  A `direct_fraction` of the demonstrations give only the answer line
  (`Problem.direct_solution`) instead of the worked digit-serial solution: a
  demonstrator that is always right, but in a form the tiny student cannot imitate
  reliably. Which form to use is then the student's choice, and RL's to correct.
  A `slip_rate` makes the worked demonstrations those of a careless teacher who drops
  each incoming carry or borrow with that probability (`arith.slipped_solution`).
  For the `pycalc` task the demonstration is the program (`tasks/pycalc.program`).
  """
  from rlhf_jax.batch import encode_pairs  # pylint: disable=import-outside-toplevel

  def make_batch(step):
    problems = list(arith.generate(seed * 1_000_003 + step, batch_size, levels, weights))
    rng = np.random.default_rng([seed, step])
    direct = rng.random(batch_size) < direct_fraction
    if task == pycalc.TASK:
      solutions = [pycalc.program(p) for p in problems]
    else:
      solutions = [p.direct_solution if d else arith.slipped_solution(p, rng, slip_rate)
                   for p, d in zip(problems, direct)]
    return encode_pairs(tokenizer, [p.prompt for p in problems], solutions,
                        prompt_prefix=prompt_prefix, prompt_length=prompt_length,
                        response_length=response_length)

  return make_batch


def pycalc_sft_batches(tokenizer, **options):
  """`arith_sft_batches` with programs as the demonstrations (the pycalc task)."""
  return arith_sft_batches(tokenizer, task=pycalc.TASK, **options)
