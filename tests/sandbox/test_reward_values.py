"""`finite_in_float32` (sandbox/reward_values.py): a reward from user code is a real number that
stays finite in float32, the batch's dtype, checked against NumPy's own float32 cast."""

from __future__ import annotations

import fractions
import math

import numpy as np
import pytest

from rlhf_jax.sandbox.reward_values import finite_in_float32

FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("value, expected", [
    (0, True), (-3.5, True), (np.float64(2.0), True), (np.int64(7), True),
    (fractions.Fraction(1, 3), True), (True, True),  # bool is a numbers.Real
    (FLOAT32_MAX, True), (1e39, False), (-1e39, False),  # finite in float64, inf in float32
    (math.inf, False), (math.nan, False), (10 ** 400, False),  # an int beyond float64
    ("1.0", False), (None, False), (1 + 0j, False), ([1.0], False),
])
def test_real_numbers_finite_in_float32_only(value, expected):
  assert finite_in_float32(value) is expected


def test_the_float32_boundary():
  # Values just past float32's largest finite number round to it or overflow, as NumPy casts.
  for value in (FLOAT32_MAX * (1 + 1e-9), FLOAT32_MAX * 1.001):
    with np.errstate(over="ignore"):
      assert finite_in_float32(value) == bool(np.isfinite(np.float32(value)))
