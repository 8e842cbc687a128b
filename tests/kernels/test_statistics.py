"""Masked statistics against NumPy on the valid entries."""

import chex
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from rlhf_jax import kernels
from tests.kernels.batches import random_batch


class StatisticsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_mean_var_whiten(self):
    x, _, mask = random_batch(seed=30)
    valid = x[mask > 0].astype(np.float64)
    np.testing.assert_allclose(self.variant(kernels.masked_mean)(x, mask), valid.mean(),
                               rtol=1e-5)
    np.testing.assert_allclose(self.variant(kernels.masked_var)(x, mask), valid.var(ddof=1),
                               rtol=1e-5)
    whitened = np.asarray(self.variant(kernels.masked_whiten)(x, mask))
    expected = (x - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(whitened[mask > 0], expected[mask > 0], rtol=1e-4, atol=1e-5)
    self.assertTrue(np.all(whitened[mask == 0] == 0))
    kept = np.asarray(kernels.masked_whiten(x, mask, shift_mean=False))
    np.testing.assert_allclose(kept[mask > 0], expected[mask > 0] + valid.mean(), rtol=1e-4,
                               atol=1e-5)

  def test_per_axis_mean(self):
    x, _, mask = random_batch(seed=31)
    out = np.asarray(kernels.masked_mean(x, mask, axis=1))
    for i in range(x.shape[0]):
      expected = x[i][mask[i] > 0].mean() if mask[i].any() else 0.0
      np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-7)

  def test_degenerate_counts(self):
    x = np.array([[3.0, 4.0]], np.float32)
    self.assertEqual(float(kernels.masked_var(x, np.array([[1.0, 0.0]]))), 0.0)
    self.assertEqual(float(kernels.masked_var(x, np.zeros((1, 2)))), 0.0)
    self.assertEqual(float(kernels.masked_mean(x, np.zeros((1, 2)))), 0.0)
    np.testing.assert_array_equal(kernels.masked_whiten(x, np.zeros((1, 2))), np.zeros((1, 2)))

  def test_explained_variance(self):
    returns, noise, mask = random_batch(seed=32, empty_row=False)
    self.assertAlmostEqual(float(kernels.explained_variance(returns, returns, mask)), 1.0,
                           places=5)
    values = returns + 0.3 * noise
    valid = mask > 0
    expected = 1 - np.var((returns - values)[valid], ddof=1) / np.var(returns[valid], ddof=1)
    np.testing.assert_allclose(kernels.explained_variance(values, returns, mask), expected,
                               rtol=1e-4)


if __name__ == "__main__":
  absltest.main()
