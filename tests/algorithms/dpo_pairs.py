"""A tiny arith policy and preference pairs of sums, shared by the DPO tests
(test_dpo.py, test_dpo_learner.py)."""

from __future__ import annotations

import numpy as np

from rlhf_jax import models
from rlhf_jax.algorithms import dpo
from rlhf_jax.batch import response_logprobs
from rlhf_jax.data import PreferencePair
from rlhf_jax.tasks import arith

TOKENIZER = arith.tokenizer()
CONFIG = arith.model_config(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1,
                            num_heads=2, max_positions=64)
MODEL, PARAMS = models.init_model(CONFIG, seed=1)
P, R = 12, 12  # prompt and response lengths


def pairs(seed, count):
  """`count` pairs 'a+b?' → (the right answer, 'No'), a and b drawn with `seed`."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    a, b = rng.integers(1, 9, 2)
    out.append(PreferencePair(f"{a}+{b}?\n", f"Answer: {a + b}", "No"))
  return out


def pair_batch(data, reference_params):
  """Groups of (chosen, rejected) rows with the reference's log-probs, paired on device."""
  batch = dpo.encode_preference_pairs(TOKENIZER, data, prefix=(), prompt_length=P,
                                      response_length=R)
  ref = response_logprobs(MODEL, reference_params, batch)
  return dpo.pairs_from_groups(batch.replace(ref_logprobs=ref), 2)
