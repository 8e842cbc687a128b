"""The server's gate and the client's token, without a server: which calls need the token,
the constant-time header check, the refusals (their status, their count, the handler kind
kept) and the bound on running calls (the gate in a live server:
tests/sampling/serve/test_security.py)."""

from __future__ import annotations

import types

import grpc
import pytest

from rlhf_jax.sampling.serve import auth
from rlhf_jax.sampling.serve.security import ServerSecurity
from rlhf_jax.sampling.serve.security import WRITE_METHODS

TOKEN = b"s3cret"
GENERATE = "/rlhf_jax.sampling.Sampler/Generate"
UPDATE = "/rlhf_jax.sampling.Sampler/UpdateWeights"


class Aborted(Exception):
  """What grpc's context.abort raises."""


class Context:
  """A call's context: abort, and the callbacks run when the RPC ends."""

  def __init__(self, over=False):
    self.over = over
    self.callbacks = []

  def abort(self, code, details):
    raise Aborted(code, details)

  def add_callback(self, callback):
    if self.over:
      return False
    self.callbacks.append(callback)
    return True

  def end(self):
    for callback in self.callbacks:
      callback()


def call(method, metadata=()):
  """The handler_call_details of a call of `method` carrying `metadata`."""
  return types.SimpleNamespace(method=method, invocation_metadata=tuple(metadata))


def handler(streaming_response=False):
  """A handler that answers "ran" (a unary-unary or unary-stream one)."""
  if streaming_response:
    return grpc.unary_stream_rpc_method_handler(lambda request, context: iter(["ran"]))
  return grpc.unary_unary_rpc_method_handler(lambda request, context: "ran")


def run(gated, context):
  """The gated handler's answer, or the (code, details) it aborted with."""
  behaviour = gated.unary_stream if gated.response_streaming else gated.unary_unary
  try:
    answer = behaviour(None, context)
    return list(answer) if gated.response_streaming else answer
  except Aborted as error:
    return error.args


def test_which_calls_need_the_token():
  writes = auth.Gate(ServerSecurity(token=TOKEN, auth="writes"), max_concurrent=4)
  assert all(writes.needs_token(m) for m in WRITE_METHODS)
  assert not writes.needs_token(GENERATE)
  every = auth.Gate(ServerSecurity(token=TOKEN, auth="all"), max_concurrent=4)
  assert every.needs_token(GENERATE) and every.needs_token("/jetstream_proto.Orchestrator/Decode")
  open_server = auth.Gate(ServerSecurity(), max_concurrent=4)
  assert not any(open_server.needs_token(m) for m in (*WRITE_METHODS, GENERATE))


@pytest.mark.parametrize("metadata, authentic", [
    ([("authorization", "Bearer s3cret")], True),
    ([("authorization", b"Bearer s3cret")], True),
    ([("other", "x"), ("authorization", "Bearer s3cret")], True),
    ([], False),
    (None, False),
    ([("authorization", "Bearer s3cre")], False),
    ([("authorization", "Bearer s3cret!")], False),
    ([("authorization", "s3cret")], False),
    ([("Authorization", "Bearer s3cret")], False),  # gRPC lower-cases keys: not a match
    ([("authorization", "Bearer s3cret"), ("authorization", "Bearer s3cret")], False),
])
def test_only_one_header_with_exactly_the_token_is_authentic(metadata, authentic):
  gate = auth.Gate(ServerSecurity(token=TOKEN), max_concurrent=4)
  assert gate.authentic(metadata) is authentic


def test_a_call_without_the_token_is_refused_and_counted_keeping_its_kind():
  gate = auth.Gate(ServerSecurity(token=TOKEN), max_concurrent=4)
  refused = gate.intercept_service(lambda details: handler(streaming_response=True),
                                   call(UPDATE, [("authorization", "Bearer wrong")]))
  assert refused.response_streaming and not refused.request_streaming
  assert run(refused, Context()) == (grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token "
                                     "(authorization: Bearer <server.token_file>)")
  assert gate.counters["rpcs_unauthenticated"] == 1
  allowed = gate.intercept_service(lambda details: handler(),
                                   call(UPDATE, [("authorization", "Bearer s3cret")]))
  assert run(allowed, Context()) == "ran"
  read = gate.intercept_service(lambda details: handler(), call(GENERATE))
  assert run(read, Context()) == "ran" and gate.counters["rpcs_unauthenticated"] == 1
  assert gate.intercept_service(lambda details: None, call("/no.Such/Method")) is None


def test_calls_beyond_max_concurrent_are_refused_until_one_ends():
  gate = auth.Gate(ServerSecurity(), max_concurrent=2)
  contexts = [Context(), Context()]
  for context in contexts:
    assert run(gate.intercept_service(lambda details: handler(), call(GENERATE)),
               context) == "ran"  # still running until its RPC ends
  busy = gate.intercept_service(lambda details: handler(), call(GENERATE))
  assert run(busy, Context()) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  "2 calls already running (server.max_workers)")
  assert gate.counters["rpcs_refused_busy"] == 1
  contexts[0].end()
  assert run(gate.intercept_service(lambda details: handler(), call(GENERATE)),
             Context(over=True)) == "ran"  # an RPC already over is released at once
  assert run(gate.intercept_service(lambda details: handler(), call(GENERATE)),
             Context()) == "ran"
  assert gate.counters == {"rpcs_unauthenticated": 0, "rpcs_refused_busy": 1}


def test_the_client_sends_the_token_with_every_kind_of_call():
  metadata = auth._Metadata(TOKEN)  # pylint: disable=protected-access
  call_details = auth._CallDetails  # pylint: disable=protected-access
  details = call_details("/m", 5.0, [("x", "1")], None, None, None)
  sent = []
  continuation = lambda details, request: sent.append((details.method, details.timeout,
                                                       list(details.metadata)))
  metadata.intercept_unary_unary(continuation, details, "request")
  metadata.intercept_unary_stream(continuation, details, "request")
  metadata.intercept_stream_unary(continuation, details, iter(()))
  metadata.intercept_stream_stream(continuation, details, iter(()))
  assert sent == [("/m", 5.0, [("x", "1"), ("authorization", "Bearer s3cret")])] * 4
