"""rlhf_jax.sampling.scheduler: continuous batching of requests over an Engine's slots.

- `scheduler`: the `Scheduler` (submit, cancel, update_params; step and run);
- `options`: its options' defaults and their one validation (shared with the config);
- `requests`: what it keeps per request and per running sample;
- `programs`: the programs it dispatches, and compiling them ahead of the first request;
- `swaps`: weight swaps under samples in flight (their KV cache recomputed).
"""

from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from rlhf_jax.sampling.scheduler.scheduler import Scheduler

__all__ = ["QueueFull", "Scheduler"]
