"""benchmarks/async_sim.py against closed forms: constant lengths make every batch take the
same sampling time S, so synchronous steps take S + U and pipelined ones max(S, U)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "async_sim", Path(__file__).resolve().parents[2] / "benchmarks" / "async_sim.py")
sim = importlib.util.module_from_spec(SPEC)
sys.modules["async_sim"] = sim  # dataclasses look their module up there
SPEC.loader.exec_module(sim)


def test_continuous_batching_time_of_equal_and_ragged_lengths():
  # 10 samples of 5 tokens on 4 slots: three waves of 5 steps.
  assert sim.sampling_time(np.full(10, 5), servers=1, slots=4, decode_s=1.0) == 15
  # A long sample runs beside the short ones: max(long, total / slots) when it fits.
  assert sim.sampling_time(np.array([20, 2, 2, 2, 2, 2]), servers=1, slots=2, decode_s=1.0) == 20
  # Two servers split the work.
  assert sim.sampling_time(np.full(8, 5), servers=2, slots=2, decode_s=1.0) == 10


@pytest.mark.parametrize("update_s", [3.0, 20.0])
def test_steps_take_s_plus_u_in_turn_and_max_when_pipelined(update_s):
  s = sim.Setting(batch=8, median_len=5, sigma=1e-9, max_len=5, servers=1, slots=4,
                  decode_s=1.0, update_s=update_s, push_s=0.0)
  sampling = 10.0  # two waves of 5 steps
  steps = 400
  assert sim.simulate(s, 0, steps) == pytest.approx(sampling + update_s)
  assert sim.simulate(s, 1, steps) == pytest.approx(max(sampling, update_s), rel=0.01)
  assert sim.simulate(s, 2, steps) == pytest.approx(max(sampling, update_s), rel=0.01)
