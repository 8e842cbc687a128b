"""Partial rollouts end to end, AReaL's semantics (sampling/scheduler/swaps.py): at a weight swap the
samples in flight get their KV cache recomputed by the new weights, so every token they
draw after the swap is the new policy's (its sampler log-prob is the trainer's under the
new weights) and decoupled PPO treats it as fresh, the tokens before the swap as stale.
A sample that had not started when the weights changed starts from a new prefill."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.scheduler import swaps as swap

CONFIG = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=24)
MODEL, OLD = models.init_model(CONFIG, seed=0)
_, NEW = models.init_model(CONFIG, seed=1)
ENGINE = sampling.Engine(MODEL, num_slots=2, cache_length=16)
PROMPT = [3, 5, 7, 9]
NEW_TOKENS = 8
PARAMS = sampling.SamplingParams(max_new_tokens=NEW_TOKENS, seed=0, stop_token_ids=())


def as_batch(completions, prompt_length=8):
  batch = batch_lib.build_rollout_batch(
      [c.prompt_ids for c in completions], [c.token_ids for c in completions],
      [c.model_logprobs for c in completions], [1.0, -1.0] * (len(completions) // 2),
      [False] * len(completions), [0] * len(completions), prompt_length=prompt_length,
      response_length=NEW_TOKENS, pad_id=0,
      token_versions=[c.token_versions for c in completions])
  return batch_lib.as_device(batch)


# Jitted, as the trainer runs it: op by op, its first call compiled each op (8 s under load).
RESPONSE_LOGPROBS = jax.jit(lambda params, batch: batch_lib.response_logprobs(MODEL, params, batch))


def new_policy_logprobs(batch):
  """The trainer's log-probs of the batch under the new weights (π_prox)."""
  return np.asarray(RESPONSE_LOGPROBS(NEW, batch))


def test_tokens_after_a_mid_sample_swap_are_the_new_policys():
  sched = Scheduler(ENGINE, OLD, prompt_buckets=(8,), steps_per_sync=2,
                    update_policy="swap_now")
  partial = sched.submit(PROMPT, PARAMS)
  sched.step()
  sched.update_params(NEW, version=1)
  whole = sched.submit(PROMPT, PARAMS)
  done = {c.request_id: c for c in sched.run()}
  rows = [done[partial], done[whole]]
  # Tokens 0-2 drawn from the old weights' logits (the prefill's, then the first
  # dispatch's two forwards), the rest after the swap.
  assert rows[0].token_versions == [0] * 3 + [1] * 5
  assert rows[1].token_versions == [1] * NEW_TOKENS

  batch = as_batch(rows)
  trainer = new_policy_logprobs(batch)
  sampler = np.asarray(batch.sampler_logprobs)
  after, before = slice(3, NEW_TOKENS), slice(0, 3)
  # The cache was recomputed: the sampler's log-probs after the swap are the new policy's
  # (over the old weights' cache they were 0.002-0.04 apart at these weights).
  np.testing.assert_allclose(sampler[0, after], trainer[0, after], atol=2e-5)
  np.testing.assert_allclose(sampler[1], trainer[1], atol=2e-5)
  assert np.max(np.abs(sampler[0, before] - trainer[0, before])) > 1e-2  # the old policy's
  assert sched.metrics()["refilled_tokens"] == len(PROMPT) + 2

  a = ppo_config.algorithm_config()
  a.staleness.mode, a.staleness.cap = "tis", 5.0
  prepared, _, metrics = ppo_family.prepare(
      a, batch, old_logprobs=jnp.asarray(trainer), ref_logprobs=None, values=None,
      kl_coef=jnp.float32(0.0), correction="none", group_size=2, version=1)
  old_logprobs, weights = np.asarray(prepared.old_logprobs), np.asarray(prepared.is_weights)
  # Before the swap: stale (π_old = π_prox, w = min(π_prox / π_behav, cap)).
  np.testing.assert_allclose(old_logprobs[0, before], trainer[0, before], rtol=1e-6)
  np.testing.assert_allclose(weights[0, before], np.minimum(
      np.exp(trainer[0, before] - sampler[0, before]), 5.0), rtol=1e-5)
  # After it, and the row drawn wholly by the new weights: fresh, plain PPO.
  np.testing.assert_array_equal(old_logprobs[0, after], sampler[0, after])
  np.testing.assert_array_equal(weights[0, after], 1.0)
  np.testing.assert_array_equal(old_logprobs[1], sampler[1])
  np.testing.assert_array_equal(weights[1], 1.0)
  np.testing.assert_allclose(metrics["staleness/stale_token_fraction"], 3 / 16)


