"""rlhf_jax.sampling: a JetStream-shaped engine (prefill / insert / generate over decode
slots), a continuous-batching scheduler, per-request sampling parameters with FIRE,
and a gRPC server and client for running the sampler in its own process.

At the top, the seam and its adapters: `protocol` (the `Sampler` interface and the
`Completion` every sampler returns), `params` (per-request `SamplingParams`), `config`
(the `sampler` section), `versioned` (the last few weight versions) and `process_shards`
(a job of several processes). Below them, four rooms:

- `engine/`: the device side (the `Engine`, its state, token sampling, the prefix cache);
- `scheduler/`: continuous batching over the engine (requests, programs, weight swaps);
- `serve/`: the sampler in its own process, behind gRPC;
- `remote/`: the trainer's side of those servers (a client, a fleet, connecting).

`serve/` (but its grpc-free config checks) and `remote/` need the `serve` extra (grpcio,
protobuf); they are not imported here, so the core needs neither."""

from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.state import DecodeState
from rlhf_jax.sampling.engine.state import GuidedParams
from rlhf_jax.sampling.engine.state import Prefix
from rlhf_jax.sampling.engine.state import SlotSampling
from rlhf_jax.sampling.engine.state import StepResult
from rlhf_jax.sampling.engine.token_sampling import sample_tokens
from rlhf_jax.sampling.engine.token_sampling import truncation_mask
from rlhf_jax.sampling.params import FireSchedule
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import prompt_seed
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.scheduler.scheduler import Scheduler

__all__ = [
    "Completion", "DecodeState", "Engine", "FireSchedule", "GuidedParams", "Prefix",
    "SamplingParams",
    "Scheduler", "SlotSampling", "StepResult", "prompt_seed", "sample_tokens",
    "truncation_mask",
]
