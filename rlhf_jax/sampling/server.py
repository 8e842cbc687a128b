"""The sampler in its own process, behind gRPC (needs the `serve` extra: grpcio, protobuf).

This module wires the pieces together:
  service.py     SamplerService: the scheduler loop thread and per-request queues;
  servicers.py   the Sampler and JetStream Orchestrator services, on one port;
  wire.py        SamplingParams / samples / weights ⇄ protos (shared with client.py);
  serve_config.py  configs/serve.py's validation and the model it names.

Weight updates follow the scheduler's `update_policy`: "finish_old" (default)
lets in-flight samples finish on the old weights while new ones wait for the
swap; "swap_now" switches at the next step, and every sample reports the first
and last weight version it was generated with. More concurrent RPCs than worker
threads are refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import concurrent.futures

import grpc
import ml_collections

from rlhf_jax.sampling import config as config_lib
from rlhf_jax.sampling import serve_config
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.protos import sampler_pb2_grpc
from rlhf_jax.sampling.scheduler import Scheduler
from rlhf_jax.sampling.service import SamplerService
from rlhf_jax.sampling.servicers import OrchestratorServicer
from rlhf_jax.sampling.servicers import SamplerServicer
from rlhf_jax.sampling.wire import MAX_MESSAGE_BYTES


def start_server(scheduler: Scheduler, *, host: str = "localhost", port: int = 0,
                 max_workers: int = 16, tokenizer=None,
                 jetstream_sampling: SamplingParams | None = None
                 ) -> tuple[grpc.Server, int, SamplerService]:
  """Starts both services on host:port (0 = any free port).

  Args:
    scheduler: the Scheduler the server drives.
    host: where to listen.
    port: the port to listen on (0 = any free port).
    max_workers: RPC handler threads; more concurrent RPCs are refused with
      RESOURCE_EXHAUSTED rather than left waiting.
    tokenizer: optional Tokenizer for text prompts / decoded text.
    jetstream_sampling: the SamplingParams of JetStream Decode requests
      (default: temperature 1, no truncation).
  Returns:
    (server, bound port, service); stop with `server.stop(grace)` then `service.stop()`.
  Raises:
    OSError when nothing can listen on host:port.
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


def serve_from_config(config: ml_collections.ConfigDict
                      ) -> tuple[grpc.Server, int, SamplerService]:
  """Loads (or builds) the model of a configs/serve.py config, builds the scheduler and
  starts the server (validate with `serve_config.validate_serve_config` first)."""
  model, params, tokenizer = serve_config.load_served_model(config)
  scheduler = config_lib.build_scheduler(config.sampler, model, params, tokenizer=tokenizer)
  return start_server(
      scheduler, host=config.server.host, port=config.server.port,
      max_workers=config.server.max_workers, tokenizer=tokenizer,
      jetstream_sampling=SamplingParams(temperature=config.server.jetstream_temperature))
