"""The rollout batch (batch/rollout_batch.py): rows laid out from prompts and responses of
every length (prompts left-padded, responses right-padded), the reward at the last token, and
a prompt too long named by its row."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax import batch as batch_lib

def test_rollout_batch_layout():
  batch = batch_lib.build_rollout_batch(
      [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [[-1.0, -2.0], [-3.0, -4.0, -5.0]],
      [1.0, -1.0], [False, True], [0, 0], prompt_length=4, response_length=3, pad_id=0)
  np.testing.assert_array_equal(batch.tokens, [[0, 5, 6, 7, 9, 10, 0], [0, 0, 0, 8, 11, 12, 13]])
  np.testing.assert_array_equal(batch.attention_mask, [[0, 1, 1, 1, 1, 1, 0],
                                                       [0, 0, 0, 1, 1, 1, 1]])
  np.testing.assert_array_equal(batch.response_mask, [[1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(batch.sampler_logprobs, [[-1, -2, 0], [-3, -4, -5]])
  np.testing.assert_array_equal(batch.lengths, [2, 3])
  np.testing.assert_array_equal(np.asarray(batch.token_rewards()), [[0, 1, 0], [0, 0, -1]])
  with pytest.raises(ValueError, match="row 0: prompt of 3 tokens exceeds prompt_length=2"):
    batch_lib.build_rollout_batch([[5, 6, 7]], [[1]], [[0.0]], [0.0], [False], [0],
                                    prompt_length=2, response_length=3, pad_id=0)
