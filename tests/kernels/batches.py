"""Small test batches with the masks that break kernels: ragged lengths, interior
holes (tool tokens), a fully masked row."""

import numpy as np


def ragged_mask(rng: np.random.Generator, batch: int, time: int, *,
                holes: bool = True, empty_row: bool = True) -> np.ndarray:
  """[B, T] float32 right-padded mask; optionally with interior holes and one empty row."""
  lengths = rng.integers(1, time + 1, size=batch)
  mask = (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32)
  if holes:
    for row in range(batch):
      if lengths[row] > 3:
        start = rng.integers(1, lengths[row] - 1)
        mask[row, start:start + rng.integers(1, 3)] = 0.0
  if empty_row and batch > 1:
    mask[-1] = 0.0
  return mask


def random_batch(seed: int = 0, batch: int = 5, time: int = 9, **mask_kwargs):
  """(rewards, values, mask) with a ragged, holed mask."""
  rng = np.random.default_rng(seed)
  rewards = rng.standard_normal((batch, time)).astype(np.float32)
  values = rng.standard_normal((batch, time)).astype(np.float32)
  return rewards, values, ragged_mask(rng, batch, time, **mask_kwargs)
