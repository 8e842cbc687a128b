"""Best-of-N and Speculative Rejection (Sun et al., "Fast Best-of-N Decoding via Speculative
Rejection", arXiv:2410.20290; docs/formulas.md#speculative-rejection) over the in-process
scheduler.

Every prompt starts N_init samples. At each decision point τ_k (a response length in
tokens), once every sample of a prompt still generating has at least τ_k tokens, a
scorer that accepts prefixes (a reward model, a PRM) scores its partial responses and
the bottom ⌊α·live⌋ are cancelled: the scheduler frees their slots at its next step and
admits waiting samples (of later prompts) into them. Survivors run to the end; the
final responses are scored and the best one per prompt is returned. With no decision
points (or α = 0) this is plain Best-of-N.

The paper starts one prompt's N_init samples in all of memory and prunes when memory
runs out; here prompts share the scheduler's slots (continuous batching), decisions
are taken per prompt at given token counts, and the prompts that reach a decision
after the same scheduler step are scored in one call. Samples of a prompt enter slots at
different times and the host sees tokens only every `steps_per_sync` steps, so a sample
may be up to `steps_per_sync − 1` tokens past τ_k (more if it waited on a slower
sibling) when the decision is taken; the partial response scored is nevertheless
exactly its first τ_k generated tokens (decoded from those ids), so every ranked prefix
has the same length, as in the paper. A sample that finished before its prompt's
decision is kept and not ranked. A prompt takes at most one decision per scheduler
step: if its samples pass τ_k and τ_k+1 in the same step, τ_k+1 is decided (on the
first τ_k+1 tokens) at the next step, or never if they have all finished by then.
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
from rlhf_jax.sampling.scheduler.scheduler import Scheduler


@dataclasses.dataclass
class Decision:
  """One prompt's decision point: the threshold, and what it scored and cancelled."""
  prompt: int
  threshold: int
  cancelled: list[int]  # sample indices
  scores: dict[int, float]  # partial score of every live sample
  lengths: dict[int, int]  # the scored prefix lengths (tokens): all `threshold`


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
  scoring_seconds: float = 0.0  # of `seconds`, in the scorer (partial and final)
  scorer_calls: int = 0


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
    self.scheduler, self.tokenizer = scheduler, tokenizer
    self._scorer = scorer
    self._scoring = [0.0, 0]
    self.n_init = n_init
    self.decision_tokens = tuple(decision_tokens)
    self.rejection_rate = rejection_rate

  def run(self, examples: Sequence[Example], prompt_ids: Sequence[Sequence[int]],
          sampling: SamplingParams) -> BestOfNResult:
    """Samples, prunes and picks the best response of every prompt."""
    start = time.perf_counter()
    self._scoring = [0.0, 0]
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
    next_decision = [0] * len(prompt_ids)
    names = {prompt: request_id for request_id, prompt in request_ids.items()}
    while self.scheduler.has_work():
      for completion in self.scheduler.step():
        key = (request_ids[completion.request_id], completion.sample_index)
        if completion.finish_reason in ("stop", "length"):
          finished[key] = completion.token_ids
        live.discard(key)
      ready = self._ready(live, tokens, next_decision)
      if ready:
        decisions += self._decide(ready, live, tokens, examples, next_decision, names)
    return self._pick_best(examples, finished, tokens, decisions, start)

  def _score(self, examples, texts):
    """The scorer's Scores, timed."""
    begin = time.perf_counter()
    scored = self._scorer.score(examples, texts)
    self._scoring[0] += time.perf_counter() - begin
    self._scoring[1] += 1
    return scored

  def _ready(self, live, tokens, next_decision) -> dict[int, list[tuple[int, int]]]:
    """Prompts whose live samples all passed their next decision length (waiting
    samples have no tokens, so a prompt is never decided before all of its run)."""
    by_prompt = collections.defaultdict(list)
    for key in sorted(live):
      by_prompt[key[0]].append(key)
    return {p: keys for p, keys in by_prompt.items()
            if next_decision[p] < len(self.decision_tokens)
            and all(len(tokens[k]) >= self.decision_tokens[next_decision[p]] for k in keys)}

  def _decide(self, ready, live, tokens, examples, next_decision, names) -> list[Decision]:
    """Scores the ready prompts' partial responses, each sample's first τ tokens (τ its
    prompt's next decision length), in one call and cancels the bottom α of each
    prompt's."""
    keys = [k for members in ready.values() for k in members]
    # Truncated to τ so that a prompt's prefixes are ranked at equal length whatever
    # the sync granularity or admission time let a sample run past τ.
    prefixes = {k: tokens[k][:self.decision_tokens[next_decision[k[0]]]] for k in keys}
    texts = [self.tokenizer.decode(prefixes[k]) for k in keys]
    scored = self._score([examples[p] for p, _ in keys], texts)
    scores = {k: _finite(s, f) for k, s, f in zip(keys, scored.scores, scored.failures)}
    out = []
    for prompt, members in ready.items():
      dropped = [members[i][1] for i in bottom_fraction([scores[k] for k in members],
                                                        self.rejection_rate)]
      for index in dropped:
        self.scheduler.cancel(names[prompt], index)
        live.discard((prompt, index))
      out.append(Decision(prompt, self.decision_tokens[next_decision[prompt]], dropped,
                          {k[1]: scores[k] for k in members},
                          {k[1]: len(prefixes[k]) for k in members}))
      next_decision[prompt] += 1
    return out

  def _pick_best(self, examples, finished, tokens, decisions, start) -> BestOfNResult:
    keys = sorted(finished)
    texts = [self.tokenizer.decode(self.tokenizer.truncate_at_eos(finished[k])) for k in keys]
    scored = self._score([examples[p] for p, _ in keys], texts)
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
        finished_samples=len(finished), scoring_seconds=self._scoring[0],
        scorer_calls=self._scoring[1])


def _finite(score: float, failure: str) -> float:
  """A failed score ranks below every real one."""
  return -np.inf if failure else float(score)
