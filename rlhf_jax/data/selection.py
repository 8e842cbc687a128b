"""Pre-PPO prompt selection (Shen et al., "Exploring Data Scaling Trends and Effects in
Reinforcement Learning from Human Feedback", arXiv:2503.22230 §3; docs/formulas.md#hybrid-rewards):
before RL, score every candidate prompt by the current policy's samples and keep the hardest.

Scores are normalised per task (z-scores), so that a task whose reward scale or base
accuracy differs from another's does not take the whole selection; the lowest-scoring
`fraction` of all prompts is kept. The sampling and scoring is a callable, so any
sampler and any scorer (rule verifiers, a reward model) plug in; launch/select_prompts.py
wires the trainer's.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np

from rlhf_jax.data.jsonl import Example

# examples → per example, the scores of its samples
ScoreFn = Callable[[Sequence[Example]], Sequence[Sequence[float]]]


@dataclasses.dataclass(frozen=True)
class Scored:
  """One candidate prompt with its selection score.

  Attributes:
    example: the prompt.
    score: the mean score of the policy's samples for it.
    normalised: (score − its task's mean) / its task's std (0 when the task's scores
      are all equal).
  """
  example: Example
  score: float
  normalised: float


def normalise_per_task(tasks: Sequence[str], scores: Sequence[float]) -> np.ndarray:
  """[N] z-scores of `scores` within each task (population std; 0 where it is 0)."""
  scores = np.asarray(scores, np.float64)
  out = np.zeros_like(scores)
  groups = collections.defaultdict(list)
  for i, task in enumerate(tasks):
    groups[task].append(i)
  for rows in groups.values():
    values = scores[rows]
    std = values.std()
    out[rows] = (values - values.mean()) / std if std > 0 else 0.0
  return out


def select_hardest(examples: Sequence[Example], scores: Sequence[float], *,
                   fraction: float = 0.1) -> list[Scored]:
  """The lowest `fraction` (at least one) by per-task normalised score, lowest first
  (ties in input order)."""
  if not 0 < fraction <= 1:
    raise ValueError(f"fraction={fraction} must be in (0, 1].")
  if len(examples) != len(scores) or not examples:
    raise ValueError(f"{len(examples)} examples for {len(scores)} scores (need >= 1).")
  normalised = normalise_per_task([e.task for e in examples], scores)
  keep = max(1, int(round(fraction * len(examples))))
  order = sorted(range(len(examples)), key=lambda i: (normalised[i], i))[:keep]
  return [Scored(examples[i], float(scores[i]), float(normalised[i])) for i in order]


def select_prompts(examples: Sequence[Example], score_fn: ScoreFn, *, fraction: float = 0.1,
                   batch_size: int = 64,
                   progress: Callable[[int], None] | None = None) -> list[Scored]:
  """Scores every example with `score_fn` (batches of `batch_size`; `progress(n)` after
  each) and keeps the hardest `fraction` (`select_hardest`)."""
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1.")
  means = []
  for start in range(0, len(examples), batch_size):
    chunk = list(examples[start:start + batch_size])
    per_example = score_fn(chunk)
    if len(per_example) != len(chunk) or any(len(s) == 0 for s in per_example):
      raise ValueError("score_fn must return a non-empty list of sample scores per example.")
    means.extend(float(np.mean(s)) for s in per_example)
    if progress is not None:
      progress(len(chunk))
  return select_hardest(examples, means, fraction=fraction)


def annotated(selected: Sequence[Scored]) -> list[Example]:
  """The selected examples with `prepo_score` / `prepo_normalised` in their metadata."""
  return [dataclasses.replace(s.example, metadata={
      **s.example.metadata, "prepo_score": s.score, "prepo_normalised": s.normalised})
          for s in selected]
