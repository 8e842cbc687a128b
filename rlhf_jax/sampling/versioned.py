"""A `Sampler` that keeps the last few weight versions, so that generation running
behind the trainer (`rollout.max_staleness` > 0) samples with the version it was given.

    trainer thread                         generation thread
    update_params(params, v)  ─ stores ─▶  with sampler.pinned(v - k + ...):
    (a copy: the learner donates its         generate(...)  loads that version into
     buffers at its next update)                            the wrapped sampler first

Which version a batch samples with is fixed when its job is submitted, never by
thread timing, so an asynchronous run is as reproducible as a synchronous one. Calls
from any thread are serialised by one lock; a call with no pinned version (evaluation)
samples with the newest weights.

Partial rollouts (`partial=True`, rollout.partial_rollouts): `update_params` hands each
new version to the wrapped sampler at once, from the trainer's thread, while generation
runs; a sampler whose update policy is 'swap_now' switches the samples in flight at its
next decode step and records each token's version (Completion.token_versions). Where
the switch falls follows the threads' timing.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.protocol import LoadsPrepared
from rlhf_jax.sampling.protocol import PreparesParams
from rlhf_jax.sampling.protocol import RollsBack


class _Pin(threading.local):
  """A thread's pinned version (None: the newest)."""
  version: int | None = None


class VersionedSampler:
  """Wraps a Sampler (see the module docstring).

  Args:
    inner: the sampler that generates (in-process Scheduler or server client); it holds
      `params` as version `version` already.
    params: those initial weights.
    version: their version.
    keep: how many of the newest versions to keep (max_staleness + 1 covers every job
      in flight).
    partial: hand new versions to the samples in flight (see the module docstring).
  """

  def __init__(self, inner, params: Any, *, version: int = 0, keep: int = 2,
               partial: bool = False):
    if keep < 1:
      raise ValueError(f"keep={keep} must be >= 1.")
    self.inner = inner
    self.keep = keep
    self.lock = threading.RLock()  # one user of the wrapped sampler at a time
    self.versions_lock = threading.Lock()  # the stored versions: never waits for sampling
    self.versions: dict[int, Any] = {version: params}
    self.latest = self.loaded = version
    self.partial = partial
    self._pin = _Pin()

  def update_params(self, params: Any, version: int) -> None:
    """Stores `params` as `version` (the newest); the wrapped sampler loads it when a
    call needs it. Versions beyond the newest `keep` are dropped. A wrapped sampler that
    `PreparesParams` (ProcessShardedSampler, a server) prepares them here, on the
    caller's thread; another's are copied (the learner donates its buffers)."""
    params = (self.inner.prepare_params(params) if isinstance(self.inner, PreparesParams)
              else jax.tree.map(jnp.copy, params))
    with self.versions_lock:
      self.versions[version] = params
      self.latest = max(self.latest, version)
      for old in sorted(self.versions)[:-self.keep]:
        del self.versions[old]
    if self.partial:
      self._load(params, version)

  def _load(self, params: Any, version: int) -> None:
    load = (self.inner.load_prepared if isinstance(self.inner, LoadsPrepared)
            else self.inner.update_params)
    if version < self.loaded and isinstance(self.inner, RollsBack):
      load = self.inner.rollback_params  # a server refuses an older version otherwise
    replies = load(params, version)  # a server's reply names its update policy; a fleet's
    replies = replies if isinstance(replies, list) else [replies]  # one per server
    policies = {r.update_policy for r in replies if r is not None} - {"swap_now"}
    if self.partial and policies:
      raise ValueError(f"rollout.partial_rollouts needs sampling servers started with "
                       f"sampler.update_policy='swap_now'; found {sorted(policies)}.")
    self.loaded = version

  @contextlib.contextmanager
  def pinned(self, version: int) -> Iterator[None]:
    """Within the block, this thread's calls sample with weights `version`."""
    self._pin.version = version
    try:
      yield
    finally:
      self._pin.version = None

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """The wrapped sampler's `generate` with this thread's pinned version (else the newest)."""
    if self.partial:  # the newest weights, swapped in under the samples as they come
      with self.lock:
        return self.inner.generate(prompts, sampling)
    with self.lock:
      with self.versions_lock:
        version = self.latest if self._pin.version is None else self._pin.version
        if version not in self.versions:
          raise KeyError(f"weights version {version} is no longer kept (kept: "
                         f"{sorted(self.versions)}); raise `keep`.")
        params = self.versions[version]
      if version != self.loaded:
        self._load(params, version)
      return self.inner.generate(prompts, sampling)

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Cancels a request (or one sample) of the wrapped sampler."""
    self.inner.cancel(request_id, sample_index)

  def close(self) -> None:
    """Closes the wrapped sampler."""
    self.inner.close()

  def wrapped(self):
    """The sampler this one loads versions into (its extras: `protocol.find_extra`)."""
    return self.inner
