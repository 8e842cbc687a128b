"""The gRPC handlers over a recording service and call context, no server: each refusal's
status code and field, the counters, the order of a stream's messages, the version rule
of weight streams (the handlers behind a live server: tests/sampling/serve/test_server.py)."""

from __future__ import annotations

import queue
import types

import grpc
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from rlhf_jax.sampling.serve import handlers
from rlhf_jax.sampling.serve.loop import RequestTooLarge
from rlhf_jax.sampling.serve.protos import jetstream_pb2
from rlhf_jax.sampling.serve.protos import sampler_pb2
from rlhf_jax.sampling.serve.security import ROLLBACK_HEADER

PROMPT = sampler_pb2.TokenIds(ids=[5, 9, 11])


class Aborted(Exception):
  """What grpc's context.abort raises, with the status it was given."""

  def __init__(self, code, details):
    super().__init__(code, details)
    self.code, self.details = code, details


class Context:
  """A call's context: its metadata, whether the client is still there, and abort."""

  def __init__(self, metadata=(), active=True):
    self.metadata = [types.SimpleNamespace(key=k, value=v) for k, v in metadata]
    self.active = active

  def abort(self, code, details):
    raise Aborted(code, details)

  def invocation_metadata(self):
    return self.metadata

  def is_active(self):
    return self.active


class Service:
  """A SamplerService that answers each submit with `events` (or raises `error`) and
  records what the handlers asked of it."""

  def __init__(self, events=(), error=None):
    self.events, self.error = list(events), error
    self.counters = {"requests_rejected": 0, "requests_invalid": 0, "requests_over_limit": 0}
    self.submitted, self.released, self.cancelled = [], [], []

  def submit(self, prompt, sampling, request_id=""):
    self.submitted.append((prompt, sampling, request_id))
    if self.error is not None:
      raise self.error
    events = queue.Queue()
    for event in self.events:
      events.put(event)
    return request_id or "given-id", events

  def release(self, request_id):
    self.released.append(request_id)

  def cancel(self, request_id, sample_index=None):
    self.cancelled.append((request_id, sample_index))

  def tokenize(self, text):
    raise ValueError("prompt_text needs a server tokenizer (config tokenizer=...)")

  def detokenize(self, ids):
    return ",".join(map(str, ids))


def completion(index, tokens, reason="length", error=""):
  """A finished sample `index` of request "r" that drew `tokens`."""
  return Completion("r", index, [5], list(tokens), [-0.5] * len(tokens),
                    [-0.25] * len(tokens), reason, 3, (0, 0), error=error)


def aborted(call):
  """The (code, details) `call` aborted with (a generator's: while it is read)."""
  with pytest.raises(Aborted) as error:
    result = call()
    if isinstance(result, types.GeneratorType):
      list(result)
  return error.value.code, error.value.details


def request(**fields):
  """A GenerateRequest of PROMPT for 4 new tokens, with these sampling fields."""
  return sampler_pb2.GenerateRequest(
      prompt_ids=fields.pop("prompt_ids", PROMPT),
      sampling=sampler_pb2.SamplingParams(max_new_tokens=4, **fields))


@pytest.mark.parametrize("error, code, counter", [
    (QueueFull("the queue holds 64 requests"), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "requests_rejected"),
    (RequestTooLarge("sampling.n=100: at most 64"), grpc.StatusCode.INVALID_ARGUMENT,
     "requests_over_limit"),
    (ValueError("prompt_ids contains 999"), grpc.StatusCode.INVALID_ARGUMENT,
     "requests_invalid")])
def test_a_refused_submit_answers_its_status_and_is_counted(error, code, counter):
  service = Service(error=error)
  servicer = handlers.SamplerServicer(service)
  assert aborted(lambda: servicer.Generate(request(), Context())) == (code, str(error))
  assert service.counters == {name: int(name == counter) for name in service.counters}


