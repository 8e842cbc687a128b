"""What the scheduler keeps per request and per running sample, and the `Completion` each
sample ends as."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import numpy as np

from rlhf_jax.sampling.engine.state import Prefix
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion

__all__ = ["InFlight", "RequestState", "SampleState", "TokenCallback",
           "cancelled_before_start", "candidate_logprobs", "completion_of",
           "drop_cancelled_waiting"]


TokenCallback = Callable[[str, int, int, float, float], None]


@dataclasses.dataclass(eq=False)
class RequestState:
  """A submitted request: its samples waiting for a slot, its prefill, its cancels."""
  request_id: str
  prompt_ids: list[int]
  sampling: SamplingParams
  seed: int
  bucket: int
  on_token: TokenCallback | None
  waiting: collections.deque  # sample indices not yet in a slot
  prefix: Prefix | None = None
  prefix_row: int = 0
  prefix_version: int = 0  # the weights version that computed `prefix` (or `parked`)
  parked: Any = None  # a PrefixCache `Parked` row this request continues, or None
  candidate_logprobs: list[float] = dataclasses.field(default_factory=list)
  outstanding: int = 0  # samples not yet completed
  cancelled: bool = False
  cancelled_samples: set = dataclasses.field(default_factory=set)  # per-sample cancels


@dataclasses.dataclass
class SampleState:
  """A sample in a decode slot and the tokens it has produced so far."""
  request: RequestState
  index: int
  version: int
  tokens: list[int] = dataclasses.field(default_factory=list)
  sampled: list[float] = dataclasses.field(default_factory=list)
  model: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)  # per token
  routes: list = dataclasses.field(default_factory=list)  # per token [L, k], if recorded
  logits_version: int = -1  # the weights of the forward that made the next token's logits

  def __post_init__(self):
    if self.logits_version < 0:
      self.logits_version = self.version  # the prefill's

  def add(self, token: int, sampled: float, model: float, version: int, routes=None) -> None:
    """Appends a token read from a dispatch that ran weights `version` (`routes` [L, k]:
    its experts, from an engine that records them)."""
    # Drawn from the logits of the forward before it (token 0: the prefill's), whose
    # weights may predate a swap; the forward after it runs this dispatch's weights.
    self.versions.append(self.logits_version)
    self.logits_version = version
    self.tokens.append(token)
    self.sampled.append(sampled)
    self.model.append(model)
    if routes is not None:
      self.routes.append(routes)


@dataclasses.dataclass
class InFlight:
  """A dispatched generate whose results the host has not read yet.

  Attributes:
    results: its StepResult ([steps, S] arrays, being copied to the host).
    samples: {slot: SampleState} of every slot that held a sample at dispatch; a slot
      whose sample finished or was cancelled since is skipped when the results are read.
    steps: the decode steps dispatched.
    version: the weights version the dispatch ran.
  """
  results: Any
  samples: dict
  steps: int
  version: int

  def ahead(self, slot: int, sample: SampleState) -> int:
    """Tokens `sample` (in `slot`) may emit in this dispatch beyond those read."""
    return self.steps if self.samples.get(slot) is sample else 0


def drop_cancelled_waiting(requests) -> list[tuple[RequestState, list[int]]]:
  """Takes the cancelled samples out of each request's waiting queue (a request may be
  listed twice); returns (request, the sample indices taken). Linear in the samples:
  `cancelled_samples` is a set."""
  dropped = []
  for request in dict.fromkeys(requests):
    if request.cancelled:
      indices, request.waiting = list(request.waiting), collections.deque()
    else:
      indices = [i for i in request.waiting if i in request.cancelled_samples]
      if indices:
        request.waiting = collections.deque(
            i for i in request.waiting if i not in request.cancelled_samples)
    request.outstanding -= len(indices)
    if indices:
      dropped.append((request, indices))
  return dropped


def cancelled_before_start(request: RequestState, index: int, version: int) -> Completion:
  """The completion of sample `index`, cancelled while it waited for a slot: no tokens,
  finish_reason "cancelled", weights `version` (the served ones)."""
  return Completion(request_id=request.request_id, sample_index=index,
                    prompt_ids=request.prompt_ids, token_ids=[], sampled_logprobs=[],
                    model_logprobs=[], finish_reason="cancelled", seed=request.seed,
                    weights_version=(version, version),
                    candidate_logprobs=request.candidate_logprobs)


def completion_of(sample: SampleState, reason: str, last_version: int, error: str = ""
                  ) -> Completion:
  """The completion of `sample`, ended for `reason` (its finish_reason) after a dispatch
  that ran weights `last_version`; `error`: why, when the reason is "error"."""
  request = sample.request
  return Completion(request_id=request.request_id, sample_index=sample.index,
                    prompt_ids=request.prompt_ids, token_ids=sample.tokens,
                    sampled_logprobs=sample.sampled, model_logprobs=sample.model,
                    finish_reason=reason, seed=request.seed,
                    weights_version=(sample.version, last_version), error=error,
                    candidate_logprobs=request.candidate_logprobs,
                    token_versions=sample.versions,
                    routes=np.stack(sample.routes) if sample.routes else None)


def candidate_logprobs(logits, token_ids) -> list[float]:
  """log softmax(logits)[t] (T = 1, float64) of each of `token_ids`; logits [V]."""
  logits = np.asarray(logits, np.float64)
  logz = logits.max() + np.log(np.exp(logits - logits.max()).sum())
  return [float(logits[t] - logz) for t in token_ids]
