"""Host work off the critical path (Scheduler overlap_host): step k + 1 is dispatched
before step k's results are read, and everything the host decides from them (finishing,
admission, cancellation, stop tokens, keep_cache, weight swaps and version tags,
per-token callbacks) comes out as when every dispatch is read before the next."""

import collections

import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.scheduler import programs
from tests.sampling.tiny_engine import BUCKETS
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import NEWLINE
from tests.sampling.tiny_engine import PARAMS
from tests.sampling.tiny_engine import peaked_params
from tests.sampling.tiny_engine import prompts

NEW_PARAMS = peaked_params(seed=1)[1]


def scheduler(overlap, **kwargs):
  kwargs.setdefault("steps_per_sync", 4)
  return Scheduler(ENGINE, kwargs.pop("params", PARAMS), prompt_buckets=BUCKETS,
                   overlap_host=overlap, **kwargs)


def summary(completion):
  return (completion.request_id, completion.sample_index, completion.token_ids,
          completion.sampled_logprobs, completion.model_logprobs, completion.finish_reason,
          completion.weights_version, completion.token_versions,
          completion.candidate_logprobs)


def spy(monkeypatch):
  """Records "dispatch" / "read" events of every Scheduler."""
  events = []
  generate, read = ENGINE.generate_steps, programs.read
  monkeypatch.setattr(ENGINE, "generate_steps",
                      lambda *a: (events.append("dispatch"), generate(*a))[1])
  monkeypatch.setattr(programs, "read", lambda flight: (events.append("read"), read(flight))[1])
  return events


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_dispatch_goes_out_before_the_last_is_read(monkeypatch, overlap):
  events = spy(monkeypatch)
  sched = scheduler(overlap)
  sched.generate(prompts(2, seed=1), sampling.SamplingParams(max_new_tokens=12, seed=0,
                                                               stop_token_ids=()))
  # 12 tokens in dispatches of 4: three dispatches.
  if overlap:
    assert events == ["dispatch", "dispatch", "read", "dispatch", "read", "read"]
  else:
    assert events == ["dispatch", "read"] * 3


def varied(sched, log):
  """Two more samples than slots, stops, n > 1, FIRE, a candidate list, callbacks."""
  on_token = lambda *event: log.append(event)
  batch = prompts(5, seed=21)
  params = [sampling.SamplingParams(max_new_tokens=m, seed=s, n=n, temperature=t,
                                    stop_token_ids=stops)
            for m, s, n, t, stops in ((11, 0, 2, 1.0, ()), (3, 1, 1, 0.7, (12,)),
                                      (9, 2, 1, 1.0, (20, 30, NEWLINE)), (6, 4, 2, 0.0, ()),
                                      (13, 5, 1, 0.9, (40,)))]
  params[2] = params[2].replace(fire=sampling.FireSchedule(temperature=2.0))
  params[3] = params[3].replace(candidate_token_ids=(3, 9))
  for prompt, p in zip(batch, params):
    sched.submit(prompt, p, on_token=on_token)
  return sorted(summary(c) for c in sched.run())


def test_overlap_gives_the_same_completions_and_callbacks():
  logs = {True: [], False: []}
  got = {overlap: varied(scheduler(overlap), logs[overlap]) for overlap in (True, False)}
  assert got[True] == got[False]
  assert sum(len(c[2]) for c in got[True]) > 40
  by_sample = {overlap: collections.defaultdict(list) for overlap in logs}
  for overlap, log in logs.items():
    for request_id, index, *event in log:
      by_sample[overlap][request_id, index].append(event)
  assert by_sample[True] == by_sample[False]
  tokens = {(c[0], c[1]): [e[0] for e in by_sample[True][c[0], c[1]]] for c in got[True]}
  assert all(tokens[c[0], c[1]] == c[2] for c in got[True])  # every token called back


