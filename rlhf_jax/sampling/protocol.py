"""The `Sampler` seam: what the training loop and evaluation need from a sampler.

Implemented by the in-process `Scheduler` (rlhf_jax.sampling.scheduler) and by the
gRPC `SamplerClient` (rlhf_jax.sampling.client); a vLLM- or SGLang-backed sampler
would be a third implementation, not a branch of the loop.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol
from typing import Sequence
from typing import runtime_checkable

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler import Completion


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
