"""The Scheduler's options and requests: their defaults and their one validation.

`validate_scheduler_options` checks the constructor's options without an engine or a
model: `Scheduler.__init__` raises a ValueError naming the argument, and the `sampler`
config section (sampling/config.py) a ConfigError naming config.<section>.<field>, so a
launcher refuses a bad section before it loads a model, by the rule a Scheduler applies.
`validate_request` checks one request against the engine (`Scheduler.submit`).
"""

from __future__ import annotations

from typing import Sequence

from rlhf_jax.config_errors import invalid
from rlhf_jax.sampling.params import SamplingParams

UPDATE_POLICIES = ("finish_old", "swap_now")


def _is_positive_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def default_prompt_buckets(cache_length: int) -> tuple[int, ...]:
  """Powers of two from 16 below `cache_length - 1`, plus `cache_length - 1`: the
  longest prompt that leaves room for a new token."""
  longest = cache_length - 1
  return tuple(b for b in (2 ** i for i in range(4, 20)) if b < longest) + (longest,)


def validate_scheduler_options(*, prompt_buckets: Sequence[int], cache_length: int,
                               steps_per_sync: int, max_prefill_batch: int, max_queue: int,
                               update_policy: str, section: str | None = None) -> None:
  """Raises an error naming the first impossible option and its allowed values: for a
  Scheduler's arguments (`section` None) a ValueError "<field>=<value> <requirement>.",
  for a config section a ConfigError (`invalid`) naming config.<section>.<field>.

  Args:
    prompt_buckets: padded prompt lengths; each in [1, cache_length): a prompt that
      fills its slot's KV cache leaves no room for a new token.
    cache_length: KV positions per slot (the Engine's; checked by the Engine).
    steps_per_sync: a positive integer (decode steps per dispatch).
    max_queue: a positive integer (most requests waiting or running).
    max_prefill_batch: a power of two (prefill batches are padded to a few sizes up to it:
      `programs.prefill_batch_sizes`).
    update_policy: one of UPDATE_POLICIES.
    section: the config section the options come from, e.g. "sampler"; None: arguments.
  """
  def refuse(field, value, requirement):
    if section is not None:
      invalid(f"{section}.{field}", value, requirement)
    raise ValueError(f"{field}={value!r} {requirement}.")

  for field, value in (("steps_per_sync", steps_per_sync), ("max_queue", max_queue),
                       ("max_prefill_batch", max_prefill_batch)):
    if not _is_positive_int(value):
      refuse(field, value, "must be a positive integer")
  if max_prefill_batch & (max_prefill_batch - 1):
    refuse("max_prefill_batch", max_prefill_batch, "must be a power of two (1, 2, 4, ...)")
  if update_policy not in UPDATE_POLICIES:
    refuse("update_policy", update_policy, f"is not one of {', '.join(UPDATE_POLICIES)}")
  buckets = tuple(prompt_buckets)
  if not buckets or not all(_is_positive_int(b) and b < cache_length for b in buckets):
    refuse("prompt_buckets", buckets, f"must be a non-empty tuple of integers in [1, "
           f"cache_length={cache_length}) (room for new tokens)")


def validate_request(prompt_ids: Sequence[int], sampling, engine, prompt_buckets: Sequence[int]
                     ) -> int:
  """Checks one request against the engine (`Scheduler.submit`); returns its prompt's
  bucket. Raises ValueError naming the bad field."""
  if not isinstance(sampling, SamplingParams):
    raise ValueError(f"sampling must be a SamplingParams; got {type(sampling).__name__}.")
  vocab = engine.vocab_size
  if not prompt_ids:
    raise ValueError("prompt_ids is empty; a prompt needs at least one token.")
  if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
    raise ValueError(f"prompt_ids has token ids outside [0, {vocab}).")
  bucket = next((b for b in sorted(prompt_buckets) if b >= len(prompt_ids)), None)
  if bucket is None:
    raise ValueError(f"prompt_ids has {len(prompt_ids)} tokens; the largest prompt bucket "
                     f"is {max(prompt_buckets)}.")
  room = engine.cache_length - len(prompt_ids)
  if sampling.max_new_tokens > room:
    raise ValueError(f"max_new_tokens={sampling.max_new_tokens} does not fit: the prompt has "
                     f"{len(prompt_ids)} tokens and cache_length is "
                     f"{engine.cache_length} (room for {room}).")
  sampling.check_against(vocab_size=vocab, max_stop_tokens=engine.max_stop_tokens)
  return bucket
