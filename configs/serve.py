"""Config for launch/serve.py: the sampling engine behind gRPC.

  python launch/serve.py --config=configs/serve.py:tiny --config.server.port=50051
  python launch/serve.py --config=configs/serve.py:hf --config.model.checkpoint=/path/to/hf_dir

Variants: `tiny` (a random 2-layer model built locally: for tests and trying the
protocol) and `hf` (a user's HF checkpoint directory with config.json,
*.safetensors and tokenizer.json).
"""

import ml_collections

from rlhf_jax.sampling.config import sampler_config


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
  """Returns the server config; every field is overridable with --config.<field>=..."""
  if variant not in ("tiny", "hf"):
    raise ValueError(f"config variant {variant!r}; allowed: 'tiny', 'hf'.")
  config = ml_collections.ConfigDict()
  # Persistent XLA compilation cache directory (runtime.enable_compile_cache); '' = off.
  config.compile_cache = "~/.cache/rlhf_jax/xla"
  config.model = ml_collections.ConfigDict()
  # 'tiny' (a random demo model: rlhf_jax.sampling.serve.config.tiny_model) or 'hf'
  # (model.checkpoint).
  config.model.kind = variant
  config.model.checkpoint = ""  # HF checkpoint directory (required for kind 'hf').
  config.model.seed = 0  # Initialisation seed of the tiny model.
  config.model.vocab_size = 256  # Tiny model: vocabulary (ignored with a checkpoint).
  config.model.num_layers = 2  # Tiny model: layers.
  config.model.hidden_size = 64  # Tiny model: width.
  config.tokenizer = ""  # Directory with tokenizer.json; empty: the checkpoint's, if any.
  config.sampler = sampler_config(num_slots=8 if variant == "tiny" else 32,
                                  cache_length=128 if variant == "tiny" else 2048,
                                  prompt_buckets=(16, 32, 64) if variant == "tiny" else (
                                      128, 256, 512, 1024))
  config.server = ml_collections.ConfigDict()
  # Interface to listen on ("0.0.0.0": all; beyond loopback needs server.token_file).
  config.server.host = "localhost"
  config.server.port = 50051  # TCP port; 0 picks a free one (printed at start).
  # Port of the OpenAI-compatible HTTP face (http://HOST:PORT/v1, same host, token and
  # limits as gRPC; needs aiohttp: the `serve` extra); -1 = off, 0 picks a free one.
  config.server.http_port = -1
  # The model id the HTTP face lists and answers to ('' = model.checkpoint, or 'tiny').
  config.server.served_model_name = ""
  config.server.max_workers = 16  # RPC threads = most concurrent RPCs; beyond: RESOURCE_EXHAUSTED.
  config.server.jetstream_temperature = 1.0  # Temperature of JetStream Decode requests.
  # Most samples one request may ask for (`n`, JetStream `num_samples`).
  config.server.max_samples_per_request = 64
  # File holding the shared secret callers send (`authorization: Bearer <token>`; clients:
  # sampler.token_file). Required to listen beyond loopback (or server.tls_ca).
  config.server.token_file = ""
  config.server.auth = "writes"  # RPCs that need the token: 'writes' (weights, Cancel), 'all'.
  config.server.tls_cert = ""  # PEM certificate to serve TLS with (with tls_key); '' = plain TCP.
  config.server.tls_key = ""  # PEM private key of tls_cert.
  config.server.tls_ca = ""  # PEM CA: clients must present a certificate it signed (mTLS).
  return config
