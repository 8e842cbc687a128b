"""A Python client for the sampling server (`launch/serve.py`); needs the `serve` extra.

    client = SamplerClient("localhost:50051")   # or security=ClientSecurity(token=...)
    completions = client.generate([prompt_ids, ...], SamplingParams(n=4, seed=0))
    client.update_weights(params, version=7)

`generate` has the in-process `Scheduler.generate` signature, so the trainer
can take either sampler.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import uuid
from typing import Iterator, Sequence

import grpc
import jax
import numpy as np

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.serve import auth
from rlhf_jax.sampling.serve.protos import sampler_pb2
from rlhf_jax.sampling.serve.protos import sampler_pb2_grpc
from rlhf_jax.sampling.serve.security import ClientSecurity
from rlhf_jax.sampling.serve.security import ROLLBACK_HEADER
from rlhf_jax.sampling.serve.wire import MAX_MESSAGE_BYTES
from rlhf_jax.sampling.serve.wire import array_from_proto
from rlhf_jax.sampling.serve.wire import array_to_proto
from rlhf_jax.sampling.serve.wire import param_names
from rlhf_jax.sampling.serve.wire import sampling_to_proto

WEIGHT_CHUNK_BYTES = 4 * 1024 * 1024

# A call failing with one of these means the server (or the way to it) is gone.
SERVER_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
               grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
MIN_CALL_S = 0.5  # a call made at a deadline still gets this long


def call_timeout(deadline: float | None, cap: float | None) -> float | None:
  """A call's timeout in seconds: at most `cap` (None: the client's own) and the time
  left before `deadline` (time.monotonic(); None: no deadline), never under MIN_CALL_S,
  so a wait for a server is bounded by the caller's deadline, not the client's."""
  if deadline is None:
    return cap
  left = max(deadline - time.monotonic(), MIN_CALL_S)
  return left if cap is None else min(cap, left)


def describe_error(error: Exception) -> str:
  """An error in one line: a gRPC status's code and details, else its repr."""
  if isinstance(error, grpc.RpcError):
    return f"{error.code().name}: {error.details()}"
  return repr(error)


@dataclasses.dataclass
class TokenEvent:
  """Tokens of one sample as the stream delivered them."""
  sample_index: int
  token_ids: list[int]
  sampled_logprobs: list[float]
  model_logprobs: list[float]


def completion_from_proto(request_id: str, prompt_ids: Sequence[int],
                          sample: sampler_pb2.Sample) -> Completion:
  """A Completion from a Sample message."""
  return Completion(
      request_id=request_id, sample_index=sample.sample_index, prompt_ids=list(prompt_ids),
      token_ids=list(sample.token_ids), sampled_logprobs=list(sample.sampled_logprobs),
      model_logprobs=list(sample.model_logprobs), finish_reason=sample.finish_reason,
      seed=sample.seed,
      weights_version=(sample.first_weights_version, sample.last_weights_version),
      error=sample.error, candidate_logprobs=list(sample.candidate_logprobs),
      token_versions=list(sample.token_versions),
      routes=(_routes_from_proto(sample) if sample.HasField("routes") else None))


def _routes_from_proto(sample: sampler_pb2.Sample) -> np.ndarray:
  """A Sample's routes, checked to hold one integer [L, k] row per token."""
  routes = array_from_proto(sample.routes, "Sample.routes")
  if (routes.ndim != 3 or routes.shape[0] != len(sample.token_ids)
      or not np.issubdtype(routes.dtype, np.integer)):
    raise ValueError(f"Sample.routes: {routes.dtype}{list(routes.shape)} is not one integer "
                     f"[layers, top_k] row per each of the {len(sample.token_ids)} tokens.")
  return routes


def _weight_chunks(params, version: int, chunk_bytes: int) -> Iterator[sampler_pb2.WeightChunk]:
  """The UpdateWeights / UpdateReference stream of `params`: tensor by tensor, in chunks."""
  for name, leaf in param_names(params):
    array = np.ascontiguousarray(jax.device_get(leaf))
    data = array.tobytes()
    for offset in range(0, max(len(data), 1), chunk_bytes):
      yield sampler_pb2.WeightChunk(version=version, name=name, dtype=str(array.dtype),
                                    shape=array.shape, offset=offset,
                                    data=data[offset:offset + chunk_bytes])


