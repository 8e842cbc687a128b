"""The `Scorer` seam: what turns decoded responses into rewards.

A scorer is given the examples (prompt, answer, task, metadata) and the decoded
responses, one response per example (repeat an example for its G samples), and
returns `Scores`. The rule-based `RewardRouter` is one scorer; reward models,
generative judges and code sandboxes are others. A scorer never raises for a bad
sample: the sample gets a failure score and a recorded reason, and the loop goes on.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol
from typing import Sequence
from typing import runtime_checkable

from rlhf_jax.data import Example


@dataclasses.dataclass
class Scores:
  """What a scorer returns for N responses.

  Attributes:
    scores: [N] the sequence-level reward of each response.
    correct: [N] whether the response is judged correct (accuracy metrics,
      DAPO's dynamic sampling, VAPO's positive examples).
    failures: [N] "" or why scoring failed ("timeout", "error: ...").
    token_scores: optional, per response a list of per-token rewards (a
      process reward model), or None.
  """
  scores: list[float]
  correct: list[bool]
  failures: list[str]
  token_scores: list[list[float]] | None = None

  def __post_init__(self):
    lengths = {len(self.scores), len(self.correct), len(self.failures)}
    if self.token_scores is not None:
      lengths.add(len(self.token_scores))
    if len(lengths) != 1:
      raise ValueError(f"Scores fields have different lengths: {sorted(lengths)}.")


@runtime_checkable
class Scorer(Protocol):
  """Scores decoded responses against their examples (see the module docstring)."""

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Scores `responses[i]` as an answer to `examples[i]`."""
    ...

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task this scorer cannot score (before training)."""
    ...