def test_a_sample_not_started_at_a_swap_is_prefilled_by_the_new_weights():
  """n = 3 samples in 2 slots: the third waits (its request's prefill kept for it) while
  the weights change; it starts from a new prefill, so its first token too is the new
  policy's."""
  sched = Scheduler(ENGINE, OLD, prompt_buckets=(8,), steps_per_sync=2,
                    update_policy="finish_old")
  request = sched.submit(PROMPT, PARAMS.replace(n=3))
  sched.step()
  sched.update_params(NEW, version=1)
  done = {c.sample_index: c for c in sched.run() if c.request_id == request}
  assert done[0].token_versions == [0] * NEW_TOKENS
  assert done[2].token_versions == [1] * NEW_TOKENS
  batch = as_batch([done[2], done[2]])
  np.testing.assert_allclose(np.asarray(batch.sampler_logprobs)[0],
                             new_policy_logprobs(batch)[0], atol=2e-5)


WIDE = sampling.Engine(MODEL, num_slots=8, cache_length=32)  # refill lengths 8, 16, 32


def test_the_refill_plan_keeps_a_chunk_within_a_normal_prefill():
  """rows × length² ≤ max_prefill_batch × longest bucket², rows a power of two in
  [1, min(max_prefill_batch, slots)]; lengths powers of two from 8, and the cache length."""
  engine = sampling.Engine(MODEL, num_slots=8, cache_length=100)
  assert swap.refill_plan(engine, 4, 16) == {8: 4, 16: 4, 32: 1, 64: 1, 100: 1}
  assert swap.refill_plan(engine, 16, 16) == {8: 8, 16: 8, 32: 4, 64: 1, 100: 1}
  assert swap.refill_plan(ENGINE, 8, 8) == {8: 2, 16: 2}  # 2 slots


@pytest.mark.slow
def test_a_refill_of_more_samples_than_the_prefill_batch_runs_in_chunks(monkeypatch):
  """8 samples in flight, max_prefill_batch 2: the refill prefills at most 2 rows at a
  time, grouped by padded length (a normal prefill's transient memory, not a second
  cache's), and every row's tokens after the swap are still the new policy's."""
  calls = []
  prefill = WIDE.prefill
  monkeypatch.setattr(WIDE, "prefill", lambda params, tokens, lengths: (
      calls.append(np.shape(tokens)), prefill(params, tokens, lengths))[1])
  sched = Scheduler(WIDE, OLD, prompt_buckets=(8,), steps_per_sync=2,
                    update_policy="swap_now", max_prefill_batch=2)
  prompts = [list(range(3, 4 + n)) for n in range(8)]  # 1-8 tokens
  ids = [sched.submit(p, PARAMS) for p in prompts]
  sched.step()
  sched.update_params(NEW, version=1)
  done = {c.request_id: c for c in sched.run()}
  rows = [done[i] for i in ids]
  # Prompt + 2 read tokens: 3-8 tokens (6 rows: 3 chunks of 2 × 8 positions), 9-10 (2 rows
  # of 16 positions, one at a time: 2 × 16² exceeds a normal prefill's 2 × 8²).
  assert calls == [(2, 8)] * 3 + [(1, 16)] * 2
  assert sched.metrics()["refilled_tokens"] == sum(len(p) + 2 for p in prompts)
  assert all(r.token_versions == [0] * 3 + [1] * 5 for r in rows)
  batch = as_batch(rows)
  after = slice(3, NEW_TOKENS)
  np.testing.assert_allclose(np.asarray(batch.sampler_logprobs)[:, after],
                             new_policy_logprobs(batch)[:, after], atol=2e-5)


@pytest.mark.slow
def test_a_row_recomputed_at_a_swap_is_kept_as_the_new_weights():
  """A keep_cache sample swapped mid-sample: its cache row is wholly the new weights'
  (recomputed, then decoded by them), so it is parked as theirs, not as mixed, and its
  continuation under the new weights prefills only the new tokens."""
  sched = Scheduler(WIDE, OLD, prompt_buckets=(8, 16), steps_per_sync=2,
                    update_policy="swap_now")
  first = sched.submit(PROMPT, PARAMS.replace(keep_cache=True))
  sched.step()
  sched.update_params(NEW, version=1)
  (turn,) = sched.run()
  assert turn.token_versions == [0] * 3 + [1] * 5
  held = PROMPT + turn.token_ids
  second = sched.submit(held + [11], PARAMS)
  (continued,) = sched.run()
  assert (turn.request_id, continued.request_id) == (first, second)
  assert sched.metrics()["reused_tokens"] == len(held)
  assert continued.token_versions == [1] * NEW_TOKENS
  batch = as_batch([continued, continued], prompt_length=16)
  np.testing.assert_allclose(np.asarray(batch.sampler_logprobs)[0],
                             new_policy_logprobs(batch)[0], atol=2e-5)
