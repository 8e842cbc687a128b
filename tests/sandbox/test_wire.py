"""The wire between the candidate's process and the trusted harness (sandbox/wire.py): plain
data round-trips, nothing else crosses, forged messages are refused."""

from __future__ import annotations

import math

import pytest

from rlhf_jax.sandbox import wire as wire


def test_plain_data_round_trips_and_nothing_else_crosses():
  value = {"a": [1, 2.5, None, True], (1, "x"): {3, 4}, "f": frozenset({b"\x00\xff"}),
           "c": complex(1, -2), "t": (1, (2, [3]))}
  assert wire.decode(wire.encode(value)) == value
  assert math.isnan(wire.decode(wire.encode(float("nan"))))

  class AlwaysEqualInt(int):
    def __eq__(self, other):
      return True
    __hash__ = int.__hash__

  crossed = wire.decode(wire.encode(AlwaysEqualInt(3)))
  assert type(crossed) is int and crossed == 3 and crossed != 4
  with pytest.raises(TypeError, match="not plain data"):
    wire.encode(object())
  for forged in ({"x": 1}, {"t": "abc"}, {"d": [[1]]}, {"d": [[[1], 2]]}, {"b": "zz"}, {}):
    with pytest.raises(wire.WireError):
      wire.decode(forged)
