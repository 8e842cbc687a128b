"""The sampler's KV cache and prompt buckets fitted to the run (training/config.py's
fit_sampler_sizes): derived from data.prompt_length and the response budget when left at
0 / (), and explicit sizes that are too small refused in one line that gives every size
that fits at once, so that taking its advice passes (no second error)."""

import re

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset
from tests.training.runs import shrink


def multi_turn():
  """A shrunken GRPO run of multi-turn episodes (tests/envs' environment)."""
  config = shrink(preset("grpo"))
  config.rollout.mode, config.env.factory = "multi_turn", "tests.envs.environments:Recheck"
  config.rollout.max_new_tokens, config.env.max_tokens = 64, 96
  config.sampler.prompt_buckets = (64, 159)
  config.env.workers = 1
  return config


def hf_grpo(directory, **fields):
  config = preset("grpo", "hf")
  data = directory / "data.jsonl"
  data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
  config.model.checkpoint, config.data.train_file = str(directory), str(data)
  config.update_from_flattened_dict(fields)
  return config


def test_the_hf_defaults_derive_prompt_plus_response(tmp_path):
  config = hf_grpo(tmp_path)
  assert (config.sampler.cache_length, tuple(config.sampler.prompt_buckets)) == (0, ())
  validate_config(config, num_devices=1)
  assert config.sampler.cache_length == 512 + 1024
  assert tuple(config.sampler.prompt_buckets) == (512,)
  shorter = hf_grpo(tmp_path, **{"data.prompt_length": 96, "rollout.max_new_tokens": 16})
  validate_config(shorter, num_devices=1)
  assert (shorter.sampler.cache_length, tuple(shorter.sampler.prompt_buckets)) == (112, (96,))


def test_multi_turn_sizes_derive_from_the_episode_budget():
  config = multi_turn()
  config.sampler.cache_length, config.sampler.prompt_buckets = 0, ()
  validate_config(config)
  p, budget = config.data.prompt_length, config.env.max_tokens
  # a row: prompt + the episode's budget; a later turn's prompt: the conversation so far
  assert config.sampler.cache_length == p + budget
  assert tuple(config.sampler.prompt_buckets) == (p, p + budget - 1)


def test_windows_buckets_reach_a_continued_response():
  config = preset("tppo")
  config.sampler.cache_length, config.sampler.prompt_buckets = 0, ()
  validate_config(config, num_devices=1)
  p, m = config.data.prompt_length, config.rollout.max_new_tokens
  w = config.rollout.windows.window_tokens
  longest = p + max(k * w for k in range(m // w + 1) if k * w < m)  # whole windows below m
  assert max(config.sampler.prompt_buckets) == longest
  assert config.sampler.cache_length == p + m


def test_sizes_too_small_are_one_line_whose_advice_passes():
  config = multi_turn()
  config.data.prompt_length = 100  # both explicit sizes are now too small
  with pytest.raises(ConfigError) as caught:
    validate_config(config)
  message = str(caught.value)
  assert "\n" not in message and message.startswith("config.sampler.cache_length: invalid")
  row = 100 + config.env.max_tokens
  assert f"must be >= {row}" in message and f"must reach {row - 1}" in message
  advice = dict(re.findall(r"--config\.(sampler\.\w+)=(\S+)", message))
  assert int(advice["sampler.cache_length"]) == row
  config.sampler.cache_length = int(advice["sampler.cache_length"])
  config.sampler.prompt_buckets = tuple(int(b) for b in advice["sampler.prompt_buckets"].split(","))
  validate_config(config)  # the advice fits: no further error
  assert max(config.sampler.prompt_buckets) == row - 1


def test_a_sampler_server_config_has_no_sizes_to_derive():
  from rlhf_jax.sampling.config import sampler_config, validate_sampler_config
  config = sampler_config(cache_length=0)
  with pytest.raises(ConfigError, match=r"config\.sampler\.cache_length: invalid value 0: "
                     "must be an int >= 1$"):
    validate_sampler_config(config)
