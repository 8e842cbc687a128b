"""The server config (configs/serve.py): its validation and the model it names.

The `tiny` model is a demo fixture: a random decoder built from three config fields,
so that `launch/serve.py` (and its smoke test) can serve without a checkpoint. It
lives here rather than in tests because the launcher exposes it, and beside the
validation because the two share one assumption (4 heads, 2 KV heads, so the width
is a multiple of 8 for even RoPE heads).
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from rlhf_jax import models
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.sampling import config as config_lib
from rlhf_jax.sampling.serve import security

MODEL_KINDS = ("tiny", "hf")
_TINY_HEADS = 4
_TINY_KV_HEADS = 2
MAX_TEMPERATURE = 1e4  # finite: inf turns every logit into NaN
MAX_SAMPLES_PER_REQUEST = 4096


def validate_serve_config(config: ml_collections.ConfigDict) -> None:
  """Checks configs/serve.py fields before anything loads or compiles.

  Raises:
    ConfigError: naming the field and its allowed values or range (a ValueError).
  """
  config_lib.validate_sampler_config(config.sampler)
  model = config.model
  one_of("model.kind", model.kind, MODEL_KINDS)
  if model.kind == "hf":
    if not model.checkpoint:
      invalid("model.checkpoint", model.checkpoint, "must be an HF checkpoint directory "
              "for model.kind='hf'")
    config_lib.check_directory("model.checkpoint", model.checkpoint, ("config.json",))
  else:
    for field, low in (("vocab_size", 4), ("num_layers", 1), ("hidden_size", 8)):
      check_range(f"model.{field}", model[field], low=low)
    if model.hidden_size % (2 * _TINY_HEADS):
      invalid("model.hidden_size", model.hidden_size, f"must be a multiple of "
              f"{2 * _TINY_HEADS} ({_TINY_HEADS} heads of even width)")
  if config.tokenizer:
    config_lib.check_directory("tokenizer", config.tokenizer, ("tokenizer.json",))
  check_range("server.port", config.server.port, low=0, high=65535)
  check_range("server.http_port", config.server.http_port, low=-1, high=65535)
  if config.server.http_port > 0 and config.server.http_port == config.server.port:
    invalid("server.http_port", config.server.http_port, "must differ from server.port "
            "(gRPC listens there)")
  if config.server.http_port >= 0 and importlib.util.find_spec("aiohttp") is None:
    invalid("server.http_port", config.server.http_port, "needs aiohttp for the OpenAI "
            "HTTP face (pip install 'rlhf-jax[serve]')")
  check_range("server.max_workers", config.server.max_workers, low=1)
  check_range("server.jetstream_temperature", config.server.jetstream_temperature, low=0,
              high=MAX_TEMPERATURE)
  check_range("server.max_samples_per_request", config.server.max_samples_per_request,
              low=1, high=MAX_SAMPLES_PER_REQUEST)
  security.server_security(config.server)  # reads and checks the token and TLS files


def tiny_model(model: ml_collections.ConfigDict):
  """A random decoder from the `model` section (vocab_size, num_layers, hidden_size,
  seed): 4 query heads, 2 KV heads, MLP 3× wide. Returns (model, params)."""
  width = model.hidden_size
  return models.init_model(models.DecoderConfig(
      vocab_size=model.vocab_size, hidden_size=width, num_layers=model.num_layers,
      num_heads=_TINY_HEADS, num_kv_heads=_TINY_KV_HEADS, head_dim=width // _TINY_HEADS,
      intermediate_size=3 * width), seed=model.seed)


def load_served_model(config: ml_collections.ConfigDict):
  """(model, params, tokenizer or None) a validated serve config names; an hf
  checkpoint's own tokenizer.json is used when `config.tokenizer` is empty."""
  tokenizer_dir = config.tokenizer
  if config.model.kind == "hf":
    checkpoint = config.model.checkpoint
    model, params = models.load_hf_checkpoint(checkpoint)
    if not tokenizer_dir and os.path.exists(os.path.join(checkpoint, "tokenizer.json")):
      tokenizer_dir = checkpoint
  else:
    model, params = tiny_model(config.model)
  tokenizer = models.Tokenizer.from_directory(tokenizer_dir) if tokenizer_dir else None
  return model, params, tokenizer