def test_a_malformed_request_names_the_field_before_it_is_submitted():
  service = Service()
  servicer = handlers.SamplerServicer(service)
  code, details = aborted(lambda: servicer.Generate(request(top_p=1.5), Context()))
  assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("sampling.top_p=1.5")
  no_prompt = sampler_pb2.GenerateRequest(sampling=sampler_pb2.SamplingParams())
  assert aborted(lambda: servicer.Generate(no_prompt, Context()))[1] == (
      "prompt: set prompt_ids or prompt_text.")
  text = sampler_pb2.GenerateRequest(prompt_text="hi", sampling=sampler_pb2.SamplingParams())
  assert "needs a server tokenizer" in aborted(lambda: servicer.Generate(text, Context()))[1]
  assert service.submitted == [] and service.counters["requests_invalid"] == 3


def test_generate_answers_the_samples_in_order_and_releases_the_request():
  service = Service(events=[("token", 1, 7, -0.5, -0.25), ("done", completion(1, [7])),
                            ("done", completion(0, [4, 2]))])
  response = handlers.SamplerServicer(service).Generate(request(n=2), Context())
  assert [list(s.token_ids) for s in response.samples] == [[4, 2], [7]]
  assert [s.text for s in response.samples] == ["4,2", "7"]
  assert response.request_id == "given-id" and service.released == ["given-id"]
  prompt, sampling, _ = service.submitted[0]
  assert prompt == [5, 9, 11] and sampling == SamplingParams(max_new_tokens=4, n=2)


def test_a_stream_sends_a_samples_consecutive_tokens_as_one_message():
  service = Service(events=[("token", 0, 11, -1.0, -2.0), ("token", 0, 12, -1.5, -2.5),
                            ("token", 1, 13, -0.5, -0.75), ("done", completion(0, [11, 12])),
                            ("done", completion(1, [13]))])
  messages = list(handlers.SamplerServicer(service).GenerateStream(request(n=2), Context()))
  kinds = [(m.WhichOneof("event"), m.tokens.sample_index if m.HasField("tokens")
            else m.finished.sample_index) for m in messages]
  assert kinds == [("tokens", 0), ("tokens", 1), ("finished", 0), ("finished", 1)]
  first = messages[0].tokens
  assert (list(first.token_ids), list(first.sampled_logprobs),
          list(first.model_logprobs)) == ([11, 12], [-1.0, -1.5], [-2.0, -2.5])
  assert list(messages[1].tokens.token_ids) == [13]
  assert service.released == ["given-id"]


@pytest.mark.parametrize("events, details", [
    ([("failed", "sampler step failed: boom")], "sampler step failed: boom"),
    ([("done", completion(0, [1], "error", "consumer gone"))], "consumer gone")])
def test_a_failed_step_or_sample_answers_internal(events, details):
  service = Service(events=events)
  code, got = aborted(lambda: handlers.SamplerServicer(service).Generate(request(), Context()))
  assert (code, got) == (grpc.StatusCode.INTERNAL, details)
  assert service.released == ["given-id"]


def test_a_client_gone_ends_the_wait_and_releases_its_request():
  service = Service(events=[])  # nothing will come: the client's departure ends it
  stream = handlers.SamplerServicer(service).GenerateStream(request(), Context(active=False))
  assert list(stream) == [] and service.released == ["given-id"]


def chunks(*versions):
  """One WeightChunk per version given, in that order."""
  return [sampler_pb2.WeightChunk(version=v, name=f"t{i}") for i, v in enumerate(versions)]


def test_a_weight_stream_is_refused_below_the_held_version_unless_a_rollback():
  versioned = handlers._versioned  # pylint: disable=protected-access
  stream = chunks(4, 4)
  assert list(versioned(iter(stream), Context(), 4, "UpdateWeights")) == stream
  assert list(versioned(iter([]), Context(), 0, "UpdateWeights")) == []
  assert aborted(lambda: versioned(iter(chunks(-1)), Context(), 0, "UpdateWeights")) == (
      grpc.StatusCode.INVALID_ARGUMENT, "UpdateWeights: version=-1 must be >= 0")
  assert aborted(lambda: versioned(iter(chunks(3)), Context(), 4, "UpdateReference")) == (
      grpc.StatusCode.FAILED_PRECONDITION, "UpdateReference: version=3 is older than this "
      "server's 4; versions only increase")
  rollback = Context(metadata=[ROLLBACK_HEADER])
  assert list(versioned(iter(chunks(3)), rollback, 4, "UpdateWeights")) == chunks(3)


