"""The Bradley-Terry reward model as a scorer (rewards/reward_model.py): the last token's value
against a plain forward of each row, too-long responses recorded as failures."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.data import Example
from rlhf_jax.rewards.reward_model import RewardModelScorer
from rlhf_jax.optim.roles import FrozenRole
from tests.rewards.tiny_lm import LAYOUT
from tests.rewards.tiny_lm import LM
from tests.rewards.tiny_lm import LM_PARAMS
from tests.rewards.tiny_lm import TOKENIZER


@pytest.mark.slow
def test_reward_model_scorer_reads_the_last_token_and_records_too_long_responses():
  model, params = models.critic_from_policy(LM, LM_PARAMS)
  params = dict(params, scalar_head=jax.random.normal(jax.random.key(0), (32,)))
  scorer = RewardModelScorer(FrozenRole(model, params), LAYOUT, batch_size=4,
                             failure_score=-5.0)
  examples = [Example("1+2?\n", "3", "arith")] * 6
  responses = ["Answer: 3", "Answer: 4", "x" * 40, "", "Answer: 3", "12"]
  scored = scorer.score(examples, responses)
  assert scored.failures[2].startswith("too long") and scored.scores[2] == -5.0
  for i in (0, 1, 3, 4, 5):  # each row alone, by a plain forward
    ids = TOKENIZER.encode(examples[i].prompt) + TOKENIZER.encode(responses[i]) + [
        TOKENIZER.eos_id]
    values, _ = model.apply(params, np.asarray([ids], np.int32))
    assert scored.scores[i] == pytest.approx(float(values[0, -1]), abs=1e-4)
    assert scored.correct[i] == (scored.scores[i] > 0)
  assert scored.scores[0] == scored.scores[4]
