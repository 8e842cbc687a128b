"""GenRM (rewards/genrm.py) served by our sampler: its score is the verdict probability of a
full forward, and its failures are recorded, not raised."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.judge import verdict_token_ids
from tests.rewards.tiny_lm import TOKENIZER
from tests.rewards.tiny_lm import full_forward_probabilities
from tests.rewards.tiny_lm import judge_scheduler


@pytest.fixture(scope="module")
def judge_sampler():
  return judge_scheduler()


@pytest.mark.slow
def test_genrm_score_is_the_verdict_probability_of_a_full_forward(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "N"})
  judge = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=128,
                       min_verdict_mass=0.0)
  scorer = genrm.GenRMScorer(judge, mode="gt")
  examples = [Example("Ann has 3 pens.\n", "5", "arith"), Example("Bo?\n", "12", "x")]
  responses = ["Answer: 5", "1\n2\nAnswer: 7"]
  scored = scorer.score(examples, responses)
  questions = [genrm.judge_question(genrm.GT_TEMPLATE, e, r) for e, r in zip(examples,
                                                                          responses)]
  expected = full_forward_probabilities(questions, ("Y", "N"))[:, 0]
  np.testing.assert_allclose(scored.scores, expected, rtol=1e-4)
  assert scored.failures == ["", ""]


def test_genrm_failures_are_recorded_not_raised(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "N"})
  picky = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=80,
                       min_verdict_mass=0.99)  # a random model is never that sure
  examples = [Example("1+1?\n", "2", "arith"), Example("1+1?\n", "", "arith"),
              Example("long " * 30, "2", "arith")]
  scored = genrm.GenRMScorer(picky, mode="gt", failure_score=-1.0).score(
      examples, ["Answer: 2"] * 3)
  assert scored.scores == [-1.0] * 3
  assert "judge gave no verdict" in scored.failures[0]
  assert scored.failures[1] == "no ground-truth answer"
  assert "exceeds 80" in scored.failures[2]
  reference = genrm.GenRMScorer(picky, mode="reference").score([examples[0]], ["Answer: 2"])
  assert "no reference response" in reference.failures[0]
