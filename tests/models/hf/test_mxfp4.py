"""models/hf/mxfp4.py against the format's definition and transformers' own dequantisation."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax.models.hf.mxfp4 import dequantize_mxfp4


def test_each_nibble_is_its_e2m1_value_times_the_blocks_power_of_two():
  # one row, two blocks of one byte: codes (lo, hi) = (1, 7) and (9, 15)
  blocks = np.array([[[0x71], [0xF9]]], np.uint8)
  scales = np.array([[127 + 2, 127 - 1]], np.uint8)
  # E2M1: 1 → 0.5, 7 → 6.0; 9 → -0.5, 15 → -6.0
  np.testing.assert_array_equal(dequantize_mxfp4(blocks, scales),
                                [[0.5 * 4, 6.0 * 4, -0.5 / 2, -6.0 / 2]])


def test_shapes_and_dtypes_that_do_not_fit_are_refused():
  with pytest.raises(ValueError, match="one scale per block"):
    dequantize_mxfp4(np.zeros((2, 3, 16), np.uint8), np.zeros((2, 4), np.uint8))
  with pytest.raises(ValueError, match="must be uint8"):
    dequantize_mxfp4(np.zeros((2, 16), np.int8), np.zeros((2,), np.uint8))


def test_equal_to_transformers_dequantisation():
  torch = pytest.importorskip("torch")
  mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
  rng = np.random.default_rng(0)
  blocks = rng.integers(0, 256, (3, 8, 2, 16), dtype=np.uint8)  # [X, rows, G, B]
  scales = rng.integers(120, 135, (3, 8, 2), dtype=np.uint8)
  want = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                          dtype=torch.float32)
  # transformers returns [X, G·2B, rows] (gpt-oss's [experts, in, out]); ours keeps rows first
  np.testing.assert_array_equal(dequantize_mxfp4(blocks, scales),
                                want.transpose(1, 2).numpy())
