"""MXFP4, the OCP microscaling 4-bit float format gpt-oss checkpoints store their experts in:
dequantised to float32 on load.

A tensor is stored as `blocks` (uint8, two FP4 E2M1 values per byte, the low nibble first)
and `scales` (uint8, one shared power-of-two exponent per block of 32 values, biased by
127). Value = FP4(nibble) · 2^(scale − 127), as transformers' `convert_moe_packed_tensors`
computes it.
"""

from __future__ import annotations

import numpy as np

# The 16 E2M1 codes: sign bit, 2 exponent bits, 1 mantissa bit.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """MXFP4 to float32.

  Args:
    blocks: [..., G, B] uint8, G blocks of B bytes (2B values each) per row.
    scales: [..., G] uint8, each block's biased exponent.
  Returns:
    [..., G · 2B] float32, the values of each row in order (a byte's low nibble first).
  Raises:
    ValueError when the shapes or dtypes do not fit.
  """
  blocks, scales = np.asarray(blocks), np.asarray(scales)
  if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
    raise ValueError(f"MXFP4 blocks and scales must be uint8; got {blocks.dtype} and "
                     f"{scales.dtype}.")
  if blocks.shape[:-1] != scales.shape:
    raise ValueError(f"MXFP4 blocks {list(blocks.shape)} do not fit scales "
                     f"{list(scales.shape)} (one scale per block).")
  values = np.empty(blocks.shape[:-1] + (2 * blocks.shape[-1],), np.float32)
  values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
  values[..., 1::2] = FP4_VALUES[blocks >> 4]
  values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
  return values.reshape(*blocks.shape[:-2], -1)
