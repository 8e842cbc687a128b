"""The sampler's config section, its validation, and building a Scheduler from it.

Used by `launch/serve.py` (configs/serve.py) and by the trainer, whose config
carries the same `sampler` section (plus `address` to use a server instead of
the in-process engine).
"""

from __future__ import annotations

import os

import ml_collections

from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.config_errors import reword
from rlhf_jax.models import with_numerics
from rlhf_jax.models.config import DTYPES
from rlhf_jax.models.config import MATMUL_PRECISIONS
from rlhf_jax.sampling import security
from rlhf_jax.sampling.engine import Engine
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler import Scheduler
from rlhf_jax.sampling.scheduler_options import validate_scheduler_options
from rlhf_jax.sampling.token_sampling import needs_truncation


def sampler_config(*, num_slots: int = 32, cache_length: int = 1024,
                   prompt_buckets: tuple[int, ...] = (64, 128, 256, 512)
                   ) -> ml_collections.ConfigDict:
  """The `sampler` config section with its defaults (one comment per field)."""
  config = ml_collections.ConfigDict()
  config.address = ""  # "host:port" of a sampling server; empty: the in-process engine.
  # Several servers ("host:port", ...): a fleet with routing and failover (sampling/fleet.py).
  config.addresses = ()
  # File with the servers' shared secret (their server.token_file), sent with every call.
  config.token_file = ""
  config.tls_ca = ""  # PEM CA of the servers' certificates: TLS to them; '' = plain TCP.
  config.tls_cert = ""  # PEM client certificate (with tls_key) for servers that ask (mTLS).
  config.tls_key = ""  # PEM private key of tls_cert.
  # With every server gone, how long a fleet waits for one to come back before it gives
  # up (the trainer then checkpoints and stops).
  config.reconnect_s = 60.0
  config.num_slots = num_slots  # Concurrent samples in the decode batch (KV cache rows).
  config.cache_length = cache_length  # KV positions per slot: longest prompt + max new tokens.
  config.prompt_buckets = prompt_buckets  # Padded prompt lengths; one prefill compile each.
  config.steps_per_sync = 8  # Decode steps per dispatch before the host reads tokens.
  config.max_prefill_batch = 8  # Most prompts per prefill call (a power of two).
  config.warmup = True  # Compile every program at start instead of on first use.
  config.continuous = True  # Refill slots as samples finish (False: static batches).
  config.max_queue = 4096  # Most requests queued or running; beyond: rejected.
  config.update_policy = "finish_old"  # Weight updates: 'finish_old' or 'swap_now'.
  config.max_stop_tokens = 4  # Room for stop token ids per request.
  # Finished samples' KV cache rows kept for their next turn (multi-turn rollouts prefill
  # only the new tokens: sampling/prefix_cache.py); each holds one slot's cache. -1:
  # num_slots; 0: off.
  config.parked_rows = -1
  # The sampler's compute dtype (float32, bfloat16): bf16 rollouts with a float32 trainer
  # are the common GPU setup (the trainer then corrects the mismatch, algorithm.correction).
  config.dtype = "float32"
  # Matmul precision: 'auto' (highest for float32, the backend default for bfloat16),
  # 'default', 'high', 'highest' (models.DecoderConfig.matmul_precision).
  config.matmul_precision = "auto"
  return config


