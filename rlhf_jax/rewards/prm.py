"""A line-level process reward model (Dai et al., arXiv:2410.17621;
docs/formulas.md#prm-ppo).

Steps are the pieces of a response that end with the step delimiter (a newline by
default), the last piece ending at the last text token. The PRM is a scalar-head model
read at each step-end token: its value there estimates the probability that the policy
can still finish the prefix into a verified answer. It is trained by regression on
0/1 step labels (`rewards/model_training.py`), so that value is directly a success
probability and can initialise the PPO critic (`critic.init_from`).

Labels follow Dai et al.: a verified response labels every step 1; for a wrong one, the
first unrecoverable step (no completion of its prefix, sampled from the policy, passes
the verifier) is found by binary search over prefixes (assuming recoverability only
falls along a response); steps before it get 1, it and later steps 0.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.parallel import run_in_chunks
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.rewards.scorer import ScorerBase


def step_end_token_ids(tokenizer, delimiter: str = "\n") -> frozenset[int]:
  """Ids of the tokens whose text contains `delimiter` (they end a step).

  Raises:
    ValueError: the delimiter is empty or no token contains it (every response would be
      one step).
  """
  if not delimiter:
    raise ValueError("the step delimiter is empty.")
  ids = frozenset(i for i in range(tokenizer.vocab_size)
                  if delimiter in tokenizer.decode([i], skip_special_tokens=False))
  if not ids:
    raise ValueError(f"no token of the tokenizer contains the step delimiter {delimiter!r}.")
  return ids


def step_end_positions(token_ids: Sequence[int], step_end_ids: frozenset[int],
                       eos_id: int) -> list[int]:
  """Indices of the tokens that end a step: every delimiter token, and the last text
  token when the text does not end with one (a trailing EOS is not text)."""
  ids = list(token_ids)
  if ids and ids[-1] == eos_id:
    ids = ids[:-1]
  ends = [i for i, t in enumerate(ids) if t in step_end_ids]
  if ids and (not ends or ends[-1] != len(ids) - 1):
    ends.append(len(ids) - 1)
  return ends


def token_steps(tokenizer, text: str, step_end_ids: frozenset[int]) -> list[str]:
  """The response's steps as texts, cut where `step_end_positions` cuts its tokens (so a
  token holding two delimiters ends one step, as the PRM and the rollout see it); [] for
  an empty response."""
  ids = tokenizer.encode(text)
  steps, start = [], 0
  for end in step_end_positions(ids, step_end_ids, tokenizer.eos_id):
    steps.append(tokenizer.decode(ids[start:end + 1], skip_special_tokens=False))
    start = end + 1
  return steps


class ProcessRewardModel:
  """Step scores of a scalar-head PRM (a frozen role on the mesh).

  Args:
    role: `.model` (scalar head) and `.params`.
    layout: the ScoringLayout of its inputs.
    step_end_ids: `step_end_token_ids` of its tokenizer.
    batch_size: rows per jitted forward.
    mesh: the trainer mesh, or None.
  """

  def __init__(self, role, layout: ScoringLayout, step_end_ids: frozenset[int], *,
               batch_size: int = 64, mesh: jax.sharding.Mesh | None = None):
    if role.model.head != "scalar":
      raise ValueError(f"a PRM needs a scalar head; got head={role.model.head!r}.")
    self.role, self.layout, self.step_end_ids = role, layout, step_end_ids
    self.batch_size, self.mesh = batch_size, mesh
    columns = layout.response_length

    def values(params, tokens, mask):
      out, _ = role.model.apply(params, tokens, attention_mask=mask, num_last=columns)
      return out

    self._values = jax.jit(values)

  def response_values(self, prompts: Sequence[Example | str], responses: Sequence[str]
                      ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """([N, R] PRM outputs at every response token, [N, R] response token ids,
    per response "" or why it could not be scored)."""
    batch, failures = self.layout.encode(prompts, responses)
    values = run_in_chunks(lambda t, m: self._values(self.role.params, t, m),
                           [batch.tokens, batch.attention_mask], self.batch_size, self.mesh)
    tokens = np.asarray(batch.tokens)[:, -self.layout.response_length:]
    lengths = np.asarray(batch.response_mask).sum(axis=1).astype(int)
    return values, [row[:n] for row, n in zip(tokens, lengths)], failures

  def step_scores(self, prompts: Sequence[Example | str], responses: Sequence[str]
                  ) -> tuple[list[list[float]], list[str]]:
    """Per response its step scores in order ([] when it could not be scored)."""
    values, tokens, failures = self.response_values(prompts, responses)
    eos = self.layout.tokenizer.eos_id
    out = []
    for row, (ids, failure) in enumerate(zip(tokens, failures)):
      ends = [] if failure else step_end_positions(ids, self.step_end_ids, eos)
      out.append([float(values[row, i]) for i in ends])
    return out, failures


class WithProcessRewards(ScorerBase):
  """A `Scorer`: the outcome scorer's scores, plus the PRM's step scores (dense rewards
  placed at step-end tokens by the rollout; Dai et al. §3). A response the PRM cannot
  score keeps its outcome reward and gets no step rewards; the failure is recorded."""

  def __init__(self, outcome: Scorer, prm: ProcessRewardModel):
    self.outcome, self.prm = outcome, prm
    self._failures = 0

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """The outcome scorer's check."""
    self.outcome.check_tasks(tasks)

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Outcome scores with `step_scores` filled in."""
    scored = self.outcome.score(examples, responses)
    try:
      steps, failures = self.prm.step_scores(list(examples), responses)
    except Exception as error:  # pylint: disable=broad-except
      steps = [[] for _ in responses]
      failures = [f"PRM error: {type(error).__name__}: {error}"[:300]] * len(responses)
    self._failures += sum(bool(f) for f in failures)
    return dataclasses.replace(scored, step_scores=steps)

  def pop_metrics(self) -> dict[str, float]:
    """The outcome scorer's metrics and the PRM's failures since the last call."""
    out = dict(self.outcome.pop_metrics())
    out["reward/prm/failures"], self._failures = float(self._failures), 0
    return out

  def close(self) -> None:
    """Closes the outcome scorer."""
    self.outcome.close()


class PrefixValueScorer(ScorerBase):
  """A `Scorer` of (partial) responses by a PRM: the value at the last text token, the
  PRM's estimate that the prefix can still be completed correctly (speculative
  rejection's partial reward). Unscorable responses are failures."""

  def __init__(self, prm: ProcessRewardModel):
    self.prm = prm

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Any task: the PRM reads text only."""
    del tasks

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Per response its last step score."""
    steps, failures = self.prm.step_scores(list(examples), responses)
    failures = [f or ("" if row else "no step to score") for row, f in zip(steps, failures)]
    return Scores(scores=[row[-1] if row else 0.0 for row in steps],
                  correct=[False] * len(steps), failures=failures)


