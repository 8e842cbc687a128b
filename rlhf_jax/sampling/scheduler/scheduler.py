"""Continuous batching over an Engine's decode slots.

Requests wait in a FIFO queue; free slots get waiting samples, prefilled (one length
bucket together, a prompt's `n` samples sharing one prefill) and inserted; every
`steps_per_sync` decode steps the host reads the tokens, hands back each finished
sample and refills its slot. `continuous=False`: static batching, for comparison.
With `overlap_host`, the host reads a dispatch's results while the device runs the next
one (a finished slot is refilled one dispatch later; the tokens are the same).

Thread safety: `submit`, `cancel`, `update_params` and `metrics` may be called
from any thread; `step`/`run` from one thread at a time (the server's loop).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Callable, Sequence

import numpy as np

from rlhf_jax.models.functional import Params
from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.prefix_cache import PrefixCache
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.scheduler import programs
from rlhf_jax.sampling.scheduler import swaps
from rlhf_jax.sampling.scheduler.options import default_prompt_buckets
from rlhf_jax.sampling.scheduler.options import validate_request
from rlhf_jax.sampling.scheduler.options import validate_scheduler_options
from rlhf_jax.sampling.scheduler.requests import RequestState
from rlhf_jax.sampling.scheduler.requests import SampleState
from rlhf_jax.sampling.scheduler.requests import TokenCallback
from rlhf_jax.sampling.scheduler.requests import cancelled_before_start
from rlhf_jax.sampling.scheduler.requests import completion_of
from rlhf_jax.sampling.scheduler.requests import drop_cancelled_waiting


class QueueFull(RuntimeError):
  """The scheduler's queue already holds `max_queue` requests."""


