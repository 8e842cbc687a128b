"""The programs a Scheduler dispatches, and compiling them all ahead of the first request.

Few programs, because each costs compile time (on a GPU every distinct GEMM fusion is
autotuned, and a lent machine starts bare): per prompt bucket × padded prefill batch
size (`prefill_batch_sizes`, a few) one prefill; one insert in all (every prefill row is
padded to the longest bucket); one generate for 1 and one for `steps_per_sync` decode
steps (`step_counts`), each with and without top-k / top-p / min-p truncation (the
engine compiles the truncating one only while a running sample asks for it). A
continuation of a parked cache row (`keep_cache`) compiles one resume per padded length of
new tokens (powers of two) when it first runs. Under update_policy 'swap_now', the refill
of the samples in flight at a weight swap (sampling/scheduler/swaps.py): per padded length
of `swaps.refill_plan` (powers of two, and the cache length) one prefill and one
`_refill_rows` write; `Scheduler.warmup` compiles them too.
"""

from __future__ import annotations

import collections
from typing import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from rlhf_jax.models.functional import Params
from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.prefix_cache import PrefixCache
from rlhf_jax.sampling.engine.state import DecodeState
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler.requests import InFlight
from rlhf_jax.sampling.scheduler.requests import RequestState
from rlhf_jax.sampling.scheduler.requests import SampleState
from rlhf_jax.sampling.scheduler.requests import candidate_logprobs


def step_counts(steps_per_sync: int) -> list[int]:
  """Decode steps per dispatch: `steps_per_sync`, and 1 for the last few steps before
  the longest-running sample's `max_new_tokens` (one generate program each)."""
  return sorted({1, steps_per_sync})


def steps_for(remaining: int, steps_per_sync: int) -> int:
  """The steps of the next dispatch when the most tokens any running sample may still
  emit is `remaining`: all `steps_per_sync` while they fit, else one at a time (a slot
  that finishes early never idles for more than `steps_per_sync - 1` steps)."""
  return steps_per_sync if remaining >= steps_per_sync else 1


def prefill_batch_sizes(max_prefill_batch: int) -> list[int]:
  """Padded prefill batch sizes: powers of four below `max_prefill_batch`, and
  `max_prefill_batch` (8 → 1, 4, 8): a batch is padded at most 4× its prompts."""
  sizes, size = {max_prefill_batch}, 1
  while size < max_prefill_batch:
    sizes.add(size)
    size *= 4
  return sorted(sizes)


def padded_batch(prompts: int, max_prefill_batch: int) -> int:
  """The prefill batch size `prompts` (≤ max_prefill_batch) prompts are padded to."""
  return next(b for b in prefill_batch_sizes(max_prefill_batch) if b >= prompts)


def state_program(engine: Engine, params: Params):
  """`engine.init_decode_state` (which must stay pure: it is traced once) as one compiled
  program, its state placed as the engine's programs place theirs on a one-device mesh
  of the params (replicated): else its ~13 array constructors compile one by one, and
  the first insert compiles once more for a state not yet committed to the mesh."""
  mesh = getattr(getattr(jax.tree.leaves(params)[0], "sharding", None), "mesh", None)
  replicated = mesh is not None and mesh.size == 1
  key = mesh if replicated else None
  if key not in engine.state_programs:  # kept on the engine: a new jit would compile again
    engine.state_programs[key] = jax.jit(
        engine.init_decode_state,
        out_shardings=NamedSharding(mesh, PartitionSpec()) if replicated else None)
  return engine.state_programs[key]


def warmup(engine: Engine, params: Params, prompt_buckets: Sequence[int], *,
           max_prefill_batch: int, steps_per_sync: int, truncation: bool = True,
           init_state=None) -> dict[str, int]:
  """Compiles every prefill, insert and generate program the Scheduler dispatches, on
  dummy inputs; returns `engine.compilations()`. `truncation=False` leaves out the
  truncating generate programs (for callers whose samples never ask for top-k / top-p /
  min-p; one would then compile at its first use). `init_state`: the Scheduler's
  `state_program` (default `engine.init_decode_state`)."""
  state = (init_state or engine.init_decode_state)()
  sampling = engine.slot_sampling(SamplingParams(max_new_tokens=1), 0, seed=0)
  for bucket in prompt_buckets:
    for batch in prefill_batch_sizes(max_prefill_batch):
      rows = engine.prefill_rows(params, np.zeros((batch, bucket), np.int32),
                                 np.ones((batch,), np.int32), pad_to=max(prompt_buckets))
      state = engine.insert(rows[0], state, 0, row=0, sampling=sampling)
  for steps in step_counts(steps_per_sync):
    for truncate in (None, True) if truncation else (None,):
      state, _ = engine.generate_steps(params, state, steps, truncate=truncate)
  jax.block_until_ready(state)
  return engine.compilations()


