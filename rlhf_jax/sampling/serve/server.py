"""The sampler in its own process, behind gRPC (needs the `serve` extra: grpcio, protobuf).

This module wires the pieces of sampling/serve/ together:
  loop.py      SamplerService: the scheduler loop thread and per-request queues;
  handlers.py  the Sampler and JetStream Orchestrator services, on one port;
  wire.py      SamplingParams / samples / weights ⇄ protos (shared with the client);
  config.py    configs/serve.py's validation and the model it names;
  openai_http.py  the OpenAI-compatible HTTP face on server.http_port, over the same
               SamplerService (`serve_http_from_config`).

Weight updates follow the scheduler's `update_policy`: "finish_old" (default)
lets in-flight samples finish on the old weights while new ones wait for the
swap; "swap_now" switches at the next step, and every sample reports the first
and last weight version it was generated with. More concurrent RPCs than worker
threads are refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import concurrent.futures
import socket

import grpc
import ml_collections

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling import config as config_lib
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import config as serve_config
from rlhf_jax.sampling.serve import security as security_lib
from rlhf_jax.sampling.serve.auth import Gate
from rlhf_jax.sampling.serve.auth import add_port
from rlhf_jax.sampling.serve.handlers import OrchestratorServicer
from rlhf_jax.sampling.serve.handlers import SamplerServicer
from rlhf_jax.sampling.serve.loop import SamplerService
from rlhf_jax.sampling.serve.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.serve.protos import sampler_pb2_grpc
from rlhf_jax.sampling.serve.security import ServerSecurity
from rlhf_jax.sampling.serve.wire import MAX_MESSAGE_BYTES


def listen(host: str = "localhost", port: int = 0, *, max_workers: int = 16,
           security: ServerSecurity | None = None) -> tuple[grpc.Server, int, Gate]:
  """A gRPC server bound to host:port (0 = any free port), not yet serving: a launcher
  binds before it builds the model, so a port in use fails at once.

  Every call passes the `Gate` first (token, at most `max_workers` running); refusals
  are counted there. The port is not shared (`so_reuseport` off): a second server on
  it fails instead of splitting the calls.
  Raises:
    ValueError: a host beyond loopback without a credential (serve/security.py).
    OSError: nothing can listen on host:port.
  """
  security = security or ServerSecurity()
  if not security_lib.is_loopback(host) and not security.has_credential:
    raise ValueError(f"host={host!r} is not loopback: a server without a token (or client "
                     "certificates) listens on loopback only.")
  gate = Gate(security, max_workers)
  headroom = max(4, max_workers // 4)  # threads that answer refusals while all are busy
  options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
             ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]
  server = grpc.server(
      concurrent.futures.ThreadPoolExecutor(max_workers=max_workers + headroom),
      interceptors=[gate], options=options, maximum_concurrent_rpcs=max_workers + headroom)
  _check_free(host, port)
  bound = add_port(server, f"{host}:{port}", security)
  if not bound:
    server.stop(None)
    raise OSError(f"could not listen on {host}:{port} (in use, or not an address of "
                  "this machine).")
  return server, bound, gate


def _check_free(host: str, port: int) -> None:
  """OSError when host:port is taken on any address `host` resolves to: gRPC would bind
  the others and serve half the addresses (and log its own error lines first)."""
  if not port:
    return
  try:
    addresses = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
  except socket.gaierror as error:
    raise OSError(f"could not resolve {host}: {error.strerror}") from None
  for family, kind, proto, _, address in addresses:
    with socket.socket(family, kind, proto) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
      try:
        probe.bind(address)
      except OSError as error:
        raise OSError(f"could not listen on {host}:{port} ({error.strerror}).") from None


def start_server(scheduler: Scheduler, *, host: str = "localhost", port: int = 0,
                 max_workers: int = 16, tokenizer=None,
                 jetstream_sampling: SamplingParams | None = None,
                 security: ServerSecurity | None = None, max_samples_per_request: int = 64,
                 listening: tuple[grpc.Server, int, Gate] | None = None
                 ) -> tuple[grpc.Server, int, SamplerService]:
  """Starts both services on host:port (0 = any free port).

  Args:
    scheduler: the Scheduler the server drives.
    host: where to listen; beyond loopback only with a credential in `security`.
    port: the port to listen on (0 = any free port).
    max_workers: most RPCs running at once; more are refused with RESOURCE_EXHAUSTED
      rather than left waiting (and counted: `rpcs_refused_busy`).
    tokenizer: optional Tokenizer for text prompts / decoded text.
    jetstream_sampling: the SamplingParams of JetStream Decode requests
      (default: temperature 1, no truncation).
    security: the token, which RPCs need it, TLS (default: none, loopback only).
    max_samples_per_request: the most samples (`n`, JetStream `num_samples`) of one
      request.
    listening: what `listen` returned, when the port was bound beforehand (host, port,
      max_workers and security are then the ones given to `listen`).
  Returns:
    (server, bound port, service); stop with `server.stop(grace)` then `service.stop()`.
  Raises:
    OSError when nothing can listen on host:port; ValueError for a host beyond loopback
    without a credential.
  """
  security = security or ServerSecurity()
  server, bound, gate = listening or listen(host, port, max_workers=max_workers,
                                            security=security)
  service = SamplerService(scheduler, tokenizer, counters=gate.counters,
                           max_samples_per_request=max_samples_per_request)
  service.start()
  sampler_pb2_grpc.add_SamplerServicer_to_server(
      SamplerServicer(service, detailed_errors=gate.security.token is not None), server)
  jetstream_pb2_grpc.add_OrchestratorServicer_to_server(
      OrchestratorServicer(service, jetstream_sampling or SamplingParams()), server)
  server.start()
  return server, bound, service


def serve_from_config(config: ml_collections.ConfigDict
                      ) -> tuple[grpc.Server, int, SamplerService]:
  """Binds the port of a configs/serve.py config, then loads (or builds) its model, builds
  the scheduler and serves (validate with `serve_config.validate_serve_config` first).

  Raises:
    ConfigError: naming config.server.port when it cannot be bound (before any work).
  """
  server = config.server
  security = security_lib.server_security(server)
  try:
    listening = listen(server.host, server.port, max_workers=server.max_workers,
                       security=security)
  except OSError as error:
    raise ConfigError(f"config.server.port: {server.port}: {error}",
                      field="server.port") from None
  try:
    model, params, tokenizer = serve_config.load_served_model(config)
    scheduler = config_lib.build_scheduler(config.sampler, model, params,
                                           tokenizer=tokenizer)
  except BaseException:
    listening[0].stop(None)
    raise
  return start_server(
      scheduler, tokenizer=tokenizer, listening=listening,
      max_samples_per_request=server.max_samples_per_request,
      jetstream_sampling=SamplingParams(temperature=server.jetstream_temperature))


def check_http_port(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming config.server.http_port when it is set and taken (checked before
  the model loads, as the gRPC port is bound then)."""
  server = config.server
  if server.http_port > 0:
    try:
      _check_free(server.host, server.http_port)
    except OSError as error:
      raise ConfigError(f"config.server.http_port: {server.http_port}: {error}",
                        field="server.http_port") from None


def serve_http_from_config(config: ml_collections.ConfigDict, service: SamplerService):
  """The OpenAI-compatible HTTP face (serve/openai_http.py) of a running server, on
  config.server.http_port (>= 0; 0: a free port), with the gRPC server's host, token,
  TLS files and limits. Returns the `openai_http.HttpServer` (its `url`, `stop()`)."""
  import ssl  # pylint: disable=import-outside-toplevel
  from rlhf_jax.sampling.serve import openai_http  # pylint: disable=import-outside-toplevel
  server = config.server
  context = None
  if server.tls_cert:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(server.tls_cert, server.tls_key)
    if server.tls_ca:  # mutual TLS, as gRPC requires it
      context.load_verify_locations(server.tls_ca)
      context.verify_mode = ssl.CERT_REQUIRED
  name = server.served_model_name or config.model.checkpoint or config.model.kind
  try:
    return openai_http.start_http(
        service, host=server.host, port=server.http_port, model_name=name,
        security=security_lib.server_security(server), ssl_context=context,
        max_concurrent=server.max_workers)
  except OSError as error:
    raise ConfigError(f"config.server.http_port: {server.http_port}: {error}",
                      field="server.http_port") from None
