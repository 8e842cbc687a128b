"""Finished samples' KV cache rows, kept for their continuations (multi-turn KV reuse).

A request with `SamplingParams.keep_cache` leaves each finished sample's cache row here
(`Engine.park`: a device copy, then the slot is free), keyed by the tokens it holds: the
prompt and every emitted token. A later request whose prompt extends those tokens (the
conversation so far, plus the environment's observation) takes the row back into a slot
and prefills only the new tokens (`Engine.resume`). The tokens drawn are the same as with
a full prefill; only the prefill work differs. A row is used once, only by the weights
version that computed it, and the least recently parked rows are dropped beyond
`capacity` (each holds one slot's worth of cache).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np

from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.state import DecodeState
from rlhf_jax.sampling.engine.state import ParkedRow
from rlhf_jax.sampling.engine.state import SlotSampling


@dataclasses.dataclass
class Parked:
  """A parked row, the tokens it holds and the weights version that computed them
  (-1: several, never reused)."""
  row: ParkedRow
  tokens: tuple[int, ...]
  version: int


class PrefixCache:
  """Parked rows by the tokens they hold, least recently parked first. Several rows may
  hold the same tokens (the G episodes of a prompt often sample the same turn), and each
  serves one continuation.

  Args:
    engine: the Engine whose slots the rows come from and go back to.
    capacity: most rows kept (0: a finished row is dropped at once).

  The new tokens of a continuation are padded to a power of two of at least
  `MIN_BUCKET` (one resume program each): an observation is short, and padding it to the
  scheduler's prompt buckets, made for whole prompts, would often not fit after the row.
  """

  MIN_BUCKET = 8

  def __init__(self, engine: Engine, capacity: int):
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
      raise ValueError(f"parked_rows={capacity!r} must be an int >= 0.")
    self.engine = engine
    self.capacity = capacity
    self._rows: collections.OrderedDict[int, Parked] = collections.OrderedDict()  # by serial
    self._by_tokens: dict[tuple[int, ...], list[int]] = {}  # tokens → serials, oldest first
    self._serials = itertools.count()
    self.stats = collections.Counter()

  def __len__(self) -> int:
    return len(self._rows)

  def _drop(self, serial: int) -> Parked:
    parked = self._rows.pop(serial)
    serials = self._by_tokens[parked.tokens]
    serials.remove(serial)
    if not serials:
      del self._by_tokens[parked.tokens]
    return parked

  def park(self, state: DecodeState, slot: int, tokens: Sequence[int], version: int
           ) -> DecodeState:
    """Takes slot `slot`'s row out of `state` (donated; use the returned state) and keeps
    it under `tokens`, dropping the oldest rows beyond `capacity`."""
    state, row = self.engine.park(state, slot)
    key, serial = tuple(int(t) for t in tokens), next(self._serials)
    self._rows[serial] = Parked(row=row, tokens=key, version=version)
    self._by_tokens.setdefault(key, []).append(serial)
    while len(self._rows) > self.capacity:
      self._drop(next(iter(self._rows)))
      self.stats["parked_rows_dropped"] += 1
    return state

  def take(self, prompt: Sequence[int], version: int) -> Parked | None:
    """Removes and returns the row holding the longest proper prefix of `prompt` that
    `version` computed and after which the new tokens, padded to their bucket, fit the
    cache; None if there is none."""
    prompt = tuple(int(t) for t in prompt)
    lengths = sorted({len(k) for k in self._by_tokens if len(k) < len(prompt)}, reverse=True)
    for held in lengths:
      if not self._fits(held, len(prompt)):
        continue
      for serial in self._by_tokens.get(prompt[:held], ()):
        if self._rows[serial].version == version:
          self.stats["reused_tokens"] += held
          return self._drop(serial)
    return None

  def resume(self, params: Any, state: DecodeState, slot: int, parked: Parked,
             prompt: Sequence[int], sampling: SlotSampling) -> tuple[DecodeState, int]:
    """Slot `slot` continues `parked` with the rest of `prompt` (`Engine.resume`; `state`
    donated). Returns the new state and the tokens prefilled."""
    new = list(prompt[len(parked.tokens):])
    tokens = np.zeros((1, self._bucket(len(new))), np.int32)
    tokens[0, :len(new)] = new
    return self.engine.resume(params, parked.row, state, slot, tokens, len(new),
                              sampling=sampling), len(new)

  def _bucket(self, length: int) -> int:
    return max(self.MIN_BUCKET, 1 << max(length - 1, 0).bit_length())

  def _fits(self, held: int, total: int) -> bool:
    return held + self._bucket(total - held) <= self.engine.cache_length

  def drop_stale(self, version: int) -> None:
    """Drops the rows other weights computed (after a weight swap)."""
    for serial in [s for s, p in self._rows.items() if p.version != version]:
      self._drop(serial)
      self.stats["parked_rows_dropped"] += 1
