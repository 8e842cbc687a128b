"""The Scheduler over the tiny engine: continuous batching, seeds, cancellation, failing
requests, weight-update policies and the requests it refuses."""

from __future__ import annotations

import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import VOCAB
from tests.sampling.tiny_engine import peaked_params
from tests.sampling.tiny_engine import prompts
from tests.sampling.tiny_engine import scheduler


def test_continuous_batching_gives_each_request_its_solo_tokens():
  batch = prompts(7, seed=3)
  params = [sampling.SamplingParams(max_new_tokens=3 + 4 * i, seed=10 + i, n=1 + i % 3,
                                    stop_token_ids=(1, 2), top_k=(i % 2) * 10,
                                    top_p=0.9 if i == 3 else 1.0)
            for i in range(len(batch))]
  together = scheduler().generate(batch, params)
  for prompt, param, samples in zip(batch, params, together):
    alone = scheduler().generate([prompt], param)[0]
    assert [c.token_ids for c in samples] == [c.token_ids for c in alone]
    for sample in samples:
      assert len(sample.token_ids) <= param.max_new_tokens
      if sample.finish_reason == "stop":
        assert sample.token_ids[-1] in (1, 2)
        assert not set(sample.token_ids[:-1]) & {1, 2}
      else:
        assert len(sample.token_ids) == param.max_new_tokens


def test_seed_reproduces_and_a_drawn_seed_is_reported():
  prompt = prompts(1, seed=5)
  params = sampling.SamplingParams(max_new_tokens=8)
  first = scheduler(seed=1).generate(prompt, params)[0][0]
  again = scheduler(seed=2).generate(prompt, params.replace(seed=first.seed))[0][0]
  assert first.token_ids == again.token_ids


def test_cancel_frees_the_slot_and_reports_cancelled():
  sched = scheduler(steps_per_sync=2)
  long_id = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=25, seed=0))
  completions = sched.step()
  sched.cancel(long_id)
  completions += sched.run()
  (cancelled,) = [c for c in completions if c.request_id == long_id]
  assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) < 25
  assert sched.metrics()["slots_busy"] == 0 and not sched.has_work()


def test_a_failing_token_callback_ends_only_its_request():
  sched = scheduler()
  def explode(*args):
    raise RuntimeError("consumer gone")
  bad = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=5, seed=0),
                     on_token=explode)
  good = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=5, seed=0))
  by_id = {c.request_id: c for c in sched.run()}
  assert by_id[bad].finish_reason == "error" and "consumer gone" in by_id[bad].error
  assert by_id[good].finish_reason == "length"


def test_a_request_that_fails_starts_none_of_its_waiting_samples():
  sched = scheduler()
  def explode(*args):
    raise RuntimeError("consumer gone")
  sched.submit(prompts(1)[0], sampling.SamplingParams(n=ENGINE.num_slots + 3,
                                                      max_new_tokens=5, seed=0),
               on_token=explode)
  out = sorted(sched.run(), key=lambda c: c.sample_index)
  assert out[0].finish_reason == "error"
  never_started = out[ENGINE.num_slots:]  # queued behind the slots when it failed
  assert [(c.finish_reason, c.token_ids) for c in never_started] == [("cancelled", [])] * 3
  assert not sched.has_work()


@pytest.mark.parametrize("policy", ["finish_old", "swap_now"])
def test_weight_update_policies(policy):
  _, other = peaked_params(seed=1)
  sched = scheduler(update_policy=policy, steps_per_sync=2)
  first = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=12, seed=0,
                                                              temperature=0))
  sched.step()
  sched.update_params(other, version=1)
  second = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=4, seed=0,
                                                               temperature=0))
  by_id = {c.request_id: c for c in sched.run()}
  assert by_id[second].weights_version == (1, 1)
  assert by_id[second].token_versions == [1] * 4
  if policy == "finish_old":
    assert by_id[first].weights_version == (0, 0)
    assert by_id[first].token_versions == [0] * 12
    assert by_id[first].token_ids == scheduler().generate(
        prompts(1), sampling.SamplingParams(max_new_tokens=12, temperature=0))[0][0].token_ids
  else:
    assert by_id[first].weights_version == (0, 1)
    # Each token is drawn from the logits of the forward before it: the prefill's and
    # the first dispatch's two forwards (version 0) drew tokens 0-2, the forwards after
    # the swap (version 1) the rest (partial rollouts, token by token).
    assert by_id[first].token_versions == [0] * 3 + [1] * 9


def test_bad_requests_name_the_field():
  """Refused at submit, before anything runs: what the engine cannot take (the
  SamplingParams' own checks: tests/sampling/test_params.py)."""
  sched = scheduler(max_queue=1)
  with pytest.raises(ValueError, match="stop_token_ids"):
    sched.submit([3], sampling.SamplingParams(max_new_tokens=2, stop_token_ids=(VOCAB,)))
  with pytest.raises(ValueError, match="max_new_tokens"):
    sched.submit([3] * 10, sampling.SamplingParams(max_new_tokens=35))
  with pytest.raises(ValueError, match="prompt_ids"):
    sched.submit([], sampling.SamplingParams(max_new_tokens=2))
  with pytest.raises(ValueError, match="prompt bucket"):
    sched.submit([3] * 17, sampling.SamplingParams(max_new_tokens=2))
  sched.submit([3], sampling.SamplingParams(max_new_tokens=2))
  with pytest.raises(QueueFull):
    sched.submit([3], sampling.SamplingParams(max_new_tokens=2))


def test_prompts_of_one_seeded_call_draw_independent_numbers():
  """One SamplingParams with a seed for many prompts: prompt k samples with
  prompt_seed(seed, k), so equal prompts get different samples (before, sample i of every
  prompt drew the same uniforms and their outcomes were correlated across the batch)."""
  prompt = prompts(1, seed=4)[0]
  params = sampling.SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
  out = scheduler().generate([prompt] * 6, params)
  assert len({tuple(c.token_ids) for (c,) in out}) >= 5  # one seed for all: 1
  assert [c.seed for (c,) in out] == [sampling.prompt_seed(5, k) for k in range(6)]
  assert out[0][0].token_ids == scheduler().generate([prompt], params)[0][0].token_ids
