"""A `Sampler` over several sampling servers (`sampler.addresses`); needs the `serve` extra.

    fleet = SamplerFleet(["host0:50051", "host1:50051"])
    fleet.update_params(params, version=3)   every live server, concurrently
    fleet.generate(prompts, sampling)        each prompt to a live server (Routing, below)

- **Routing.** A prompt's request goes to the live server with the fewest requests in
  flight from this fleet; a continuation (a prompt that starts with a sample drawn with
  `keep_cache`, the next turn of an episode) goes to the server that keeps that sample's
  KV cache while it has room (`sampling/remote/affinity.py`), so it prefills only the new
  tokens.
  Each prompt carries its own seed (`per_prompt`), so its samples are the same whichever
  server draws them.
- **A server that fails** a call (unavailable, reset, deadline) is marked dead, logged,
  and its unfinished requests are sent again to the others: nothing is lost, and the
  re-sent samples equal the lost ones (same seed, same weights version).
- **A server that joins or comes back** is probed with `Health` (a 5 s deadline: a hung
  server holds no wait up) before each `generate` (at most every `probe_interval_s`); it
  gets the current weights before its first request, as a rollback (the trainer owns the
  servers' version: after a pinned job's they are older than the server's).
- **No server left**: `generate` (and `reference_logprobs`) wait up to `reconnect_s` for
  one to come back, logging when they start waiting and when one is back, then raise
  `FleetUnavailableError`, naming every address.
- **The reference** (`update_reference`, `reference_logprobs`): every server keeps the
  trainer's reference weights; a batch's reference log-probs are computed on the
  least-loaded server, with the same failover.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from typing import Any, Callable, Sequence

import grpc
import jax

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.protocol import SamplerUnavailable
from rlhf_jax.sampling.remote.affinity import CacheAffinity
from rlhf_jax.sampling.remote.client import SERVER_LOST
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.remote.client import call_timeout
from rlhf_jax.sampling.remote.client import describe_error
from rlhf_jax.sampling.serve.security import ClientSecurity

_MAX_REJECTIONS = 1200  # a prompt refused for a full queue this often (~1 min): give up
HEALTH_TIMEOUT_S = 5.0  # a probe's Health deadline: a live server answers in far less


class FleetUnavailableError(SamplerUnavailable):
  """No server of the fleet answers."""


class SamplerFleet:
  """Several sampling servers behind the `Sampler` interface (module docstring).

  Args:
    addresses: "host:port" of each server.
    timeout_s: deadline of one request on one server.
    max_in_flight: requests in flight per server.
    probe_interval_s: how often a dead server is probed again.
    log: where joins, deaths and re-sends are reported.
    client_factory: builds a client for an address (tests).
    security: the servers' token and TLS settings, for every client.
    reconnect_s: with every server gone, how long to wait for one to come back.
  """

  def __init__(self, addresses: Sequence[str], *, timeout_s: float = 600.0,
               max_in_flight: int = 8, probe_interval_s: float = 2.0,
               log: Callable[[str], None] = print,
               client_factory: Callable[[str], Any] | None = None,
               security: ClientSecurity | None = None, reconnect_s: float = 60.0):
    if not addresses:
      raise ValueError("a fleet needs at least one address.")
    factory = client_factory or (lambda a: SamplerClient(
        a, timeout_s=timeout_s, max_in_flight=max_in_flight, security=security))
    self.reconnect_s = reconnect_s
    self.addresses = list(addresses)
    self.clients = {a: factory(a) for a in self.addresses}
    self.max_in_flight = max_in_flight
    self.probe_interval_s = probe_interval_s
    self.log = log
    self.live: set[str] = set()
    self.in_flight = {a: 0 for a in self.addresses}
    self.last_probe = {a: -float("inf") for a in self.addresses}
    self.weights: tuple[Any, int] | None = None  # (host params, version) to give joiners
    self.reference: Any = None  # host reference weights (update_reference), for joiners
    # per server, the newest version it acknowledged: what a request sent now samples
    # with at least (a push may still be on its way while generation runs)
    self.acked: dict[str, int] = {}
    self.lock = threading.Lock()
    self.open: dict[str, str] = {}  # request id → address serving it
    self.counters = {"resent_requests": 0, "server_deaths": 0, "server_joins": 0,
                     "cache_routed": 0, "reconnect_waits": 0}
    self.affinity = CacheAffinity()  # whose kept caches continuations can reuse
    self.executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, max_in_flight * len(self.addresses)), thread_name_prefix="fleet")

  # ------------------------------------------------------------------ membership

  def probe(self, force: bool = False, deadline: float | None = None) -> None:
    """Health-checks the dead servers (at most every `probe_interval_s`, or now with
    `force`); one that answers gets the current weights, then joins. A Health probe
    waits at most `HEALTH_TIMEOUT_S` (a hung server must not hold up the others), and
    before `deadline` (time.monotonic()) like the weights a joining server gets."""
    now = time.monotonic()
    for address in self.addresses:
      if address in self.live or (not force and now - self.last_probe[address]
                                  < self.probe_interval_s):
        continue
      self.last_probe[address] = now
      client = self.clients[address]
      try:
        client.health(timeout_s=call_timeout(deadline, HEALTH_TIMEOUT_S))
        if self.weights is not None:
          self._give_weights(address, call_timeout(deadline, None))
        if self.reference is not None:
          client.update_reference(self.reference)
      except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
          raise  # our token is wrong: no wait fixes that
        if error.code() not in SERVER_LOST:  # it answers, but refuses: say why
          self.log(f"sampler fleet: {address} refused to join: {describe_error(error)}")
        continue
      with self.lock:
        self.live.add(address)
        self.counters["server_joins"] += 1
      self.log(f"sampler fleet: {address} joined"
               + (f" (weights version {self.weights[1]})" if self.weights else ""))

  def _give_weights(self, address: str, timeout_s: float | None = None) -> None:
    """The fleet's weights to a server that joins or restarted, as a rollback: after a
    pinned job's rollback they are older than the ones the server held before its blip,
    and the fleet's trainer owns the servers' version."""
    host, version = self.weights
    self.clients[address].update_weights(host, version, rollback=True, timeout_s=timeout_s)
    self.acked[address] = version

  def wait_ready(self, timeout_s: float = 60.0) -> None:
    """Blocks until at least one server answers."""
    deadline = time.monotonic() + timeout_s
    while not self.live:
      self.probe(force=True, deadline=deadline)
      if self.live:
        return
      if time.monotonic() > deadline:
        raise FleetUnavailableError(f"no sampler server answered in {timeout_s:.0f} s: "
                                    f"{', '.join(self.addresses)}")
      time.sleep(0.2)

  def await_server(self, what: str) -> None:
    """Returns once a server is live, probing every `probe_interval_s` (at least 0.2 s)
    for up to `reconnect_s`; raises FleetUnavailableError naming every address after."""
    start = time.monotonic()
    deadline = start + self.reconnect_s
    self.probe(force=True, deadline=deadline)
    if self.live:
      return
    self.counters["reconnect_waits"] += 1
    self.log(f"sampler fleet: every server is gone ({', '.join(self.addresses)}); waiting "
             f"up to {self.reconnect_s:.0f} s for one to come back")
    while time.monotonic() - start < self.reconnect_s:
      time.sleep(min(max(self.probe_interval_s, 0.2),
                     max(self.reconnect_s - (time.monotonic() - start), 0)))
      self.probe(force=True, deadline=deadline)
      if self.live:
        self.log(f"sampler fleet: {', '.join(sorted(self.live))} back after "
                 f"{time.monotonic() - start:.1f} s")
        return
    raise FleetUnavailableError(f"{what}: every sampler server is gone and none came back "
                                f"in {self.reconnect_s:.0f} s: {', '.join(self.addresses)}")

  def _lost(self, address: str, error: Exception) -> None:
    with self.lock:
      if address not in self.live:
        return
      self.live.discard(address)
      self.last_probe[address] = time.monotonic()
      self.counters["server_deaths"] += 1
      self.affinity.forget(address)
    self.log(f"sampler fleet: {address} lost ({describe_error(error)}); its requests go to "
             f"{', '.join(sorted(self.live)) or 'no server'}")

  # ------------------------------------------------------------------ the Sampler interface

  def update_params(self, params: Any, version: int, *, rollback: bool = False
                    ) -> list[Any]:
    """Sends `params` as `version` to every live server at once; kept for joiners.
    Returns the replies of the servers that took them (each names its update policy).
    `rollback`: an older version on purpose (servers refuse one otherwise); a refusal
    other than a lost server is raised."""
    host = jax.device_get(params)
    self.weights = (host, version)
    live = sorted(self.live)
    futures = {a: self.executor.submit(self.clients[a].update_weights, host, version,
                                       rollback=rollback) for a in live}
    replies = []
    for address, future in futures.items():
      try:
        replies.append(future.result())
        self.acked[address] = version  # a pinned job may load an older one: exactly this
      except grpc.RpcError as error:
        if error.code() not in SERVER_LOST:
          raise
        self._lost(address, error)
    return replies

  def rollback_params(self, params: Any, version: int) -> list[Any]:
    """`update_params` with an older version on purpose (`VersionedSampler`)."""
    return self.update_params(params, version, rollback=True)

  def update_reference(self, params: Any) -> list[Any]:
    """Sends the reference weights to every live server at once; kept for joiners and
    servers that restart. Returns the replies (each names its compute dtype)."""
    self.reference = jax.device_get(params)
    futures = {a: self.executor.submit(self.clients[a].update_reference, self.reference)
               for a in sorted(self.live)}
    replies = []
    for address, future in futures.items():
      try:
        replies.append(future.result())
      except grpc.RpcError as error:
        self._lost(address, error)
    return replies

  def reference_logprobs(self, tokens, attention_mask, response_mask):
    """`SamplerClient.reference_logprobs` on the least-loaded live server; a server that
    fails is marked lost and the rows go to another, one that restarted (no reference)
    gets the reference again first."""
    self.probe()
    for _ in range(len(self.addresses) + 1):
      if not self.live:
        self.await_server("reference_logprobs")
      address = self._least_loaded()
      with self.lock:
        self.in_flight[address] += 1
      try:
        return self.clients[address].reference_logprobs(tokens, attention_mask, response_mask)
      except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.FAILED_PRECONDITION and self.reference is not None:
          self.log(f"sampler fleet: {address} had lost the reference weights: sending them "
                   "again")
          try:
            self.clients[address].update_reference(self.reference)
          except grpc.RpcError as again:
            self._lost(address, again)
        elif error.code() in SERVER_LOST:
          self._lost(address, error)
        else:
          raise
      finally:
        with self.lock:
          self.in_flight[address] -= 1
    raise FleetUnavailableError("no sampler server computed the reference log-probs: "
                                f"{', '.join(self.addresses)}")

  def prepare_params(self, params: Any) -> Any:
    """Host copies of `params` (what a `VersionedSampler` keeps per version)."""
    return jax.device_get(params)

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """Per prompt its completions, each prompt on a live server (a continuation on the one
    keeping its cache, else the least loaded: the module docstring). A prompt
    is tried on at most `len(addresses) + 1` servers; on any error the batch's other
    requests are cancelled before it is raised."""
    samplings = per_prompt(prompts, sampling)
    self.probe()
    batch_id = uuid.uuid4().hex[:12]
    out: list[list[Completion] | None] = [None] * len(prompts)
    waiting = list(range(len(prompts)))[::-1]
    attempts, rejected = [0] * len(prompts), [0] * len(prompts)
    # per request: its prompt, server, and the weights version it was sent under
    running: dict[concurrent.futures.Future, tuple[int, str, int | None]] = {}
    try:
      while waiting or running:
        while waiting and self._has_room():
          index = waiting.pop()
          attempts[index] += 1
          future, address = self._send(batch_id, index, prompts[index], samplings[index])
          running[future] = (index, address, self.acked.get(address))
        if not running:  # prompts left and no live server
          self.await_server("generate")
          continue
        done, _ = concurrent.futures.wait(running,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
          index, address, sent_version = running.pop(future)
          self._finished(f"{batch_id}-{index}", address)
          retry = self._outcome(future, address, sent_version)
          if retry is None:
            out[index] = future.result()
            if samplings[index].keep_cache:
              with self.lock:
                for completion in out[index]:
                  self.affinity.record(list(prompts[index]) + list(completion.token_ids),
                                       address)
            continue
          if retry.startswith("RESOURCE_EXHAUSTED") and rejected[index] < _MAX_REJECTIONS:
            attempts[index] -= 1  # back-pressure (a full queue), not a failure: wait a little
            rejected[index] += 1
            time.sleep(0.05)
          elif attempts[index] > len(self.addresses) or rejected[index] >= _MAX_REJECTIONS:
            raise FleetUnavailableError(f"prompt {index} failed on {attempts[index]} tries; "
                                        f"last: {retry}")
          with self.lock:
            self.counters["resent_requests"] += 1
          waiting.append(index)
    finally:
      for future, (index, address, _) in running.items():  # an error: free their slots
        self.clients[address].cancel(f"{batch_id}-{index}")
        self._finished(f"{batch_id}-{index}", address)
    return out

  def _send(self, batch_id: str, index: int, prompt, sampling
            ) -> tuple[concurrent.futures.Future, str]:
    address = self._cache_owner(prompt) or self._least_loaded()
    request_id = f"{batch_id}-{index}"
    with self.lock:
      self.in_flight[address] += 1
      self.open[request_id] = address
    return self.clients[address].submit(prompt, sampling, request_id=request_id), address

  def _finished(self, request_id: str, address: str) -> None:
    with self.lock:
      if self.open.pop(request_id, None) is not None:
        self.in_flight[address] -= 1

  def _outcome(self, future: concurrent.futures.Future, address: str,
               sent_version: int | None) -> str | None:
    """None when the request's completions are good; else why it goes to another server
    (the server is marked lost, or given the current weights again). A sample that
    started on weights older than those it was sent under was served by a restarted
    server; newer ones are a swap under a sample in flight (partial rollouts)."""
    try:
      completions = future.result()
    except grpc.RpcError as error:
      if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return describe_error(error)  # a full queue: try again, elsewhere if possible
      if error.code() not in SERVER_LOST:
        raise
      self._lost(address, error)
      return describe_error(error)
    if sent_version is not None and any(c.weights_version[0] < sent_version
                                        for c in completions):
      # It restarted between two calls (the channel reconnected): weights first, again.
      self.log(f"sampler fleet: {address} sampled with weights version "
               f"{completions[0].weights_version[0]}, not {sent_version}: sending them "
               "again")
      try:
        self._give_weights(address)
      except grpc.RpcError as error:
        self._lost(address, error)
      return f"{address} had lost its weights"
    return None

  def _has_room(self) -> bool:
    with self.lock:  # the trainer's thread may drop a server meanwhile (partial rollouts)
      return any(self.in_flight[a] < self.max_in_flight for a in self.live)

  def _cache_owner(self, prompt) -> str | None:
    """The live server keeping the cache of the prompt's longest kept prefix, if it has
    room for another request."""
    with self.lock:
      address = self.affinity.owner(prompt)
      if (address is None or address not in self.live
          or self.in_flight[address] >= self.max_in_flight):
        return None
      self.counters["cache_routed"] += 1
      return address

  def _least_loaded(self) -> str:
    with self.lock:
      return min(sorted(self.live), key=lambda a: self.in_flight[a])

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Cancels a request, or one of its samples, on the server serving it (ids are
    `<batch>-<prompt index>`)."""
    address = self.open.get(request_id)
    if address is not None:
      self.clients[address].cancel(request_id, sample_index)

  def metrics(self) -> dict[str, float]:
    """fleet/live_servers and the fleet's counters."""
    return {"fleet/live_servers": float(len(self.live)),
            **{f"fleet/{k}": float(v) for k, v in self.counters.items()}}

  def close(self) -> None:
    """Closes every connection."""
    self.executor.shutdown(wait=False, cancel_futures=True)
    for client in self.clients.values():
      client.close()