# ------------------------------------------------------------------ step labels


def first_unrecoverable_steps(num_steps: Sequence[int],
                              recoverable: Callable[[list[tuple[int, int]]], list[bool]]
                              ) -> list[int]:
  """Per wrong response, the first step k (1-based) whose prefix (steps 1..k) cannot be
  completed into a verified answer, by binary search over k (Dai et al.).

  Args:
    num_steps: per response its number of steps K ≥ 1; the full response (k = K) is
      wrong, so k = K is unrecoverable by definition.
    recoverable: given (response index, k) queries, whether each prefix can still be
      completed correctly (batched: one call per round of the search).
  Returns:
    Per response its first unrecoverable step in [1, K].
  """
  low = [1] * len(num_steps)  # the answer lies in [low, high]
  high = list(num_steps)
  while True:
    queries = [(i, (low[i] + high[i]) // 2) for i in range(len(num_steps)) if low[i] < high[i]]
    if not queries:
      return high
    for (i, k), ok in zip(queries, recoverable(queries), strict=True):
      if ok:
        low[i] = k + 1
      else:
        high[i] = k


def step_labels(num_steps: int, correct: bool, first_bad: int | None) -> list[float]:
  """0/1 labels of a response's steps: all 1 when correct, else 1 before the first
  unrecoverable step and 0 from it on."""
  if correct:
    return [1.0] * num_steps
  return [1.0 if k < first_bad else 0.0 for k in range(1, num_steps + 1)]


def label_responses(sampler, tokenizer, scorer: Scorer, examples: Sequence[Example],
                    responses: Sequence[str], *, prefix: Sequence[int], completions: int,
                    max_new_tokens: int, step_end_ids: frozenset[int], seed: int = 0
                    ) -> list[list[float]]:
  """Step labels of (example, response) pairs: the verifier (`scorer`) judges the
  responses; for each wrong one, `completions` samples from the policy (`sampler`) per
  probed prefix decide recoverability in a binary search (`first_unrecoverable_steps`).

  Returns:
    Per response its labels in step order (`token_steps`: one per step end the PRM
    reads; none for an empty response).
  """
  steps = [token_steps(tokenizer, r, step_end_ids) for r in responses]
  correct = scorer.score(list(examples), list(responses)).correct
  wrong = [i for i, ok in enumerate(correct) if not ok]
  calls = [0]

  def recoverable(queries):
    prompts = [list(prefix) + tokenizer.encode(examples[wrong[i]].prompt
                                               + "".join(steps[wrong[i]][:k]))
               for i, k in queries]
    params = SamplingParams(temperature=1.0, n=completions, max_new_tokens=max_new_tokens,
                            stop_token_ids=(tokenizer.eos_id,), seed=seed + calls[0])
    calls[0] += 1
    out = sampler.generate(prompts, params)
    flat_examples, flat_texts = [], []
    for (i, k), samples in zip(queries, out):
      head = "".join(steps[wrong[i]][:k])
      for sample in samples:
        flat_examples.append(examples[wrong[i]])
        flat_texts.append(head + tokenizer.decode(sample.token_ids))
    verdicts = np.asarray(scorer.score(flat_examples, flat_texts).correct)
    return [bool(v) for v in verdicts.reshape(len(queries), completions).any(axis=1)]

  wrong = [i for i in wrong if steps[i]]  # an empty response has no step to label
  first_bad = dict(zip(wrong, first_unrecoverable_steps([len(steps[i]) for i in wrong],
                                                         recoverable)))
  return [step_labels(len(s), bool(ok), first_bad.get(i))
          for i, (s, ok) in enumerate(zip(steps, correct))]
