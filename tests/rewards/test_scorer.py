"""The `Scorer` seam's records and helpers (rewards/scorer.py): `Scores` and the optional
columns it grows, a `Completion` that keeps its token ids through a pickle, a scorer that
raises costing its samples a recorded failure, results gathered back in sample order, and
the streak of steps whose every reward failed."""

from __future__ import annotations

import pickle

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.rewards.scorer import FailureStreak
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import gather_scores
from rlhf_jax.rewards.scorer import guarded_score


def test_scores_want_one_length_and_grow_their_optional_columns_on_demand():
  with pytest.raises(ValueError, match=r"different lengths: \[1, 2\]"):
    Scores([1.0, 0.0], [True], ["", ""])
  scores = Scores([], [], [])
  scores.append(1.0, True, "", "")
  assert scores.reasons == [""] and scores.extracted is None and scores.scored is None
  scores.append(0, False, "", "no answer found", "7", scored=False)
  assert scores.scores == [1.0, 0.0] and scores.correct == [True, False]
  assert scores.extracted == [None, "7"] and scores.scored == [True, False]
  assert scores.reason(1) == "no answer found" and scores.answer(1) == "7"
  plain = Scores([0.0], [False], ["timeout"])
  assert plain.reason(0) == "timeout" and plain.answer(0) is None  # the failure is the reason


def test_a_completion_is_its_text_and_keeps_its_ids_through_a_pickle():
  completion = Completion("Answer: 4", [7, 8, 9])
  assert completion == "Answer: 4" and completion.token_ids == [7, 8, 9]
  back = pickle.loads(pickle.dumps(completion))
  assert isinstance(back, Completion) and back == completion and back.token_ids == [7, 8, 9]


class Raising:
  def score(self, examples, responses):
    raise KeyError("answer")


def test_a_raising_scorer_costs_its_samples_a_recorded_failure():
  examples = [Example("q", "1", "t")] * 3
  scored = guarded_score(Raising(), examples, ["a"] * 3, failure_score=-2.0, what="rm")
  assert scored.scores == [-2.0] * 3 and scored.correct == [False] * 3
  assert scored.failures == ["rm error: KeyError: 'answer'"] * 3
  assert scored.reason(0) == scored.failures[0]


def test_gathered_scores_are_in_sample_order():
  first = Scores([1.0, 2.0], [True, False], ["", ""], reasons=["", "wrong"],
                 extracted=["1", "2"])
  second = Scores([3.0], [True], ["timeout"])
  out = gather_scores({0: (1, first), 1: (0, second), 2: (0, first)}, 3)
  assert out.scores == [2.0, 3.0, 1.0] and out.correct == [False, True, True]
  assert out.failures == ["", "timeout", ""] and out.reasons == ["wrong", "timeout", ""]
  assert out.extracted == ["2", None, "1"]


def test_a_run_whose_every_reward_fails_stops_after_max_failed_steps():
  streak = FailureStreak(3)
  assert streak.update(4, ["x: boom"] * 4) is None
  assert streak.update(4, ["x: boom"] * 3) is None  # one sample scored: the count restarts
  assert streak.update(4, ["x: boom"] * 4) is None
  assert streak.update(4, ["x: boom"] * 4) is None
  assert streak.update(4, ["x: boom"] * 4) == (
      "every sample's reward failed in 3 steps in a row (reward.max_failed_steps=3); "
      "the first reason: x: boom")
  never = FailureStreak(0)
  assert all(never.update(2, ["x"] * 2) is None for _ in range(10))


def test_a_step_with_nothing_finished_neither_counts_nor_resets_the_streak():
  streak = FailureStreak(2)
  assert streak.update(4, ["x"] * 4) is None
  assert streak.update(0, []) is None  # T-PPO: no response finished this step
  assert streak.update(4, ["x"] * 4) is not None
