"""A tiny arith language model, its scoring layout and a judge's sampler over it, shared by the
model-reward tests (GenRM, the pairwise judge, the reward model, the PRM, their training)."""

from __future__ import annotations

import jax
import numpy as np

from rlhf_jax import models
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import arith

TOKENIZER = arith.tokenizer()
CONFIG = arith.model_config(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1,
                            num_heads=2, max_positions=160)
LM, LM_PARAMS = models.init_model(CONFIG, seed=3)
LAYOUT = ScoringLayout(TOKENIZER, prefix=(), prompt_length=24, response_length=16)


def judge_scheduler():
  """A scheduler serving LM: 8 slots, one prompt bucket of 128 tokens, no warm-up."""
  config = sampler_config_lib.sampler_config(num_slots=8, cache_length=136,
                                             prompt_buckets=(128,))
  config.warmup = False
  return sampler_config_lib.build_scheduler(config, LM, LM_PARAMS, tokenizer=TOKENIZER)


# One compiled forward for every question: rows right-padded to the model's positions (a
# causal model's logits at a position never see the padding after it).
_FORWARD = jax.jit(lambda ids: LM.apply(LM_PARAMS, ids)[0])


def full_forward_probabilities(questions, verdicts):
  """Softmax of the LM's next-token logits after each question, by a plain forward."""
  encoded = [TOKENIZER.encode(question) for question in questions]
  ids = np.zeros((len(encoded), CONFIG.max_position_embeddings), np.int32)
  for row, tokens in enumerate(encoded):
    ids[row, :len(tokens)] = tokens
  all_logits = np.asarray(_FORWARD(ids), np.float64)
  out = []
  for logits, tokens in zip(all_logits, encoded):
    logits = logits[len(tokens) - 1]
    p = np.exp(logits - logits.max())
    out.append((p / p.sum())[[TOKENIZER.encode(v)[0] for v in verdicts]])
  return np.asarray(out)
