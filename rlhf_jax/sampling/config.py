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
from rlhf_jax.models import with_numerics
from rlhf_jax.models.decoder_config import DTYPES
from rlhf_jax.models.decoder_config import MATMUL_PRECISIONS
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section
from rlhf_jax.sampling.engine.engine import Engine
from rlhf_jax.sampling.engine.token_sampling import needs_truncation
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler.options import validate_scheduler_options
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import security


def sampler_config(*, num_slots: int = 32, cache_length: int = 1024,
                   prompt_buckets: tuple[int, ...] = (64, 128, 256, 512)
                   ) -> ml_collections.ConfigDict:
  """The `sampler` config section with its defaults (one comment per field)."""
  config = ml_collections.ConfigDict()
  config.address = ""  # "host:port" of a sampling server; empty: the in-process engine.
  # Several servers ("host:port", ...): a fleet with routing and failover (sampling/remote/fleet.py).
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
  # KV positions per slot: longest prompt + max new tokens. In a trainer's config 0 derives
  # it from data.prompt_length and the rollout's response budget (`fit_sizes`).
  config.cache_length = cache_length
  # Padded prompt lengths; one prefill compile each. In a trainer's config () derives them:
  # data.prompt_length and the longest prompt the rollout sends (`fit_sizes`).
  config.prompt_buckets = prompt_buckets
  config.steps_per_sync = 8  # Decode steps per dispatch before the host reads tokens.
  config.max_prefill_batch = 8  # Most prompts per prefill call (a power of two).
  config.warmup = True  # Compile every program at start instead of on first use.
  config.continuous = True  # Refill slots as samples finish (False: static batches).
  config.max_queue = 4096  # Most requests queued or running; beyond: rejected.
  config.update_policy = "finish_old"  # Weight updates: 'finish_old' or 'swap_now'.
  config.max_stop_tokens = 4  # Room for stop token ids per request.
  # Finished samples' KV cache rows kept for their next turn (multi-turn rollouts prefill
  # only the new tokens: sampling/engine/prefix_cache.py); each holds one slot's cache. -1:
  # num_slots; 0: off.
  config.parked_rows = -1
  # The sampler's compute dtype (float32, bfloat16): bf16 rollouts with a float32 trainer
  # are the common GPU setup (the trainer then corrects the mismatch, algorithm.correction).
  config.dtype = "float32"
  # Matmul precision: 'auto' (highest for float32, the backend default for bfloat16),
  # 'default', 'high', 'highest' (models.DecoderConfig.matmul_precision).
  config.matmul_precision = "auto"
  # A mixture-of-experts model's sampler returns each token's experts per layer with the
  # completion (routing replay: docs/moe.md); a dense model refuses it at start.
  config.record_routes = False
  return config


def validate_sampler_config(config: ml_collections.ConfigDict, prefix: str = "sampler",
                            num_devices: int | None = None, *, derivable: bool = False) -> None:
  """Raises ConfigError naming the `config.<prefix>.*` field of an impossible sampler
  setting, with its allowed values or range. `derivable` (a trainer's config, whose
  `fit_sizes` runs later): cache_length 0 and prompt_buckets () are accepted as "derive"."""
  del num_devices  # the sampler runs on the trainer's mesh (or a server's devices)
  derive_cache, derive_buckets = derived_sizes(config) if derivable else (False, False)
  for field in ("num_slots", "cache_length", "max_stop_tokens"):  # the Engine's
    if field == "cache_length" and derive_cache:
      continue
    if not isinstance(config[field], int) or config[field] < 1:
      requirement = "must be an int >= 1" + (" (0: derived)" if derivable else "")
      invalid(f"{prefix}.{field}", config[field], requirement)
  # A size still to derive is checked once it is: a stand-in keeps the other's rules here.
  buckets = (1,) if derive_buckets else tuple(config.prompt_buckets)
  cache_length = (max(buckets) + 1 if derive_cache and _all_ints(buckets) else
                  2 if derive_cache else config.cache_length)
  if not isinstance(config.parked_rows, int) or config.parked_rows < -1:
    invalid(f"{prefix}.parked_rows", config.parked_rows, "must be an int >= -1 (-1: "
            "num_slots, 0: off)")
  validate_scheduler_options(
      prompt_buckets=buckets, cache_length=cache_length,
      steps_per_sync=config.steps_per_sync, max_prefill_batch=config.max_prefill_batch,
      max_queue=config.max_queue, update_policy=config.update_policy, section=prefix)
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


def derived_sizes(config: ml_collections.ConfigDict) -> tuple[bool, bool]:
  """(cache_length is left to derive: 0, prompt_buckets is: empty)."""
  return config.cache_length == 0, not tuple(config.prompt_buckets)


