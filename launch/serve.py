r"""Runs the sampling engine in its own process behind gRPC.

  python launch/serve.py --config=configs/serve.py:tiny [--config.server.port=0]
  python launch/serve.py --config=configs/serve.py:hf --config.model.checkpoint=DIR

Prints one JSON line {"event": "serving", "address": ...} once it accepts calls
(port 0 picks a free port), then serves until SIGINT/SIGTERM. The port is bound before
the model is built: a port in use is one line, exit status 2. Beyond loopback it needs
--config.server.token_file (docs/sampling.md, "Who may call a server"). Services:
rlhf_jax.sampling.Sampler (rlhf_jax/sampling/serve/protos/sampler.proto) and
JetStream's jetstream_proto.Orchestrator (Decode, HealthCheck). Clients:
rlhf_jax.sampling.remote.client.SamplerClient, or any JetStream client. With
--config.server.http_port=PORT it also speaks the OpenAI API over HTTP (its base URL
`http://127.0.0.1:PORT/v1` is printed as "openai_base_url"; docs/sampling.md).
"""

from __future__ import annotations

import json
import signal
import threading

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Server config file.",
                                          lock_config=True)
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config"])


def main(argv) -> None:
  del argv
  from rlhf_jax.sampling.serve import config as serve_config
  from rlhf_jax.sampling.serve import server as server_lib

  config = _CONFIG.value
  serve_config.validate_serve_config(config)  # before anything loads or compiles
  check_served_files(config)
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  server_lib.check_http_port(config)  # before the model loads, as the gRPC port
  server, port, service = server_lib.serve_from_config(config)
  http = None
  if config.server.http_port >= 0:
    try:
      http = server_lib.serve_http_from_config(config, service)
    except BaseException:
      server.stop(None)
      service.stop()
      raise
  print(json.dumps({"event": "serving", "address": f"{config.server.host}:{port}",
                    **({"openai_base_url": http.url} if http else {}),
                    "num_slots": config.sampler.num_slots,
                    "cache_length": config.sampler.cache_length,
                    "token": bool(config.server.token_file), "auth": config.server.auth,
                    "tls": bool(config.server.tls_cert),
                    "client_certificates": bool(config.server.tls_ca)}), flush=True)
  stop = threading.Event()
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stop.set())
  stop.wait()
  if http is not None:
    http.stop()
  server.stop(grace=5).wait()
  service.stop()
  print(json.dumps({"event": "stopped", **service.metrics()}), flush=True)


def check_served_files(config) -> None:
  """The files a server loads, checked as train.py checks them, before anything loads:
  the checkpoint (checks.check_checkpoint_dir: config.json's bounds, the safetensors
  headers against it, a tokenizer.json there against the embedding), its model family,
  and the tokenizer; each error one line naming the field (cli.run: exit status 2)."""
  import os  # pylint: disable=import-outside-toplevel
  from rlhf_jax import models  # pylint: disable=import-outside-toplevel
  from rlhf_jax.config_errors import unfit  # pylint: disable=import-outside-toplevel
  from rlhf_jax.models.hf import checks  # pylint: disable=import-outside-toplevel
  tokenizer = config.tokenizer
  if config.model.kind == "hf":
    checkpoint = config.model.checkpoint
    own = os.path.exists(os.path.join(checkpoint, checks.TOKENIZER))
    checks.check_checkpoint_dir(checkpoint, "config.model.checkpoint", tokenizer=own)
    try:
      models.read_hf_config(checkpoint)
    except (ValueError, KeyError) as error:
      unfit("model.checkpoint", f"{checkpoint}: {error}")
    tokenizer = tokenizer or (checkpoint if own else "")
  if tokenizer:
    try:
      models.Tokenizer.from_directory(tokenizer)
    except (OSError, ValueError) as error:
      unfit("tokenizer" if config.tokenizer else "model.checkpoint",
            f"{tokenizer}: the tokenizer does not load: {error}")


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)  # config errors as one line, exit status 2
