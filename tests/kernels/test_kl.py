"""KL estimators (k1, k2, k3, abs and their straight-through "+" variants) and the adaptive
KL coefficient."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

from rlhf_jax import kernels
from tests.kernels.references import kl_reference


STRAIGHT_THROUGH = [e for e in kernels.KL_ESTIMATORS if e.endswith("+")]


class KlTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*kernels.KL_ESTIMATORS)
  def test_values(self, estimator):
    rng = np.random.default_rng(50)
    logp = -rng.uniform(0, 3, (3, 6)).astype(np.float32)
    ref = -rng.uniform(0, 3, (3, 6)).astype(np.float32)
    out = self.variant(functools.partial(kernels.kl_penalty, estimator=estimator))(logp, ref)
    np.testing.assert_allclose(out, kl_reference(logp, ref, estimator), rtol=1e-5, atol=1e-6)

  def test_k3_clamps(self):
    # |Δ| = 50: the log-ratio is clamped to ±20, then k3 (≥ 19 there) to 10.
    out = kernels.kl_penalty(np.array([-50.0, 50.0, 3.0], np.float32), np.zeros(3, np.float32),
                             estimator="k3")
    np.testing.assert_allclose(out, [10.0, 10.0, np.exp(-3.0) - 1.0 + 3.0], rtol=1e-6)

  def test_unknown_estimator_mentions_verl_names(self):
    with self.assertRaisesRegex(ValueError, "low_var_kl=k3"):
      kernels.kl_penalty(np.zeros(2, np.float32), np.zeros(2, np.float32),
                         estimator="low_var_kl")

  def test_every_estimator_has_a_straight_through_variant(self):
    bases = [e for e in kernels.KL_ESTIMATORS if not e.endswith("+")]
    self.assertEqual(sorted(STRAIGHT_THROUGH), sorted(b + "+" for b in bases))

  @given(st.sampled_from(STRAIGHT_THROUGH), st.integers(0, 1000))
  def test_straight_through_value_and_gradient(self, estimator, seed):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0, 3, 5).astype(np.float32)
    ref = -rng.uniform(0, 3, 5).astype(np.float32)
    value = kernels.kl_penalty(logp, ref, estimator=estimator)
    np.testing.assert_allclose(value, kl_reference(logp, ref, estimator), rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda lp: jnp.sum(kernels.kl_penalty(lp, ref, estimator=estimator)))(logp)
    np.testing.assert_allclose(grad, logp - ref, rtol=1e-5, atol=1e-6)  # ∇ ½Δ² = Δ

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*STRAIGHT_THROUGH)
  def test_straight_through_beyond_the_k3_clamps(self, estimator):
    # |Δ| up to 30: k3's value is clamped to 10 there, k1/abs are large; the
    # gradient is still Δ (that of ½Δ²), not the base estimator's (1, sign Δ, clamp 0).
    logp = np.array([[-30.0, -12.0, -0.5, -1.0], [-0.2, -3.0, -7.0, -2.5]], np.float32)
    ref = np.array([[-0.1, -0.7, -2.0, -1.0], [-25.0, -1.0, -0.3, -9.0]], np.float32)
    fn = self.variant(jax.value_and_grad(
        lambda lp: (jnp.sum(kernels.kl_penalty(lp, ref, estimator=estimator)),
                    kernels.kl_penalty(lp, ref, estimator=estimator)), has_aux=True))
    (_, value), grad = fn(logp)
    np.testing.assert_allclose(value, kl_reference(logp, ref, estimator), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, logp.astype(np.float64) - ref, rtol=1e-6, atol=1e-6)

  def test_adaptive_controller(self):
    # Ziegler et al.: e = clip(KL/target − 1, ±0.2); β ← β(1 + e·n/horizon).
    new = kernels.adaptive_kl_coefficient(0.1, 0.3, target=0.1, horizon=10000, n_steps=256)
    np.testing.assert_allclose(new, 0.1 * (1 + 0.2 * 256 / 10000), rtol=1e-6)
    new = kernels.adaptive_kl_coefficient(0.1, 0.09, target=0.1, horizon=10000, n_steps=256)
    np.testing.assert_allclose(new, 0.1 * (1 - 0.1 * 256 / 10000), rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
