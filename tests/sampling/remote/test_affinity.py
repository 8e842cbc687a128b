"""CacheAffinity: the server keeping the longest recorded prefix of a prompt, checked
against a plain search over the recorded sequences (the routing it drives:
tests/sampling/remote/test_fleet.py)."""

from __future__ import annotations

import numpy as np

from rlhf_jax.sampling.remote.affinity import CacheAffinity
from rlhf_jax.sampling.remote.affinity import prefix_hashes


def test_cache_affinity_finds_the_longest_kept_prefix_and_forgets_a_lost_server():
  affinity = CacheAffinity(capacity=2)
  affinity.record([1, 2, 3], "a")
  affinity.record([1, 2, 3, 4, 5], "b")
  assert affinity.owner([1, 2, 3, 4, 5, 9]) == "b"
  assert affinity.owner([1, 2, 3, 4]) == "a" and affinity.owner([1, 2, 3]) == "a"
  assert affinity.owner([1, 2]) is None and affinity.owner([7, 1, 2, 3]) is None
  affinity.record([8], "a")  # over capacity: the oldest, [1, 2, 3], is forgotten
  assert affinity.owner([1, 2, 3, 4]) is None
  affinity.forget("b")
  assert affinity.owner([1, 2, 3, 4, 5, 9]) is None and affinity.owner([8, 0]) == "a"


def test_prefix_hashes_are_those_of_each_prefix_alone():
  tokens = [5, 1, 5, 1, 9]
  chained = prefix_hashes(tokens)
  assert len(chained) == len(tokens)
  assert chained == [prefix_hashes(tokens[:k + 1])[-1] for k in range(len(tokens))]
  assert len(set(chained)) == len(tokens)  # the repeated tokens hash apart by position
  assert prefix_hashes(np.asarray(tokens)) == chained  # numpy ids hash as ints
  assert prefix_hashes([]) == []


def test_owner_is_the_longest_recorded_prefix_of_a_brute_force_search():
  rng = np.random.default_rng(0)
  affinity, recorded = CacheAffinity(), {}
  for index in range(60):
    tokens = tuple(int(t) for t in rng.integers(0, 3, rng.integers(1, 7)))
    address = f"server{index % 4}"
    affinity.record(tokens, address)
    recorded[tokens] = address  # a sequence kept again: its newest server
  affinity.record([], "nobody")  # nothing to keep
  for _ in range(200):
    prompt = tuple(int(t) for t in rng.integers(0, 3, rng.integers(1, 9)))
    prefixes = [prompt[:k] for k in range(len(prompt), 0, -1) if prompt[:k] in recorded]
    assert affinity.owner(prompt) == (recorded[prefixes[0]] if prefixes else None), prompt