def _all_ints(values) -> bool:
  return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def fit_sizes(config: ml_collections.ConfigDict, *, prompt_length: int,
              row: tuple[int, str], longest_prompt: tuple[int, str],
              prefix: str = "sampler") -> None:
  """The KV cache and prompt buckets a run needs, decided together.

  A run's rows hold up to `row` = (tokens, why) positions (prompt + response budget) and
  its requests up to `longest_prompt` = (tokens, why) prompt tokens (the prompt itself,
  or a multi-turn conversation so far, or a continued response). A size left to derive
  (cache_length 0, prompt_buckets ()) is set here: cache_length = the row (at least the
  largest bucket + 1), prompt_buckets = (prompt_length, longest prompt) without repeats.
  Explicit sizes that are too small are one ConfigError naming the first of them and
  giving every size that fits at once (a fix of one never makes another insufficient).
  The `why`s are the fields each bound comes from, e.g. "data.prompt_length 512 +
  rollout.max_new_tokens 1024"."""
  derive_cache, derive_buckets = derived_sizes(config)
  needed_row, row_why = row
  longest, longest_why = longest_prompt
  buckets = (tuple(sorted({prompt_length, longest})) if derive_buckets else
             tuple(config.prompt_buckets))
  cache_length = (max(needed_row, max(buckets) + 1) if derive_cache else config.cache_length)
  problems = []
  if cache_length < needed_row:
    problems.append((f"{prefix}.cache_length", cache_length,
                     f"must be >= {needed_row} = {row_why}"))
  if max(buckets) < longest:
    problems.append((f"{prefix}.prompt_buckets", buckets,
                     f"must reach {longest} = {longest_why}"))
  if problems:
    fitting_buckets = tuple(sorted({*buckets, longest})) if max(buckets) < longest else buckets
    fitting_cache = max(cache_length, needed_row, max(fitting_buckets) + 1)
    field, value, requirement = problems[0]
    also = "".join(f"; and config.{f}={v!r} {r}" for f, v, r in problems[1:])
    invalid(field, value, f"{requirement}{also}; sizes that fit: --config.{prefix}."
            f"cache_length={fitting_cache} --config.{prefix}.prompt_buckets="
            f"{','.join(str(b) for b in fitting_buckets)} (or 0 and () to derive them)")
  config.cache_length, config.prompt_buckets = cache_length, buckets


def newline_token_ids(tokenizer) -> list[int]:
  """Ids of the tokens whose text ends with a newline (FIRE's every-line mode)."""
  return [i for i in range(tokenizer.vocab_size)
          if tokenizer.decode([i], skip_special_tokens=False).endswith("\n")]


def build_scheduler(config: ml_collections.ConfigDict, model, params, *, tokenizer=None,
                    seed: int = 0, logits_hook=None,
                    requests: SamplingParams | None = None,
                    record_routes: bool | None = None) -> Scheduler:
  """An Engine and Scheduler as the sampler section says (validate it first): the
  model computes in `config.dtype` at `config.matmul_precision`; with `config.warmup`,
  every program is compiled before this returns; given the `requests` a caller will send,
  the top-k/top-p generate variants only if those truncate (a request that does compiles
  them on first use). Every launcher builds its sampler here.
  With a `logits_hook` (guided decoding), `params` are `GuidedParams(model, guide)`.
  `record_routes`: overrides `config.record_routes` (a trainer's routing replay)."""
  newline = newline_token_ids(tokenizer) if tokenizer is not None else ()
  model = with_numerics(model, dtype=config.dtype, matmul_precision=config.matmul_precision)
  engine = Engine(model, num_slots=config.num_slots, cache_length=config.cache_length,
                  newline_token_ids=newline, max_stop_tokens=config.max_stop_tokens,
                  logits_hook=logits_hook,
                  record_routes=config.record_routes if record_routes is None else record_routes)
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


def trainer_sampler_config() -> ml_collections.ConfigDict:
  """The trainer's `sampler` section: 256 slots, and the KV cache and prompt buckets
  derived from the run's prompt and response budget (0 and (): `fit_sizes`), so a longer
  prompt, response or episode grows them and a shorter one shrinks them."""
  return sampler_config(num_slots=256, cache_length=0, prompt_buckets=())


def check_sampler_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `sampler` section (its sizes are fitted to the run later, with every
  bound at once: training/config.py's `fit_sampler_sizes`)."""
  del checking
  validate_sampler_config(c.sampler, derivable=True)


SECTION = Section("sampler", at="sampler", fields=trainer_sampler_config,
                  check=check_sampler_section)
