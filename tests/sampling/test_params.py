"""SamplingParams and FireSchedule: every refusal names its field, the engine-dependent
checks, and the per-prompt seeds of one seeded call."""

from __future__ import annotations

import math
import re

import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.params import MAX_TOKEN_LIST
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.params import prompt_seed


def test_bad_requests_name_the_field():
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingParams(temperature=-1)
  with pytest.raises(ValueError, match="fire.top_k"):
    sampling.FireSchedule(top_k=-2)


@pytest.mark.parametrize("fields, message", [
    ({"temperature": math.nan}, "temperature is NaN"),
    ({"temperature": math.inf}, "temperature=inf must be finite"),
    ({"temperature": "hot"}, "temperature='hot' must be a number"),
    ({"top_k": 2.5}, "top_k=2.5 must be an integer"),
    ({"top_k": True}, "top_k=True must be an integer"),
    ({"top_p": 1.01}, "top_p=1.01 must be <= 1.0"),
    ({"min_p": 1.0}, "min_p=1.0 must be < 1.0"),
    ({"min_p": -0.1}, "min_p=-0.1 must be >= 0.0"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 must be >= 1"),
    ({"n": 0}, "n=0 must be >= 1"),
    ({"seed": -1}, "seed=-1 must be >= 0"),
    ({"seed": 2**32}, f"seed={2**32} must be <= {2**32 - 1}"),
    ({"stop_token_ids": "12"}, "stop_token_ids='12' must be a sequence"),
    ({"stop_token_ids": (3, -1)}, "stop_token_ids=(3, -1) must be a sequence"),
    ({"stop_token_ids": tuple(range(MAX_TOKEN_LIST + 1))},
     f"stop_token_ids has {MAX_TOKEN_LIST + 1} ids; at most {MAX_TOKEN_LIST}"),
    ({"candidate_token_ids": (1, False)}, "candidate_token_ids=(1, False) must be"),
    ({"keep_cache": 1}, "keep_cache=1 must be a bool"),
    ({"fire": {"temperature": 30.0}}, "fire={'temperature': 30.0} must be a FireSchedule"),
])
def test_each_refusal_names_its_field_and_value(fields, message):
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    sampling.SamplingParams(**fields)


@pytest.mark.parametrize("fields, message", [
    ({"temperature": 0.0}, "fire.temperature=0.0 must be > 0.0"),
    ({"top_k": 1.0}, "fire.top_k=1.0 must be an integer"),
    ({"every_line": "yes"}, "fire.every_line='yes' must be a bool"),
])
def test_fire_refusals_name_the_fire_field(fields, message):
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    sampling.FireSchedule(**fields)


def test_token_lists_become_int_tuples_and_replace_checks_again():
  params = sampling.SamplingParams(stop_token_ids=[2, 5], candidate_token_ids=[7])
  assert params.stop_token_ids == (2, 5) and params.candidate_token_ids == (7,)
  assert params.replace(n=3).n == 3 and params.replace(n=3).stop_token_ids == (2, 5)
  with pytest.raises(ValueError, match="^n=0 must be >= 1"):
    params.replace(n=0)


@pytest.mark.parametrize("fields, message", [
    ({"stop_token_ids": (3, 64)}, "stop_token_ids contains 64, outside the vocabulary "
     "(size 64)"),
    ({"candidate_token_ids": (70,)}, "candidate_token_ids contains 70, outside"),
    ({"stop_token_ids": (1, 2, 3)}, "stop_token_ids has 3 ids; this engine takes at most 2"),
    ({"top_k": 65}, "top_k=65 exceeds the vocabulary size 64"),
    ({"fire": sampling.FireSchedule(top_k=65)}, "fire.top_k=65 exceeds the vocabulary"),
])
def test_the_engines_limits_are_checked_naming_the_field(fields, message):
  params = sampling.SamplingParams(**fields)
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    params.check_against(vocab_size=64, max_stop_tokens=2)
  sampling.SamplingParams(stop_token_ids=(63, 0), top_k=64).check_against(
      vocab_size=64, max_stop_tokens=2)  # the edges fit


def test_prompt_seeds_keep_the_first_and_differ_for_the_others():
  seeds = [prompt_seed(5, k) for k in range(200)]
  assert seeds[0] == 5  # a one-prompt call samples as `submit` does
  assert len(set(seeds)) == 200 and all(0 <= s < 2**31 for s in seeds)
  assert seeds == [prompt_seed(5, k) for k in range(200)]  # a function of (seed, k) only
  assert [prompt_seed(6, k) for k in range(1, 200)] != seeds[1:]


def test_per_prompt_gives_each_prompt_its_params():
  seeded = sampling.SamplingParams(seed=5, top_k=3)
  out = per_prompt([[1], [2], [3]], seeded)
  assert [p.seed for p in out] == [prompt_seed(5, k) for k in range(3)]
  assert all(p.replace(seed=5) == seeded for p in out)
  unseeded = sampling.SamplingParams()
  assert per_prompt([[1], [2]], unseeded) == [unseeded, unseeded]
  given = [sampling.SamplingParams(n=2), sampling.SamplingParams(n=3)]
  assert per_prompt([[1], [2]], given) == given
  with pytest.raises(ValueError, match="got 2 SamplingParams for 3 prompts"):
    per_prompt([[1], [2], [3]], given)
