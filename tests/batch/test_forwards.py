"""Model forwards over a rollout batch (batch/forwards.py): the response tokens' log-probs
against one unpadded forward per row."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import batch as batch_lib

@pytest.mark.slow
def test_response_logprobs_match_an_unpadded_forward():
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  model, params = models.init_model(config, seed=3)
  prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
  batch = batch_lib.build_rollout_batch(
      prompts, responses, [[0.0] * 2, [0.0] * 3], [0.0, 0.0], [False, False], [0, 1],
      prompt_length=4, response_length=3, pad_id=0)
  got = np.asarray(batch_lib.response_logprobs(model, params, batch_lib.as_device(batch)))
  for row, (prompt, response) in enumerate(zip(prompts, responses)):
    sequence = jnp.asarray([prompt + response])
    logits, _ = model.apply(params, sequence)
    expected = kernels.token_logprobs(logits[:, len(prompt) - 1:-1], sequence[:, len(prompt):])
    np.testing.assert_allclose(got[row, :len(response)], expected[0], atol=1e-5)
    assert np.all(got[row, len(response):] == 0)
