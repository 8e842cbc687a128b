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


class PreferenceTest(parameterized.TestCase):

  def pairs(self, seed=70, n=6):
    rng = np.random.default_rng(seed)
    return [(-rng.uniform(5, 30, n)).astype(np.float32) for _ in range(4)]

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(("sigmoid", 0.0), ("sigmoid", 0.1), ("ipo", 0.0), ("hinge", 0.0))
  def test_dpo(self, kind, label_smoothing):
    chosen, rejected, ref_chosen, ref_rejected = self.pairs()
    beta = 0.3
    fn = self.variant(functools.partial(kernels.dpo_loss, beta=beta, kind=kind,
                                        label_smoothing=label_smoothing))
    loss, metrics = fn(chosen, rejected, ref_chosen, ref_rejected)
    z = (chosen.astype(np.float64) - ref_chosen) - (rejected - ref_rejected)
    log_sigmoid = lambda x: -np.log1p(np.exp(-x))
    if kind == "sigmoid":
      expected = -(1 - label_smoothing) * log_sigmoid(beta * z) - label_smoothing * log_sigmoid(
          -beta * z)
    elif kind == "ipo":
      expected = (z - 1 / (2 * beta))**2
    else:
      expected = np.maximum(0, 1 - beta * z)
    np.testing.assert_allclose(loss, expected.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["reward_accuracy"], np.mean(z > 0), atol=1e-6)
    np.testing.assert_allclose(metrics["reward_margin"], beta * z.mean(), rtol=1e-4)

  @parameterized.parameters("sigmoid", "ipo")
  def test_dpo_weights_drop_pairs(self, kind):
    chosen, rejected, ref_chosen, ref_rejected = self.pairs(seed=74)
    weights = np.array([1, 0, 1, 1, 0, 1], np.float32)
    keep = weights > 0
    loss, metrics = kernels.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.2,
                                     kind=kind, weights=weights)
    kept_loss, kept_metrics = kernels.dpo_loss(chosen[keep], rejected[keep], ref_chosen[keep],
                                               ref_rejected[keep], beta=0.2, kind=kind)
    np.testing.assert_allclose(loss, kept_loss, rtol=1e-6)
    for key, value in kept_metrics.items():
      np.testing.assert_allclose(metrics[key], value, rtol=1e-6, atol=1e-7)
    # A global normalizer (gradient accumulation): Σ w·ℓ / N.
    scaled, _ = kernels.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.2,
                                 kind=kind, weights=weights, normalizer=8.0)
    np.testing.assert_allclose(scaled, kept_loss * keep.sum() / 8.0, rtol=1e-6)

  def test_dpo_gradient_pushes_chosen_up(self):
    import jax
    chosen, rejected, ref_chosen, ref_rejected = self.pairs(seed=71)
    grads = jax.grad(lambda c, r: kernels.dpo_loss(c, r, ref_chosen, ref_rejected)[0],
                     argnums=(0, 1))(chosen, rejected)
    self.assertTrue(np.all(np.asarray(grads[0]) < 0))
    self.assertTrue(np.all(np.asarray(grads[1]) > 0))

  @parameterized.parameters("sigmoid", "ipo", "hinge")
  def test_dpo_gradient_against_finite_differences(self, kind):
    from jax.test_util import check_grads
    chosen, rejected, ref_chosen, ref_rejected = [x / 10 for x in self.pairs(seed=73, n=4)]
    check_grads(lambda c, r: kernels.dpo_loss(c, r, ref_chosen, ref_rejected, beta=0.5,
                                              kind=kind)[0],
                (chosen, rejected), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)

  def test_dpo_errors(self):
    chosen, rejected, ref_chosen, ref_rejected = self.pairs()
    with self.assertRaisesRegex(ValueError, "kind='kto'"):
      kernels.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, kind="kto")
    with self.assertRaisesRegex(ValueError, "label_smoothing=0.1 is only defined"):
      kernels.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, kind="ipo",
                       label_smoothing=0.1)
    with self.assertRaisesRegex(ValueError, "shape mismatch"):
      kernels.dpo_loss(chosen, rejected[:3], ref_chosen, ref_rejected)

  def test_bradley_terry(self):
    chosen, rejected, margin, _ = self.pairs(seed=72)
    chosen, rejected, margin = chosen / 10, rejected / 10, np.abs(margin) / 30
    expected = np.mean(np.log1p(np.exp(-(chosen - rejected - margin))))
    np.testing.assert_allclose(kernels.bradley_terry_loss(chosen, rejected, margin=margin),
                               expected, rtol=1e-5)

  def test_position_debiased_preference(self):
    first = np.array([0.9, 0.5, 0.2], np.float32)
    swapped = np.array([0.3, 0.5, 0.8], np.float32)
    out = kernels.position_debiased_preference(first, swapped)
    np.testing.assert_allclose(out, [0.8, 0.5, 0.2], rtol=1e-6)
    # Antisymmetry: swapping the roles gives 1 − P.
    np.testing.assert_allclose(kernels.position_debiased_preference(swapped, first),
                               1 - np.asarray(out), rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
