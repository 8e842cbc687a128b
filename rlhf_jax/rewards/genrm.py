"""GenRM: a generative reward model that judges a response against a reference
(Shen et al., arXiv:2503.22230; docs/formulas.md#hybrid-rewards).

Two templates: "with ground truth" (reasoning prompts: the reference answer) and
"with reference response" (the rest: e.g. the SFT policy's best-of-N response by the
BT RM, `launch/make_references.py`, stored in the example's metadata). The reward is
the judge's probability of the "yes" verdict token (`judge.VerdictJudge`).
"""

from __future__ import annotations

from typing import Sequence

from rlhf_jax.data import Example
from rlhf_jax.data.prompts import conversation_text
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase

# Placeholders: {prompt} (ends with a newline for the built-in tasks), {answer} or
# {reference}, {response}. The question ends where the verdict token comes.
GT_TEMPLATE = "{prompt}Reference answer: {answer}\nResponse:\n{response}\nCorrect? "
REFERENCE_TEMPLATE = ("{prompt}Reference response:\n{reference}\nResponse:\n{response}\n"
                      "As good? ")
MODES = ("gt", "reference")
TEMPLATE_FIELDS = {"gt": ("prompt", "answer", "response"),
                   "reference": ("prompt", "reference", "response")}


def judge_question(template: str, example: Example, response: str, *,
                   reference: str = "") -> str:
  """The judge's question for one response (`str.format` of the template)."""
  return template.format(prompt=conversation_text(example), answer=example.answer,
                         reference=reference,
                         response=response)


class GenRMScorer(ScorerBase):
  """A `Scorer`: P(yes) of a generative judge comparing each response with the
  example's ground truth (`mode` 'gt') or its reference response ('reference':
  `example.metadata[reference_key]`).

  Args:
    judge: a VerdictJudge whose verdict tokens are (yes, no).
    mode: 'gt' or 'reference'.
    template: the question template (GT_TEMPLATE / REFERENCE_TEMPLATE by default).
    reference_key: the metadata key of the reference response.
    failure_score: the reward when the judge fails (too long, off-format answer) or
      the example has no ground truth / reference.
  """

  def __init__(self, judge: VerdictJudge, *, mode: str = "gt", template: str = "",
               reference_key: str = "reference", failure_score: float = 0.0):
    if mode not in MODES:
      raise ValueError(f"GenRM mode={mode!r}; allowed: {', '.join(MODES)}.")
    if len(judge.verdict_ids) != 2:
      raise ValueError("a GenRM judge has two verdicts (yes, no).")
    self.judge, self.mode = judge, mode
    self.template = template or (GT_TEMPLATE if mode == "gt" else REFERENCE_TEMPLATE)
    self.reference_key, self.failure_score = reference_key, failure_score

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """A judge scores any task."""

  def missing_reference(self, example: Example) -> str:
    """"" or why this example cannot be judged in this mode."""
    if self.mode == "gt":
      return "" if example.answer.strip() else "no ground-truth answer"
    reference = (example.metadata or {}).get(self.reference_key)
    return "" if isinstance(reference, str) and reference else (
        f"no reference response in metadata[{self.reference_key!r}]")

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """P(yes) per response; failures get `failure_score` and a reason."""
    missing = [self.missing_reference(e) for e in examples]
    asked = [i for i, m in enumerate(missing) if not m]
    questions = [judge_question(self.template, examples[i], responses[i],
                                reference=(examples[i].metadata or {}).get(
                                    self.reference_key, "")) for i in asked]
    probs, failures = self.judge.probabilities(questions)
    result = {i: (p, f) for i, p, f in zip(asked, probs, failures)}
    out = Scores([], [], [], reasons=[])
    for i in range(len(examples)):
      p, failure = result.get(i, (None, missing[i]))
      if failure:
        out.append(self.failure_score, False, failure, failure)
      else:
        yes = float(p[0])
        out.append(yes, yes > 0.5, "", "" if yes > 0.5 else f"judge P(yes)={yes:.3f}")
    return out
