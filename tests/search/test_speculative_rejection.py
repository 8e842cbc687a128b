"""Per-sample cancellation in the scheduler, and speculative rejection: at each decision
point τ every live sample of a prompt is scored on exactly its first τ tokens, exactly the
bottom α of them (by those partial scores) are cancelled, they generate nothing more, and
the best finished response is returned."""

import collections
import functools
import hashlib
import math

import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.data import Example
from rlhf_jax.rewards import Scores
from rlhf_jax.search.speculative_rejection import SpeculativeRejection
from rlhf_jax.search.speculative_rejection import bottom_fraction
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from tests.sampling.tiny_engine import BUCKETS
from tests.sampling.tiny_engine import CONFIG
from tests.sampling.tiny_engine import prompts

MODEL, PARAMS = models.init_model(CONFIG, seed=2)  # near-uniform: samples differ


@functools.cache
def engine(slots: int) -> sampling.Engine:
  """One engine per slot count under every test's new Scheduler: its programs compile once."""
  return sampling.Engine(MODEL, num_slots=slots, cache_length=40)


class Tokens:
  """Decodes ids as space-separated numbers (the scorer hashes them)."""
  eos_id = -1

  def decode(self, ids):
    return " ".join(map(str, ids))

  def truncate_at_eos(self, ids):
    return list(ids)


def hashed(text):
  return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


class HashScorer:
  """A deterministic score of any (partial) response; records every call, and if given a
  RecordingScheduler, how many tokens each sample had emitted at that call."""

  def __init__(self, sched=None):
    self.calls, self.examples, self.emitted_at_call = [], [], []
    self._sched = sched

  def score(self, examples, responses):
    self.calls.append(list(responses))
    self.examples.append(list(examples))
    if self._sched is not None:
      self.emitted_at_call.append({k: len(v) for k, v in self._sched.emitted.items()})
    values = [hashed(r) for r in responses]
    return Scores(scores=values, correct=[False] * len(values), failures=[""] * len(values))


