"""Scoring samples by task: rule verifiers in killable workers, and a router of scorers.

A rule verifier is a module-level `fn(response_text, answer) -> Judgement | bool |
float` (rewards/math.py's `verify`, tasks/arith.py's `verify`). `VerifierScorer`
runs them in worker processes with a per-sample deadline (sandbox/workers.py): one
that raises, hangs or crashes its worker gives that sample `failure_score` and a
recorded reason, and the run goes on. `RewardRouter` dispatches each example to the
`Scorer` of its task (verifiers, the code sandbox, later reward models) and keeps
per-task accuracy, failure rate and time for the metrics.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time
from typing import Callable, Mapping, Sequence

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Judgement
from rlhf_jax.rewards.scorer import NO_ANSWER
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import gather_scores
from rlhf_jax.rewards.scorer import guarded_score
from rlhf_jax.sandbox.workers import KillablePool
from rlhf_jax.tasks import registry
from rlhf_jax.rewards.scorer import ScorerBase

LOG = logging.getLogger("rlhf_jax.rewards")

Verifier = Callable[[str, str], "Judgement | bool | float"]


def has_verifier(task: str) -> bool:
  """Whether `router_for_tasks` has a rule scorer for `task` (a registered task:
  tasks/registry.py)."""
  return registry.is_known(task)


def rule_verifiers(tasks=None) -> dict[str, Verifier]:
  """task → verifier of the registered tasks scored by a plain rule (of `tasks`, or all);
  a task that registers its answer extraction (`Task.extract`) has it run beside the
  verifier (`judge_with_answer`)."""
  names = registry.scored_by("verifier", registry.known_tasks() if tasks is None else tasks)
  out = {}
  for name in names:
    task = registry.get_task(name)
    out[name] = (task.verifier if task.extract is None else
                 functools.partial(judge_with_answer, task.verifier, task.extract))
  return out


def judge_with_answer(verifier: Verifier, extract: Callable[[str], "str | None"],
                      response: str, answer: str):
  """`verifier(response, answer)` as a Judgement carrying `extract(response)`, the final
  answer the response gives (maj@k's vote); a verdict that is not a Judgement, bool or
  number is returned as it is (the scorer reports it)."""
  value = verifier(response, answer)
  judgement = _as_judgement(value)
  if judgement is None or judgement.extracted is not None:
    return value
  found = extract(response)
  reason = NO_ANSWER if found is None and not judgement.correct else judgement.reason
  return dataclasses.replace(judgement, reason=reason, extracted=found)


class VerifierScorer(ScorerBase):
  """A `Scorer` running rule verifiers (task → function) in killable worker processes.

  Args:
    verifiers: task name → module-level verifier function.
    correct_score: reward of a True verdict (DAPO: +1).
    wrong_score: reward of a False verdict (DAPO: −1).
    failure_score: reward of a sample whose verifier raised, hung or crashed.
    timeout_s: per-sample limit.
    max_workers: worker processes.
  """

  def __init__(self, verifiers: Mapping[str, Verifier], *, correct_score: float = 1.0,
               wrong_score: float = 0.0, failure_score: float = 0.0, timeout_s: float = 5.0,
               max_workers: int = 2):
    for task, fn in verifiers.items():
      KillablePool.check_picklable(fn, task)
    self.verifiers = dict(verifiers)
    self.correct_score, self.wrong_score = correct_score, wrong_score
    self.failure_score = failure_score
    # Each worker imports the verifiers' modules while it starts (under the pool's start-up
    # limit), so a module that is slow to import (jax, on a busy machine) does not spend a
    # sample's `timeout_s` and fail it.
    self._pool = KillablePool(max_workers, timeout_s,
                              initializer=(receive_verifiers, (tuple(verifiers.values()),)))

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task that has no verifier."""
    unknown = sorted(set(tasks) - set(self.verifiers))
    if unknown:
      raise ValueError(f"no verifier for task(s) {unknown}; known: {sorted(self.verifiers)}.")

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Runs each sample's task verifier; see the class docstring."""
    self.check_tasks([e.task for e in examples])
    results = self._pool.map([(self.verifiers[e.task], (str(response), e.answer))
                              for e, response in zip(examples, responses, strict=True)])
    out = Scores([], [], [], reasons=[])
    for status, value in results:
      if status == "ok":
        judgement = _as_judgement(value)
      if status != "ok" or judgement is None:
        failure = ("timeout" if status == "timeout" else
                   f"error: {value}" if status == "error" else
                   f"verifier returned {type(value).__name__}, not a Judgement/bool/float")
        out.append(self.failure_score, False, failure, failure)
        continue
      score = judgement.score
      if score is None:
        score = self.correct_score if judgement.correct else self.wrong_score
      out.append(score, judgement.correct, "", judgement.reason, judgement.extracted)
    return out

  def close(self) -> None:
    """Stops the worker processes."""
    self._pool.close()


def receive_verifiers(verifiers: Sequence[Verifier]) -> None:
  """A verifier worker's initializer: receiving the functions (unpickled by reference)
  imports their modules, before the worker takes calls."""
  del verifiers


def _as_judgement(value) -> Judgement | None:
  if isinstance(value, Judgement):
    return value
  if isinstance(value, bool):
    return Judgement(value, "" if value else "wrong answer")
  if isinstance(value, (int, float)):
    return Judgement(float(value) > 0, "", float(value))
  return None


class RewardRouter(ScorerBase):
  """A `Scorer` that sends each example to the scorer of its task.

  Args:
    verifiers: task → rule verifier, run by one VerifierScorer (default: the built-in
      tasks; pass {} for none).
    scorers: task → any other `Scorer` (code sandbox, reward model); wins over verifiers.
      One that is not a `Scorer` is refused (TypeError) before any worker starts.
    correct_score: the VerifierScorer's `correct_score`.
    wrong_score: the VerifierScorer's `wrong_score`.
    failure_score: the VerifierScorer's `failure_score`.
    timeout_s: the VerifierScorer's `timeout_s`.
    max_workers: the VerifierScorer's `max_workers`.
  """

  def __init__(self, verifiers: Mapping[str, Verifier] | None = None, *,
               scorers: Mapping[str, Scorer] | None = None, correct_score: float = 1.0,
               wrong_score: float = 0.0, failure_score: float = 0.0, timeout_s: float = 5.0,
               max_workers: int = 2):
    for task, scorer in (scorers or {}).items():  # before any worker starts
      if not isinstance(scorer, Scorer):
        raise TypeError(f"scorers[{task!r}]: a {type(scorer).__name__} is not a Scorer "
                        "(score, check_tasks, pop_metrics, close; ScorerBase gives the last "
                        "two)")
    verifiers = dict(rule_verifiers() if verifiers is None else verifiers)
    self.failure_score = failure_score
    self.scorers: dict[str, Scorer] = {}
    if verifiers:
      rules = VerifierScorer(verifiers, correct_score=correct_score, wrong_score=wrong_score,
                             failure_score=failure_score, timeout_s=timeout_s,
                             max_workers=max_workers)
      self.scorers.update({task: rules for task in verifiers})
    self.scorers.update(scorers or {})
    self._totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self._first_failure: dict[str, str] = {}

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task that no scorer handles."""
    unknown = sorted(set(tasks) - set(self.scorers))
    if unknown:
      raise ValueError(f"no scorer for task(s) {unknown}; known: {sorted(self.scorers)}.")

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Scores `responses[i]` against `examples[i]` with its task's scorer."""
    if len(examples) != len(responses):
      raise ValueError(f"{len(examples)} examples for {len(responses)} responses.")
    self.check_tasks([e.task for e in examples])
    by_scorer: dict[int, list[int]] = collections.defaultdict(list)
    for i, example in enumerate(examples):
      by_scorer[id(self.scorers[example.task])].append(i)
    parts: dict[int, tuple[int, Scores]] = {}
    for rows in by_scorer.values():
      scorer = self.scorers[examples[rows[0]].task]
      start = time.monotonic()
      scored = guarded_score(scorer, [examples[i] for i in rows], [responses[i] for i in rows],
                             failure_score=self.failure_score)
      seconds = (time.monotonic() - start) / len(rows)
      for position, i in enumerate(rows):
        parts[i] = (position, scored)
        self._count(examples[i].task, scored, position, seconds)
    return gather_scores(parts, len(examples))

  def _count(self, task: str, scored: Scores, position: int, seconds: float) -> None:
    totals = self._totals[task]
    totals["samples"] += 1
    totals["correct"] += bool(scored.correct[position])
    totals["failures"] += bool(scored.failures[position])
    totals["seconds"] += seconds
    if scored.failures[position] and task not in self._first_failure:
      self._first_failure[task] = scored.failures[position]

  def pop_metrics(self) -> dict[str, float]:
    """Per task since the last call: accuracy, failure rate, scoring seconds (as
    time_reward/<task>: wall clock, like time_generate). Logs one line per task whose
    scorer failed on some samples, with the count and the first reason."""
    out = {}
    for task, t in sorted(self._totals.items()):
      if t["failures"]:
        LOG.warning("the scorer of task %s failed on %d of %d samples: %s", task,
                    t["failures"], t["samples"], self._first_failure.get(task, "")[:300])
      out[f"reward/{task}/accuracy"] = t["correct"] / t["samples"]
      out[f"reward/{task}/failure_rate"] = t["failures"] / t["samples"]
      out[f"time_reward/{task}"] = t["seconds"]
      out[f"reward/{task}/samples"] = float(t["samples"])
    self._totals.clear()
    self._first_failure.clear()
    return out

  def close(self) -> None:
    """Stops worker processes of the scorers that have them."""
    for scorer in {id(s): s for s in self.scorers.values()}.values():
      scorer.close()


def router_for_tasks(tasks: Sequence[str], *, correct_score: float = 1.0,
                     wrong_score: float = 0.0, failure_score: float = 0.0,
                     timeout_s: float = 5.0, workers: int = 2, math_extractor: str = "auto",
                     sandbox_timeout_s: float = 5.0, sandbox_memory_mb: int = 512,
                     sandbox_workers: int | None = None,
                     sandbox_isolation: str = "namespaces") -> RewardRouter:
  """The router of the rule scorers that `tasks` need, by the task table (tasks/registry.py):
  the registered verifiers, math's equivalence (`math` needs math-verify) and the code
  sandbox for the 'sandbox' tasks ('code', 'pycalc').

  Raises:
    ImportError: math-verify is missing for a 'math' task.
    rewards.sandbox.SandboxUnavailable: a code task, and the sandbox cannot start here.
  """
  tasks = set(tasks)
  verifiers = rule_verifiers()
  math_tasks = registry.scored_by("math", tasks)
  if math_tasks:
    from rlhf_jax.rewards import math as math_lib  # pylint: disable=import-outside-toplevel
    math_lib.check_extractor(math_extractor)
    verifiers.update({t: functools.partial(math_lib.verify, extractor=math_extractor)
                      for t in math_tasks})
  scores = dict(correct_score=correct_score, wrong_score=wrong_score)
  scorers = {}
  code_tasks = registry.scored_by("sandbox", tasks)
  if code_tasks:
    from rlhf_jax.rewards import code  # pylint: disable=import-outside-toplevel
    from rlhf_jax.sandbox import jobs as sandbox  # pylint: disable=import-outside-toplevel
    sandbox.check_isolation(sandbox_isolation)
    scorer = code.CodeScorer(code_tasks, timeout_s=sandbox_timeout_s,
                             memory_mb=sandbox_memory_mb, max_workers=sandbox_workers,
                             isolation=sandbox_isolation, **scores)
    scorers.update({task: scorer for task in code_tasks})
  return RewardRouter(verifiers, scorers=scorers, failure_score=failure_score,
                      timeout_s=timeout_s, max_workers=workers, **scores)
