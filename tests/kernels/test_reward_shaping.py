"""Overlong punishment, reward placement, KL-in-reward and PRM Clip / Delta."""

import functools

import chex
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

from rlhf_jax import kernels
from tests.kernels.batches import random_batch
from tests.kernels.references import reward_to_go
from tests.kernels.references import kl_reference


def overlong_reference(length, max_length, buffer_length, factor):
  """DAPO Eq. 13, branch by branch."""
  expected = max_length - buffer_length
  if length <= expected:
    return 0.0
  if length <= max_length:
    return factor * (expected - length) / buffer_length
  return -factor


class RewardShapingTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_overlong_penalty(self):
    lengths = np.array([0, 50, 60, 61, 70, 80, 81, 200])
    fn = self.variant(functools.partial(kernels.overlong_penalty, max_length=80,
                                        buffer_length=20, factor=0.5))
    expected = [overlong_reference(l, 80, 20, 0.5) for l in lengths]
    np.testing.assert_allclose(fn(lengths), expected, rtol=1e-6)

  def test_overlong_bad_options(self):
    with self.assertRaisesRegex(ValueError, "buffer_length=90"):
      kernels.overlong_penalty(np.array([1]), max_length=80, buffer_length=90)
    with self.assertRaisesRegex(ValueError, "lengths must be a"):
      kernels.overlong_penalty(np.ones((2, 2)), max_length=80, buffer_length=10)

  @chex.variants(with_jit=True, without_jit=True)
  def test_place_at_last_token(self):
    _, _, mask = random_batch(seed=60)
    scores = np.arange(1, mask.shape[0] + 1, dtype=np.float32)
    out = np.asarray(self.variant(kernels.place_at_last_token)(scores, mask))
    for i in range(mask.shape[0]):
      valid = np.flatnonzero(mask[i])
      expected = np.zeros(mask.shape[1])
      if valid.size:
        expected[valid[-1]] = scores[i]
      np.testing.assert_array_equal(out[i], expected)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_in_reward(self):
    rewards, logp, mask = random_batch(seed=61)
    ref = logp + np.random.default_rng(62).normal(0, 0.3, logp.shape).astype(np.float32)
    fn = self.variant(functools.partial(kernels.kl_in_reward, beta=0.05, estimator="k3"))
    shaped, kl = fn(rewards, logp, ref, mask)
    expected_kl = kl_reference(logp, ref, "k3") * mask
    np.testing.assert_allclose(kl, expected_kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shaped, (rewards - 0.05 * expected_kl) * mask, rtol=1e-5,
                               atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_prm_clip(self):
    rewards, _, mask = random_batch(seed=63)
    out = self.variant(functools.partial(kernels.prm_clip, eta=0.2))(rewards, mask)
    np.testing.assert_allclose(out, np.minimum(rewards - 0.2, 0) * mask, rtol=1e-6)
    self.assertTrue(np.all(np.asarray(out) <= 0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_prm_delta(self):
    rewards, _, mask = random_batch(seed=64)
    out = np.asarray(self.variant(kernels.prm_delta)(rewards, mask))
    for i in range(rewards.shape[0]):
      steps = np.flatnonzero(mask[i])
      expected = np.zeros(rewards.shape[1])
      for k, t in enumerate(steps):
        following = rewards[i, steps[k + 1]] if k + 1 < len(steps) else 0.0
        expected[t] = rewards[i, t] - following
      np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-6)

  @given(st.integers(0, 1000), st.floats(-1, 1))
  def test_delta_return_telescopes_and_clip_is_bounded(self, seed, eta):
    # Gao et al.: with Delta the return from step t is r_t itself; with Clip the
    # return never grows when steps are added.
    rewards, _, mask = random_batch(seed=seed, batch=3, time=7)
    returns = reward_to_go(np.asarray(kernels.prm_delta(rewards, mask)), mask)
    np.testing.assert_allclose(returns, rewards * mask, atol=1e-5)
    clipped = np.asarray(kernels.prm_clip(rewards, mask, eta=eta))
    clipped_returns = reward_to_go(clipped, mask)
    self.assertTrue(np.all(np.diff(clipped_returns * mask, axis=1)[mask[:, 1:] * mask[:, :-1] > 0]
                           >= -1e-6))


if __name__ == "__main__":
  absltest.main()
