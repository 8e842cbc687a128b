"""Weight swaps in the Scheduler (sampling/scheduler.py), AReaL's semantics: the samples in
flight at a swap continue on the new weights with their KV cache recomputed by them.

A swap that kept the cache the old weights computed would let the new weights draw every
later token over the old weights' keys and values: tokens of neither policy, though
labelled with the new version. So at a swap each running sample's prompt and emitted tokens
are prefilled again under the new weights (one prefill of all slots, padded to a power of
two of positions) and replace its cache row; its next token, already drawn from the old
weights' logits, keeps the old version (`SampleState.logits_version`), and every token
after it is the new policy's. Prefills of samples that have not started (a request's other
samples waiting for a slot, a parked row taken for a continuation) are dropped too, so
they start from a prefill by the new weights.

Costs: one prefill of every slot at a swap with samples in flight (its programs compile at
the first such swap, one per padded length), and with `overlap_host` the dispatch in flight
is read first (the host must know every emitted token).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.models.decoder import KVCache
from rlhf_jax.sampling.engine import Engine
from rlhf_jax.sampling.engine_state import DecodeState
from rlhf_jax.sampling.engine_state import Prefix

MIN_POSITIONS = 8


def refill_program(engine: Engine):
  """jit (prefix [S rows], state (donated), refresh [S] bool) → state whose cache rows of
  the `refresh` slots are the prefix's rows (padded to the cache length); other slots, the
  next tokens, counts and sampling state stay."""
  cache_length = engine.cache_length

  def refill(prefix: Prefix, state: DecodeState, refresh: jax.Array) -> DecodeState:
    cache = state.cache
    batch_axis = 1 if cache.stacked else 0

    def put(old, new, position_axis):
      pad = [(0, 0)] * new.ndim
      pad[position_axis] = (0, cache_length - new.shape[position_axis])
      new = jnp.pad(new, pad).astype(old.dtype)
      shape = [1] * old.ndim
      shape[batch_axis] = old.shape[batch_axis]
      return jnp.where(refresh.reshape(shape), new, old)

    lengths = prefix.true_length
    valid = jnp.arange(cache_length)[None, :] < lengths[:, None]
    return state.replace(cache=KVCache(
        keys=jax.tree.map(lambda o, n: put(o, n, n.ndim - 1), cache.keys, prefix.keys),
        values=jax.tree.map(lambda o, n: put(o, n, n.ndim - 2), cache.values, prefix.values),
        valid=jnp.where(refresh[:, None], valid, cache.valid),
        end=jnp.where(refresh, lengths, cache.end),
        length=jnp.where(refresh, lengths, cache.length)))

  return jax.jit(refill, donate_argnums=(1,))


def refill_slots(engine: Engine, params: Any, state: DecodeState, running: dict, program
                 ) -> DecodeState:
  """Recomputes the cache rows of `running` ({slot: SampleState}) under `params`: each
  row's prompt and emitted tokens prefilled (`state` donated; use the returned one)."""
  slots = engine.num_slots
  sequences = {slot: list(s.request.prompt_ids) + list(s.tokens) for slot, s in running.items()}
  longest = max(len(q) for q in sequences.values())
  positions = min(engine.cache_length, max(MIN_POSITIONS, 1 << (longest - 1).bit_length()))
  tokens = np.zeros((slots, positions), np.int32)
  lengths = np.ones((slots,), np.int32)  # idle rows: one dummy token, not written back
  refresh = np.zeros((slots,), bool)
  for slot, sequence in sequences.items():
    tokens[slot, :len(sequence)] = sequence
    lengths[slot], refresh[slot] = len(sequence), True
  prefix = engine.prefill(params, tokens, lengths)
  return program(prefix, state, refresh)


class WeightSwaps:
  """The Scheduler's weight swaps (a mixin: it reads the Scheduler's own state)."""

  def _swap_reads_first(self) -> bool:
    """A swap is due under 'swap_now' while a dispatch's tokens are unread: `step` reads
    them first (the refill needs every emitted token)."""
    return (self._in_flight is not None and self._pending_params is not None
            and self.update_policy == "swap_now")

  def _swap_params_if_due(self) -> None:  # under self._lock
    pending = self._pending_params
    running = {i: s for i, s in enumerate(self._slots) if s is not None}
    if pending is None or (self.update_policy == "finish_old" and running):
      return
    if running and self._in_flight is not None:
      return  # sent after this step's read: the next step reads, then swaps
    self.params, self.weights_version = pending
    self._pending_params = None
    self.prefix_cache.drop_stale(self.weights_version)
    for request in self._requests.values():  # samples not started: prefill them anew
      if request.prefix_version != self.weights_version:
        request.prefix = request.parked = None
    if running:
      if self._refill is None:
        self._refill = refill_program(self.engine)
      self._state = refill_slots(self.engine, self.params, self._state, running, self._refill)
      self._stats["refilled_tokens"] += sum(
          len(s.request.prompt_ids) + len(s.tokens) for s in running.values())
    self._stats["weight_updates"] += 1
