"""A generative judge: a language model served by our sampler whose verdict is one token.

The judge is asked a templated question and its answer is read as the probabilities
of the verdict tokens at the first generated position (`SamplingParams.
candidate_token_ids`, exact log-probs from the engine's prefill logits), never by
parsing generated text. The sampler is the in-process scheduler of the judge's
weights or a `SamplerClient` of a server that serves them. A question that does not
fit, or an answer that puts little mass on any verdict token, is a recorded failure.
"""

from __future__ import annotations

import string
from typing import Mapping, Sequence

import numpy as np

from rlhf_jax.config_errors import invalid
from rlhf_jax.sampling import SamplingParams


def template_fields(template: str) -> set[str]:
  """The `{field}` names a template uses ("" or a number for a positional `{}`)."""
  return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def check_template(template: str, allowed: Sequence[str], required: Sequence[str],
                   field: str) -> None:
  """Raises ConfigError naming `field` if the template uses an unknown placeholder or
  lacks a required one."""
  used = template_fields(template)
  unknown = sorted(used - set(allowed))
  missing = sorted(set(required) - used)
  if unknown or missing:
    invalid(field, template, f"placeholders must include {sorted(required)} and come from "
            f"{sorted(allowed)} (unknown: {unknown}, missing: {missing})")


def verdict_token_ids(tokenizer, verdicts: Mapping[str, str]) -> tuple[int, ...]:
  """The single token id of each verdict text, in order; `verdicts` maps each verdict's
  config field (e.g. "reward.genrm.yes") to its text. ConfigError naming the field of a
  verdict that is not one token, or that shares its token with an earlier one."""
  ids: dict[int, str] = {}
  for field, verdict in verdicts.items():
    encoded = tokenizer.encode(verdict)
    if len(encoded) != 1:
      invalid(field, verdict, f"is {len(encoded)} tokens for the judge's tokenizer; a "
              "verdict must be exactly one token")
    if encoded[0] in ids:
      invalid(field, verdict, f"shares its token with {ids[encoded[0]]} for the judge's "
              "tokenizer")
    ids[encoded[0]] = field
  return tuple(ids)


class VerdictJudge:
  """Probabilities of a judge's verdict tokens after templated questions.

  Args:
    sampler: a `Sampler` serving the judge's weights.
    tokenizer: the judge's tokenizer.
    verdict_ids: the verdict tokens (`verdict_token_ids`).
    prefix: token ids before every question.
    max_prompt_tokens: the longest question the sampler takes (longer: a failure).
    min_verdict_mass: the least total probability on the verdict tokens for an
      answer to count; below it the judge is off-format (a failure).
  """

  def __init__(self, sampler, tokenizer, verdict_ids: Sequence[int], *,
               prefix: Sequence[int] = (), max_prompt_tokens: int,
               min_verdict_mass: float = 0.5):
    self.sampler, self.tokenizer = sampler, tokenizer
    self.verdict_ids, self.prefix = tuple(verdict_ids), list(prefix)
    self.max_prompt_tokens, self.min_verdict_mass = max_prompt_tokens, min_verdict_mass

  def probabilities(self, questions: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """([N, K] probability of each verdict token, per question "" or the failure).
    A failed question's row is NaN."""
    probs = np.full((len(questions), len(self.verdict_ids)), np.nan)
    failures = [""] * len(questions)
    prompts, rows = [], []
    for i, question in enumerate(questions):
      try:
        ids = self.prefix + self.tokenizer.encode(question)
      except Exception as error:  # pylint: disable=broad-except
        failures[i] = f"judge cannot tokenize the question: {error}"[:300]
        continue
      if len(ids) > self.max_prompt_tokens:
        failures[i] = (f"judge prompt of {len(ids)} tokens exceeds {self.max_prompt_tokens} "
                       "(truncated input)")
      else:
        prompts.append(ids)
        rows.append(i)
    if prompts:
      params = SamplingParams(temperature=0.0, max_new_tokens=1, seed=0,
                              candidate_token_ids=self.verdict_ids)
      for i, samples in zip(rows, self.sampler.generate(prompts, params)):
        sample = samples[0]
        if sample.finish_reason in ("error", "cancelled") or not sample.candidate_logprobs:
          failures[i] = f"judge {sample.finish_reason or 'gave no log-probs'}: {sample.error}"
          continue
        p = np.exp(np.asarray(sample.candidate_logprobs, np.float64))
        if p.sum() < self.min_verdict_mass:
          said = self.tokenizer.decode(sample.token_ids, skip_special_tokens=False)
          failures[i] = (f"judge gave no verdict: said {said!r}, verdict mass "
                         f"{p.sum():.3f} < {self.min_verdict_mass}")
          continue
        probs[i] = p
    return probs, failures
