"""The `sampler` config section: its refusals (one line naming config.sampler.<field>),
the sizes a run derives, and the Scheduler built from it (the options shared with a
directly built Scheduler: tests/sampling/scheduler/test_options.py)."""

from __future__ import annotations

import re

import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling import config as config_lib
from rlhf_jax.sampling.config import sampler_config
from rlhf_jax.sampling.config import validate_sampler_config


@pytest.mark.parametrize("fields, message", [
    ({"addresses": ("localhost",)}, "every entry must be 'host:port'"),
    ({"addresses": ("a:1", "a:1")}, "has an address twice"),
    ({"addresses": ("a:1",), "address": "b:2"}, "not both"),
])
def test_bad_fleet_addresses_are_named(fields, message):
  config = sampler_config()
  config.update(fields)
  with pytest.raises(ConfigError, match=f"config.sampler.addresses.*{message}"):
    validate_sampler_config(config)


@pytest.mark.parametrize("field, value", [
    ("num_slots", 0), ("cache_length", -5), ("max_stop_tokens", -1), ("parked_rows", -2),
    ("dtype", "float8"), ("matmul_precision", "fast"), ("reconnect_s", -1.0),
    ("address", "nowhere"), ("steps_per_sync", 0)])
def test_each_refusal_is_one_line_naming_its_field(field, value):
  config = sampler_config()
  config[field] = value
  with pytest.raises(ConfigError) as error:
    validate_sampler_config(config, prefix="rollout.sampler")
  assert str(error.value).startswith(f"config.rollout.sampler.{field}")
  assert "\n" not in str(error.value)


def test_a_trainers_section_may_leave_its_sizes_to_derive_and_a_servers_may_not():
  trainer = config_lib.trainer_sampler_config()
  assert (trainer.cache_length, tuple(trainer.prompt_buckets)) == (0, ())
  validate_sampler_config(trainer, derivable=True)
  with pytest.raises(ConfigError, match=r"^config\.sampler\.cache_length"):
    validate_sampler_config(trainer)


def test_fit_sizes_derives_both_sizes_from_the_run():
  config = config_lib.trainer_sampler_config()
  config_lib.fit_sizes(config, prompt_length=64, row=(64 + 200, "prompt + response"),
                       longest_prompt=(150, "a continued response"))
  assert (config.cache_length, tuple(config.prompt_buckets)) == (264, (64, 150))
  small = config_lib.trainer_sampler_config()
  config_lib.fit_sizes(small, prompt_length=64, row=(70, "row"), longest_prompt=(64, "p"))
  assert (small.cache_length, tuple(small.prompt_buckets)) == (70, (64,))


def test_sizes_too_small_are_one_error_naming_both_with_sizes_that_fit():
  config = sampler_config(cache_length=100, prompt_buckets=(32, 64))
  with pytest.raises(ConfigError) as error:
    config_lib.fit_sizes(config, prompt_length=64, row=(180, "data.prompt_length 64 + 116"),
                         longest_prompt=(120, "the episode"))
  message = str(error.value)
  assert message.startswith("config.sampler.cache_length: invalid value 100: must be >= 180 = "
                            "data.prompt_length 64 + 116; and config.sampler.prompt_buckets="
                            "(32, 64) must reach 120 = the episode")
  assert message.endswith("sizes that fit: --config.sampler.cache_length=180 "
                          "--config.sampler.prompt_buckets=32,64,120 (or 0 and () to derive "
                          "them)")
  fitted = sampler_config(cache_length=180, prompt_buckets=(32, 64, 120))
  config_lib.fit_sizes(fitted, prompt_length=64, row=(180, "row"),
                       longest_prompt=(120, "p"))  # the advice passes


def test_check_directory_names_the_field_and_the_missing_file(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  config_lib.check_directory("model.checkpoint", str(tmp_path), ("config.json",))
  with pytest.raises(ConfigError, match=re.escape(
      f"config.model.checkpoint: invalid value {str(tmp_path)!r}: must be a directory "
      "holding tokenizer.json")):
    config_lib.check_directory("model.checkpoint", str(tmp_path), ("tokenizer.json",))
  with pytest.raises(ConfigError, match=r"^config\.tokenizer: invalid value .*: must be an "
                     "existing directory"):
    config_lib.check_directory("tokenizer", str(tmp_path / "none"))


class Tokenizer:
  """Token i decodes to `texts[i]`."""

  def __init__(self, texts):
    self.texts = texts
    self.vocab_size = len(texts)

  def decode(self, ids, skip_special_tokens=True):
    del skip_special_tokens
    return "".join(self.texts[i] for i in ids)


def test_newline_tokens_are_those_whose_text_ends_a_line():
  tokenizer = Tokenizer(["a", "b\n", "\n", "\nc", "d\r\n", ""])
  assert config_lib.newline_token_ids(tokenizer) == [1, 2, 4]


def test_the_scheduler_is_built_as_the_section_says():
  model, params = models.init_model(models.DecoderConfig(
      vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
      intermediate_size=32), seed=0)
  config = sampler_config(num_slots=3, cache_length=20, prompt_buckets=(4, 8))
  config.update({"warmup": False, "steps_per_sync": 2, "max_queue": 5, "parked_rows": 0,
                 "update_policy": "swap_now", "max_stop_tokens": 2})
  validate_sampler_config(config)
  scheduler = config_lib.build_scheduler(config, model, params, seed=7)
  engine = scheduler.engine
  assert (engine.num_slots, engine.cache_length, engine.max_stop_tokens) == (3, 20, 2)
  assert scheduler.prompt_buckets == (4, 8) and scheduler.steps_per_sync == 2
  assert scheduler.max_queue == 5 and scheduler.update_policy == "swap_now"
  assert engine.compilations() == {}  # warmup off: nothing compiled yet