def validate_sampler_config(config: ml_collections.ConfigDict, prefix: str = "sampler",
                            num_devices: int | None = None) -> None:
  """Raises ConfigError naming the `config.<prefix>.*` field of an impossible sampler
  setting, with its allowed values or range."""
  del num_devices  # the sampler runs on the trainer's mesh (or a server's devices)
  for field in ("num_slots", "cache_length", "max_stop_tokens"):  # the Engine's
    if not isinstance(config[field], int) or config[field] < 1:
      invalid(f"{prefix}.{field}", config[field], "must be an int >= 1")
  if not isinstance(config.parked_rows, int) or config.parked_rows < -1:
    invalid(f"{prefix}.parked_rows", config.parked_rows, "must be an int >= -1 (-1: "
            "num_slots, 0: off)")
  try:
    validate_scheduler_options(
        prompt_buckets=tuple(config.prompt_buckets), cache_length=config.cache_length,
        steps_per_sync=config.steps_per_sync, max_prefill_batch=config.max_prefill_batch,
        max_queue=config.max_queue, update_policy=config.update_policy,
        prefix=f"config.{prefix}.")
  except ValueError as error:  # "config.<prefix>.<field>=<value> <rule>."
    raise reword(error) from None
  one_of(f"{prefix}.dtype", config.dtype, DTYPES)
  one_of(f"{prefix}.matmul_precision", config.matmul_precision, MATMUL_PRECISIONS)
  addresses = tuple(config.addresses)
  for address in addresses:
    if not isinstance(address, str) or ":" not in address:
      invalid(f"{prefix}.addresses", addresses, f"every entry must be 'host:port' (got "
              f"{address!r})")
  if len(set(addresses)) != len(addresses):
    invalid(f"{prefix}.addresses", addresses, "has an address twice")
  if addresses and config.address:
    invalid(f"{prefix}.addresses", addresses, f"set either {prefix}.address (one server) or "
            f"{prefix}.addresses (a fleet), not both")
  check_range(f"{prefix}.reconnect_s", config.reconnect_s, low=0, high=7 * 24 * 3600)
  if config.address or addresses:
    security.client_security(config, prefix)  # the files exist and hold something
  if config.address and ":" not in config.address:
    invalid(f"{prefix}.address", config.address, "must be 'host:port' (or empty for the "
            "in-process engine)")


def newline_token_ids(tokenizer) -> list[int]:
  """Ids of the tokens whose text ends with a newline (FIRE's every-line mode)."""
  return [i for i in range(tokenizer.vocab_size)
          if tokenizer.decode([i], skip_special_tokens=False).endswith("\n")]


def build_scheduler(config: ml_collections.ConfigDict, model, params, *, tokenizer=None,
                    seed: int = 0, logits_hook=None,
                    requests: SamplingParams | None = None) -> Scheduler:
  """An Engine and Scheduler as the sampler section says (validate it first): the
  model computes in `config.dtype` at `config.matmul_precision`; with `config.warmup`,
  every program is compiled before this returns; given the `requests` a caller will send,
  the top-k/top-p generate variants only if those truncate (a request that does compiles
  them on first use). Every launcher builds its sampler here.
  With a `logits_hook` (guided decoding), `params` are `GuidedParams(model, guide)`."""
  newline = newline_token_ids(tokenizer) if tokenizer is not None else ()
  model = with_numerics(model, dtype=config.dtype, matmul_precision=config.matmul_precision)
  engine = Engine(model, num_slots=config.num_slots, cache_length=config.cache_length,
                  newline_token_ids=newline, max_stop_tokens=config.max_stop_tokens,
                  logits_hook=logits_hook)
  scheduler = Scheduler(engine, params, prompt_buckets=tuple(config.prompt_buckets),
                   steps_per_sync=config.steps_per_sync, continuous=config.continuous,
                   max_queue=config.max_queue, update_policy=config.update_policy, seed=seed,
                   max_prefill_batch=config.max_prefill_batch,
                   parked_rows=None if config.parked_rows == -1 else config.parked_rows)
  if config.warmup:
    truncation = requests is None or needs_truncation(
        engine.slot_sampling(requests, 0, seed=0))
    scheduler.warmup(truncation=truncation)
  return scheduler


def check_directory(field: str, path: str, required: tuple[str, ...] = ()) -> None:
  """Raises ConfigError naming `field` if `path` is not a directory holding `required`."""
  if not os.path.isdir(path):
    invalid(field, path, "must be an existing directory")
  for name in required:
    if not os.path.exists(os.path.join(path, name)):
      invalid(field, path, f"must be a directory holding {name}")
