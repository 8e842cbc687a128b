"""The programs a Scheduler dispatches, and compiling them all ahead of the first request.

Per prompt bucket × padded prefill batch size one prefill (and one insert), per decode
step count one generate. A continuation of a parked cache row (`keep_cache`) compiles
one resume per padded length of new tokens (powers of two) when it first runs.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np

from rlhf_jax.models.functional import Params
from rlhf_jax.sampling.engine import Engine
from rlhf_jax.sampling.params import SamplingParams


def step_counts(steps_per_sync: int) -> list[int]:
  """Decode steps per dispatch: powers of two below `steps_per_sync`, and
  `steps_per_sync` (one generate program each)."""
  counts = [2 ** i for i in range(int(math.log2(steps_per_sync)) + 1)]
  return sorted(set(c for c in counts if c < steps_per_sync) | {steps_per_sync})


def prefill_batch_sizes(max_prefill_batch: int) -> list[int]:
  """Padded prefill batch sizes: powers of two up to `max_prefill_batch`."""
  return [2 ** i for i in range(int(math.log2(max_prefill_batch)) + 1)]


def warmup(engine: Engine, params: Params, prompt_buckets: Sequence[int], *,
           max_prefill_batch: int, steps_per_sync: int) -> dict[str, int]:
  """Compiles every prefill, insert and generate program on dummy inputs; returns
  `engine.compilations()`."""
  state = engine.init_decode_state()
  sampling = engine.slot_sampling(SamplingParams(max_new_tokens=1), 0, seed=0)
  for bucket in prompt_buckets:
    for batch in prefill_batch_sizes(max_prefill_batch):
      prefix = engine.prefill(params, np.zeros((batch, bucket), np.int32),
                              np.ones((batch,), np.int32))
      state = engine.insert(prefix, state, 0, row=0, sampling=sampling)
  for steps in step_counts(steps_per_sync):
    state, _ = engine.generate_steps(params, state, steps)
  jax.block_until_ready(state)
  return engine.compilations()
