"""KV reuse across turns (sampling/engine/prefix_cache.py, Engine.park / resume): a continuation
of a kept sample draws the same tokens with the same log-probs as re-prefilling the whole
conversation, prefills only the new tokens, never uses rows of other weights, and keeps
at most `parked_rows` rows."""

import dataclasses
import functools

import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import Scheduler

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
PROMPTS = [[5, 9, 11], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [3]]
OBSERVATIONS = [[40, 41], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54], [55]]


@functools.lru_cache(maxsize=None)
def engine_and_params(scan_layers: bool):
  """One engine per layout for the whole file (its schedulers run one after another): a
  new engine traces and compiles every program again."""
  model, init = models.init_model(dataclasses.replace(CONFIG, scan_layers=scan_layers), seed=0)
  return sampling.Engine(model, num_slots=2, cache_length=64), init


def scheduler(scan_layers=False, parked_rows=None, params=None):
  engine, init = engine_and_params(scan_layers)
  return Scheduler(engine, init if params is None else params,
                   prompt_buckets=(8, 16, 32, 56), steps_per_sync=4, parked_rows=parked_rows)


def conversation(sched, turns=3):
  """Three turns of three conversations: each turn continues the last with new tokens."""
  contexts, drawn = [list(p) for p in PROMPTS], []
  for turn in range(turns):
    params = [sampling.SamplingParams(max_new_tokens=5, seed=100 * turn + i, keep_cache=True,
                                      stop_token_ids=(2,)) for i in range(len(contexts))]
    out = sched.generate(contexts, params)
    drawn.append([(c.token_ids, c.model_logprobs) for (c,) in out])
    contexts = [ctx + list(c.token_ids) + obs for ctx, (c,), obs in
                zip(contexts, out, OBSERVATIONS)]
  return drawn


@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_continuation_draws_what_a_full_prefill_draws(scan_layers):
  kept, fresh = scheduler(scan_layers, parked_rows=3), scheduler(scan_layers, parked_rows=0)
  with_reuse, without = conversation(kept), conversation(fresh)
  for turn_a, turn_b in zip(with_reuse, without):
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(turn_a, turn_b):
      assert tokens_a == tokens_b
      np.testing.assert_allclose(logprobs_a, logprobs_b, atol=1e-5)
  assert fresh.metrics()["reused_tokens"] == 0
  reused, prefilled = kept.metrics()["reused_tokens"], kept.metrics()["prefilled_tokens"]
  # Turns 2 and 3 of every conversation prefill only the observation.
  assert prefilled == sum(map(len, PROMPTS)) + 2 * sum(map(len, OBSERVATIONS))
  assert reused + prefilled == fresh.metrics()["prefilled_tokens"]
  assert kept.engine.compilations().get("resume", 0) >= 1


def test_rows_of_other_weights_are_not_used_and_capacity_is_kept():
  sched = scheduler(parked_rows=2)
  params = [sampling.SamplingParams(max_new_tokens=3, seed=i, keep_cache=True)
            for i in range(3)]
  sched.generate(PROMPTS, params)
  assert len(sched.prefix_cache) == 2  # the oldest of three dropped
  _, other = models.init_model(CONFIG, seed=1)
  sched.update_params(other, version=1)
  first = sched.generate([PROMPTS[0]], sampling.SamplingParams(max_new_tokens=1, seed=0))
  assert len(sched.prefix_cache) == 0  # computed by version 0: dropped at the swap
  assert sched.metrics()["reused_tokens"] == 0
  assert first[0][0].weights_version == (1, 1)


def test_samples_with_the_same_tokens_each_keep_a_row_for_their_continuation():
  """The G episodes of a prompt often draw the same turn: each keeps its own row."""
  sched = scheduler(parked_rows=4)
  greedy = sampling.SamplingParams(temperature=0.0, max_new_tokens=4, keep_cache=True)
  first = sched.generate([PROMPTS[0]] * 3, greedy)
  assert len({tuple(c.token_ids) for (c,) in first}) == 1 and len(sched.prefix_cache) == 3
  continued = [PROMPTS[0] + list(c.token_ids) + [40 + i] for i, (c,) in enumerate(first)]
  sched.generate(continued, sampling.SamplingParams(max_new_tokens=2, seed=1))
  assert sched.metrics()["reused_tokens"] == 3 * (len(PROMPTS[0]) + 4)
  assert len(sched.prefix_cache) == 0


def test_without_keep_cache_nothing_is_parked():
  sched = scheduler()
  sched.generate(PROMPTS, sampling.SamplingParams(max_new_tokens=3, seed=0))
  assert len(sched.prefix_cache) == 0
  with pytest.raises(ValueError, match="keep_cache"):
    sampling.SamplingParams(keep_cache="yes")


def test_through_the_server_the_continuations_reuse_the_servers_caches():
  from rlhf_jax.sampling.serve import server as server_lib  # pylint: disable=import-outside-toplevel
  from rlhf_jax.sampling.remote.client import SamplerClient  # pylint: disable=import-outside-toplevel
  served = scheduler(parked_rows=3)
  server, port, service = server_lib.start_server(served, port=0, max_workers=4)
  client = SamplerClient(f"localhost:{port}", timeout_s=60)
  try:
    client.wait_ready()
    remote = conversation(client)
  finally:
    client.close()
    server.stop(grace=None)
    service.stop()
  local = conversation(scheduler(parked_rows=0))
  assert [[t for t, _ in turn] for turn in remote] == [[t for t, _ in turn] for turn in local]
  assert served.metrics()["reused_tokens"] > 0
