"""Best-of-N and Speculative Rejection (Sun et al., "Fast Best-of-N Decoding via Speculative
Rejection", arXiv:2410.20290; ALGORITHMS.md §13.1) over the in-process scheduler.

Every prompt starts N_init samples. At each decision point τ_k (a response length in
tokens), once every sample still generating has at least τ_k tokens, a scorer that
accepts prefixes (a reward model, a PRM) scores the partial responses and the bottom
⌊α·live⌋ of each prompt's live samples are cancelled: the scheduler frees their slots at
its next step and admits waiting samples into them. Survivors run to the end; the
final responses are scored and the best one per prompt is returned. With no decision
points (or α = 0) this is plain Best-of-N.

The paper places decision points where accelerator memory runs out; here they are
given as token counts, and a sample may pass τ_k by up to `steps_per_sync − 1` tokens
before the host sees it (the scheduler's dispatch granularity): the partial response
scored is everything generated so far.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Sequence

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.rewards import Scorer
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling.scheduler import Scheduler


@dataclasses.dataclass
class Decision:
  """One decision point: the threshold, when it fired, and what it cancelled."""
  threshold: int
  live_before: int
  cancelled: list[tuple[int, int]]  # (prompt, sample index)
  scores: dict[tuple[int, int], float]  # partial score of every live sample
  lengths: dict[tuple[int, int], int]  # their lengths (tokens) when scored


@dataclasses.dataclass
class BestOfNResult:
  """Per prompt the best response (text, tokens, final score), and the cost."""
  texts: list[str]
  token_ids: list[list[int]]
  scores: list[float]
  generated_tokens: int
  seconds: float
  decisions: list[Decision]
  finished_samples: int


def bottom_fraction(scores: Sequence[float], rate: float) -> list[int]:
  """Indices of the ⌊rate·n⌋ lowest of `scores` (ties: the later sample goes first)."""
  count = math.floor(rate * len(scores) + 1e-9)
  order = sorted(range(len(scores)), key=lambda i: (scores[i], -i))
  return sorted(order[:count])


class SpeculativeRejection:
  """Best-of-N with pruning of partial responses (module docstring).

  Args:
    scheduler: the in-process scheduler (per-sample cancel frees slots).
    scorer: scores (example, response text); it must accept partial responses.
    tokenizer: decodes responses for the scorer.
    n_init: samples started per prompt (N_init; plain Best-of-N: N).
    decision_tokens: response lengths at which to prune (ascending; empty: none).
    rejection_rate: α, the fraction of live samples cancelled at each decision.
  """

  def __init__(self, scheduler: Scheduler, scorer: Scorer, tokenizer, *, n_init: int,
               decision_tokens: Sequence[int] = (), rejection_rate: float = 0.5):
    if n_init < 1:
      raise ValueError(f"n_init={n_init} must be >= 1.")
    if not 0.0 <= rejection_rate < 1.0:
      raise ValueError(f"rejection_rate={rejection_rate} must be in [0, 1).")
    if list(decision_tokens) != sorted(set(decision_tokens)) or any(
        t < 1 for t in decision_tokens):
      raise ValueError(f"decision_tokens={tuple(decision_tokens)} must be increasing "
                       "positive token counts.")
    self.scheduler, self.scorer, self.tokenizer = scheduler, scorer, tokenizer
    self.n_init = n_init
    self.decision_tokens = tuple(decision_tokens)
    self.rejection_rate = rejection_rate

  def run(self, examples: Sequence[Example], prompt_ids: Sequence[Sequence[int]],
          sampling: SamplingParams) -> BestOfNResult:
    """Samples, prunes and picks the best response of every prompt."""
    start = time.perf_counter()
    tokens: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    request_ids = {}

    def on_token(request_id, index, token, sampled, model):
      del sampled, model
      tokens[(request_ids[request_id], index)].append(token)

    sampling = dataclasses.replace(sampling, n=self.n_init)
    for prompt, ids in enumerate(prompt_ids):
      seed = None if sampling.seed is None else sampling.seed + 7919 * prompt
      request_id = self.scheduler.submit(ids, dataclasses.replace(sampling, seed=seed),
                                         request_id=f"bon-{prompt}-{id(self)}",
                                         on_token=on_token)
      request_ids[request_id] = prompt
    live = {(p, i) for p in range(len(prompt_ids)) for i in range(self.n_init)}
    finished: dict[tuple[int, int], list[int]] = {}
    decisions: list[Decision] = []
    pending = list(self.decision_tokens)
    while self.scheduler.has_work():
      for completion in self.scheduler.step():
        key = (request_ids[completion.request_id], completion.sample_index)
        if completion.finish_reason in ("stop", "length"):
          finished[key] = completion.token_ids
        live.discard(key)
      if pending and live and all(len(tokens[key]) >= pending[0] for key in live):
        decisions.append(self._decide(pending.pop(0), live, tokens, examples, request_ids))
    return self._pick_best(examples, finished, tokens, decisions, start)

  def _decide(self, threshold, live, tokens, examples, request_ids) -> Decision:
    """Scores the live partial responses and cancels the bottom α of each prompt's."""
    keys = sorted(live)
    texts = [self.tokenizer.decode(tokens[key]) for key in keys]
    scored = self.scorer.score([examples[p] for p, _ in keys], texts)
    scores = {key: _finite(s, f) for key, s, f in zip(keys, scored.scores, scored.failures)}
    by_prompt = collections.defaultdict(list)
    for key in keys:
      by_prompt[key[0]].append(key)
    cancelled = []
    names = {prompt: request_id for request_id, prompt in request_ids.items()}
    for prompt, members in by_prompt.items():
      for position in bottom_fraction([scores[k] for k in members], self.rejection_rate):
        key = members[position]
        self.scheduler.cancel(names[prompt], key[1])
        live.discard(key)
        cancelled.append(key)
    return Decision(threshold, len(keys), cancelled, scores,
                    {key: len(tokens[key]) for key in keys})

  def _pick_best(self, examples, finished, tokens, decisions, start) -> BestOfNResult:
    keys = sorted(finished)
    texts = [self.tokenizer.decode(self.tokenizer.truncate_at_eos(finished[k])) for k in keys]
    scored = self.scorer.score([examples[p] for p, _ in keys], texts)
    best: dict[int, tuple[float, int]] = {}
    for position, (key, score, failure) in enumerate(zip(keys, scored.scores,
                                                         scored.failures)):
      value = _finite(score, failure)
      if key[0] not in best or value > best[key[0]][0]:
        best[key[0]] = (value, position)
    picks = [best.get(p, (-np.inf, None)) for p in range(len(examples))]
    return BestOfNResult(
        texts=[texts[i] if i is not None else "" for _, i in picks],
        token_ids=[finished[keys[i]] if i is not None else [] for _, i in picks],
        scores=[float(v) for v, _ in picks],
        generated_tokens=sum(len(t) for t in tokens.values()),
        seconds=time.perf_counter() - start, decisions=decisions,
        finished_samples=len(finished))


def _finite(score: float, failure: str) -> float:
  """A failed score ranks below every real one."""
  return -np.inf if failure else float(score)
