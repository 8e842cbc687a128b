"""SamplerService, the loop behind the server, without gRPC: a request's events (its tokens,
then its finished samples), the per-request limits, and a failing step that fails only
the requests then running."""

from __future__ import annotations

import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.serve.loop import MAX_REQUEST_ID
from rlhf_jax.sampling.serve.loop import TEXT_PER_POSITION
from rlhf_jax.sampling.serve.loop import RequestTooLarge
from rlhf_jax.sampling.serve.loop import SamplerService
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import prompts
from tests.sampling.tiny_engine import scheduler

PROMPT = prompts(1, seed=3)[0]
WAIT_S = 60  # an event's longest wait: a bound for a broken test, not a race


def events_until_done(events, samples):
  """A request's events up to its `samples` finished samples (or a "failed" event)."""
  out, done = [], 0
  while done < samples:
    event = events.get(timeout=WAIT_S)
    out.append(event)
    if event[0] == "failed":
      break
    done += event[0] == "done"
  return out


@pytest.fixture()
def service():
  """A running SamplerService over the tiny engine that takes at most 3 samples a request."""
  running = SamplerService(scheduler(steps_per_sync=2), max_samples_per_request=3)
  running.start()
  yield running
  running.stop()


def test_a_requests_events_are_its_tokens_then_its_samples(service):
  params = sampling.SamplingParams(n=2, max_new_tokens=6, seed=4)
  request_id, events = service.submit(PROMPT, params, request_id="mine")
  got = events_until_done(events, 2)
  assert request_id == "mine"
  done = {e[1].sample_index: e[1] for e in got if e[0] == "done"}
  alone = scheduler().generate([PROMPT], params)[0]
  assert [done[i].token_ids for i in (0, 1)] == [c.token_ids for c in alone]
  for index in (0, 1):
    tokens = [e for e in got if e[0] == "token" and e[1] == index]
    assert [e[2] for e in tokens] == done[index].token_ids
    assert [e[3] for e in tokens] == done[index].sampled_logprobs
    assert [e[4] for e in tokens] == done[index].model_logprobs
    last_token = max(i for i, e in enumerate(got) if e[0] == "token" and e[1] == index)
    assert got.index(("done", done[index])) > last_token
  service.release("mine")
  assert service.submit(PROMPT, params.replace(n=1), request_id="mine")[0] == "mine"


def test_requests_beyond_the_limits_are_refused_naming_the_field():
  service = SamplerService(scheduler(), max_samples_per_request=3)  # its loop never runs
  short = sampling.SamplingParams(max_new_tokens=4)
  with pytest.raises(RequestTooLarge, match=r"^sampling\.n=4: this server takes at most 3 "
                     r"samples per request \(server\.max_samples_per_request\)"):
    service.submit(PROMPT, short.replace(n=4))
  with pytest.raises(RequestTooLarge, match=f"^request_id has {MAX_REQUEST_ID + 1} "
                     f"characters; at most {MAX_REQUEST_ID}"):
    service.submit(PROMPT, short, request_id="x" * (MAX_REQUEST_ID + 1))
  service.submit(PROMPT, short, request_id="taken")
  with pytest.raises(ValueError, match="^request_id='taken' is already in use"):
    service.submit(PROMPT, short, request_id="taken")
  with pytest.raises(ValueError, match="prompt_ids"):  # the scheduler's refusal
    service.submit([], short, request_id="empty")
  service.submit(PROMPT, short, request_id="empty")  # the id is free again
  generated, _ = service.submit(PROMPT, short)
  assert len(generated) == 32  # a fresh id when none is given


def test_text_prompts_need_a_tokenizer_and_fit_the_cache():
  with pytest.raises(ValueError, match="^prompt_text needs a server tokenizer"):
    SamplerService(scheduler()).tokenize("hello")

  class Characters:
    def encode(self, text):
      return [ord(c) % 64 for c in text]

    def decode(self, ids):
      return "".join(chr(97 + i % 26) for i in ids)

  service = SamplerService(scheduler(), Characters())
  assert service.tokenize("ab") == [33, 34] and service.detokenize([0, 1]) == "ab"
  longest = TEXT_PER_POSITION * ENGINE.cache_length
  assert len(service.tokenize("a" * longest)) == longest
  with pytest.raises(RequestTooLarge, match=f"^prompt_text has {longest + 1} characters"):
    service.tokenize("a" * (longest + 1))
  assert SamplerService(scheduler()).detokenize([1, 2]) == ""


def test_a_failing_step_fails_the_running_requests_and_the_loop_goes_on(service,
                                                                        monkeypatch):
  original = ENGINE.generate_steps
  calls = []

  def fail_once(*args):
    calls.append(len(calls))
    if len(calls) == 1:
      raise RuntimeError("injected device failure")
    return original(*args)

  monkeypatch.setattr(ENGINE, "generate_steps", fail_once)
  params = sampling.SamplingParams(max_new_tokens=4, seed=1)
  _, events = service.submit(PROMPT, params, request_id="first")
  message = "sampler step failed: RuntimeError('injected device failure')"
  got = [events.get(timeout=WAIT_S)]
  while got[-1][0] != "failed":
    got.append(events.get(timeout=WAIT_S))
  assert got[-1] == ("failed", message)
  (failed,) = [e[1] for e in got if e[0] == "done"]  # the running sample ends in error
  assert (failed.finish_reason, failed.error) == ("error", message)
  service.release("first")
  _, events = service.submit(PROMPT, params, request_id="second")
  (done,) = [e[1] for e in events_until_done(events, 1) if e[0] == "done"]
  assert done.token_ids == scheduler().generate([PROMPT], params)[0][0].token_ids
  metrics = service.metrics()
  assert metrics["step_failures"] == 1.0 and metrics["requests_rejected"] == 0.0
  assert "slots_busy" in metrics  # the scheduler's figures beside the server's counters
