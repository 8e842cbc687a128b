"""The Scheduler's options are validated once: a directly built Scheduler and the
`sampler` config section accept and refuse exactly the same values, each error naming
its field (the argument, or config.sampler.<field>) and the allowed values."""

import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.scheduler.scheduler import default_prompt_buckets

CONFIG = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=32)
MODEL, PARAMS = models.init_model(CONFIG, seed=0)
CACHE = 24
ENGINE = sampling.Engine(MODEL, num_slots=1, cache_length=CACHE)
GOOD = {"prompt_buckets": (8, 16), "steps_per_sync": 2, "max_prefill_batch": 4,
        "max_queue": 8, "update_policy": "finish_old"}


def direct_error(**options):
  """The direct path's error message, or None when the Scheduler builds."""
  try:
    Scheduler(ENGINE, PARAMS, **{**GOOD, **options})
  except ValueError as error:
    return str(error)
  return None


def config_error(**options):
  """The config path's error message, or None when the section validates."""
  config = sampler_config_lib.sampler_config(num_slots=1, cache_length=CACHE)
  for field, value in {**GOOD, **options}.items():
    config[field] = value
  try:
    sampler_config_lib.validate_sampler_config(config)
  except ConfigError as error:
    return str(error)
  return None


def is_power_of_two(value):
  return value >= 1 and bin(value).count("1") == 1


@pytest.mark.parametrize("field,values,allowed", [
    ("steps_per_sync", range(-2, 6), lambda v: v >= 1),
    ("max_queue", range(-2, 6), lambda v: v >= 1),
    ("max_prefill_batch", range(-1, 19), is_power_of_two),
    ("prompt_buckets", [(b,) for b in range(-1, CACHE + 3)],
     lambda buckets: 1 <= buckets[0] < CACHE),
    ("prompt_buckets", [(), (4, CACHE - 1), (4, CACHE), (CACHE - 1, 0)],
     lambda buckets: bool(buckets) and all(1 <= b < CACHE for b in buckets)),
    ("update_policy", ["finish_old", "swap_now", "later", ""],
     lambda v: v in ("finish_old", "swap_now")),
])
def test_both_paths_accept_exactly_the_allowed_values(field, values, allowed):
  for value in values:
    direct, configured = direct_error(**{field: value}), config_error(**{field: value})
    if allowed(value):
      assert direct is None and configured is None, (field, value, direct, configured)
    else:
      assert direct.startswith(f"{field}={value!r} "), direct
      requirement = direct[len(f"{field}={value!r} "):].rstrip(".")
      assert configured.startswith(f"config.sampler.{field}"), configured
      assert requirement in configured, (direct, configured)


@pytest.mark.parametrize("field,value,allowed", [
    ("steps_per_sync", True, "positive integer"),
    ("max_queue", 0, "positive integer"),
    ("max_prefill_batch", 6, "power of two"),
    ("prompt_buckets", (8, CACHE), f"[1, cache_length={CACHE})"),
    ("update_policy", "later", "finish_old, swap_now"),
])
def test_errors_state_the_allowed_values(field, value, allowed):
  assert allowed in direct_error(**{field: value})
  assert allowed in config_error(**{field: value})


def test_a_directly_built_scheduler_refuses_a_float_count():
  # A ConfigDict cannot hold a float in an int field; a keyword argument can.
  assert direct_error(max_queue=2.0) == "max_queue=2.0 must be a positive integer."


@pytest.mark.parametrize("cache_length", [2, 16, 17, 18, 100, 1024])
def test_default_prompt_buckets_leave_room_for_a_new_token(cache_length):
  buckets = default_prompt_buckets(cache_length)
  assert buckets[-1] == cache_length - 1
  assert list(buckets) == sorted(set(buckets))
  assert all(b == cache_length - 1 or (b >= 16 and is_power_of_two(b)) for b in buckets)
  scheduler = Scheduler(sampling.Engine(MODEL, num_slots=1, cache_length=cache_length), PARAMS)
  assert scheduler.prompt_buckets == buckets


def test_a_prompt_of_the_largest_bucket_still_gets_its_token():
  scheduler = Scheduler(ENGINE, PARAMS, prompt_buckets=(CACHE - 1,))
  (completion,) = scheduler.generate([[1] * (CACHE - 1)],
                                     sampling.SamplingParams(max_new_tokens=1, seed=0))[0]
  assert len(completion.token_ids) == 1
