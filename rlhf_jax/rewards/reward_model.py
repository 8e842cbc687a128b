"""Scalar-head reward models as `Scorer`s: the Bradley–Terry outcome RM.

A reward model reads the rollout layout (prefix + prompt left-padded to P, response +
EOS right-padded to R; `algorithms.rollout.encode_pairs`), so training batches and
scoring batches are the same arrays. Scoring runs one jitted forward per fixed-size
chunk of rows on the mesh (the params are a frozen role laid out like the reference):
no Python loop over samples and one compile per run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from rlhf_jax.parallel import run_in_chunks
from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.models import score_at_last_token
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase


@dataclasses.dataclass(frozen=True)
class ScoringLayout:
  """How prompts and responses become a reward model's input rows.

  Attributes:
    tokenizer: the reward model's tokenizer (`encode`, `eos_id`, `pad_id`).
    prefix: token ids before every prompt.
    prompt_length: P, prompt tokens (prefix included).
    response_length: R, response tokens (EOS included).
    chat_template: how an Example's prompt is rendered with the reward model's own chat
      template (`data.chat_template`: 'auto' renders chat-list prompts; data/prompts.py).
    system_prompt: `data.system_prompt`, for rendered prompts without a system turn.
  """
  tokenizer: Any
  prefix: tuple[int, ...]
  prompt_length: int
  response_length: int
  chat_template: str = "auto"
  system_prompt: str = ""

  def prompt_text(self, prompt: Example | str) -> str:
    """A prompt as the reward model reads it: text as it is, an Example rendered with
    the reward model's tokenizer (its chat template for a chat-list prompt)."""
    if isinstance(prompt, str):
      return prompt
    return PromptFormat(self.tokenizer, chat_template=self.chat_template,
                        system_prompt=self.system_prompt).text(prompt)

  def encode(self, prompts: Sequence[Example | str], responses: Sequence[str]
             ) -> tuple[RolloutBatch, list[str]]:
    """The rows of (prompt, response) pairs, and per pair "" or why it does not fit or
    render (such a row is encoded with an empty response; its score must not be used)."""
    failures, prompt_ids, response_ids = [], [], []
    for prompt, response in zip(prompts, responses, strict=True):
      try:  # each text is tokenized once: the length check and the row use the same ids
        p = list(self.prefix) + self.tokenizer.encode(self.prompt_text(prompt))
        r = self.tokenizer.encode(response) + [self.tokenizer.eos_id]
      except Exception as error:  # pylint: disable=broad-except
        p, r, failure = [], [], f"the reward model cannot tokenize it: {error}"[:300]
      else:
        failure = ("" if len(p) <= self.prompt_length and len(r) <= self.response_length else
                   f"too long for the reward model: prompt {len(p)} tokens (max "
                   f"{self.prompt_length}), response {len(r)} (max {self.response_length})")
      if failure:  # an empty row keeps the batch's shape; its score is not used
        p, r = [], [self.tokenizer.eos_id]
      failures.append(failure)
      prompt_ids.append(p)
      response_ids.append(r)
    batch = build_rollout_batch(
        prompt_ids, response_ids, [[0.0] * len(r) for r in response_ids],
        [0.0] * len(prompt_ids), [False] * len(prompt_ids), list(range(len(prompt_ids))),
        prompt_length=self.prompt_length, response_length=self.response_length,
        pad_id=self.tokenizer.pad_id)
    return batch, failures


def sequence_scores(model, params, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """[B] a scalar-head model's output at each row's last real token (the BT RM score)."""
  values, _ = model.apply(params, tokens, attention_mask=attention_mask)
  return score_at_last_token(values, attention_mask)


class RewardModelScorer(ScorerBase):
  """A `Scorer` reading a Bradley–Terry reward model's score at the last token
  (Ouyang et al., arXiv:2203.02155 §3.5).

  Args:
    role: a frozen role (`.model` with a scalar head, `.params` on the mesh).
    layout: the ScoringLayout of its inputs.
    batch_size: rows per jitted forward.
    correct_threshold: a response counts as correct when its score exceeds this
      (the reward's own verdict, for accuracy metrics and dynamic sampling).
    failure_score: the reward of a response that cannot be scored (too long).
    mesh: the trainer mesh (rows are split over data × fsdp × expert), or None.
  """

  def __init__(self, role, layout: ScoringLayout, *, batch_size: int = 64,
               correct_threshold: float = 0.0, failure_score: float = 0.0,
               mesh: jax.sharding.Mesh | None = None):
    if role.model.head != "scalar":
      raise ValueError(f"a reward model needs a scalar head; got head={role.model.head!r}.")
    self.role, self.layout, self.batch_size, self.mesh = role, layout, batch_size, mesh
    self.correct_threshold, self.failure_score = correct_threshold, failure_score
    self._score = jax.jit(lambda params, tokens, mask: sequence_scores(
        role.model, params, tokens, mask))

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """A reward model scores any task."""

  def raw_scores(self, prompts: Sequence[Example | str], responses: Sequence[str]
                 ) -> tuple[np.ndarray, list[str]]:
    """[N] scores and per response "" or why it could not be scored (`prompts`: texts,
    or Examples rendered by the layout)."""
    batch, failures = self.layout.encode(prompts, responses)
    scores = run_in_chunks(lambda t, m: self._score(self.role.params, t, m),
                           [batch.tokens, batch.attention_mask], self.batch_size, self.mesh)
    return scores.astype(np.float32), failures

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """The RM's score of each response; a response too long to score gets
    `failure_score` and a recorded failure."""
    raw, failures = self.raw_scores(list(examples), responses)
    out = Scores([], [], [], reasons=[])
    for value, failure in zip(raw, failures):
      if failure:
        out.append(self.failure_score, False, failure, failure)
      else:
        correct = bool(value > self.correct_threshold)
        out.append(float(value), correct, "", "" if correct else
                   f"RM score {value:.3f} <= {self.correct_threshold}")
    return out
