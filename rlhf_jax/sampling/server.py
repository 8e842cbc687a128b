"""The sampler in its own process, behind gRPC (needs the `serve` extra: grpcio, protobuf).

Two services on one port:
  rlhf_jax.sampling.Sampler   Generate (unary), GenerateStream, UpdateWeights
                              (client stream of tensors), Health, Metrics —
                              with sampling parameters and per-token log-probs;
  jetstream_proto.Orchestrator  Decode (server stream) and HealthCheck, the wire
                              shape of JetStream's service, so its clients work.

One thread runs the scheduler loop; RPC handlers submit requests and wait on a
per-request queue that the loop fills with tokens and finished samples.
Errors: a malformed request answers INVALID_ARGUMENT naming the field; a full
queue (or more concurrent RPCs than worker threads) RESOURCE_EXHAUSTED; a
client that disconnects cancels its request, which frees its slots at the next
step; an exception inside a decode step ends the requests then running with
INTERNAL and the server carries on with a fresh decode state.

Weight updates follow the scheduler's `update_policy`: "finish_old" (default)
lets in-flight samples finish on the old weights while new ones wait for the
swap; "swap_now" switches at the next step, and every sample reports the first
and last weight version it was generated with.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import uuid
from typing import Iterator

import grpc
import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.sampling import config as config_lib
from rlhf_jax.sampling.params import FireSchedule
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protos import jetstream_pb2
from rlhf_jax.sampling.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.protos import sampler_pb2
from rlhf_jax.sampling.protos import sampler_pb2_grpc
from rlhf_jax.sampling.scheduler import Completion
from rlhf_jax.sampling.scheduler import QueueFull
from rlhf_jax.sampling.scheduler import Scheduler

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_POLL_S = 0.05


def sampling_from_proto(message: sampler_pb2.SamplingParams) -> SamplingParams:
  """SamplingParams from its proto (unset fields take the defaults).

  Raises:
    ValueError naming the field ("sampling.top_p=...").
  """
  fields = {}
  for name in ("temperature", "top_k", "top_p", "min_p", "max_new_tokens", "n", "seed"):
    if message.HasField(name):
      fields[name] = getattr(message, name)
  fields["stop_token_ids"] = tuple(message.stop_token_ids)
  fields["candidate_token_ids"] = tuple(message.candidate_token_ids)
  if message.HasField("fire"):
    fire = {name: getattr(message.fire, name) for name in ("temperature", "top_k")
            if message.fire.HasField(name)}
    fields["fire"] = FireSchedule(every_line=message.fire.every_line, **fire)
  try:
    return SamplingParams(**fields)
  except ValueError as error:
    raise ValueError(f"sampling.{error}") from None


def sampling_to_proto(params: SamplingParams) -> sampler_pb2.SamplingParams:
  """The proto of a SamplingParams (every field set)."""
  message = sampler_pb2.SamplingParams(
      temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
      min_p=params.min_p, max_new_tokens=params.max_new_tokens,
      stop_token_ids=list(params.stop_token_ids), n=params.n,
      candidate_token_ids=list(params.candidate_token_ids))
  if params.seed is not None:
    message.seed = params.seed
  if params.fire is not None:
    message.fire.CopyFrom(sampler_pb2.Fire(temperature=params.fire.temperature,
                                           top_k=params.fire.top_k,
                                           every_line=params.fire.every_line))
  return message


def sample_to_proto(completion: Completion, text: str = "") -> sampler_pb2.Sample:
  """The proto of one finished sample."""
  first, last = completion.weights_version
  return sampler_pb2.Sample(
      sample_index=completion.sample_index, token_ids=completion.token_ids,
      sampled_logprobs=completion.sampled_logprobs, model_logprobs=completion.model_logprobs,
      finish_reason=completion.finish_reason, seed=completion.seed,
      first_weights_version=first, last_weights_version=last, text=text,
      error=completion.error, candidate_logprobs=completion.candidate_logprobs)


def param_names(params) -> list[tuple[str, jax.Array]]:
  """(path, leaf) of every parameter, paths like "layers/0/mlp/up_proj"."""
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  return [("/".join(str(getattr(key, "key", key)) for key in path), leaf) for path, leaf in flat]


class SamplerService:
  """The scheduler loop plus request bookkeeping, independent of gRPC.

  Args:
    scheduler: the Scheduler to drive.
    tokenizer: optional rlhf_jax Tokenizer, for text prompts and decoded text.
  """

  def __init__(self, scheduler: Scheduler, tokenizer=None):
    self.scheduler = scheduler
    self.tokenizer = tokenizer
    self._sinks: dict[str, queue.Queue] = {}
    self._lock = threading.Lock()
    self._wake = threading.Event()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="sampler-loop", daemon=True)
    self.counters = {"requests_rejected": 0, "requests_invalid": 0, "step_failures": 0}

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
    Raises ValueError (bad field) or QueueFull.
    """
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

  def tokenize(self, text: str) -> list[int]:
    """Token ids of a text prompt; ValueError when the server has no tokenizer."""
    if self.tokenizer is None:
      raise ValueError("prompt_text needs a server tokenizer (config tokenizer=...); "
                       "send prompt_ids instead.")
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

  def _loop(self) -> None:
    while not self._stop.is_set():
      if not self.scheduler.has_work():
        self._wake.wait(_POLL_S)
        self._wake.clear()
        continue
      try:
        completions = self.scheduler.step()
      except Exception as error:  # a failed step must not take the server down
        logging.exception("sampler step failed; failing the running requests")
        self.counters["step_failures"] += 1
        message = f"sampler step failed: {error!r}"
        for completion in self.scheduler.fail_all(message):
          self._deliver(completion)
        with self._lock:
          for sink in self._sinks.values():
            sink.put(("failed", message))
        continue
      for completion in completions:
        self._deliver(completion)


