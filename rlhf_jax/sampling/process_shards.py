"""A `Sampler` for a job of several processes: each process samples its share of the
prompts with its own sampler, and every process gets every completion back.

    every process                    generate(all prompts, sampling)
      per_prompt(...)                one SamplingParams per prompt: the seeds of the
                                     one-process call (`prompt_seed` of the global index)
      local.generate(my share)       contiguous share: `distributed.process_share`
      exchange.all_gather(...)       completions of the others (host key-value store)
    → the one-process call's list, in the same order, on every process

So the rest of the step (scoring, packing, metrics, checkpoints of the rollout state)
runs unchanged and identically on every process. The weights reach each process's
sampler as whole host-local arrays (`update_params` replicates cross-process arrays
first), so the sampler's own mesh is the process's local devices.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from rlhf_jax.parallel.distributed import HostExchange
from rlhf_jax.parallel.distributed import fully_replicated_host_value
from rlhf_jax.parallel.distributed import process_share
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.scheduler import Completion


class ProcessShardedSampler:
  """Splits `generate` over the processes of a job (see the module docstring).

  Args:
    local: this process's sampler (an in-process Scheduler on its local devices).
    mesh: the trainer's global mesh, over which `update_params` replicates the weights.
    to_local: maps the replicated host-local weights to the local sampler's layout.
  """

  def __init__(self, local, mesh: jax.sharding.Mesh, to_local=lambda params: params):
    self.local = local
    self.mesh = mesh
    self.to_local = to_local
    self.exchange = HostExchange("sampler")

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """Per prompt its completions, as one process sampling all of them would return."""
    samplings = per_prompt(prompts, sampling)
    share = process_share(len(prompts))
    mine = self.local.generate(list(prompts[share]), samplings[share]) if (
        share.stop > share.start) else []
    return [group for part in self.exchange.all_gather(mine) for group in part]

  def update_params(self, params: Any, version: int) -> None:
    """Every process's sampler gets the whole weights (a collective: all processes call)."""
    self.load_prepared(self.prepare_params(params), version)

  def prepare_params(self, params: Any) -> Any:
    """The weights whole on this process's devices: the collective half of
    `update_params`, which a `VersionedSampler` runs on the trainer's thread (collectives
    must come in the same order on every process)."""
    return self.to_local(fully_replicated_host_value(params, self.mesh))

  def load_prepared(self, prepared: Any, version: int) -> None:
    """The local half of `update_params`: this process's sampler takes `prepared`."""
    self.local.update_params(prepared, version=version)

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Cancels a request (or one sample) of this process's sampler."""
    self.local.cancel(request_id, sample_index)

  def close(self) -> None:
    """Closes this process's sampler."""
    self.local.close()

  def wrapped(self):
    """This process's sampler (its figures and warm-up: `protocol.find_extra`)."""
    return self.local
