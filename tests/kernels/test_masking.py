"""The index helpers over masked rows against a plain Python scan of each row: the last
valid position, and the value at the next valid position (or the row's fill)."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax.kernels import masking
from tests.kernels.batches import ragged_mask


def next_valid_reference(x, mask, fill):
  """For each (i, t): x[i, k] for the first k > t with mask 1, else fill[i]."""
  out = np.empty(x.shape, np.float64)
  for i in range(x.shape[0]):
    for t in range(x.shape[1]):
      later = [k for k in range(t + 1, x.shape[1]) if mask[i, k] > 0]
      out[i, t] = x[i, later[0]] if later else fill[i]
  return out


@pytest.mark.parametrize("seed", range(4))
def test_last_valid_index_is_the_last_kept_position_or_minus_one(seed):
  mask = ragged_mask(np.random.default_rng(seed), 6, 9)  # holes and one empty row
  expected = [max((t for t in range(9) if row[t] > 0), default=-1) for row in mask]
  np.testing.assert_array_equal(np.asarray(masking.last_valid_index(mask)), expected)


@pytest.mark.parametrize("seed", range(4))
def test_next_valid_values_skips_holes_and_fills_past_the_end(seed):
  rng = np.random.default_rng(seed)
  mask = ragged_mask(rng, 5, 8)
  x = rng.standard_normal((5, 8)).astype(np.float32)
  fill = rng.standard_normal(5).astype(np.float32)
  np.testing.assert_allclose(np.asarray(masking.next_valid_values(x, mask, fill)),
                             next_valid_reference(x, mask, fill), rtol=1e-6)
