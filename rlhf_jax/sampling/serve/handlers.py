"""The two gRPC services over a SamplerService (needs the `serve` extra).

  rlhf_jax.sampling.Sampler     Generate (unary), GenerateStream, UpdateWeights
                                (client stream of tensors), Health, Metrics — with
                                sampling parameters and per-token log-probs; the
                                trainer's reference (UpdateReference, ReferenceLogprobs);
  jetstream_proto.Orchestrator  Decode (server stream) and HealthCheck, the wire
                                shape of JetStream's service, so its clients work.

Errors: a malformed request, or one beyond the server's limits, answers INVALID_ARGUMENT
naming the field; a full queue RESOURCE_EXHAUSTED; a client that disconnects cancels its
request, which frees its slots at the next step; a failed decode step answers INTERNAL.
Weights that do not fit the served model are described (tensor names, shapes) only to a
caller who sent the server's token; weight versions never go back (FAILED_PRECONDITION).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Iterator

import grpc

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from rlhf_jax.sampling.serve import wire
from rlhf_jax.sampling.serve.loop import POLL_S
from rlhf_jax.sampling.serve.loop import RequestTooLarge
from rlhf_jax.sampling.serve.loop import SamplerService
from rlhf_jax.sampling.serve.protos import jetstream_pb2
from rlhf_jax.sampling.serve.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.serve.protos import sampler_pb2
from rlhf_jax.sampling.serve.protos import sampler_pb2_grpc
from rlhf_jax.sampling.serve.reference import NoReferenceError
from rlhf_jax.sampling.serve.security import ROLLBACK_HEADER


def _abort_for(context, error: Exception, service: SamplerService):
  if isinstance(error, QueueFull):
    service.counters["requests_rejected"] += 1
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
  if isinstance(error, RequestTooLarge):
    service.counters["requests_over_limit"] += 1
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
  service.counters["requests_invalid"] += 1
  context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def _events(service: SamplerService, request_id: str, events: queue.Queue, samples: int,
            context) -> Iterator[tuple]:
  """Yields a request's events until its `samples` samples are done; cancels it if
  the client goes away."""
  done = 0
  try:
    while done < samples:
      try:
        event = events.get(timeout=POLL_S)
      except queue.Empty:
        if not context.is_active():
          return
        continue
      if event[0] == "failed":
        context.abort(grpc.StatusCode.INTERNAL, event[1])
      if event[0] == "done":
        done += 1
        if event[1].finish_reason == "error":
          context.abort(grpc.StatusCode.INTERNAL, event[1].error)
      yield event
  finally:
    service.release(request_id)


def _versioned(chunks, context, newest: int, what: str):
  """The chunk stream, refused (before the tensors are read) when its version is negative
  or older than `newest`, the version the server already holds, unless the caller sent
  the rollback header (a trainer's job pinned to an older version)."""
  chunks = iter(chunks)
  first = next(chunks, None)
  version = 0 if first is None else first.version
  if version < 0:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: version={version} must be "
                  ">= 0")
  rollback = (ROLLBACK_HEADER[0], ROLLBACK_HEADER[1]) in tuple(
      (m.key, m.value) for m in context.invocation_metadata() or ())
  if version < newest and not rollback:
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{what}: version={version} is "
                  f"older than this server's {newest}; versions only increase")
  return itertools.chain(() if first is None else (first,), chunks)


