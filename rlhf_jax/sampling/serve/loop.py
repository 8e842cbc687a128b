"""The scheduler loop behind the sampling server, independent of gRPC.

One thread runs the scheduler loop; callers (the RPC handlers in `handlers.py`)
submit requests and read a per-request event queue that the loop fills with tokens
and finished samples. An exception inside a decode step ends the requests then
running (their queues get a "failed" event) and the loop carries on with a fresh
decode state.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid

from rlhf_jax.models.functional import Params
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve.reference import ReferencePolicy

# How long the idle loop and the RPC handlers wait before looking again (a client's
# disconnect or `stop` is noticed within this).
POLL_S = 0.05
MAX_REQUEST_ID = 128  # characters of a caller's request_id
# Characters of a text prompt per KV position: longer text cannot fit the cache, and
# tokenizing it would cost the server time for nothing.
TEXT_PER_POSITION = 64


class RequestTooLarge(ValueError):
  """A request beyond the server's per-request limits (answered INVALID_ARGUMENT)."""


class SamplerService:
  """The scheduler loop plus request bookkeeping.

  Args:
    scheduler: the Scheduler to drive.
    tokenizer: optional rlhf_jax Tokenizer, for text prompts and decoded text.
    max_samples_per_request: the most samples (`n`) one request may ask for: a request's
      samples are queued at once, so an unbounded `n` would hold the queue.
    counters: a dict the server's other parts count into (auth.Gate's refusals); its
      entries are reported by `metrics`.
  """

  def __init__(self, scheduler: Scheduler, tokenizer=None, *,
               max_samples_per_request: int = 64, counters: dict | None = None):
    self.scheduler = scheduler
    self.tokenizer = tokenizer
    self.max_samples_per_request = max_samples_per_request
    # The trainer's reference weights, once sent (UpdateReference).
    self.reference = ReferencePolicy(scheduler.engine.model,
                                     max_length=scheduler.engine.cache_length)
    self._sinks: dict[str, queue.Queue] = {}
    self._lock = threading.Lock()
    self._wake = threading.Event()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="sampler-loop", daemon=True)
    self.counters = counters if counters is not None else {}
    for name in ("requests_rejected", "requests_invalid", "step_failures",
                 "requests_over_limit"):
      self.counters.setdefault(name, 0)

  def start(self) -> None:
    """Starts the scheduler loop thread."""
    self._thread.start()

  def stop(self) -> None:
    """Stops the loop thread (requests still queued are left unanswered)."""
    self._stop.set()
    self._wake.set()
    self._thread.join(timeout=30)

  def submit(self, prompt_ids, sampling: SamplingParams, request_id: str = "") -> tuple[
      str, queue.Queue]:
    """Queues a request; returns (request_id, events).

    Events: ("token", sample_index, token, sampled_logprob, model_logprob),
    ("done", Completion), ("failed", message).
    Raises ValueError (bad field), RequestTooLarge or QueueFull.
    """
    if sampling.n > self.max_samples_per_request:
      raise RequestTooLarge(f"sampling.n={sampling.n}: this server takes at most "
                            f"{self.max_samples_per_request} samples per request "
                            "(server.max_samples_per_request).")
    if len(request_id) > MAX_REQUEST_ID:
      raise RequestTooLarge(f"request_id has {len(request_id)} characters; at most "
                            f"{MAX_REQUEST_ID}.")
    request_id = request_id or uuid.uuid4().hex
    events: queue.Queue = queue.Queue()
    with self._lock:
      if request_id in self._sinks:
        raise ValueError(f"request_id={request_id!r} is already in use.")
      self._sinks[request_id] = events
    try:
      self.scheduler.submit(prompt_ids, sampling, request_id=request_id,
                            on_token=self._on_token)
    except Exception:
      with self._lock:
        self._sinks.pop(request_id, None)
      raise
    self._wake.set()
    return request_id, events

  def release(self, request_id: str) -> None:
    """Forgets a request's event queue and cancels whatever of it still runs."""
    with self._lock:
      self._sinks.pop(request_id, None)
    self.scheduler.cancel(request_id)
    self._wake.set()

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Ends a request, or its sample `sample_index`; its samples complete "cancelled"."""
    self.scheduler.cancel(request_id, sample_index)
    self._wake.set()

  def update_params(self, params: Params, version: int) -> None:
    """Hands new weights to the scheduler (its `update_policy` applies) and wakes the
    loop, which may be idle: the swap happens in a step."""
    self.scheduler.update_params(params, version)
    self._wake.set()

  def tokenize(self, text: str) -> list[int]:
    """Token ids of a text prompt; ValueError when the server has no tokenizer."""
    if self.tokenizer is None:
      raise ValueError("prompt_text needs a server tokenizer (config tokenizer=...); "
                       "send prompt_ids instead.")
    longest = TEXT_PER_POSITION * self.scheduler.engine.cache_length
    if len(text) > longest:
      raise RequestTooLarge(f"prompt_text has {len(text)} characters; at most {longest}.")
    return self.tokenizer.encode(text)

  def detokenize(self, ids) -> str:
    """Text of token ids, or "" without a tokenizer."""
    return "" if self.tokenizer is None else self.tokenizer.decode(ids)

  def metrics(self) -> dict[str, float]:
    """Scheduler metrics plus the server's own counters."""
    return {**self.scheduler.metrics(), **{k: float(v) for k, v in self.counters.items()}}

  def _on_token(self, request_id, sample_index, token, sampled_logprob, model_logprob):
    sink = self._sinks.get(request_id)
    if sink is not None:
      sink.put(("token", sample_index, token, sampled_logprob, model_logprob))

  def _deliver(self, completion: Completion) -> None:
    sink = self._sinks.get(completion.request_id)
    if sink is not None:
      sink.put(("done", completion))

  def _fail_running(self, error: Exception) -> None:
    logging.exception("sampler step failed; failing the running requests")
    self.counters["step_failures"] += 1
    message = f"sampler step failed: {error!r}"
    for completion in self.scheduler.fail_all(message):
      self._deliver(completion)
    with self._lock:
      for sink in self._sinks.values():
        sink.put(("failed", message))

  def _loop(self) -> None:
    while not self._stop.is_set():
      if not self.scheduler.has_work():
        self._wake.wait(POLL_S)
        self._wake.clear()
        continue
      try:
        completions = self.scheduler.step()
      except Exception as error:  # a failed step must not take the server down
        self._fail_running(error)
        continue
      for completion in completions:
        self._deliver(completion)
