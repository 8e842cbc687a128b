"""The scheduler's per-request and per-sample records: which version drew each token, the
completion a sample ends as, the cancelled samples taken out of the queue, and the
candidates' log-probs against a float64 log-softmax."""

from __future__ import annotations

import collections

import numpy as np

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.scheduler import requests


def request(request_id="r", waiting=(0, 1, 2), **fields):
  """A RequestState whose samples `waiting` wait for a slot."""
  return requests.RequestState(
      request_id=request_id, prompt_ids=[5, 6], sampling=SamplingParams(), seed=9, bucket=8,
      on_token=None, waiting=collections.deque(waiting), outstanding=len(waiting), **fields)


def test_each_token_carries_the_version_of_the_forward_before_it():
  """Token 0 comes from the prefill's logits (version 1); a dispatch that ran version 2
  draws its first token from version 1's logits and the rest from its own."""
  sample = requests.SampleState(request(), index=0, version=1)
  sample.add(11, -0.5, -0.25, version=1)
  sample.add(12, -0.75, -0.5, version=2)  # the swap: this token is still version 1's
  sample.add(13, -1.0, -0.75, version=2)
  assert sample.versions == [1, 1, 2] and sample.logits_version == 2
  assert (sample.tokens, sample.sampled, sample.model) == (
      [11, 12, 13], [-0.5, -0.75, -1.0], [-0.25, -0.5, -0.75])


def test_a_completion_is_the_samples_tokens_and_routes():
  state = request(candidate_logprobs=[-1.5])
  sample = requests.SampleState(state, index=2, version=0)
  for token in (3, 4):
    sample.add(token, -0.5, -0.25, version=1, routes=np.full((2, 1), token, np.int32))
  done = requests.completion_of(sample, "stop", last_version=1)
  assert (done.request_id, done.sample_index, done.prompt_ids, done.token_ids) == (
      "r", 2, [5, 6], [3, 4])
  assert (done.finish_reason, done.seed, done.weights_version, done.token_versions) == (
      "stop", 9, (0, 1), [0, 1])
  assert done.candidate_logprobs == [-1.5] and done.error == ""
  np.testing.assert_array_equal(done.routes, [[[3], [3]], [[4], [4]]])
  plain = requests.SampleState(state, index=0, version=0)
  failed = requests.completion_of(plain, "error", last_version=0, error="consumer gone")
  assert failed.routes is None and (failed.finish_reason, failed.error) == (
      "error", "consumer gone")


def test_a_sample_cancelled_before_its_slot_ends_without_tokens():
  done = requests.cancelled_before_start(request(candidate_logprobs=[-0.5]), 1, version=4)
  assert (done.sample_index, done.token_ids, done.finish_reason, done.weights_version,
          done.seed, done.candidate_logprobs) == (1, [], "cancelled", (4, 4), 9, [-0.5])


def test_cancelled_samples_leave_the_queue_once_and_are_counted_out():
  whole = request("whole", cancelled=True)
  some = request("some", waiting=(0, 1, 2, 3), cancelled_samples={1, 3, 7})
  untouched = request("untouched")
  dropped = requests.drop_cancelled_waiting([whole, some, untouched, some])
  assert [(r.request_id, indices) for r, indices in dropped] == [
      ("whole", [0, 1, 2]), ("some", [1, 3])]
  assert list(whole.waiting) == [] and whole.outstanding == 0
  assert list(some.waiting) == [0, 2] and some.outstanding == 2
  assert list(untouched.waiting) == [0, 1, 2] and untouched.outstanding == 3
  assert requests.drop_cancelled_waiting([some]) == []  # nothing left to drop


def test_in_flight_counts_tokens_ahead_only_for_the_sample_dispatched():
  state = request()
  first, second = (requests.SampleState(state, i, 0) for i in (0, 1))
  flight = requests.InFlight(results=None, samples={0: first}, steps=4, version=0)
  assert flight.ahead(0, first) == 4
  assert flight.ahead(0, second) == 0  # slot 0 now holds another sample
  assert flight.ahead(1, second) == 0


def test_candidate_logprobs_are_the_float64_log_softmax():
  logits = np.asarray([2.0, -1.0, 0.5, 300.0], np.float32)
  got = requests.candidate_logprobs(logits, [0, 3, 2])
  # log softmax by hand: log(e^x_t / sum_v e^x_v), shifted by the largest logit.
  shifted = [float(x) - 300.0 for x in logits]
  logz = np.log(sum(np.exp(x) for x in shifted))
  np.testing.assert_allclose(got, [shifted[0] - logz, shifted[3] - logz, shifted[2] - logz],
                             rtol=1e-12)
  assert requests.candidate_logprobs(logits, []) == []
