"""T-PPO's in-flight pool (rlhf_jax.rollout.windows), without a model."""

import dataclasses

import pytest

from rlhf_jax.rollout import windows as windowed
from rlhf_jax.data import Example
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams

EOS = 0


def take_from(counter):
  def take(n):
    out = []
    for _ in range(n):
      counter[0] += 1
      out.append((Example(f"q{counter[0]}", "1", "arith"), [100 + counter[0]]))
    return out
  return take


def test_pool_keeps_its_size_and_continues_unfinished_responses():
  counter = [0]
  pool = windowed.WindowPool(4, group_size=3, window_tokens=2, max_new_tokens=5,
                             stop_token_ids=(EOS,))
  assert pool.fill(take_from(counter)) == 4
  # Two prompts were taken (3 + 3 samples); two samples of the second wait.
  assert counter[0] == 2 and len(pool.waiting) == 2
  assert [t.example.prompt for t in pool.in_flight] == ["q1", "q1", "q1", "q2"]
  base = SamplingParams(n=3, max_new_tokens=99, seed=5,
                        fire=FireSchedule(temperature=30.0, top_k=16))
  requests = pool.requests(base, seeds=[1, 2, 3, 4])
  assert [p for p, _ in requests] == [[101]] * 3 + [[102]]
  assert all(s.n == 1 and s.max_new_tokens == 2 and s.fire is not None for _, s in requests)
  assert [s.seed for _, s in requests] == [1, 2, 3, 4]
  # Row 0 stops at EOS; the others continue.
  segments = pool.advance([([7, EOS], [-0.1, -0.2]), ([7, 8], [-0.3, -0.4]),
                           ([9, 9], [-0.5, -0.6]), ([4, 4], [-0.7, -0.8])])
  assert [s.finished for s in segments] == [True, False, False, False]
  assert all(s.window_start == 0 for s in segments)
  assert len(pool.in_flight) == 3
  # The freed place goes to a waiting sample of q2.
  assert pool.fill(take_from(counter)) == 1 and counter[0] == 2
  requests = pool.requests(base, seeds=[5, 6, 7, 8])
  assert [p for p, _ in requests] == [[101, 7, 8], [101, 9, 9], [102, 4, 4], [102]]
  assert [s.fire is None for _, s in requests] == [True, True, True, False]
  segments = pool.advance([([1, 2], [0.0] * 2), ([EOS], [0.0]), ([3, 3], [0.0] * 2),
                           ([5, 6], [0.0] * 2)])
  assert [s.window_start for s in segments] == [2, 2, 2, 0]
  assert [s.finished for s in segments] == [False, True, False, False]
  assert segments[0].trajectory.tokens == [7, 8, 1, 2]
  assert segments[0].trajectory.logprobs == [-0.3, -0.4, 0.0, 0.0]
  # The last window is cut to the cap: 5 − 4 = 1 token.
  requests = pool.requests(base, seeds=[0, 0, 0])
  assert [s.max_new_tokens for _, s in requests] == [1, 1, 2]
  segments = pool.advance([([3], [0.0]), ([3], [0.0]), ([3, 3], [0.0] * 2)])
  assert [(s.finished, s.truncated) for s in segments] == [(True, True), (True, True),
                                                           (False, False)]


def test_pool_state_round_trips():
  counter = [0]
  pool = windowed.WindowPool(2, group_size=3, window_tokens=2, max_new_tokens=6,
                             stop_token_ids=(EOS,))
  pool.fill(take_from(counter))
  pool.advance([([1, 2], [-1.0, -2.0]), ([3, 4], [-3.0, -4.0])])
  copy = windowed.WindowPool(2, group_size=3, window_tokens=2, max_new_tokens=6,
                             stop_token_ids=(EOS,))
  copy.restore(pool.state())
  assert copy.state() == pool.state()
  assert [dataclasses.asdict(t) for t in copy.in_flight] == [
      dataclasses.asdict(t) for t in pool.in_flight]
  assert copy.longest_prompt(10) == pool.longest_prompt(10) == 10 + 4


def test_pool_checks_its_inputs():
  with pytest.raises(ValueError, match="window_tokens=0 must be >= 1"):
    windowed.WindowPool(2, group_size=1, window_tokens=0, max_new_tokens=4, stop_token_ids=())
  pool = windowed.WindowPool(2, group_size=1, window_tokens=2, max_new_tokens=4,
                             stop_token_ids=())
  pool.fill(take_from([0]))
  with pytest.raises(ValueError, match="got 1 seeds for 2 responses"):
    pool.requests(SamplingParams(), seeds=[1])
  with pytest.raises(ValueError, match="got 1 windows for 2 responses"):
    pool.advance([([1], [0.0])])
