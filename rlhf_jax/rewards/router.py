"""Scoring samples by task with rule-based verifiers, never crashing the loop.

A verifier is `fn(response_text, answer) -> bool | float`. The router is a
`Scorer` (rewards/scorer.py): it runs the verifier of each example's task per
sample in a worker thread with a timeout; a verifier that raises or times out
gives that sample `failure_score` and a recorded reason, and the run goes on.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Mapping, Sequence

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.tasks import arith

Verifier = Callable[[str, str], "bool | float"]

BUILTIN_VERIFIERS: dict[str, Verifier] = {arith.TASK: arith.verify}


class RewardRouter:
  """A `Scorer` that routes each sample to its task's verifier.

  Args:
    verifiers: task name → verifier (default: the built-in tasks).
    correct_score, wrong_score: rewards of boolean verdicts (DAPO: +1 / −1).
    failure_score: reward of a sample whose verifier raised or timed out.
    timeout_s: per-sample limit.
    max_workers: verifier threads.
  """

  def __init__(self, verifiers: Mapping[str, Verifier] | None = None, *,
               correct_score: float = 1.0, wrong_score: float = 0.0,
               failure_score: float = 0.0, timeout_s: float = 5.0, max_workers: int = 4):
    self.verifiers = dict(BUILTIN_VERIFIERS if verifiers is None else verifiers)
    self.correct_score = correct_score
    self.wrong_score = wrong_score
    self.failure_score = failure_score
    self.timeout_s = timeout_s
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers,
                                                       thread_name_prefix="verifier")

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task that has no verifier."""
    unknown = sorted(set(tasks) - set(self.verifiers))
    if unknown:
      raise ValueError(f"no verifier for task(s) {unknown}; known: {sorted(self.verifiers)}.")

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Scores `responses[i]` against `examples[i].answer` with its task's verifier."""
    if len(examples) != len(responses):
      raise ValueError(f"{len(examples)} examples for {len(responses)} responses.")
    self.check_tasks([e.task for e in examples])
    futures = [self._pool.submit(self.verifiers[e.task], response, e.answer)
               for e, response in zip(examples, responses)]
    scores, correct, failures = [], [], []
    for future in futures:
      try:
        verdict = future.result(timeout=self.timeout_s)
      except concurrent.futures.TimeoutError:
        scores.append(self.failure_score), correct.append(False), failures.append("timeout")
        continue
      except Exception as error:  # a verifier bug must not end the run
        scores.append(self.failure_score)
        correct.append(False)
        failures.append(f"error: {error!r}")
        continue
      if isinstance(verdict, bool):
        scores.append(self.correct_score if verdict else self.wrong_score)
        correct.append(verdict)
      else:
        scores.append(float(verdict))
        correct.append(float(verdict) > 0)
      failures.append("")
    return Scores(scores, correct, failures)
