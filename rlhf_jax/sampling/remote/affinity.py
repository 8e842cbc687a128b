"""Which server of a fleet holds the KV cache a continuation can reuse.

A request with `SamplingParams.keep_cache` leaves each finished sample's cache row parked
on the server that drew it (sampling/engine/prefix_cache.py), keyed by its tokens: the
prompt and the sample. The next turn of that conversation is a prompt that starts with those
tokens; sent to the same server, it prefills only the new ones. `CacheAffinity` records
(tokens → server) and finds the server of the longest recorded prefix of a prompt, by a
chain of prefix hashes (one pass over the prompt). It is a routing hint: a server that no
longer holds the row (evicted, restarted) prefills the whole prompt, with the same tokens
drawn either way.
"""

from __future__ import annotations

import collections
from typing import Sequence


def prefix_hashes(tokens: Sequence[int]) -> list[int]:
  """hash of tokens[:k + 1] for every k, chained so that one pass computes them all."""
  out, value = [], 0
  for token in tokens:
    value = hash((value, int(token)))
    out.append(value)
  return out


class CacheAffinity:
  """Token sequences whose caches were kept, and the server that keeps each (the newest
  `capacity` of them).

  Args:
    capacity: sequences remembered; the oldest are forgotten first.
  """

  def __init__(self, capacity: int = 65536):
    self.capacity = capacity
    self.owners: collections.OrderedDict[int, str] = collections.OrderedDict()

  def record(self, tokens: Sequence[int], address: str) -> None:
    """`address` keeps the cache of `tokens` (a prompt and its sample)."""
    if not tokens:
      return
    key = prefix_hashes(tokens)[-1]
    self.owners[key] = address
    self.owners.move_to_end(key)
    while len(self.owners) > self.capacity:
      self.owners.popitem(last=False)

  def owner(self, prompt: Sequence[int]) -> str | None:
    """The server keeping the longest recorded prefix of `prompt` (the whole prompt
    included), or None."""
    for key in reversed(prefix_hashes(prompt)):
      address = self.owners.get(key)
      if address is not None:
        return address
    return None

  def forget(self, address: str) -> None:
    """Drops every sequence of a server (it was lost: its caches with it)."""
    for key in [k for k, a in self.owners.items() if a == address]:
      del self.owners[key]
