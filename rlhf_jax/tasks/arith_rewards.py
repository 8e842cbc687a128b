"""Data for the arith task's reward models, made locally: preference pairs (a correct
worked solution over a slipped one) and judged responses (solutions of a careless
teacher with their verifier verdicts). The RM, PRM and judge launchers use them when
no data file is given."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.data import PreferencePair
from rlhf_jax.tasks import arith


def _problems(seed: int, levels, weights) -> Iterator[arith.Problem]:
  yield from arith.generate(seed, 10**9, tuple(levels), weights)


def preference_pairs(seed: int, count: int, levels=(1, 2), weights=None
                     ) -> list[PreferencePair]:
  """`count` pairs: chosen = the correct worked solution, rejected = the same problem
  solved by a teacher who drops every carry or borrow (problems where that changes
  nothing are skipped, so the rejected answer is always wrong)."""
  rng = np.random.default_rng([seed, 1])
  pairs = []
  for problem in _problems(seed, levels, weights):
    rejected = arith.slipped_solution(problem, rng, 1.0)
    if arith.verify(rejected, str(problem.answer)):
      continue
    pairs.append(PreferencePair(problem.prompt, problem.solution, rejected,
                                {"answer": str(problem.answer), "level": problem.level}))
    if len(pairs) == count:
      return pairs
  return pairs


def judged_responses(seed: int, count: int, levels=(1, 2), weights=None,
                     slip_rates=(0.0, 0.5, 1.0)) -> list[tuple[Example, str, bool]]:
  """`count` (example, response, correct) triples: solutions of a teacher whose slip
  rate is drawn from `slip_rates` per problem, judged by the arith verifier."""
  rng = np.random.default_rng([seed, 2])
  out = []
  for problem in _problems(seed, levels, weights):
    response = arith.slipped_solution(problem, rng, float(rng.choice(slip_rates)))
    example = Example(**problem.to_json())
    out.append((example, response, arith.verify(response, example.answer)))
    if len(out) == count:
      return out
  return out


def judged_with_references(seed: int, count: int, levels=(1, 2), weights=None,
                           slip_rates=(0.0, 0.5, 1.0)) -> list[tuple[Example, str, bool]]:
  """As `judged_responses`, each example also holding a reference response in
  `metadata["reference"]`: another careless-teacher solution of the same problem (right
  or wrong, as a best-of-N SFT sample can be). The verdict is still the response's own
  correctness: the judge learns to use the reference, not to copy it."""
  rng = np.random.default_rng([seed, 3])
  out = []
  for example, response, correct in judged_responses(seed, count, levels, weights, slip_rates):
    problem = arith.Problem(**{k: example.metadata[k] for k in ("a", "b", "op", "level")})
    reference = arith.slipped_solution(problem, rng, float(rng.choice(slip_rates)))
    metadata = dict(example.metadata, reference=reference)
    out.append((Example(example.prompt, example.answer, example.task, metadata), response,
                correct))
  return out


# The kinds of generated reward-model data (`reward_data`), by the function that makes them.
REWARD_DATA = {"pairs": preference_pairs, "judged": judged_responses,
               "judged_with_references": judged_with_references}


def reward_data(kind: str, seed: int, count: int) -> list:
  """`count` generated rows of `kind` (`REWARD_DATA`: preference pairs, judged responses,
  judged responses with references) of levels 1-2: the reward-model fits' default data
  (the task record's `reward_data`)."""
  if kind not in REWARD_DATA:
    raise ValueError(f"reward data kind {kind!r}; allowed: {', '.join(REWARD_DATA)}.")
  return list(REWARD_DATA[kind](seed, count))
