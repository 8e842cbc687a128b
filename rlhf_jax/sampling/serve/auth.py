"""The server's gate and the client's credentials over gRPC (serve/security.py: the data).

`Gate` is a server interceptor that runs before any handler: a call without the token
(where `ServerSecurity.auth` requires one) answers UNAUTHENTICATED, a call beyond
`max_concurrent` running ones answers RESOURCE_EXHAUSTED, and both are counted (the
server's Metrics). The token is compared in constant time (`hmac.compare_digest`).
"""

from __future__ import annotations

import collections
import hmac
import threading

import grpc

from rlhf_jax.sampling.serve.security import ClientSecurity
from rlhf_jax.sampling.serve.security import ServerSecurity
from rlhf_jax.sampling.serve.security import WRITE_METHODS

_HEADER = "authorization"


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str):
  """A handler of `handler`'s kind that aborts every call with (code, message)."""
  def refuse(request, context):
    del request
    context.abort(code, message)

  kind = ("stream" if handler.request_streaming else "unary") + "_" + (
      "stream" if handler.response_streaming else "unary")
  make = getattr(grpc, f"{kind}_rpc_method_handler")
  return make(refuse, request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)


def _counted(handler: grpc.RpcMethodHandler, release_later):
  """`handler` whose call, once started, counts as running until the RPC ends."""
  kind = ("stream" if handler.request_streaming else "unary") + "_" + (
      "stream" if handler.response_streaming else "unary")
  behaviour = getattr(handler, kind)

  def run(request, context):
    release_later(context)
    return behaviour(request, context)

  make = getattr(grpc, f"{kind}_rpc_method_handler")
  return make(run, request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)


class Gate(grpc.ServerInterceptor):
  """Authenticates and bounds every RPC of a server.

  Args:
    security: the server's ServerSecurity (its token and which RPCs need it).
    max_concurrent: most RPCs running at once; more answer RESOURCE_EXHAUSTED.
  Attributes:
    counters: "rpcs_unauthenticated", "rpcs_refused_busy" (refusals so far).
  """

  def __init__(self, security: ServerSecurity, max_concurrent: int):
    self.security = security
    self.max_concurrent = max_concurrent
    self.counters = collections.Counter(rpcs_unauthenticated=0, rpcs_refused_busy=0)
    self._running = 0
    self._lock = threading.Lock()
    self._expected = (None if security.token is None
                      else b"Bearer " + security.token)

  def needs_token(self, method: str) -> bool:
    """Whether calls of `method` ("/package.Service/Method") must carry the token."""
    if self._expected is None:
      return False
    return self.security.auth == "all" or method in WRITE_METHODS

  def authentic(self, metadata) -> bool:
    """Whether the call's metadata holds `authorization: Bearer <token>`."""
    sent = [value for key, value in metadata or () if key == _HEADER]
    if len(sent) != 1:
      return False
    value = sent[0].encode() if isinstance(sent[0], str) else bytes(sent[0])
    return hmac.compare_digest(value, self._expected)

  def _release_later(self, context) -> None:
    with self._lock:
      self._running += 1
    if not context.add_callback(self._release):  # already over
      self._release()

  def _release(self) -> None:
    with self._lock:
      self._running -= 1

  def intercept_service(self, continuation, handler_call_details):
    handler = continuation(handler_call_details)
    if handler is None:
      return None
    if (self.needs_token(handler_call_details.method)
        and not self.authentic(handler_call_details.invocation_metadata)):
      self.counters["rpcs_unauthenticated"] += 1
      return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                      "missing or wrong token (authorization: Bearer <server.token_file>)")
    with self._lock:
      busy = self._running >= self.max_concurrent
    if busy:
      self.counters["rpcs_refused_busy"] += 1
      return _refusal(handler, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"{self.max_concurrent} calls already running (server.max_workers)")
    return _counted(handler, self._release_later)


def add_port(server: grpc.Server, address: str, security: ServerSecurity) -> int:
  """Binds `address` (TLS when the security has a key pair); returns the port, 0 when
  nothing could bind."""
  try:
    if security.tls_cert is None:
      return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(security.tls_key, security.tls_cert)], root_certificates=security.tls_ca,
        require_client_auth=security.tls_ca is not None)
    return server.add_secure_port(address, credentials)
  except RuntimeError:  # grpc >= 1.5x raises where older ones returned 0
    return 0


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
  """Adds `authorization: Bearer <token>` to every call of a channel."""

  def __init__(self, token: bytes):
    self.header = (_HEADER, "Bearer " + token.decode())

  def _details(self, details):
    metadata = list(details.metadata or ()) + [self.header]
    return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                        details.wait_for_ready, details.compression)

  def intercept_unary_unary(self, continuation, details, request):
    return continuation(self._details(details), request)

  def intercept_unary_stream(self, continuation, details, request):
    return continuation(self._details(details), request)

  def intercept_stream_unary(self, continuation, details, request_iterator):
    return continuation(self._details(details), request_iterator)

  def intercept_stream_stream(self, continuation, details, request_iterator):
    return continuation(self._details(details), request_iterator)


class _CallDetails(collections.namedtuple(
    "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                     "compression")), grpc.ClientCallDetails):
  pass


def channel(address: str, security: ClientSecurity | None, options) -> grpc.Channel:
  """A channel to `address`: TLS when `security.tls_ca` is set (with the client's key
  pair for mutual TLS), the token added to every call when set."""
  security = security or ClientSecurity()
  if security.tls_ca is not None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=security.tls_ca, private_key=security.tls_key,
        certificate_chain=security.tls_cert)
    base = grpc.secure_channel(address, credentials, options=options)
  else:
    base = grpc.insecure_channel(address, options=options)
  if security.token is None:
    return base
  return grpc.intercept_channel(base, _Metadata(security.token))
