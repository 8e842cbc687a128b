"""Training reward models (rewards/model_training.py) on a tiny model: the Bradley-Terry RM
raises held-out pair accuracy, and PRM step targets sit at the step ends."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.data import PreferencePair
from rlhf_jax.rewards import prm as prm_lib
from rlhf_jax.rewards import model_training as rt
from tests.rewards.tiny_lm import LAYOUT
from tests.rewards.tiny_lm import LM
from tests.rewards.tiny_lm import LM_PARAMS
from tests.rewards.tiny_lm import TOKENIZER


def synthetic_pairs(seed, count):
  """Chosen: states the answer; rejected: a shorter line without it."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    a, b = rng.integers(10, 99, 2)
    pairs.append(PreferencePair(f"{a}+{b}?\n", f"Answer: {a + b}", rng.choice(["Hmm", "No"])))
  return pairs


def test_bradley_terry_training_raises_held_out_pair_accuracy():
  model, params = models.critic_from_policy(LM, LM_PARAMS)
  result = rt.train_bradley_terry(model, params, LAYOUT, synthetic_pairs(0, 64),
                                  synthetic_pairs(1, 32), steps=30, batch_size=16,
                                  learning_rate=3e-3)
  assert result.before == 0.0  # a zero head ties every pair
  assert result.after >= 0.9
  assert result.losses[-1] < result.losses[0]


def test_step_targets_put_labels_at_step_ends():
  newline = prm_lib.step_end_token_ids(TOKENIZER)
  tokens, mask, targets, where = rt.step_targets(LAYOUT, ["1?\n"], ["a\nb\nc"],
                                                 [[1.0, 0.0, 0.0]], newline)
  assert np.flatnonzero(where[0]).tolist() == [1, 3, 4]
  assert targets[0, [1, 3, 4]].tolist() == [1.0, 0.0, 0.0]
  with pytest.raises(ValueError, match="2 step labels for 3 step ends"):
    rt.step_targets(LAYOUT, ["1?\n"], ["a\nb\nc"], [[1.0, 0.0]], newline)