def _abort_for(context, error: Exception, service: SamplerService):
  if isinstance(error, QueueFull):
    service.counters["requests_rejected"] += 1
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
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
        event = events.get(timeout=_POLL_S)
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


class SamplerServicer(sampler_pb2_grpc.SamplerServicer):
  """rlhf_jax.sampling.Sampler over a SamplerService."""

  def __init__(self, service: SamplerService):
    self.service = service

  def _submit(self, request, context):
    try:
      sampling = sampling_from_proto(request.sampling)
      which = request.WhichOneof("prompt")
      if which is None:
        raise ValueError("prompt: set prompt_ids or prompt_text.")
      prompt = (list(request.prompt_ids.ids) if which == "prompt_ids"
                else self.service.tokenize(request.prompt_text))
      request_id, events = self.service.submit(prompt, sampling, request.request_id)
    except (ValueError, QueueFull) as error:
      _abort_for(context, error, self.service)
    return request_id, events, sampling.n

  def Generate(self, request, context):
    request_id, events, samples = self._submit(request, context)
    finished = [None] * samples
    for event in _events(self.service, request_id, events, samples, context):
      if event[0] == "done":
        finished[event[1].sample_index] = event[1]
    if any(c is None for c in finished):
      context.abort(grpc.StatusCode.CANCELLED, "the request was cancelled")
    return sampler_pb2.GenerateResponse(
        request_id=request_id,
        samples=[sample_to_proto(c, self.service.detokenize(c.token_ids)) for c in finished])

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
        completion = event[1]
        yield sampler_pb2.GenerateStreamResponse(
            request_id=request_id,
            finished=sample_to_proto(completion, self.service.detokenize(completion.token_ids)))

  def UpdateWeights(self, request_iterator, context):
    template = dict(param_names(self.service.scheduler.params))
    buffers: dict[str, bytearray] = {}
    version = None
    try:
      for chunk in request_iterator:
        if version is None:
          version = chunk.version
        elif chunk.version != version:
          raise ValueError(f"version changed within one update ({version} → {chunk.version}).")
        if chunk.name not in template:
          raise ValueError(f"unexpected tensor {chunk.name!r}.")
        expected = template[chunk.name]
        if tuple(chunk.shape) != tuple(expected.shape) or chunk.dtype != str(expected.dtype):
          raise ValueError(f"tensor {chunk.name!r}: got {chunk.dtype}{list(chunk.shape)}, "
                           f"expected {expected.dtype}{list(expected.shape)}.")
        nbytes = int(np.prod(expected.shape)) * jnp.dtype(expected.dtype).itemsize
        buffer = buffers.setdefault(chunk.name, bytearray(nbytes))
        if chunk.offset < 0 or chunk.offset + len(chunk.data) > nbytes:
          raise ValueError(f"tensor {chunk.name!r}: chunk at offset {chunk.offset} overruns "
                           f"its {nbytes} bytes.")
        buffer[chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
      missing = sorted(set(template) - set(buffers))
      if missing:
        raise ValueError(f"missing tensors: {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''}.")
    except ValueError as error:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"UpdateWeights: {error}")
    old = self.service.scheduler.params
    leaves, treedef = jax.tree_util.tree_flatten(old)
    names = [name for name, _ in param_names(old)]
    new_leaves = [
        jax.device_put(np.frombuffer(bytes(buffers[name]), jnp.dtype(leaf.dtype)).reshape(
            leaf.shape), leaf.sharding) for name, leaf in zip(names, leaves)]
    self.service.scheduler.update_params(jax.tree_util.tree_unflatten(treedef, new_leaves),
                                         version)
    self.service._wake.set()
    return sampler_pb2.UpdateWeightsResponse(version=version, tensors=len(buffers),
                                             update_policy=self.service.scheduler.update_policy)

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

  def Decode(self, request, context):
    samples = max(request.num_samples, 1)
    try:
      which = request.WhichOneof("content")
      if which is None:
        raise ValueError("content: set text_content or token_content.")
      prompt = (list(request.token_content.token_ids) if which == "token_content"
                else self.service.tokenize(request.text_content.text))
      if request.max_tokens <= 0:
        raise ValueError(f"max_tokens={request.max_tokens} must be positive.")
      sampling = self.default_sampling.replace(max_new_tokens=request.max_tokens, n=samples)
      request_id, events = self.service.submit(prompt, sampling)
    except (ValueError, QueueFull) as error:
      _abort_for(context, error, self.service)
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