class Scheduler:
  """Feeds requests through an Engine with continuous batching.

  Args:
    engine: the Engine.
    params: model parameters (replaced by `update_params`).
    prompt_buckets: padded prompt lengths (one prefill compile each), each in
      [1, engine.cache_length); default `default_prompt_buckets(engine.cache_length)`.
    steps_per_sync: most decode steps per dispatch; a finished slot idles at most this
      many steps minus one (with overlap_host, one dispatch more) before it is refilled.
    continuous: refill slots as samples finish (False: static batching).
    max_queue: most requests waiting or running; `submit` raises QueueFull beyond.
    update_policy: "finish_old" (in-flight samples finish on the old weights;
      new samples wait for the swap) or "swap_now" (the next step uses the new
      weights, the samples in flight with their KV cache recomputed by them:
      sampling/scheduler/swaps.py; each Completion records the versions it saw).
    seed: seeds the draws for requests that give no seed.
    weights_version: the version number of `params`.
    max_prefill_batch: most prompts per prefill call (a power of two); prefill
      batches are padded to a few sizes up to it (`programs.prefill_batch_sizes`).
    parked_rows: most finished samples' cache rows kept for continuations (requests
      with `keep_cache`: sampling/engine/prefix_cache.py); None: `num_slots`.
    overlap_host: dispatch the next decode steps before reading the last ones' results
      (the device never waits for the host's bookkeeping); False: read each dispatch's
      results before the next (the same completions, one dispatch sooner).
  """

  # Called first in every `step`: a test holds the loop in it until its event happened.
  step_hook: Callable[[Scheduler], None] | None = None

  def __init__(self, engine: Engine, params: Params, *,
               prompt_buckets: Sequence[int] | None = None, steps_per_sync: int = 8,
               continuous: bool = True, max_queue: int = 4096,
               update_policy: str = "finish_old", seed: int = 0, weights_version: int = 0,
               max_prefill_batch: int = 8, parked_rows: int | None = None,
               overlap_host: bool = True):
    buckets = tuple(default_prompt_buckets(engine.cache_length) if prompt_buckets is None
                    else prompt_buckets)
    validate_scheduler_options(
        prompt_buckets=buckets, cache_length=engine.cache_length,
        steps_per_sync=steps_per_sync, max_prefill_batch=max_prefill_batch,
        max_queue=max_queue, update_policy=update_policy)
    buckets = tuple(sorted(buckets))
    self.engine = engine
    self.params = params
    self.prompt_buckets = buckets
    self.steps_per_sync = steps_per_sync
    self.max_prefill_batch = max_prefill_batch
    self.continuous = continuous
    self.overlap_host = bool(overlap_host)
    self._in_flight: programs.InFlight | None = None  # dispatched, results not read yet
    self.max_queue = max_queue
    self.update_policy = update_policy
    self.weights_version = weights_version
    self._rng = np.random.default_rng(seed)
    self._lock = threading.Lock()
    self._ids = itertools.count()
    self._queue: collections.deque[RequestState] = collections.deque()
    self._requests: dict[str, RequestState] = {}
    self._slots: list[SampleState | None] = [None] * engine.num_slots
    self._pending_params: tuple[Params, int] | None = None
    self._to_reap: list[RequestState] = []  # requests with a cancel since the last step
    self._new_state = programs.state_program(engine, params)  # one program, not ~13
    self._refill_plan = swaps.refill_plan(engine, max_prefill_batch, buckets[-1])
    self._state = self._new_state()
    self.prefix_cache = PrefixCache(engine, engine.num_slots if parked_rows is None
                                    else parked_rows)
    self._stats = collections.Counter()
    self._started = time.perf_counter()

  # ---------------------------------------------------------------- client side

  def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams = SamplingParams(), *,
             request_id: str | None = None, on_token: TokenCallback | None = None) -> str:
    """Queues a request; returns its id.

    Args:
      prompt_ids: the prompt tokens (at least one).
      sampling: its SamplingParams.
      request_id: an id of the caller's choice (default: a counter).
      on_token: called as on_token(request_id, sample_index, token,
        sampled_logprob, model_logprob) for every token, from the thread that
        runs `step`; an exception in it ends that request with an error.
    Raises:
      ValueError naming the bad field; QueueFull when the queue is full.
    """
    prompt_ids = [int(t) for t in prompt_ids]
    bucket = validate_request(prompt_ids, sampling, self.engine, self.prompt_buckets)
    with self._lock:
      if len(self._requests) >= self.max_queue:
        raise QueueFull(f"{len(self._requests)} requests queued or running "
                        f"(max_queue={self.max_queue}).")
      request_id = str(next(self._ids)) if request_id is None else request_id
      if request_id in self._requests:
        raise ValueError(f"request_id={request_id!r} is already in use.")
      seed = sampling.seed if sampling.seed is not None else int(self._rng.integers(2**31))
      request = RequestState(request_id=request_id, prompt_ids=prompt_ids, sampling=sampling,
                         seed=seed, bucket=bucket, on_token=on_token,
                         waiting=collections.deque(range(sampling.n)), outstanding=sampling.n)
      self._requests[request_id] = request
      self._queue.append(request)
      self._stats["requests_submitted"] += 1
    return request_id

  def close(self) -> None:
    """Nothing to release: the in-process scheduler holds only device state."""

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Ends a request, or only its sample `sample_index` (speculative rejection prunes
    single samples): its waiting and running samples complete "cancelled" at the next
    step. Finished samples and unknown ids are left alone. O(1): the step does the rest."""
    with self._lock:
      request = self._requests.get(request_id)
      if request is None:
        return
      if sample_index is None:
        request.cancelled = True
      else:
        request.cancelled_samples.add(int(sample_index))
      self._to_reap.append(request)

  def update_params(self, params: Params, version: int) -> None:
    """Hands new weights to the sampler (applied per `update_policy`)."""
    with self._lock:
      self._pending_params = (params, int(version))

  def newest_version(self) -> int:
    """The version of the weights handed over last: pending, else served (after a
    rollback the pending one is older, and the next update must not go below it)."""
    with self._lock:
      pending = self._pending_params
      return self.weights_version if pending is None else pending[1]

  def has_work(self) -> bool:
    """Something is queued, running, or a weight update is pending."""
    with self._lock:
      return bool(self._requests) or self._pending_params is not None

  def metrics(self) -> dict[str, float]:
    """Queue depth, slot use, token and request counts, tokens/s since start."""
    with self._lock:
      busy = sum(s is not None for s in self._slots)
      stats = dict(self._stats)
      waiting = sum(len(r.waiting) for r in self._requests.values())
    elapsed = max(time.perf_counter() - self._started, 1e-9)
    slot_steps = stats.get("slot_steps", 0)
    return {
        "queue_depth": float(waiting),
        "slots_busy": float(busy),
        "num_slots": float(self.engine.num_slots),
        "slot_utilisation": stats.get("emitted_tokens", 0) / slot_steps if slot_steps else 0.0,
        "generated_tokens": float(stats.get("emitted_tokens", 0)),
        "requests_completed": float(stats.get("requests_completed", 0)),
        "tokens_per_second": stats.get("emitted_tokens", 0) / elapsed,
        "prefilled_tokens": float(stats.get("prefilled_tokens", 0)),
        "reused_tokens": float(self.prefix_cache.stats["reused_tokens"]),
        "refilled_tokens": float(stats.get("refilled_tokens", 0)),  # at swaps (swaps.py)
        "weights_version": float(self.weights_version),
    }

  def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[
      SamplingParams] = SamplingParams()) -> list[list[Completion]]:
    """Samples every prompt and returns, per prompt, its `n` completions in order.

    The in-process `Sampler` interface (docs/concepts.md#the-seams): `generate(prompts, params)`.
    """
    samplings = per_prompt(prompts, sampling)
    ids = [self.submit(p, s) for p, s in zip(prompts, samplings)]
    done = {rid: [None] * s.n for rid, s in zip(ids, samplings)}
    for completion in self.run():
      if completion.request_id in done:
        done[completion.request_id][completion.sample_index] = completion
    return [done[rid] for rid in ids]

  def warmup(self, truncation: bool = True) -> dict[str, int]:
    """Compiles every program the scheduler can dispatch (sampling/scheduler/programs.py;
    without the truncating generates if not `truncation`; under 'swap_now' the swap's
    refill), so no request pays for compilation.
    Returns `engine.compilations()`."""
    compiled = programs.warmup(
        self.engine, self.params, self.prompt_buckets, max_prefill_batch=self.max_prefill_batch,
        init_state=self._new_state, steps_per_sync=self.steps_per_sync, truncation=truncation)
    if self.update_policy != "swap_now":
      return compiled
    self._state = swaps.warmup_refill(self.engine, self.params, self._state, self._refill_plan)
    return self.engine.compilations()

  def fail_all(self, reason: str) -> list[Completion]:
    """Ends every queued and running request with finish_reason "error" and starts
    from a fresh decode state: what the server does when a step itself fails, so
    one bad batch never takes the process down."""
    completions = [self._finish(slot, "error", reason)
                   for slot, sample in enumerate(self._slots) if sample is not None]
    with self._lock:
      self._stats["requests_failed"] += len(self._requests)
      self._requests.clear()
      self._queue.clear()
      self._to_reap.clear()
    self._in_flight = None
    self._state = self._new_state()
    return completions

  # ---------------------------------------------------------------- loop side

  def run(self) -> list[Completion]:
    """Steps until nothing is queued or running; returns completions in finishing order."""
    completions = []
    while self.has_work():
      completions.extend(self.step())
    return completions

  def step(self) -> list[Completion]:
    """Admits waiting samples into free slots, dispatches up to `steps_per_sync` decode
    steps, and returns the samples that finished in the dispatch before (`overlap_host`:
    read while the device runs this one), else in this one."""
    if self.step_hook is not None:
      self.step_hook(self)
    completions = self._reap_cancelled()
    if swaps.reads_first(self.update_policy, self._pending_params is not None,
                         self._in_flight is not None):
      completions.extend(self._read(self._in_flight))
      self._in_flight = None
    self._admit()  # swaps the weights first when due
    running = self._dispatch()
    for flight in (self._in_flight, running if not self.overlap_host else None):
      if flight is not None:
        completions.extend(self._read(flight))
    self._in_flight = running if self.overlap_host else None
    self._drop_finished_requests()
    return completions

  def _dispatch(self) -> programs.InFlight | None:
    """Dispatches the running samples' decode steps; None when each is sure to finish
    (max_new_tokens) in the dispatch in flight."""
    flight, running = self._in_flight, {i: s for i, s in enumerate(self._slots) if s}
    remaining = max((s.request.sampling.max_new_tokens - len(s.tokens) - (
        flight.ahead(i, s) if flight else 0) for i, s in running.items()), default=0)
    if remaining <= 0:
      return None
    steps = programs.steps_for(remaining, self.steps_per_sync)
    self._stats["slot_steps"] += steps * self.engine.num_slots
    self._state, flight = programs.dispatch(self.engine, self.params, self._state, running,
                                            steps, self.weights_version)
    return flight

  def _read(self, flight: programs.InFlight) -> list[Completion]:
    """Hands a dispatch's tokens to the samples that still hold their slots."""
    results = programs.read(flight)
    # A slot whose sample finished, was cancelled or replaced since is skipped.
    return [c for slot, sample in flight.samples.items() if self._slots[slot] is sample
            for c in self._collect(slot, results, flight.version)]

  def _collect(self, slot, results, version: int) -> list[Completion]:
    sample = self._slots[slot]
    request = sample.request
    for t in np.nonzero(results.emitted[:, slot])[0]:
      token = int(results.tokens[t, slot])
      sample.add(token, float(results.sampled_logprobs[t, slot]),
                 float(results.model_logprobs[t, slot]), version,
                 None if results.routes is None else np.asarray(results.routes[t, slot]))
      self._stats["emitted_tokens"] += 1
      if request.on_token is not None and not request.cancelled:
        try:
          request.on_token(request.request_id, sample.index, token, sample.sampled[-1],
                           sample.model[-1])
        except Exception as error:  # a failing consumer ends its request only
          return [self._finish(slot, "error", f"on_token raised {error!r}", version)]
      if results.finished[t, slot]:
        return [self._finish(slot, "stop" if results.stopped[t, slot] else "length",
                             version=version)]
    return []

  def _finish(self, slot: int, reason: str, error: str = "",
              version: int | None = None) -> Completion:
    """Ends slot `slot`'s sample, last run by weights `version` (None: the served ones)."""
    last = self.weights_version if version is None else version
    sample = self._slots[slot]
    self._slots[slot] = None
    request = sample.request
    with self._lock:
      request.outstanding -= 1
      if reason == "error":  # its other samples end too; the waiting never start
        request.cancelled = True
        self._to_reap.append(request)
    self._stats["samples_completed"] += 1
    if request.sampling.keep_cache and reason in ("stop", "length"):
      self._state = self.prefix_cache.park(self._state, slot, request.prompt_ids
                                           + sample.tokens, swaps.cache_version(sample))
    return completion_of(sample, reason, last, error)

  def _reap_cancelled(self) -> list[Completion]:
    """Completes the samples cancelled since the last step, waiting and running ones.
    Linear in those requests' samples, and the lock is held only to take them out of
    the queue: a request of many samples must not freeze `submit` and `metrics`."""
    with self._lock:
      to_reap, self._to_reap = self._to_reap, []
      dropped = drop_cancelled_waiting(to_reap)
    completions = [cancelled_before_start(request, index, self.weights_version)
                   for request, indices in dropped for index in indices]
    self._stats["samples_completed"] += len(completions)
    for slot, sample in enumerate(self._slots):
      if sample is not None and (sample.request.cancelled
                                 or sample.index in sample.request.cancelled_samples):
        completions.append(self._finish(slot, "cancelled"))
    return completions

  def _drop_finished_requests(self) -> None:
    with self._lock:
      for request_id in [rid for rid, r in self._requests.items() if r.outstanding <= 0]:
        del self._requests[request_id]
        self._stats["requests_completed"] += 1
      self._queue = collections.deque(r for r in self._queue if r.waiting)

  def _admit(self) -> None:
    with self._lock:
      # with the queue's lock: a request sent after update_params gets the new weights
      self._swap_if_due()
      if self._pending_params is not None and self.update_policy == "finish_old":
        return  # new samples start on the new weights
      free = [i for i, s in enumerate(self._slots) if s is None]
      if not self.continuous and len(free) < len(self._slots):
        return
      admitted = []
      for request in self._queue:
        while request.waiting and len(admitted) < len(free):
          admitted.append((request, request.waiting.popleft()))
        if len(admitted) == len(free):
          break
    if not admitted:
      return
    self._state, started, prefilled = programs.start_samples(
        self.engine, self.params, self._state, admitted, free, self.prefix_cache,
        max_prefill_batch=self.max_prefill_batch, pad_to=self.prompt_buckets[-1],
        version=self.weights_version)
    self._stats["prefilled_tokens"] += prefilled
    for slot, sample in started.items():
      self._slots[slot] = sample

  def _swap_if_due(self) -> None:  # under self._lock
    running = {i: s for i, s in enumerate(self._slots) if s is not None}
    if not swaps.swap_due(self.update_policy, self._pending_params is not None,
                          bool(running), self._in_flight is not None):
      return
    (self.params, self.weights_version), self._pending_params = self._pending_params, None
    self._state, refilled = swaps.swap_weights(
        self.engine, self.params, self.weights_version, self._state, running,
        self._requests.values(), self.prefix_cache, self._refill_plan)
    self._stats["refilled_tokens"] += refilled
    self._stats["weight_updates"] += 1

