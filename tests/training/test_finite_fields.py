"""NaN and infinite hyper-parameters are refused naming the field, wherever the float
sits: a float field, a tuple or list field, a tuple inside a tuple."""

from __future__ import annotations

import math

import ml_collections
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.sections import check_finite


def reference_non_finite(value) -> bool:
  """Whether any float in `value` (nested lists/tuples walked) is NaN or infinite."""
  if isinstance(value, float):
    return math.isnan(value) or math.isinf(value)
  if isinstance(value, (list, tuple)):
    return any(reference_non_finite(v) for v in value)
  return False


@pytest.mark.parametrize("value", [
    1.0, float("nan"), float("inf"), (1.0, float("nan")), [0.5, float("-inf")],
    ((1.0, 2.0), (3.0, float("nan"))), [(1.0,), [float("inf")]], "nan", (1, 2), (),
])
def test_a_non_finite_float_anywhere_in_a_field_is_refused(value):
  config = ml_collections.ConfigDict({"optim": {"weights": value}, "seed": 0})
  if reference_non_finite(value):
    with pytest.raises(ConfigError, match=r"^config.optim.weights: invalid value .*: must be "
                                          "finite$"):
      check_finite(config)
  else:
    check_finite(config)