def prefill_requests(engine: Engine, params: Params, requests: Sequence[RequestState], *,
                     max_prefill_batch: int, pad_to: int, version: int) -> int:
  """Prefills `requests` (one prompt bucket per call, at most `max_prefill_batch` prompts
  padded to `padded_batch`), handing each its own prefix row (KV padded to `pad_to`, the
  longest bucket: one insert program) made by weights `version`. Returns the prompt
  tokens prefilled."""
  by_bucket = collections.defaultdict(list)
  for request in requests:
    by_bucket[request.bucket].append(request)
  prefilled = 0
  for bucket, group in by_bucket.items():
    for start in range(0, len(group), max_prefill_batch):
      chunk = group[start:start + max_prefill_batch]
      batch = padded_batch(len(chunk), max_prefill_batch)
      tokens = np.zeros((batch, bucket), np.int32)
      lengths = np.ones((batch,), np.int32)
      for row, request in enumerate(chunk):
        tokens[row, :len(request.prompt_ids)] = request.prompt_ids
        lengths[row] = len(request.prompt_ids)
        prefilled += len(request.prompt_ids)
      rows = engine.prefill_rows(params, tokens, lengths, pad_to=pad_to)
      for request, prefix in zip(chunk, rows):
        request.prefix, request.prefix_row, request.prefix_version = prefix, 0, version
        if request.sampling.candidate_token_ids:
          # The first token is drawn from these logits: its T=1 log-probs are exact.
          request.candidate_logprobs = candidate_logprobs(
              prefix.logits[0], request.sampling.candidate_token_ids)
  return prefilled


def start_samples(engine: Engine, params: Params, state: DecodeState,
                  admitted: Sequence[tuple[RequestState, int]], slots: Sequence[int],
                  prefix_cache: PrefixCache, *, max_prefill_batch: int, pad_to: int,
                  version: int) -> tuple[DecodeState, dict[int, SampleState], int]:
  """Puts the `admitted` samples ((request, sample index) pairs) into `slots`, in order.
  A request seen for the first time takes the parked cache row its prompt continues
  (`prefix_cache`, weights `version`; not when the prefill's logits are asked for:
  `candidate_token_ids`), else is prefilled with the others (`prefill_requests`); each
  sample is inserted from its request's prefix, or resumed from the parked row with only
  the tokens after it prefilled. Returns the state (`state` donated), {slot: its new
  SampleState} and the prompt tokens prefilled."""
  starting = [r for r in dict.fromkeys(r for r, _ in admitted)
              if r.prefix is None and r.parked is None]
  for request in starting:
    if not request.sampling.candidate_token_ids:  # those read the prefill's logits
      request.parked = prefix_cache.take(request.prompt_ids, version)
      request.prefix_version = version
  prefilled = prefill_requests(engine, params, [r for r in starting if r.parked is None],
                               max_prefill_batch=max_prefill_batch, pad_to=pad_to,
                               version=version)
  started = {}
  for (request, index), slot in zip(admitted, slots):
    sampling = engine.slot_sampling(request.sampling, index, seed=request.seed)
    if request.parked is not None:  # prefill only the tokens after the parked ones
      state, resumed = prefix_cache.resume(params, state, slot, request.parked,
                                           request.prompt_ids, sampling)
      prefilled += resumed
    else:
      state = engine.insert(request.prefix, state, slot, row=request.prefix_row,
                            sampling=sampling)
    started[slot] = SampleState(request=request, index=index, version=request.prefix_version)
  for request, _ in admitted:
    if not request.waiting:
      request.prefix = request.parked = None  # every sample is in a slot: free them
  return state, started, prefilled


def dispatch(engine: Engine, params: Params, state: DecodeState, samples, steps: int,
             version: int) -> tuple[DecodeState, InFlight]:
  """Dispatches `steps` decode steps and starts copying their results to the host, so
  that reading them later does not wait for the copy; returns the new state and the
  in-flight record of which sample each slot held (`samples`: {slot: SampleState})."""
  state, results = engine.generate_steps(params, state, steps)
  if jax.default_backend() != "cpu":  # on CPU the results already are host memory
    for leaf in jax.tree.leaves(results):
      leaf.copy_to_host_async()
  return state, InFlight(results=results, samples=dict(samples), steps=steps, version=version)


def read(flight: InFlight):
  """A dispatch's StepResult as NumPy arrays (waits for the device only if the dispatch
  has not finished; the copy was started at dispatch)."""
  if not isinstance(flight.results.tokens, np.ndarray):
    flight.results = jax.device_get(flight.results)
  return flight.results
