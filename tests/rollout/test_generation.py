"""Sampling and scoring groups (rollout/generation.py) with a scripted sampler and scorer: G
responses per example, each scored on its decoded text with its ids, the per-token policy
versions, step scores placed at the tokens that end steps, fresh seeds that a checkpoint
restores, and a group's JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rollout.generation import Group
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import token_versions
from rlhf_jax.sampling import SamplingParams
from tests.fakes import FakeSampler
from tests.fakes import FakeScorer
from tests.fakes import fake_tokenizer

TOKENIZER = fake_tokenizer()
EXAMPLES = [Example("1+1?", "2", "arith"), Example("2+2?", "4", "arith")]


def spelled(text):
  """A sampler's response: the ids of `text`."""
  return lambda prompt, sampling, i: TOKENIZER.encode(text[:i + 1])


def generator(sampler, scorer, **options):
  return GroupGenerator(sampler, scorer, PromptFormat(TOKENIZER, prompt_length=8),
                        sampling=SamplingParams(n=3, max_new_tokens=4), seed=5, **options)


def test_each_example_gets_its_g_responses_scored_on_their_text():
  sampler, scorer = FakeSampler(spelled("abc"), version=2), FakeScorer(lambda e, r: len(r))
  groups = generator(sampler, scorer).generate_groups(EXAMPLES)
  assert [g.example for g in groups] == EXAMPLES
  for group in groups:
    assert group.prompt_ids == TOKENIZER.encode(group.example.prompt)
    assert [TOKENIZER.decode(r) for r in group.responses] == ["a", "ab", "abc"]
    assert group.scores == [1.0, 2.0, 3.0] and group.correct == [True] * 3
    assert group.versions == [[2], [2, 2], [2, 2, 2]] and group.version == 2
    assert group.truncated == [False] * 3 and group.step_rewards is None
  (examples, responses), = scorer.calls  # one call for the whole step, in group order
  assert examples == [EXAMPLES[0]] * 3 + [EXAMPLES[1]] * 3
  assert all(isinstance(r, str) for r in responses)
  assert [r.token_ids for r in responses[:3]] == groups[0].responses


def test_fresh_seeds_per_call_and_a_restored_generator_repeats_them():
  first = generator(FakeSampler(), FakeScorer())
  state = json.loads(json.dumps(first.state()))
  seeds = [first.next_seed() for _ in range(3)]
  assert len(set(seeds)) == 3
  again = generator(FakeSampler(), FakeScorer())
  again.restore(state)
  assert [again.next_seed() for _ in range(3)] == seeds


class StepScorer(FakeScorer):
  """Two step scores per response, whatever its steps."""

  def score(self, examples, responses):
    scored = super().score(examples, responses)
    return dataclasses.replace(scored, step_scores=[[0.5, -1.0]] * len(responses))


def test_step_scores_sit_at_the_tokens_that_end_steps():
  newline = TOKENIZER.encode("\n")[0]
  sampler = FakeSampler(lambda prompt, sampling, i: TOKENIZER.encode("a\nbc\nd"))
  groups = generator(sampler, StepScorer(), step_end_ids=frozenset({newline})).generate_groups(
      EXAMPLES[:1])
  # Steps end at columns 1 and 4 (the newlines); extra step ends would be dropped.
  assert groups[0].step_rewards == [[(1, 0.5), (4, -1.0)]] * 3
  assert generator(sampler, StepScorer()).generate_groups(EXAMPLES[:1])[0].step_rewards is None


def test_token_versions_from_the_sampler_or_its_first_version():
  sampled = FakeSampler(version=4).generate([[1]], SamplingParams(n=1))[0][0]
  assert token_versions(sampled) == [4]
  unrecorded = dataclasses.replace(sampled, token_ids=[5, 6], token_versions=[],
                                   weights_version=(3, 7))
  assert token_versions(unrecorded) == [3, 3]
  with pytest.raises(ValueError, match="1 token versions for 2 tokens"):
    token_versions(dataclasses.replace(unrecorded, token_versions=[1]))


def test_a_group_round_trips_through_json_and_old_versions_spread_over_tokens():
  group = generator(FakeSampler(spelled("abc")), FakeScorer()).generate_groups(EXAMPLES[:1])[0]
  data = json.loads(json.dumps(group.to_json()))
  assert Group.from_json(data) == group
  data["versions"] = [1, 2, 3]  # a checkpoint from before per-token versions
  assert Group.from_json(data).versions == [[1], [2, 2], [3, 3, 3]]
  assert Group.from_json(dict(data, versions=None)).version == 0


def test_routes_travel_with_the_group_through_json_and_into_the_batch():
  from rlhf_jax.rollout.generation import pack_groups  # pylint: disable=import-outside-toplevel
  group = Group(example=EXAMPLES[0], prompt_ids=[1, 2], responses=[[3, 4], [5]],
                logprobs=[[0.0, 0.0], [0.0]], scores=[1.0, 0.0], correct=[True, False],
                truncated=[False, False], failures=["", ""],
                routes=[np.asarray([[[0, 1]], [[2, 3]]], np.int8), None])
  back = Group.from_json(json.loads(json.dumps(group.to_json())))
  assert back.routes[1] is None and back.routes[0].dtype == np.int8
  np.testing.assert_array_equal(back.routes[0], group.routes[0])
  batch = pack_groups([back], prompt_length=3, response_length=2, pad_id=0).batch
  np.testing.assert_array_equal(batch.routes[0, 3:5], group.routes[0])
  assert (batch.routes[1] == -1).all() and (batch.routes[0, :3] == -1).all()