class SamplerServicer(sampler_pb2_grpc.SamplerServicer):
  """rlhf_jax.sampling.Sampler over a SamplerService.

  Args:
    service: the SamplerService.
    detailed_errors: whether a weight stream that does not fit is described (tensor
      names and shapes); only where the write RPCs need the token, so that a stranger
      on a token-less loopback server learns nothing of the model from its mistakes.
  """

  def __init__(self, service: SamplerService, detailed_errors: bool = False):
    self.service = service
    self.detailed_errors = detailed_errors
    self._writing = threading.Lock()  # one weight update at a time: versions in order
    self._reference_version = 0

  def _unfit(self, context, what: str, error: ValueError):
    logging.warning("%s refused: %s", what, error)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  f"{what}: {error}" if self.detailed_errors else
                  f"{what}: the tensors do not fit the served model (see the server log)")

  def _submit(self, request, context):
    try:
      sampling = wire.sampling_from_proto(request.sampling)
      which = request.WhichOneof("prompt")
      if which is None:
        raise ValueError("prompt: set prompt_ids or prompt_text.")
      prompt = (list(request.prompt_ids.ids) if which == "prompt_ids"
                else self.service.tokenize(request.prompt_text))
      request_id, events = self.service.submit(prompt, sampling, request.request_id)
    except (ValueError, QueueFull) as error:
      _abort_for(context, error, self.service)
    return request_id, events, sampling.n

  def _sample(self, completion) -> sampler_pb2.Sample:
    return wire.sample_to_proto(completion, self.service.detokenize(completion.token_ids))

  def Generate(self, request, context):
    request_id, events, samples = self._submit(request, context)
    finished = [None] * samples
    for event in _events(self.service, request_id, events, samples, context):
      if event[0] == "done":
        finished[event[1].sample_index] = event[1]
    if any(c is None for c in finished):
      context.abort(grpc.StatusCode.CANCELLED, "the request was cancelled")
    return sampler_pb2.GenerateResponse(request_id=request_id,
                                        samples=[self._sample(c) for c in finished])

  def GenerateStream(self, request, context):
    request_id, events, samples = self._submit(request, context)
    pending = []  # consecutive tokens of one sample go out as one message

    def flush():
      if not pending:
        return None
      chunk = sampler_pb2.TokenChunk(
          sample_index=pending[0][1], token_ids=[e[2] for e in pending],
          sampled_logprobs=[e[3] for e in pending], model_logprobs=[e[4] for e in pending])
      pending.clear()
      return sampler_pb2.GenerateStreamResponse(request_id=request_id, tokens=chunk)

    for event in _events(self.service, request_id, events, samples, context):
      if event[0] == "token":
        if pending and pending[0][1] != event[1]:
          yield flush()
        pending.append(event)
        if events.empty():
          yield flush()
      else:
        message = flush()
        if message is not None:
          yield message
        yield sampler_pb2.GenerateStreamResponse(request_id=request_id,
                                                 finished=self._sample(event[1]))

  def UpdateWeights(self, request_iterator, context):
    scheduler = self.service.scheduler
    with self._writing:
      chunks = _versioned(request_iterator, context, scheduler.newest_version(),
                          "UpdateWeights")
      try:
        params, version, tensors = wire.params_from_chunks(chunks, scheduler.params)
      except ValueError as error:
        self._unfit(context, "UpdateWeights", error)
      self.service.update_params(params, version)
    return sampler_pb2.UpdateWeightsResponse(version=version, tensors=tensors,
                                             update_policy=scheduler.update_policy,
                                             compute_dtype=self._compute_dtype())

  def _compute_dtype(self) -> str:
    return str(self.service.scheduler.engine.model.config.dtype)

  def UpdateReference(self, request_iterator, context):
    with self._writing:
      chunks = _versioned(request_iterator, context, self._reference_version,
                          "UpdateReference")
      try:  # the reference has the served weights' tree, shapes and placement
        params, version, tensors = wire.params_from_chunks(chunks,
                                                           self.service.scheduler.params)
      except ValueError as error:
        self._unfit(context, "UpdateReference", error)
      self.service.reference.load(params)
      self._reference_version = version or 0
    return sampler_pb2.UpdateWeightsResponse(version=version or 0, tensors=tensors,
                                             compute_dtype=self._compute_dtype())

  def ReferenceLogprobs(self, request, context):
    try:
      rows = [wire.array_from_proto(getattr(request, field), field)
              for field in ("tokens", "attention_mask", "response_mask")]
      logprobs = self.service.reference.logprobs(*rows)
    except ValueError as error:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReferenceLogprobs: {error}")
    except NoReferenceError as error:
      context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"ReferenceLogprobs: {error}")
    return sampler_pb2.ReferenceLogprobsResponse(logprobs=wire.array_to_proto(logprobs))

  def Cancel(self, request, context):
    if request.HasField("sample_index") and request.sample_index < 0:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                    f"Cancel: sample_index={request.sample_index} must be >= 0")
    self.service.cancel(request.request_id,
                        request.sample_index if request.HasField("sample_index") else None)
    return sampler_pb2.CancelResponse()

  def Health(self, request, context):
    return sampler_pb2.HealthResponse(is_live=True,
                                      weights_version=self.service.scheduler.weights_version)

  def Metrics(self, request, context):
    return sampler_pb2.MetricsResponse(values=self.service.metrics())


class OrchestratorServicer(jetstream_pb2_grpc.OrchestratorServicer):
  """jetstream_proto.Orchestrator (JetStream's wire shape) over a SamplerService.

  Sampling is the server's default SamplingParams with max_new_tokens from
  the request; each response message carries, per sample, the tokens drawn
  since the previous message.
  """

  def __init__(self, service: SamplerService, default_sampling: SamplingParams):
    self.service = service
    self.default_sampling = default_sampling

  def _submit(self, request, samples: int, context):
    try:
      which = request.WhichOneof("content")
      if which is None:
        raise ValueError("content: set text_content or token_content.")
      prompt = (list(request.token_content.token_ids) if which == "token_content"
                else self.service.tokenize(request.text_content.text))
      if request.max_tokens <= 0:
        raise ValueError(f"max_tokens={request.max_tokens} must be positive.")
      sampling = self.default_sampling.replace(max_new_tokens=request.max_tokens, n=samples)
      return self.service.submit(prompt, sampling)
    except (ValueError, QueueFull) as error:
      _abort_for(context, error, self.service)

  def Decode(self, request, context):
    samples = max(request.num_samples, 1)
    request_id, events = self._submit(request, samples, context)
    yield jetstream_pb2.DecodeResponse(
        initial_content=jetstream_pb2.DecodeResponse.InitialContent())
    new_tokens = [[] for _ in range(samples)]

    def message():
      content = jetstream_pb2.DecodeResponse.StreamContent(samples=[
          jetstream_pb2.DecodeResponse.StreamContent.Sample(
              token_ids=ids, text=self.service.detokenize(ids)) for ids in new_tokens])
      for ids in new_tokens:
        ids.clear()
      return jetstream_pb2.DecodeResponse(stream_content=content)

    for event in _events(self.service, request_id, events, samples, context):
      if event[0] == "token":
        new_tokens[event[1]].append(event[2])
      if events.empty() and any(new_tokens):
        yield message()

  def HealthCheck(self, request, context):
    return jetstream_pb2.HealthCheckResponse(is_live=True)
