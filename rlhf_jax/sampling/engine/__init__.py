"""rlhf_jax.sampling.engine: decoding on the device, in JetStream's shape.

- `engine`: the `Engine` (prefill, insert into a decode slot, generate steps);
- `state`: its device state and results (`DecodeState`, `Prefix`, `StepResult`, ...);
- `token_sampling`: drawing one token per row from logits (pure, jittable);
- `prefix_cache`: finished samples' KV cache rows kept for their continuations.
"""

from rlhf_jax.sampling.engine.engine import Engine

__all__ = ["Engine"]
