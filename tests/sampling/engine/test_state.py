"""sampling/engine/state.py: a request's SamplingParams as one slot's arrays
(`SlotSampling.of`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax.sampling.engine.state import SlotSampling
from rlhf_jax.sampling.params import FireSchedule
from rlhf_jax.sampling.params import SamplingParams


def test_the_fields_and_stop_tokens_padded_with_minus_one():
  params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, max_new_tokens=11,
                          stop_token_ids=(2, 9), keep_cache=True, seed=4)
  slot = SlotSampling.of(params, 3, seed=None, max_stop_tokens=4)
  np.testing.assert_array_equal(slot.stop_token_ids, [2, 9, -1, -1])
  assert (float(slot.temperature), int(slot.top_k), int(slot.max_new_tokens)) == (
      pytest.approx(0.7), 5, 11)
  assert bool(slot.keep_cache) and not bool(slot.fire)
  # sample 3's stream: the request seed's key folded with its index
  want = jax.random.key_data(jax.random.fold_in(jax.random.key(4), 3))
  np.testing.assert_array_equal(slot.key, want)


def test_a_seed_given_overrides_the_params_and_none_at_all_is_refused():
  a = SlotSampling.of(SamplingParams(seed=1), 0, seed=7, max_stop_tokens=2)
  b = SlotSampling.of(SamplingParams(seed=7), 0, seed=None, max_stop_tokens=2)
  np.testing.assert_array_equal(a.key, b.key)
  with pytest.raises(ValueError, match="seed is None"):
    SlotSampling.of(SamplingParams(), 0, seed=None, max_stop_tokens=2)


def test_fire_fields():
  fire = FireSchedule(temperature=3.0, top_k=8, every_line=True)
  slot = SlotSampling.of(SamplingParams(fire=fire), 0, seed=0, max_stop_tokens=1)
  assert bool(slot.fire) and bool(slot.fire_every_line)
  assert (float(slot.fire_temperature), int(slot.fire_top_k)) == (3.0, 8)
