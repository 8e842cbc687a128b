"""The kernels' entry checks (kernels/_validation.py): each bad value raises one error that
names the argument; Python numbers are range-checked, arrays and tracers pass through."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.kernels import _validation as check


def test_choice_names_the_argument_and_the_allowed_values():
  check.check_choice("mode", "a", ("a", "b"))
  with pytest.raises(ValueError, match=r"mode='c' is not supported; allowed values: 'a', 'b'\. "
                                       r"see the docs"):
    check.check_choice("mode", "c", ("a", "b"), hint="see the docs")


@pytest.mark.parametrize("value, bounds, message", [
    (-0.1, dict(low=0.0), r"gamma=-0.1 must be >= 0.0"),
    (0.0, dict(low=0.0, low_inclusive=False), r"gamma=0.0 must be > 0.0"),
    (1.5, dict(high=1.0), r"gamma=1.5 must be <= 1.0"),
    (1.0, dict(high=1.0, high_inclusive=False), r"gamma=1.0 must be < 1.0"),
    (2.0, dict(low=0.0, high=1.0, high_inclusive=False), r"gamma=2.0 must be in \[0.0, 1.0\)"),
])
def test_range_rejects_numbers_outside_the_interval(value, bounds, message):
  with pytest.raises(ValueError, match=message):
    check.check_range("gamma", value, **bounds)


def test_range_lets_inside_values_bools_arrays_and_tracers_through():
  for value in (0.0, 0.5, 1.0, True, np.array([5.0])):
    check.check_range("gamma", value, low=0.0, high=1.0)
  jax.jit(lambda lam: check.check_range("lam", lam, low=0.0, high=1.0) or lam)(jnp.ones(3) * 7)


def test_batch_time_wants_rank_two_and_one_shape():
  check.check_batch_time(np.zeros((2, 3)), np.zeros((2, 3)), names=("a", "b"))
  with pytest.raises(ValueError, match=r"b must be a \[batch, time\] array; got shape \(3,\)"):
    check.check_batch_time(np.zeros((2, 3)), np.zeros(3), names=("a", "b"))
  with pytest.raises(ValueError, match="shape mismatch between"):
    check.check_batch_time(np.zeros((2, 3)), np.zeros((2, 4)), names=("a", "b"))


def test_per_row_and_dtype_checks():
  check.check_per_row(np.zeros(4), "lam", 4)
  with pytest.raises(ValueError, match=r"lam must have shape \[batch\]=\(4,\); got \(3,\)"):
    check.check_per_row(np.zeros(3), "lam", 4)
  check.check_floating(np.zeros(2, np.float16), "logp")
  with pytest.raises(TypeError, match="logp must be a floating-point array"):
    check.check_floating(np.zeros(2, np.int32), "logp")
  check.check_integer(np.zeros(2, np.int32), "tokens")
  with pytest.raises(TypeError, match="tokens must be an integer array"):
    check.check_integer(np.zeros(2, np.float32), "tokens")


def test_as_float32_upcasts_and_unpacks_one():
  one = check.as_float32(jnp.ones(2, jnp.bfloat16))
  assert one.dtype == jnp.float32
  pair = check.as_float32(np.ones(2, np.float16), np.ones(3, np.int32))
  assert [a.dtype for a in pair] == [jnp.float32, jnp.float32]