class RecordingScheduler(Scheduler):
  """A scheduler that also records every token each sample emits, keyed by
  (prompt = submission order, sample index): the sequence it finishes or is cancelled with."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.emitted = collections.defaultdict(list)
    self._prompt_of = {}

  def submit(self, prompt_ids, sampling_params, *, request_id=None, on_token=None):
    def record(request_id, index, token, *rest):
      self.emitted[(self._prompt_of[request_id], index)].append(token)
      on_token(request_id, index, token, *rest)
    request_id = super().submit(prompt_ids, sampling_params, request_id=request_id,
                                on_token=record)
    self._prompt_of[request_id] = len(self._prompt_of)
    return request_id


def run_search(rate, slots, steps_per_sync, max_new_tokens=12, decision_tokens=(3, 7)):
  """Speculative rejection of 2 prompts × 8 samples with recording scheduler and scorer."""
  sched = RecordingScheduler(engine(slots), PARAMS, prompt_buckets=BUCKETS,
                             steps_per_sync=steps_per_sync)
  scorer = HashScorer(sched)
  search = SpeculativeRejection(sched, scorer, Tokens(), n_init=8,
                                decision_tokens=decision_tokens, rejection_rate=rate)
  examples = [Example("a", "", "t"), Example("b", "", "t")]
  result = search.run(examples, prompts(2, seed=4),
                      sampling.SamplingParams(max_new_tokens=max_new_tokens, seed=3))
  return result, sched, scorer, examples


def test_per_sample_cancel_frees_its_slot_for_a_waiting_sample():
  sched = Scheduler(engine(2), PARAMS, prompt_buckets=BUCKETS, steps_per_sync=2)
  request = sched.submit(prompts(1)[0], sampling.SamplingParams(n=4, max_new_tokens=20, seed=1))
  sched.cancel(request, 3)  # still waiting: never runs, completes "cancelled" with no tokens
  completions = sched.step()
  assert [(c.sample_index, c.finish_reason, c.token_ids) for c in completions] == [
      (3, "cancelled", [])]
  assert sched.metrics()["slots_busy"] == 2  # samples 0 and 1
  sched.cancel(request, 0)
  completions += sched.step()  # sample 0 leaves, sample 2 takes its slot
  assert [c.sample_index for c in completions if c.finish_reason == "cancelled"] == [3, 0]
  assert sched.metrics()["slots_busy"] == 2
  completions += sched.run()
  reasons = {c.sample_index: c.finish_reason for c in completions}
  assert reasons == {0: "cancelled", 1: "length", 2: "length", 3: "cancelled"}
  assert not sched.has_work()


def test_bottom_fraction_is_the_lowest_scores():
  assert bottom_fraction([0.5, 0.1, 0.9, 0.3], 0.5) == [1, 3]
  assert bottom_fraction([0.5, 0.1, 0.9], 0.5) == [1]  # ⌊1.5⌋
  assert bottom_fraction([0.2, 0.2, 0.9, 0.8], 0.5) == [0, 1]
  assert bottom_fraction([1.0, 2.0], 0.0) == []


@pytest.mark.parametrize("rate, slots", [(0.5, 16), (0.25, 8)])
def test_speculative_rejection_cancels_the_bottom_fraction_at_each_decision(rate, slots):
  # 8 slots for 2 × 8 samples: the second prompt's samples run in the slots the first
  # prompt's cancelled and finished ones free.
  result, sched, scorer, _ = run_search(rate, slots, steps_per_sync=2)
  survivors = {}
  for prompt in range(2):
    decisions = [d for d in result.decisions if d.prompt == prompt]
    assert [d.threshold for d in decisions] == [3, 7]
    live = set(range(8))
    for decision in decisions:
      # Scored: the samples still generating (one that already finished is not pruned).
      assert set(decision.scores) <= live and len(decision.scores) >= 2
      live = set(decision.scores)
      assert decision.lengths == {i: decision.threshold for i in live}
      ranked = sorted(live, key=lambda i: decision.scores[i])
      assert len(set(decision.scores.values())) == len(live)  # distinct partial responses
      assert sorted(decision.cancelled) == sorted(ranked[:math.floor(rate * len(live))])
      live -= set(decision.cancelled)
    survivors[prompt] = set(range(8)) - {i for d in decisions for i in d.cancelled}
  assert result.finished_samples == sum(len(v) for v in survivors.values())
  final = {k: len(v) for k, v in sched.emitted.items()}
  assert result.generated_tokens == sum(final.values())
  assert all(final[(p, i)] == 12 for p in survivors for i in survivors[p])
  # The answer of each prompt is its best finished response under the scorer.
  finals = scorer.calls[-1]  # the finished responses, keys sorted by (prompt, sample)
  first = len(survivors[0])
  for prompt, texts in enumerate((finals[:first], finals[first:])):
    best = max(texts, key=hashed)
    assert result.texts[prompt] == best and result.scores[prompt] == pytest.approx(hashed(best))
  assert not sched.has_work() and sched.metrics()["slots_busy"] == 0


def partial_calls(result, scorer):
  """Pairs each partial scorer call with the decisions it served (decisions are appended
  in call order, each call serves ≥ 1 of them) and the tokens emitted at that call."""
  pending, out = list(result.decisions), []
  for texts, examples, emitted in zip(scorer.calls[:-1], scorer.examples,
                                      scorer.emitted_at_call):
    served = []
    while sum(len(d.scores) for d in served) < len(texts):
      served.append(pending.pop(0))
    out.append((texts, examples, emitted, served))
  assert not pending
  return out


@pytest.mark.parametrize("rate, slots, steps_per_sync", [
    (0.5, 16, 4), (0.25, 8, 4), (0.5, 8, 2), (0.5, 16, 8)])
def test_each_decision_scores_exactly_the_first_tau_tokens(rate, slots, steps_per_sync):
  # Samples overshoot τ between syncs (and, with 8 slots, while waiting for siblings
  # admitted later); the scorer must still see exactly their first τ tokens.
  result, sched, scorer, examples = run_search(rate, slots, steps_per_sync)
  full = sched.emitted  # each sample's final or cancelled token sequence
  overshoot = 0
  for texts, given, emitted, served in partial_calls(result, scorer):
    assert len({d.prompt for d in served}) == len(served)  # one decision per prompt
    keys = [(d.prompt, i, d.threshold) for d in served for i in sorted(d.scores)]
    assert texts == [Tokens().decode(full[(p, i)][:tau]) for p, i, tau in keys]
    assert [list(map(int, t.split())) for t in texts] == [full[(p, i)][:tau]
                                                          for p, i, tau in keys]
    assert given == [examples[p] for p, _, _ in keys]
    for decision in served:
      prompt, tau = decision.prompt, decision.threshold
      assert decision.lengths == {i: tau for i in decision.scores}
      for index in decision.scores:
        assert decision.scores[index] == pytest.approx(hashed(texts[keys.index(
            (prompt, index, tau))]))
        overshoot = max(overshoot, emitted[(prompt, index)] - tau)
      for index in decision.cancelled:  # generates nothing after its decision
        assert len(full[(prompt, index)]) == emitted[(prompt, index)]
      # A sample neither cancelled earlier nor scored had already finished: kept, unranked.
      earlier = {i for d in result.decisions if d.prompt == prompt and d.threshold < tau
                 for i in d.cancelled}
      for index in set(range(8)) - earlier - set(decision.scores):
        assert emitted[(prompt, index)] == len(full[(prompt, index)]) == 12
  assert overshoot > 0  # the scenario does run samples past τ before deciding
  cancelled = sum(len(d.cancelled) for d in result.decisions)
  assert result.finished_samples == 16 - cancelled


def test_plain_best_of_n_scores_every_sample_once_and_returns_the_best():
  sched = Scheduler(engine(8), PARAMS, prompt_buckets=BUCKETS)
  scorer = HashScorer()
  search = SpeculativeRejection(sched, scorer, Tokens(), n_init=4)
  result = search.run([Example("a", "", "t"), Example("b", "", "t")], prompts(2, seed=5),
                      sampling.SamplingParams(max_new_tokens=6, seed=0))
  assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 8 and not result.decisions
  by_prompt = [scorer.calls[0][:4], scorer.calls[0][4:]]  # keys sorted by (prompt, sample)
  for prompt, texts in enumerate(by_prompt):
    best = max(texts, key=hashed)
    assert result.texts[prompt] == best and result.scores[prompt] == pytest.approx(hashed(best))
  assert result.generated_tokens == 8 * 6


def test_bad_arguments_are_named():
  sched = Scheduler(engine(2), PARAMS, prompt_buckets=BUCKETS)
  with pytest.raises(ValueError, match="rejection_rate=1.0"):
    SpeculativeRejection(sched, HashScorer(), Tokens(), n_init=4, rejection_rate=1.0)
  with pytest.raises(ValueError, match=r"decision_tokens=\(8, 4\)"):
    SpeculativeRejection(sched, HashScorer(), Tokens(), n_init=4, decision_tokens=(8, 4))
