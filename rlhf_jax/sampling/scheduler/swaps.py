"""Weight swaps in the Scheduler (sampling/scheduler/scheduler.py), AReaL's semantics: the
samples in flight at a swap continue on the new weights with their KV cache recomputed by
them.

A swap that kept the cache the old weights computed would let the new weights draw every
later token over the old weights' keys and values: tokens of neither policy, though
labelled with the new version. So at a swap each running sample's prompt and emitted tokens
are prefilled again under the new weights and replace its cache row; its next token,
already drawn from the old weights' logits, keeps the old version
(`SampleState.logits_version`), and every token after it is the new policy's. Prefills of
samples that have not started (a request's other samples waiting for a slot, a parked row
taken for a continuation) are dropped too, so they start from a prefill by the new weights.
A sample finished after a swap has a cache row wholly the new weights' (`cache_version`):
kept for a continuation (`keep_cache`), the new weights reuse it.

Memory and programs: the rows are prefilled grouped by padded length (`refill_plan`:
powers of two, and the cache length), in chunks of at most the scheduler's
`max_prefill_batch` rows, fewer at lengths past the longest prompt bucket (a chunk's
attention scores, rows × length², stay within a normal prefill's while one row does), and
each chunk's rows are written into their slots in place (`dynamic_update_slice` on the
donated state): at a swap the device holds the cache and one chunk's prefill, never a
second cache. One prefill and one `_refill_rows` program per refill length;
`Scheduler.warmup` compiles and runs them under update_policy 'swap_now' (a first swap
compiling under the scheduler's lock would block `submit` and `metrics` for the compile
time; and a refill that does not fit the device fails there, not mid-run).

Costs: a prefill of every running sample's tokens at a swap with samples in flight, and
with `overlap_host` the dispatch in flight is read first (the host must know every emitted
token).

These are plain functions of what they are handed: the Scheduler asks `reads_first` and
`swap_due` at each step and hands its state to `swap_weights` when one is due.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.prefix_cache import PrefixCache
from rlhf_jax.sampling.engine.state import DecodeState
from rlhf_jax.sampling.engine.state import Prefix
from rlhf_jax.sampling.scheduler.requests import RequestState
from rlhf_jax.sampling.scheduler.requests import SampleState

MIN_POSITIONS = 8


def refill_plan(engine: Engine, max_prefill_batch: int, longest_bucket: int
                ) -> dict[int, int]:
  """{padded length: rows per prefill} of a refill: the lengths are powers of two from
  MIN_POSITIONS below `engine.cache_length`, and the cache length (one prefill and one
  write program each); the rows the most (a power of two, at least 1, at most
  `max_prefill_batch` and the slots) whose rows × length² stay within a normal prefill's
  `max_prefill_batch` × `longest_bucket`² (its attention scores)."""
  lengths, length = {engine.cache_length}, MIN_POSITIONS
  while length < engine.cache_length:
    lengths.add(length)
    length *= 2
  budget, most = max_prefill_batch * longest_bucket ** 2, min(max_prefill_batch,
                                                                engine.num_slots)
  plan = {}
  for length in sorted(lengths):
    rows = 1
    while rows * 2 <= most and rows * 2 * length ** 2 <= budget:
      rows *= 2
    plan[length] = rows
  return plan


def _refill_rows(prefix: Prefix, state: DecodeState, slots: jax.Array, count: jax.Array
                 ) -> DecodeState:
  """Writes rows 0..count-1 of `prefix` ([R] rows of L ≤ cache_length positions) into the
  cache rows `slots[:count]` (the positions past a row's length marked invalid); the
  other slots, next tokens, counts and sampling state stay. In place: `state` is donated
  and each row is a dynamic_update_slice."""
  cache = state.cache
  axis = 1 if cache.stacked else 0  # stacked: [layers, S, ...]
  positions = jnp.arange(cache.valid.shape[1])

  def write(r, cache):
    slot, length = slots[r], prefix.true_length[r]

    def put(buffer, rows):
      update = jax.lax.dynamic_index_in_dim(rows, r, axis).astype(buffer.dtype)
      start = [0] * buffer.ndim
      start[axis] = slot
      return jax.lax.dynamic_update_slice(buffer, update, start)

    return cache.replace(keys=jax.tree.map(put, cache.keys, prefix.keys),
                         values=jax.tree.map(put, cache.values, prefix.values),
                         valid=cache.valid.at[slot].set(positions < length),
                         end=cache.end.at[slot].set(length),
                         length=cache.length.at[slot].set(length))

  return state.replace(cache=jax.lax.fori_loop(0, count, write, cache))


REFILL_ROWS = jax.jit(_refill_rows, donate_argnums=(1,))


def refill_slots(engine: Engine, params: Any, state: DecodeState,
                 running: dict[int, SampleState], plan: dict[int, int]) -> DecodeState:
  """Recomputes the cache rows of `running` ({slot: SampleState}) under `params`: each
  row's prompt and emitted tokens prefilled, grouped by padded length and chunked as
  `plan` (`refill_plan`) says, and written into its slot (`state` donated; use the
  returned one)."""
  groups = collections.defaultdict(list)
  for slot, sample in running.items():
    sequence = list(sample.request.prompt_ids) + list(sample.tokens)
    groups[next(n for n in sorted(plan) if n >= len(sequence))].append((slot, sequence))
  for length, group in sorted(groups.items()):
    rows = plan[length]
    for start in range(0, len(group), rows):
      chunk = group[start:start + rows]
      tokens = np.zeros((rows, length), np.int32)
      true_length = np.ones((rows,), np.int32)  # padding rows: one dummy token, unwritten
      slots = np.zeros((rows,), np.int32)
      for row, (slot, sequence) in enumerate(chunk):
        tokens[row, :len(sequence)] = sequence
        true_length[row], slots[row] = len(sequence), slot
      prefix = engine.prefill(params, tokens, true_length)
      state = REFILL_ROWS(prefix, state, slots, np.int32(len(chunk)))
  return state


def warmup_refill(engine: Engine, params: Any, state: DecodeState, plan: dict[int, int]
                  ) -> DecodeState:
  """Compiles and runs every refill program of `plan` (`refill_plan`) on dummy rows that
  write nothing, and waits for them (`state` donated, returned unchanged)."""
  for length, rows in plan.items():
    prefix = engine.prefill(params, np.zeros((rows, length), np.int32),
                            np.ones((rows,), np.int32))
    state = REFILL_ROWS(prefix, state, np.zeros((rows,), np.int32), np.int32(0))
  return jax.block_until_ready(state)


def cache_version(sample: SampleState) -> int:
  """The weights version that computed `sample`'s cache row: its prefill's, or after a
  swap the new weights' (every swap with the sample in flight recomputes the whole row,
  and the dispatches after it run those weights): the weights of its last dispatch."""
  return sample.logits_version


def reads_first(update_policy: str, pending: bool, in_flight: bool) -> bool:
  """Whether `step` reads the dispatch in flight before it admits: a swap is due under
  'swap_now' (`pending` weights) while a dispatch's tokens are unread, and the refill
  needs every emitted token."""
  return update_policy == "swap_now" and pending and in_flight


def swap_due(update_policy: str, pending: bool, running: bool, in_flight: bool) -> bool:
  """Whether `pending` weights replace the served ones at this step: under 'finish_old'
  once no sample runs; under 'swap_now' at once, but with samples running only once the
  dispatch in flight has been read (weights sent after this step's read wait a step)."""
  if not pending or (update_policy == "finish_old" and running):
    return False
  return not (running and in_flight)


def swap_weights(engine: Engine, params: Any, version: int, state: DecodeState,
                 running: dict[int, SampleState], requests: Iterable[RequestState],
                 prefix_cache: PrefixCache, plan: dict[int, int]) -> tuple[DecodeState, int]:
  """Puts weights `params` (`version`) under everything a scheduler holds: the parked
  rows of other weights dropped, the prefills of `requests`' samples not started yet
  dropped (they start from a prefill by the new weights), and the cache rows of
  `running` ({slot: SampleState}) recomputed (`refill_slots`, chunked as `plan` says).
  Returns the new state (`state` donated) and the tokens prefilled again."""
  prefix_cache.drop_stale(version)
  for request in requests:
    if request.prefix_version != version:
      request.prefix = request.parked = None
  if not running:
    return state, 0
  state = refill_slots(engine, params, state, running, plan)
  return state, sum(len(s.request.prompt_ids) + len(s.tokens) for s in running.values())
