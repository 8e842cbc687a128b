"""Fitting Q♯'s guide (algorithms/qsharp_fit.py) with scripted samplers: π_ref roll-outs after
a guided roll-in of t ~ U[1, R) tokens (none in round 0), the positions that count from the
switch on, datasets aggregated over rounds, and the head fitted on them."""

from __future__ import annotations

import numpy as np

from rlhf_jax.algorithms import qsharp
from rlhf_jax.algorithms.qsharp_fit import GuideData
from rlhf_jax.algorithms.qsharp_fit import fit_guide
from rlhf_jax.algorithms.qsharp_fit import rollouts
from tests.fakes import FakeSampler

GUIDED, REFERENCE, STOP, R = 7, 8, 2, 6


def always(token):
  """A sampler's response: `token` for every new token it may write."""
  return lambda prompt, sampling, i: [token] * sampling.max_new_tokens


def test_round_zero_is_the_reference_alone():
  rows, responses, switches = rollouts(FakeSampler(always(REFERENCE)), None, [[1], [1, 2]],
                                       samples=2, max_new_tokens=R, stop=(STOP,), seed=0)
  assert rows == [[1], [1], [1, 2], [1, 2]]
  assert responses == [[REFERENCE] * R] * 4 and switches == [0] * 4


def test_a_guided_roll_in_then_the_reference_to_the_same_length():
  reference = FakeSampler(always(REFERENCE))
  rows, responses, switches = rollouts(reference, FakeSampler(always(GUIDED)), [[1]] * 5,
                                       samples=4, max_new_tokens=R, stop=(STOP,), seed=3)
  assert len(rows) == len(responses) == 20
  rollins = [r.count(GUIDED) for r in responses]
  assert all(1 <= t < R for t in rollins) and len(set(rollins)) > 1  # t ~ U[1, R)
  for response, t, switch in zip(responses, rollins, switches):
    assert response == [GUIDED] * t + [REFERENCE] * (R - t) and switch == t - 1
  (prompts, _), = reference.calls  # the reference continues each row after its roll-in
  assert all(p[:1] == [1] and set(p[1:]) == {GUIDED} for p in prompts)


def test_a_roll_in_that_stopped_is_not_rolled_out():
  reference = FakeSampler(always(REFERENCE))
  _, responses, _ = rollouts(reference, FakeSampler(always(STOP)), [[1]], samples=3,
                             max_new_tokens=R, stop=(STOP,), seed=0)
  assert all(set(r) == {STOP} for r in responses) and reference.calls[0][0] == []


def test_data_aggregate_and_the_head_fits_them():
  rng = np.random.default_rng(0)
  n, t, e, v = 16, 3, 4, 5
  first = GuideData(rng.standard_normal((n, t, e)).astype(np.float32),
                    rng.integers(0, v, (n, t)), np.ones((n, t), np.float32),
                    rng.choice([0.0, 1.0], n).astype(np.float32))
  second = GuideData(*(a[:2] for a in (first.hidden, first.actions, first.mask, first.returns)))
  both = first.extend(second)
  assert both.hidden.shape == (n + 2, t, e) and first.extend(None) is first
  np.testing.assert_array_equal(both.returns[n:], first.returns[:2])
  values = qsharp.bin_values(2, 0.0, 1.0)
  lines = []
  guide, losses = fit_guide(qsharp.init_guide(e, v, 2), first, values=values, steps=40,
                            batch_size=8, learning_rate=0.1, seed=0, log=lines.append)
  assert guide["w"].shape == (e, v * 2) and len(losses) == 40
  assert np.mean(losses[-5:]) < np.mean(losses[:5])  # log 2 at the zero head, then lower
  assert abs(losses[0] - np.log(2)) < 1e-5
  assert lines == [f"guide fitted on {n} rows: loss {losses[0]:.4f} → {losses[-1]:.4f}"]