def start_server(scheduler: Scheduler, *, host: str = "localhost", port: int = 0,
                 max_workers: int = 16, tokenizer=None,
                 jetstream_sampling: SamplingParams | None = None
                 ) -> tuple[grpc.Server, int, SamplerService]:
  """Starts both services on host:port (0 = any free port).

  Args:
    scheduler: the Scheduler the server drives.
    host, port: where to listen.
    max_workers: RPC handler threads; more concurrent RPCs are refused with
      RESOURCE_EXHAUSTED rather than left waiting.
    tokenizer: optional Tokenizer for text prompts / decoded text.
    jetstream_sampling: the SamplingParams of JetStream Decode requests
      (default: temperature 1, no truncation).
  Returns:
    (server, bound port, service); stop with `server.stop(grace)` then `service.stop()`.
  """
  service = SamplerService(scheduler, tokenizer)
  service.start()
  options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
             ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=max_workers),
                       options=options, maximum_concurrent_rpcs=max_workers)
  sampler_pb2_grpc.add_SamplerServicer_to_server(SamplerServicer(service), server)
  jetstream_pb2_grpc.add_OrchestratorServicer_to_server(
      OrchestratorServicer(service, jetstream_sampling or SamplingParams()), server)
  bound = server.add_insecure_port(f"{host}:{port}")
  if not bound:
    service.stop()
    raise OSError(f"could not listen on {host}:{port}.")
  server.start()
  return server, bound, service


def validate_serve_config(config) -> None:
  """Checks configs/serve.py fields before anything loads; ValueError names the field."""
  config_lib.validate_sampler_config(config.sampler)
  model = config.model
  if model.kind not in ("tiny", "hf"):
    raise ValueError(f"config.model.kind={model.kind!r}; allowed: 'tiny', 'hf'.")
  if model.kind == "hf":
    if not model.checkpoint:
      raise ValueError("config.model.checkpoint is required for model.kind='hf'.")
    config_lib.check_directory("model.checkpoint", model.checkpoint, ("config.json",))
  else:
    for field, low in (("vocab_size", 4), ("num_layers", 1), ("hidden_size", 8)):
      if model[field] < low:
        raise ValueError(f"config.model.{field}={model[field]!r} must be >= {low}.")
    if model.hidden_size % 8:
      raise ValueError(f"config.model.hidden_size={model.hidden_size} must be a multiple of 8 "
                       "(4 heads of even width).")
  if config.tokenizer:
    config_lib.check_directory("tokenizer", config.tokenizer, ("tokenizer.json",))
  if not 0 <= config.server.port <= 65535:
    raise ValueError(f"config.server.port={config.server.port} must be in [0, 65535].")
  if config.server.max_workers < 1:
    raise ValueError(f"config.server.max_workers={config.server.max_workers} must be >= 1.")
  if config.server.jetstream_temperature < 0:
    raise ValueError(f"config.server.jetstream_temperature="
                     f"{config.server.jetstream_temperature} must be >= 0.")


def serve_from_config(config) -> tuple[grpc.Server, int, SamplerService]:
  """Loads (or builds) the model, builds the scheduler and starts the server."""
  import os

  from rlhf_jax import models

  tokenizer_dir = config.tokenizer
  if config.model.kind == "hf":
    model, params = models.load_hf_checkpoint(config.model.checkpoint)
    if not tokenizer_dir and os.path.exists(os.path.join(config.model.checkpoint,
                                                         "tokenizer.json")):
      tokenizer_dir = config.model.checkpoint
  else:
    width = config.model.hidden_size
    model, params = models.init_model(models.DecoderConfig(
        vocab_size=config.model.vocab_size, hidden_size=width,
        num_layers=config.model.num_layers, num_heads=4, num_kv_heads=2,
        head_dim=width // 4, intermediate_size=3 * width), seed=config.model.seed)
  tokenizer = models.Tokenizer.from_directory(tokenizer_dir) if tokenizer_dir else None
  scheduler = config_lib.build_scheduler(config.sampler, model, params, tokenizer=tokenizer)
  return start_server(
      scheduler, host=config.server.host, port=config.server.port,
      max_workers=config.server.max_workers, tokenizer=tokenizer,
      jetstream_sampling=SamplingParams(temperature=config.server.jetstream_temperature))
