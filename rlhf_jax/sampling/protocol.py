"""The `Sampler` seam: what the training loop and evaluation need from a sampler.

Implemented by the in-process `Scheduler` (rlhf_jax.sampling.scheduler) and by the gRPC
`SamplerClient` (rlhf_jax.sampling.remote); a vLLM- or SGLang-backed sampler would be a
third implementation, not a branch of the loop. What every sampler returns, `Completion`,
is here too, so the seam imports no sampler.

The optional extras (preparing and loading weights, rolling back, keeping versions,
figures, the reference RPCs) are small Protocols of their own, asked with isinstance;
`find_extra` finds one behind a wrapper.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ContextManager
from typing import Protocol
from typing import Sequence
from typing import runtime_checkable

from rlhf_jax.sampling.params import SamplingParams


@dataclasses.dataclass
class Completion:
  """One finished sample.

  Attributes:
    request_id: the id `submit` returned.
    sample_index: which of the request's `n` samples.
    prompt_ids: the prompt tokens.
    token_ids: the generated tokens (a stop token included).
    sampled_logprobs: per token, log q under the distribution it was drawn from.
    model_logprobs: per token, log π under the model at temperature 1 (PPO's π_old).
    finish_reason: "stop" (a stop token), "length" (max_new_tokens),
      "cancelled", or "error" (see `error`).
    seed: the seed used (drawn by the scheduler when the request gave none).
    weights_version: (first, last) weight versions the sample was generated with.
    token_versions: per token, the weights version that sampled it (they differ only
      when the weights were swapped mid-sample: update_policy "swap_now"); empty from
      a sampler that records none.
    error: the failure message when finish_reason == "error".
    candidate_logprobs: log π (T=1) of `sampling.candidate_token_ids` at the first
      generated position (empty when none were asked for).
    routes: [len(token_ids), L, k] int, each token's experts per layer as the sampler's
      forward routed it (a mixture-of-experts sampler that records routes; None
      otherwise).
  """
  request_id: str
  sample_index: int
  prompt_ids: list[int]
  token_ids: list[int]
  sampled_logprobs: list[float]
  model_logprobs: list[float]
  finish_reason: str
  seed: int
  weights_version: tuple[int, int]
  error: str = ""
  candidate_logprobs: list[float] = dataclasses.field(default_factory=list)
  token_versions: list[int] = dataclasses.field(default_factory=list)
  routes: Any = None


@runtime_checkable
class Sampler(Protocol):
  """Generates completions with both log-probs per token, and takes new weights."""

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams]
               ) -> list[list[Completion]]:
    """Per prompt, its `sampling.n` completions (each token with `sampled_logprobs`
    and `model_logprobs`, the latter log π at temperature 1: PPO's behaviour policy)."""
    ...

  def update_params(self, params: Any, version: int) -> None:
    """Samples started after this call use `params` (tagged `version`)."""
    ...

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Stops a request, or only its sample `sample_index`; unfinished samples end with
    finish_reason "cancelled"."""
    ...

  def close(self) -> None:
    """Releases what the sampler holds (a server connection); the sampler is unusable
    afterwards."""
    ...


# The optional extras. A sampler declares one by having its methods; the library asks
# with isinstance (runtime_checkable), never by probing attributes, and a wrapper
# (VersionedSampler, ProcessShardedSampler) forwards the `Sampler` interface only: an
# extra of the sampler it wraps is found with `find_extra`.


@runtime_checkable
class PreparesParams(Protocol):
  """A sampler whose weights take a form of their own before they are loaded (host copies
  for a server; for a job of several processes, a collective replication that must run on
  the trainer's thread). A `VersionedSampler` keeps each version in this form."""

  def prepare_params(self, params: Any) -> Any:
    """`params` in the form `update_params` (or `load_prepared`) takes."""
    ...


@runtime_checkable
class LoadsPrepared(PreparesParams, Protocol):
  """A sampler whose `update_params` is `prepare_params` then `load_prepared`, so that a
  prepared version loads without preparing it again (ProcessShardedSampler)."""

  def load_prepared(self, prepared: Any, version: int) -> Any:
    """Loads weights that `prepare_params` returned, tagged `version`."""
    ...


@runtime_checkable
class RollsBack(Protocol):
  """A sampler that refuses an older version than its own unless told it is on purpose
  (a server: a job pinned to an older version, or a resumed run)."""

  def rollback_params(self, params: Any, version: int) -> Any:
    """`update_params` with an older `version` on purpose."""
    ...


@runtime_checkable
class KeepsVersions(Protocol):
  """A sampler that keeps the newest `keep` weight versions and samples, per thread,
  with a pinned one (VersionedSampler): what generation running ahead needs."""

  latest: int
  keep: int

  def pinned(self, version: int) -> ContextManager[None]:
    """Within the block, this thread's calls sample with weights `version`."""
    ...


@runtime_checkable
class ReportsMetrics(Protocol):
  """A sampler with figures of its own (queue depth, prefilled and reused tokens, ...)."""

  def metrics(self) -> dict[str, float]:
    """The sampler's counters and gauges."""
    ...


class SamplerUnavailable(RuntimeError):
  """No server of a sampler over servers answers (a fleet whose every server is gone).
  The training loop saves the last complete step, says so in one line and stops."""


@runtime_checkable
class ServerFleet(Protocol):
  """A sampler over servers that can come and go (`SamplerFleet`): the loop logs its
  figures each step and, in a synchronous run, keeps the rollout's state at the start of
  each step, so a fleet lost while sampling still leaves a checkpoint of the last step."""

  def await_server(self, what: str) -> None:
    """Blocks until a server answers, or raises `SamplerUnavailable` naming `what`."""
    ...

  def metrics(self) -> dict[str, float]:
    """Live servers, deaths, joins, re-sent requests."""
    ...


@runtime_checkable
class ReferenceSampler(Protocol):
  """Sampling servers that also keep the frozen reference policy and score rows under it
  (`rollout.reference_logprobs='sampler'`: SamplerClient, SamplerFleet)."""

  def update_reference(self, params: Any) -> Any:
    """Sends the reference weights; the reply (a fleet: one per server) names the
    server's compute dtype."""
    ...

  def reference_logprobs(self, tokens: Any, attention_mask: Any, response_mask: Any) -> Any:
    """log π_ref [B, R] float32 of the response tokens of rows in the rollout batch's
    layout (tokens, attention_mask [B, P+R]; response_mask [B, R])."""
    ...


@runtime_checkable
class Wrapper(Protocol):
  """A sampler that samples through another one (VersionedSampler, ProcessShardedSampler)."""

  def wrapped(self) -> Any:
    """The sampler this one forwards to."""
    ...


def find_extra(sampler: Any, extra: type) -> Any:
  """`sampler`, or the first sampler it wraps (`Wrapper`, outermost first), that is an
  instance of `extra` (an extra's Protocol, or a class such as SamplerFleet); None when
  there is none."""
  while sampler is not None:
    if isinstance(sampler, extra):
      return sampler
    sampler = sampler.wrapped() if isinstance(sampler, Wrapper) else None
  return None


def require_extra(sampler: Any, extra: type, needed_by: str) -> Any:
  """`find_extra(sampler, extra)`, or a TypeError saying that `needed_by` needs it."""
  found = find_extra(sampler, extra)
  if found is None:
    raise TypeError(f"{needed_by} needs a sampler that is a {extra.__name__}; "
                    f"{type(sampler).__name__} is not, nor wraps one")
  return found
