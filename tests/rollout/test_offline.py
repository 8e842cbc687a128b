"""rollout.mode = "offline" (rollout/offline.py): labelled groups encoded (reduced to pairs,
ties dropped, long responses cut), reference log-probs cached from the reference's forward,
and a stream that resumes exactly."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.batch import response_logprobs
from rlhf_jax.data import LabelledGroup
from rlhf_jax.data.example import Example
from rlhf_jax.rollout.offline import OfflineRollout
from rlhf_jax.rollout.offline import cache_reference_logprobs
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rollout.offline import encode_groups
from rlhf_jax.tasks import arith

TOKENIZER = arith.tokenizer()


def group(prompt, responses, scores):
  """A labelled arith group; a response is correct where its score is positive."""
  return LabelledGroup(Example(prompt, "", "arith"), tuple(responses), tuple(scores),
                       tuple(s > 0 for s in scores))


def test_encode_groups_reduces_to_pairs_drops_ties_and_cuts_long_responses():
  labelled = [group("1+1?\n", ["7", "2", "2", "9"], [0.0, 1.0, 1.0, 0.0]),
              group("2+2?\n", ["4", "4"], [1.0, 1.0]),
              group("3+3?\n", ["6" * 20, "5"], [1.0, 0.0])]
  groups, counts = encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8),
                                 response_length=6, group_size=2, pairs=True)
  assert counts == {"dropped": 1, "truncated": 1}
  assert [TOKENIZER.decode(r) for r in groups[0].responses] == ["2", "7"]  # best, worst
  assert groups[1].responses[0] == TOKENIZER.encode("6" * 6) and groups[1].truncated == [
      True, False]
  with pytest.raises(ValueError, match="offline group 0 has 4 responses; set rollout.group_size=4"):
    encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8), response_length=6,
                  group_size=2)  # DQO keeps whole groups
  with pytest.raises(ValueError, match="offline group 0: the prompt has 5 tokens"):
    encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=4), response_length=6,
                  group_size=2, pairs=True)


def test_cached_reference_logprobs_are_the_reference_forward_and_the_stream_resumes():
  model, params = models.init_model(arith.model_config(
      vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
      max_positions=32), seed=3)
  labelled = [group(f"{i}+1?\n", [str(i + 1), str(i)], [1.0, 0.0]) for i in range(5)]
  shapes = dict(prompt_length=8, response_length=6, pad_id=TOKENIZER.pad_id)
  groups, _ = encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8),
                            response_length=6, group_size=2)
  forward = jax.jit(lambda rows: response_logprobs(model, params, rows))
  cache_reference_logprobs(groups, forward, chunk=2, **shapes)
  rollout = OfflineRollout(groups, prompts_per_step=5, seed=0, shuffle=False, **shapes)
  batch = rollout.collect().batch
  np.testing.assert_allclose(batch.sampler_logprobs, forward(batch), rtol=1e-5, atol=1e-6)
  first = OfflineRollout(groups, prompts_per_step=2, seed=1, **shapes)
  first.collect()
  state = first.state()
  expected = first.collect().batch.tokens
  second = OfflineRollout(groups, prompts_per_step=2, seed=1, **shapes)
  second.restore(json.loads(json.dumps(state)))
  np.testing.assert_array_equal(second.collect().batch.tokens, expected)
