"""Checks on reward values that come from user code (reward functions, environments),
light enough for the worker processes that run that code (numpy only, no jax)."""

from __future__ import annotations

import numbers

import numpy as np


def finite_in_float32(value) -> bool:
  """Whether `value` is a real number that stays finite as float32, the batch's dtype
  (1e39 passes `math.isfinite` but is inf in float32: every update would be skipped).
  Rewards that come from user code (reward functions, environments) are checked with it
  and fail their sample otherwise."""
  if not isinstance(value, numbers.Real):
    return False
  try:
    value = float(value)
  except OverflowError:  # an int beyond float64
    return False
  with np.errstate(over="ignore", invalid="ignore"):
    return bool(np.isfinite(np.float32(value)))
