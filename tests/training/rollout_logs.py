"""Two tiny rollouts and their tokenizer, shared by the rollout-log and logger tests."""

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax.rollout.generation import Rollouts

TOKENIZER = models.build_character_tokenizer("abcdef |\n")


def rollouts():
  """Two single-turn samples: prompt "ab" + "c|d\\nef" (score 0.5) and "abc|d" + "e" (−1)."""
  prompts = [TOKENIZER.encode("ab"), TOKENIZER.encode("abc|d")]
  responses = [TOKENIZER.encode("c|d\nef"), TOKENIZER.encode("e")]
  batch = batch_lib.build_rollout_batch(
      prompts, responses, [[0.0] * len(r) for r in responses], [0.5, -1.0], [False] * 2,
      [0, 1], prompt_length=6, response_length=7, pad_id=TOKENIZER.pad_id)
  return Rollouts(batch=batch, correct=[True, False], failures=[], metrics={})
