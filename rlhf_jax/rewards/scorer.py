"""The `Scorer` seam: what turns decoded responses into rewards.

A scorer is given the examples (prompt, answer, task, metadata) and the decoded
responses, one response per example (repeat an example for its G samples), and
returns `Scores`. The rule-based `RewardRouter` is one scorer; reward models,
generative judges and code sandboxes are others. A scorer never raises for a bad
sample: the sample gets a failure score and a recorded reason, and the loop goes on.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Protocol
from typing import Sequence
from typing import runtime_checkable

import numpy as np

from rlhf_jax.data import Example


@dataclasses.dataclass(frozen=True)
class Judgement:
  """One rule verifier's verdict on one response.

  Attributes:
    correct: whether the response's answer is right.
    reason: "" when correct, else why not ("no answer found", "not equivalent: 1/2 vs 0.4").
    score: an explicit reward, or None to let the scorer map `correct` to its
      correct / wrong scores (DAPO's ±1, or 1/0).
    extracted: the final answer the verifier read from the response (None: none found,
      or the verifier does not say): maj@k's vote (rollout/eval_stats.py). Not part of
      the verdict: two Judgements are equal whatever text their answers were read from.
  """
  correct: bool
  reason: str = ""
  score: float | None = None
  extracted: str | None = dataclasses.field(default=None, compare=False)


# The reason of a response in which the verifier found no final answer: counted as
# eval/no_answer_rate (rollout/evaluation.py), never a silent wrong answer.
NO_ANSWER = "no answer found"


@dataclasses.dataclass
class Scores:
  """What a scorer returns for N responses.

  Attributes:
    scores: [N] the sequence-level reward of each response.
    correct: [N] whether the response is judged correct (accuracy metrics,
      DAPO's dynamic sampling, VAPO's positive examples).
    failures: [N] "" or why scoring itself failed ("timeout", "error: ...",
      "scorer error: ..."): the sample got the failure score.
    step_scores: optional, per response its process rewards in step order (a PRM's
      score of each step; rewards/prm.py): the rollout places step k's reward at the
      token that ends step k (`prm.step_end_positions`).
    reasons: optional [N] "" or why a response is not correct ("no answer found",
      "test failed: ..."); a failure's reason is the failure.
    extracted: optional [N] the final answer a verifier read from each response (None
      where it read none); the evaluation's majority vote (maj@k) reads it.
    scored: optional [N] False for a sample no reward scored that leaves training
      (`reward.unscored = "drop"`: `RolloutBatch.scored`); None: every sample counts.
  """
  scores: list[float]
  correct: list[bool]
  failures: list[str]
  step_scores: list[list[float]] | None = None
  reasons: list[str] | None = None
  extracted: list[str | None] | None = None
  scored: list[bool] | None = None

  def __post_init__(self):
    lengths = {len(self.scores), len(self.correct), len(self.failures)}
    for optional in (self.step_scores, self.reasons, self.extracted, self.scored):
      if optional is not None:
        lengths.add(len(optional))
    if len(lengths) != 1:
      raise ValueError(f"Scores fields have different lengths: {sorted(lengths)}.")

  def reason(self, i: int) -> str:
    """Why sample i is not correct ("" if it is, or if the scorer gave no reasons)."""
    if self.reasons is not None:
      return self.reasons[i]
    return self.failures[i]

  def answer(self, i: int) -> str | None:
    """The final answer read from sample i (None if none, or the scorer reads none)."""
    return self.extracted[i] if self.extracted is not None else None

  def append(self, score: float, correct: bool, failure: str, reason: str,
             extracted: str | None = None, *, scored: bool = True) -> None:
    """Adds one sample (scorers that build their result one sample at a time)."""
    self.scores.append(float(score))
    self.correct.append(bool(correct))
    self.failures.append(failure)
    if self.reasons is None:
      self.reasons = [""] * (len(self.scores) - 1)
    self.reasons.append(reason)
    if self.extracted is None and extracted is not None:
      self.extracted = [None] * (len(self.scores) - 1)
    if self.extracted is not None:
      self.extracted.append(extracted)
    if self.scored is None and not scored:
      self.scored = [True] * (len(self.scores) - 1)
    if self.scored is not None:
      self.scored.append(bool(scored))


class Completion(str):
  """A decoded response that also carries the token ids it was sampled as (a scorer that
  needs them, e.g. a reward function's `completion_ids`, reads `token_ids`; any other
  scorer sees the text)."""

  def __new__(cls, text: str, token_ids):
    out = super().__new__(cls, text)
    out.token_ids = [int(i) for i in token_ids]
    return out

  def __reduce__(self):  # pickles as the same text with its ids (checkpoints, workers)
    return (Completion, (str(self), self.token_ids))


@runtime_checkable
class Scorer(Protocol):
  """Scores decoded responses against their examples (see the module docstring)."""

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Scores `responses[i]` as an answer to `examples[i]`."""
    ...

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task this scorer cannot score (before training)."""
    ...

  def pop_metrics(self) -> dict[str, float]:
    """The scorer's own metrics since the last call (per-task accuracy, failure rate,
    time); {} for scorers that keep none."""
    ...

  def close(self) -> None:
    """Releases workers, sandboxes and engines."""
    ...


class ScorerBase:
  """Defaults for a `Scorer` that keeps no metrics and holds nothing to release."""

  def pop_metrics(self) -> dict[str, float]:
    """No metrics of its own."""
    return {}

  def close(self) -> None:
    """Nothing to release."""




class FailureStreak:
  """Counts the steps in a row in which every sample's reward failed, and says when
  there have been `limit` (`reward.max_failed_steps`; 0: never): a run whose reward
  cannot be computed stops, naming the reason, instead of training on failure scores.
  """

  def __init__(self, limit: int):
    self.limit, self.steps = limit, 0

  def update(self, samples: int, failures: Sequence[str]) -> str | None:
    """After a step of `samples` scored samples with these failure reasons (non-empty
    ones): None, or the one-line reason to stop."""
    failed = [f for f in failures if f]
    if not samples:  # nothing finished (T-PPO windows): no evidence either way
      return None
    self.steps = self.steps + 1 if len(failed) >= samples else 0
    if not self.limit or self.steps < self.limit:
      return None
    return (f"every sample's reward failed in {self.steps} steps in a row "
            f"(reward.max_failed_steps={self.limit}); the first reason: {failed[0][:300]}")


def failed_scores(count: int, failure: str, failure_score: float) -> Scores:
  """`count` samples that all failed for the same reason."""
  return Scores([failure_score] * count, [False] * count, [failure] * count,
                reasons=[failure] * count)


def guarded_score(scorer: Scorer, examples: Sequence[Example], responses: Sequence[str], *,
                  failure_score: float, what: str = "scorer") -> Scores:
  """`scorer.score(...)`; a scorer that raises costs its samples a recorded failure
  ("<what> error: ..."), not the run."""
  try:
    return scorer.score(examples, responses)
  except Exception as error:  # pylint: disable=broad-except
    return failed_scores(len(examples), f"{what} error: {type(error).__name__}: {error}"[:300],
                         failure_score)


def gather_scores(parts: dict[int, tuple[int, Scores]], count: int) -> Scores:
  """The Scores of samples 0..count−1 from per-part results: sample i is row
  `parts[i][0]` of `parts[i][1]` (what routers assemble after scoring by group)."""
  out = Scores([], [], [], reasons=[])
  for i in range(count):
    position, scored = parts[i]
    out.append(scored.scores[position], scored.correct[position], scored.failures[position],
               scored.reason(position), scored.answer(position))
  return out
