"""The pairwise judge (rewards/pairwise.py): Pairwise-PPO's reward averages both orders of a
pair, against a full forward of each."""

from __future__ import annotations

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import pairwise
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.judge import verdict_token_ids
from tests.rewards.tiny_lm import TOKENIZER
from tests.rewards.tiny_lm import full_forward_probabilities
from tests.rewards.tiny_lm import judge_scheduler


@pytest.fixture(scope="module")
def judge_sampler():
  return judge_scheduler()


def test_pairwise_reward_averages_both_orders(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.pairwise.first": "A",
                                     "reward.pairwise.second": "B"})
  judge = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=128,
                       min_verdict_mass=0.0)
  scorer = pairwise.PairwiseScorer(judge, anchor_key="solution", centre=0.5)
  example = Example("1+2?\n", "3", "arith", metadata={"solution": "Answer: 3"})
  responses = ["Answer: 3", "Answer: 9"]
  scored = scorer.score([example] * 2, responses)
  for response, score in zip(responses, scored.scores):
    forward = full_forward_probabilities(
        [pairwise.pair_question(pairwise.PAIR_TEMPLATE, example.prompt, response, "Answer: 3"),
         pairwise.pair_question(pairwise.PAIR_TEMPLATE, example.prompt, "Answer: 3", response)],
        ("A", "B"))
    first_wins = forward[:, 0] / forward.sum(axis=1)
    assert score == pytest.approx(0.5 * (first_wins[0] + 1 - first_wins[1]) - 0.5, abs=1e-4)
  no_anchor = scorer.score([Example("1+2?\n", "3", "arith")], ["Answer: 3"])
  assert "no anchor" in no_anchor.failures[0]