def served_weights_service():
  """A Service over a scheduler holding weights {"w": float32[2, 3]} at version 2."""
  service = Service()
  service.updates = []
  service.scheduler = types.SimpleNamespace(
      params={"w": jnp.zeros((2, 3), jnp.float32)}, newest_version=lambda: 2,
      update_policy="swap_now",
      engine=types.SimpleNamespace(model=types.SimpleNamespace(
          config=types.SimpleNamespace(dtype="float32"))))
  service.update_params = lambda params, version: service.updates.append((params, version))
  return service


def test_weights_that_do_not_fit_are_described_only_to_an_authenticated_caller():
  wrong = [sampler_pb2.WeightChunk(version=3, name="w", dtype="float32", shape=[3, 3],
                                   data=bytes(36))]
  service = served_weights_service()
  quiet = handlers.SamplerServicer(service)
  assert aborted(lambda: quiet.UpdateWeights(iter(wrong), Context())) == (
      grpc.StatusCode.INVALID_ARGUMENT, "UpdateWeights: the tensors do not fit the served "
      "model (see the server log)")
  detailed = handlers.SamplerServicer(service, detailed_errors=True)
  code, details = aborted(lambda: detailed.UpdateWeights(iter(wrong), Context()))
  assert details == "UpdateWeights: tensor 'w': got float32[3, 3], expected float32[2, 3]."
  assert service.updates == []
  values = np.arange(6, dtype=np.float32)
  good = [sampler_pb2.WeightChunk(version=3, name="w", dtype="float32", shape=[2, 3],
                                  data=values.tobytes())]
  response = quiet.UpdateWeights(iter(good), Context())
  assert (response.version, response.tensors, response.update_policy,
          response.compute_dtype) == (3, 1, "swap_now", "float32")
  (params, version), = service.updates
  assert version == 3
  np.testing.assert_array_equal(params["w"], values.reshape(2, 3))


def test_cancel_refuses_a_negative_sample_index_and_passes_the_rest_on():
  service = Service()
  servicer = handlers.SamplerServicer(service)
  assert aborted(lambda: servicer.Cancel(
      sampler_pb2.CancelRequest(request_id="r", sample_index=-1), Context())) == (
          grpc.StatusCode.INVALID_ARGUMENT, "Cancel: sample_index=-1 must be >= 0")
  servicer.Cancel(sampler_pb2.CancelRequest(request_id="r", sample_index=2), Context())
  servicer.Cancel(sampler_pb2.CancelRequest(request_id="s"), Context())
  assert service.cancelled == [("r", 2), ("s", None)]


def test_jetstream_decode_samples_with_the_servers_defaults_and_refuses_a_bad_request():
  default = SamplingParams(temperature=0.7, max_new_tokens=99, seed=1)
  service = Service(events=[("token", 0, 4, -1.0, -1.0), ("token", 1, 6, -1.0, -1.0),
                            ("done", completion(0, [4])), ("done", completion(1, [6]))])
  servicer = handlers.OrchestratorServicer(service, default)
  tokens = jetstream_pb2.DecodeRequest.TokenContent(token_ids=[5, 9])
  responses = list(servicer.Decode(jetstream_pb2.DecodeRequest(
      max_tokens=3, num_samples=2, token_content=tokens), Context()))
  assert responses[0].WhichOneof("content") == "initial_content"
  per_sample = [[], []]
  for response in responses[1:]:
    for index, sample in enumerate(response.stream_content.samples):
      per_sample[index] += list(sample.token_ids)
  assert per_sample == [[4], [6]]
  assert service.submitted[0][1] == default.replace(max_new_tokens=3, n=2)
  for bad, details in ((jetstream_pb2.DecodeRequest(max_tokens=0, token_content=tokens),
                        "max_tokens=0 must be positive."),
                       (jetstream_pb2.DecodeRequest(max_tokens=3),
                        "content: set text_content or token_content.")):
    assert aborted(lambda: servicer.Decode(bad, Context())) == (
        grpc.StatusCode.INVALID_ARGUMENT, details)
