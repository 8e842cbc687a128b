"""The pairwise judge and Pairwise-PPO's reward (Pairwise-RL, arXiv:2504.04950;
docs/formulas.md#pairwise-rl).

A generative judge reads (prompt, response A, response B) and answers with the token
of the better one. P(y ≻ anchor) is averaged over both orders
(`kernels.position_debiased_preference`), and the reward is that win probability
against the prompt's anchor response (the ground-truth solution or a reference
response from the example's metadata), minus a centre.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlhf_jax import kernels
from rlhf_jax.data import Example
from rlhf_jax.data.prompts import conversation_text
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase

PAIR_TEMPLATE = "{prompt}Response A:\n{first}\nResponse B:\n{second}\nBetter? "
TEMPLATE_FIELDS = ("prompt", "first", "second")


def pair_question(template: str, prompt: str, first: str, second: str) -> str:
  """The judge's question with `first` shown as A and `second` as B."""
  return template.format(prompt=prompt, first=first, second=second)


def anchor_of(example: Example, anchor_key: str) -> str:
  """The anchor response: `example.answer` for 'answer', else metadata[anchor_key]
  ("" when absent)."""
  if anchor_key == "answer":
    return example.answer
  value = (example.metadata or {}).get(anchor_key)
  return value if isinstance(value, str) else ""


class PairwiseScorer(ScorerBase):
  """A `Scorer`: the win probability of each response against its example's anchor,
  from a pairwise judge asked in both orders, minus `centre`.

  Args:
    judge: a VerdictJudge whose verdict tokens are (first wins, second wins); its
      probabilities are renormalised over the two.
    anchor_key: 'answer' or the metadata key of the anchor response ('solution',
      'reference').
    template: the question template (PAIR_TEMPLATE by default).
    centre: subtracted from P(y ≻ anchor) (0.5: a tie is worth 0).
    failure_score: the reward when either order fails or there is no anchor.
  """

  def __init__(self, judge: VerdictJudge, *, anchor_key: str = "solution",
               template: str = PAIR_TEMPLATE, centre: float = 0.5,
               failure_score: float = 0.0):
    if len(judge.verdict_ids) != 2:
      raise ValueError("a pairwise judge has two verdicts (first, second).")
    self.judge, self.anchor_key, self.template = judge, anchor_key, template
    self.centre, self.failure_score = centre, failure_score

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """A judge scores any task."""

  def win_probabilities(self, prompts: Sequence[str], responses: Sequence[str],
                        anchors: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """[N] P(response ≻ anchor) averaged over both orders, and per pair "" or the
    failure of either order."""
    n = len(responses)
    questions = ([pair_question(self.template, p, r, a)
                  for p, r, a in zip(prompts, responses, anchors)]
                 + [pair_question(self.template, p, a, r)
                    for p, r, a in zip(prompts, responses, anchors)])
    probs, failures = self.judge.probabilities(questions)
    first = probs[:, 0] / probs.sum(axis=1)  # NaN on failures, dropped below
    p = np.asarray(kernels.position_debiased_preference(
        np.nan_to_num(first[:n]), np.nan_to_num(first[n:])))
    return p, [a or b for a, b in zip(failures[:n], failures[n:])]

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """P(y ≻ anchor) − centre per response; failures get `failure_score`."""
    anchors = [anchor_of(e, self.anchor_key) for e in examples]
    p, failures = self.win_probabilities([conversation_text(e) for e in examples], responses,
                                         anchors)
    out = Scores([], [], [], reasons=[])
    for win, failure, anchor in zip(p, failures, anchors):
      failure = failure or ("" if anchor else f"no anchor response ({self.anchor_key!r})")
      if failure:
        out.append(self.failure_score, False, failure, failure)
      else:
        out.append(float(win) - self.centre, bool(win > 0.5), "",
                   "" if win > 0.5 else f"P(y beats the anchor)={win:.3f}")
    return out
