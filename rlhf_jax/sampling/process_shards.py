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

One user of the process's devices at a time. With generation running ahead
(`rollout.max_staleness` > 0) the local sampler dispatches from the worker thread while
the trainer's thread gathers the next weights (`prepare_params`: a collective program
and a copy per leaf). `devices_lock` keeps the two apart: a gather waits for the local
generation in flight, a generation for the gather. So in every process the gather's
collectives run with no other dispatch of that process beside them, whatever the
threads' timing (two threads dispatching at once into one XLA:CPU client, gloo
collectives in flight, is where the 2-process test crashed). The local generation has
no collective and waits for no other process: holding the lock never waits on a peer
that waits on this process.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import jax

from rlhf_jax.parallel.distributed import HostExchange
from rlhf_jax.parallel.distributed import fully_replicated_host_value
from rlhf_jax.parallel.distributed import process_share
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.protocol import Completion


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
    # The gather of new weights and the local generation never dispatch at once.
    self.devices_lock = threading.Lock()

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """Per prompt its completions, as one process sampling all of them would return."""
    samplings = per_prompt(prompts, sampling)
    share = process_share(len(prompts))
    mine = []
    if share.stop > share.start:
      with self.devices_lock:
        mine = self.local.generate(list(prompts[share]), samplings[share])
    # Outside the lock: a peer still generating never holds up this process's gather.
    return [group for part in self.exchange.all_gather(mine) for group in part]

  def update_params(self, params: Any, version: int) -> None:
    """Every process's sampler gets the whole weights (a collective: all processes call)."""
    self.load_prepared(self.prepare_params(params), version)

  def prepare_params(self, params: Any) -> Any:
    """The weights whole on this process's devices: the collective half of
    `update_params`, which a `VersionedSampler` runs on the trainer's thread (collectives
    must come in the same order on every process), once the local generation in flight
    has returned (`devices_lock`)."""
    with self.devices_lock:
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