def stepped(overlap, policy, swap_after=2):
  """Samples 3 prompts (fewer than the slots) step by step, new weights handed over after
  `swap_after` steps, then a fourth prompt submitted."""
  sched = scheduler(overlap, update_policy=policy)
  params = sampling.SamplingParams(max_new_tokens=14, seed=3, stop_token_ids=())
  for prompt in prompts(3, seed=31):
    sched.submit(prompt, params)
  completions = []
  for _ in range(swap_after):
    completions += sched.step()
  sched.update_params(NEW_PARAMS, 1)
  sched.submit(prompts(1, seed=32)[0], params, request_id="late")
  completions += sched.run()
  return sorted(summary(c) for c in completions)


def test_swap_now_tags_each_token_with_the_same_version_as_without_overlap():
  got = stepped(True, "swap_now")
  assert got == stepped(False, "swap_now")
  early = [c for c in got if c[0] != "late"]
  assert all(c[6] == (0, 1) and 0 in c[7] and 1 in c[7] for c in early)  # swapped mid-way
  assert [c[6] for c in got if c[0] == "late"] == [(1, 1)]


def test_finish_old_lets_the_samples_in_flight_end_on_the_old_weights():
  got = stepped(True, "finish_old")
  assert got == stepped(False, "finish_old")
  assert [(c[6], set(c[7])) for c in got] == [((0, 0), {0})] * 3 + [((1, 1), {1})]


def test_a_cancel_while_a_dispatch_is_in_flight():
  params = sampling.SamplingParams(max_new_tokens=16, seed=5, stop_token_ids=())
  batch = prompts(6, seed=41)  # two more than the slots: they wait for the cancelled ones
  alone = scheduler(True)
  for prompt in batch:
    alone.submit(prompt, params)
  expected = {c.request_id: c.token_ids for c in alone.run()}  # ids "0".."5" again
  sched, called = scheduler(True), []
  ids = [sched.submit(p, params, on_token=lambda rid, *_: called.append(rid)) for p in batch]
  completions = sched.step() + sched.step()  # one dispatch read, one in flight
  seen = called.count(ids[0])
  sched.cancel(ids[0])
  completions += sched.run()
  done = {c.request_id: c for c in completions}
  assert done[ids[0]].finish_reason == "cancelled" and called.count(ids[0]) == seen
  assert done[ids[0]].token_ids == expected[ids[0]][:seen] and seen == 4
  for rid in ids[1:]:  # the waiting ones took the freed slots; their tokens are unchanged
    assert done[rid].finish_reason == "length" and done[rid].token_ids == expected[rid]


def test_keep_cache_continuations_match_without_overlap():
  first = sampling.SamplingParams(max_new_tokens=5, seed=6, keep_cache=True,
                                  stop_token_ids=(NEWLINE,))
  got = {}
  for overlap in (True, False):
    sched = scheduler(overlap)
    turns = sched.generate(prompts(3, seed=51), first)
    follow = [p + c[0].token_ids + [11, 12] for p, c in zip(prompts(3, seed=51), turns)]
    again = sched.generate(follow, first.replace(keep_cache=False))
    got[overlap] = [summary(c[0]) for c in turns + again]
    assert sched.metrics()["reused_tokens"] > 0
  assert got[True] == got[False]


@pytest.mark.parametrize("stop_early", [False, True])
def test_a_finished_row_rides_along_at_most_one_dispatch(monkeypatch, stop_early):
  """Finishing by length is foreseen (no extra dispatch); a stop token is seen one
  dispatch late."""
  prompt, params = prompts(1, seed=61), sampling.SamplingParams(max_new_tokens=8, seed=0,
                                                                  stop_token_ids=())
  if stop_early:  # its third token stops it, in the first of two dispatches
    third = scheduler(False).generate(prompt, params)[0][0].token_ids[2]
    params = params.replace(stop_token_ids=(third,))
  counts = {}
  for overlap in (True, False):
    events = spy(monkeypatch)
    (completion,), = scheduler(overlap).generate(prompt, params)
    assert completion.finish_reason == ("stop" if stop_early else "length")
    assert len(completion.token_ids) <= 3 if stop_early else len(completion.token_ids) == 8
    counts[overlap] = events.count("dispatch")
    monkeypatch.undo()
  assert counts == ({True: 2, False: 1} if stop_early else {True: 2, False: 2})
