"""The preference losses (DPO's sigmoid, IPO and hinge kinds, Bradley-Terry) and the
position-debiased preference, against NumPy written from their formulas."""

import functools

import chex
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from rlhf_jax import kernels


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
