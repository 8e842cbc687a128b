"""rlhf_jax.sampling: a JetStream-shaped engine (prefill / insert / generate over decode
slots), a continuous-batching scheduler, per-request sampling parameters with FIRE,
and a gRPC server and client for running the sampler in its own process.

The server (`server`, `servicers`, `wire`) and `client` need the `serve` extra (grpcio,
protobuf); they are not imported here, so the core needs neither."""

from rlhf_jax.sampling.engine import Engine
from rlhf_jax.sampling.engine_state import DecodeState
from rlhf_jax.sampling.engine_state import GuidedParams
from rlhf_jax.sampling.engine_state import Prefix
from rlhf_jax.sampling.engine_state import SlotSampling
from rlhf_jax.sampling.engine_state import StepResult
from rlhf_jax.sampling.params import FireSchedule
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import prompt_seed
from rlhf_jax.sampling.scheduler import Completion
from rlhf_jax.sampling.scheduler import Scheduler
from rlhf_jax.sampling.token_sampling import sample_tokens
from rlhf_jax.sampling.token_sampling import truncation_mask

__all__ = [
    "Completion", "DecodeState", "Engine", "FireSchedule", "GuidedParams", "Prefix",
    "SamplingParams",
    "Scheduler", "SlotSampling", "StepResult", "prompt_seed", "sample_tokens",
    "truncation_mask",
]