class SamplerClient:
  """Talks to a sampling server.

  Args:
    address: "host:port".
    timeout_s: default deadline per call (None: none).
    max_in_flight: most requests `generate` keeps open at once. Each open request
      holds one of the server's `max_workers` handler threads, beyond which it
      answers RESOURCE_EXHAUSTED, so keep this below the server's setting.
    security: the server's token (sent with every call) and TLS settings
      (`security.client_security` reads them from a config's sampler section).
  """

  def __init__(self, address: str, *, timeout_s: float | None = 600.0, max_in_flight: int = 8,
               security: ClientSecurity | None = None):
    if max_in_flight < 1:
      raise ValueError(f"max_in_flight={max_in_flight} must be >= 1.")
    self.address = address
    self.timeout_s = timeout_s
    self.max_in_flight = max_in_flight
    self._channel = auth.channel(address, security, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # a server that comes back is seen within seconds (gRPC's default backs off to 2 min)
        ("grpc.max_reconnect_backoff_ms", 5000)])
    self._stub = sampler_pb2_grpc.SamplerStub(self._channel)
    self._futures: dict[str, grpc.Future] = {}  # request id → open unary call

  def close(self) -> None:
    """Closes the channel."""
    self._channel.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def wait_ready(self, timeout_s: float = 60.0) -> None:
    """Blocks until the server answers (raises grpc.FutureTimeoutError otherwise)."""
    grpc.channel_ready_future(self._channel).result(timeout=timeout_s)

  @staticmethod
  def _request(prompt_ids, sampling: SamplingParams, request_id: str):
    return sampler_pb2.GenerateRequest(
        request_id=request_id, prompt_ids=sampler_pb2.TokenIds(ids=[int(t) for t in prompt_ids]),
        sampling=sampling_to_proto(sampling))

  def generate_one(self, prompt_ids: Sequence[int], sampling: SamplingParams = SamplingParams(),
                   *, request_id: str = "") -> list[Completion]:
    """The `n` completions of one prompt (unary call)."""
    response = self._stub.Generate(self._request(prompt_ids, sampling, request_id),
                                   timeout=self.timeout_s)
    return [completion_from_proto(response.request_id, prompt_ids, s) for s in response.samples]

  def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams, *, request_id: str
             ) -> concurrent.futures.Future:
    """Starts one prompt's request; the future gives its completions ([] once cancelled
    with `cancel(request_id)`) or raises the call's grpc.RpcError."""
    call = self._stub.Generate.future(self._request(prompt_ids, sampling, request_id),
                                      timeout=self.timeout_s)
    self._futures[request_id] = call
    result = concurrent.futures.Future()

    def finish(done):
      self._futures.pop(request_id, None)
      try:
        response = done.result()
        result.set_result([completion_from_proto(response.request_id, prompt_ids, s)
                           for s in response.samples])
      except grpc.FutureCancelledError:
        result.set_result([])
      except BaseException as error:  # pylint: disable=broad-except
        # grpc swallows a callback's exception: the caller would wait forever.
        result.set_exception(error)
    call.add_done_callback(finish)
    return result

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """Per prompt, its `n` completions; all prompts are in flight at once, so the
    server batches them."""
    samplings = per_prompt(prompts, sampling)
    out: list[list[Completion] | None] = [None] * len(prompts)
    pending = list(enumerate(zip(prompts, samplings)))[::-1]
    in_flight = []  # (index, prompt, request id, future), oldest first
    batch_id = uuid.uuid4().hex[:12]
    try:
      while pending or in_flight:
        while pending and len(in_flight) < self.max_in_flight:
          index, (prompt, sampling_params) = pending.pop()
          request_id = f"{batch_id}-{index}"
          future = self._stub.Generate.future(
              self._request(prompt, sampling_params, request_id), timeout=self.timeout_s)
          self._futures[request_id] = future
          in_flight.append((index, prompt, request_id, future))
        index, prompt, request_id, future = in_flight.pop(0)
        try:
          response = future.result()
          out[index] = [completion_from_proto(response.request_id, prompt, s)
                        for s in response.samples]
        except grpc.FutureCancelledError:
          out[index] = []  # cancelled by `cancel`
        finally:
          self._futures.pop(request_id, None)
    finally:
      for _, _, request_id, future in in_flight:  # an error: the server frees their slots
        future.cancel()
        self._futures.pop(request_id, None)
    return out

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Cancels an open `generate` request (ids are `<batch>-<prompt index>`): the server
    sees the disconnect and frees its slots. With `sample_index`, ends only that sample
    (the `Cancel` RPC); the request still returns, that sample with finish_reason
    "cancelled". Unknown ids are ignored."""
    if sample_index is not None:
      self._stub.Cancel(sampler_pb2.CancelRequest(request_id=request_id,
                                                  sample_index=int(sample_index)),
                        timeout=self.timeout_s)
      return
    future = self._futures.get(request_id)
    if future is not None:
      future.cancel()

  def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams = SamplingParams(), *,
             request_id: str = "") -> Iterator[TokenEvent | Completion]:
    """Yields TokenEvents as tokens are drawn and a Completion as each sample ends.

    Stop iterating (or call `.cancel()` on the underlying call via `close`) to
    cancel the request; the server frees its slots.
    """
    call = self._stub.GenerateStream(self._request(prompt_ids, sampling, request_id),
                                     timeout=self.timeout_s)
    try:
      for message in call:
        if message.WhichOneof("event") == "tokens":
          chunk = message.tokens
          yield TokenEvent(chunk.sample_index, list(chunk.token_ids),
                           list(chunk.sampled_logprobs), list(chunk.model_logprobs))
        else:
          yield completion_from_proto(message.request_id, prompt_ids, message.finished)
    finally:
      call.cancel()

  def update_weights(self, params, version: int, chunk_bytes: int = WEIGHT_CHUNK_BYTES, *,
                     rollback: bool = False, timeout_s: float | None = None
                     ) -> sampler_pb2.UpdateWeightsResponse:
    """Sends new parameters (tensor by tensor, in chunks) tagged with `version`. The
    server refuses a version older than its own unless `rollback` (a job pinned to an
    older version: `rollback_params`). `timeout_s`: this call's deadline, else the
    client's."""
    return self._stub.UpdateWeights(_weight_chunks(params, version, chunk_bytes),
                                    timeout=self.timeout_s if timeout_s is None else timeout_s,
                                    metadata=[ROLLBACK_HEADER] if rollback else None)

  def rollback_params(self, params, version: int) -> sampler_pb2.UpdateWeightsResponse:
    """`update_params` with an older version on purpose (`VersionedSampler`'s pinned
    jobs); the server's other checks apply."""
    return self.update_weights(params, version, rollback=True)

  def update_reference(self, params) -> sampler_pb2.UpdateWeightsResponse:
    """Sends the reference policy's weights, which the server keeps beside the served
    ones for `reference_logprobs`; the reply names its compute dtype."""
    return self._stub.UpdateReference(_weight_chunks(params, 0, WEIGHT_CHUNK_BYTES),
                                      timeout=self.timeout_s)

  def reference_logprobs(self, tokens, attention_mask, response_mask) -> np.ndarray:
    """log π_ref [B, R] float32 of the response tokens of rows in the rollout batch's
    layout (tokens, attention_mask [B, P+R] int32; response_mask [B, R] float32), under
    the weights of `update_reference` (FAILED_PRECONDITION before)."""
    request = sampler_pb2.ReferenceLogprobsRequest(
        tokens=array_to_proto(np.asarray(tokens, np.int32)),
        attention_mask=array_to_proto(np.asarray(attention_mask, np.int32)),
        response_mask=array_to_proto(np.asarray(response_mask, np.float32)))
    response = self._stub.ReferenceLogprobs(request, timeout=self.timeout_s)
    return array_from_proto(response.logprobs, "logprobs")

  def update_params(self, params, version: int) -> sampler_pb2.UpdateWeightsResponse:
    """`update_weights` under the in-process Scheduler's name, so the trainer can hold
    either sampler; the server's reply (its update policy) is returned."""
    return self.update_weights(params, version)

  def prepare_params(self, params):
    """Host copies of `params` (what a `VersionedSampler` keeps per version: no device
    memory for weights that only travel to the server)."""
    return jax.device_get(params)

  def health(self, timeout_s: float | None = None) -> sampler_pb2.HealthResponse:
    """Liveness and the weight version being served (`timeout_s`: this call's deadline,
    else the client's)."""
    return self._stub.Health(sampler_pb2.HealthRequest(),
                             timeout=self.timeout_s if timeout_s is None else timeout_s)

  def metrics(self) -> dict[str, float]:
    """Queue depth, slot use, tokens/s and counters."""
    return dict(self._stub.Metrics(sampler_pb2.MetricsRequest(), timeout=self.timeout_s).values)
