"""DQO's soft λ-returns, clipped importance weights and losses against NumPy loops
written from the formulas (kernels/q_learning.py; docs/formulas.md#dqo)."""

import chex
import jax
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from rlhf_jax import kernels
from tests.kernels.batches import ragged_mask


def soft_returns_reference(rewards, values, log_ratio, traces, mask, beta, lam, gamma):
  """G_h = r_h + γV_{h+1} + γλc_{h+1}(G_{h+1} − βℓ_{h+1} − V_{h+1}), h+1 = the next valid
  token, nothing after the last one; one row at a time, backwards."""
  out = np.zeros_like(rewards, dtype=np.float64)
  for b in range(rewards.shape[0]):
    valid = [t for t in range(rewards.shape[1]) if mask[b, t] > 0]
    following = None
    for t in reversed(valid):
      if following is None:
        g = rewards[b, t]
      else:
        n = following
        g = (rewards[b, t] + gamma * values[b, n]
             + gamma * lam * traces[b, n] * (out[b, n] - beta * log_ratio[b, n] - values[b, n]))
      out[b, t] = g
      following = t
  return out


def inputs(seed, batch=6, time=11):
  rng = np.random.default_rng(seed)
  mask = ragged_mask(rng, batch, time)
  draw = lambda: rng.standard_normal((batch, time)).astype(np.float32)
  return draw(), draw(), 0.5 * draw(), rng.uniform(0.2, 1.0, (batch, time)).astype(
      np.float32), mask


class SoftLambdaReturnsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((0.0, 1.0), (0.5, 1.0), (0.95, 0.9), (1.0, 1.0))
  def test_matches_loop(self, lam, gamma):
    rewards, values, log_ratio, traces, mask = inputs(seed=3)
    fn = self.variant(lambda *a: kernels.soft_lambda_returns(*a, beta=0.3, lam=lam,
                                                             gamma=gamma))
    got = fn(rewards, values, log_ratio, traces, mask)
    expected = soft_returns_reference(rewards, values, log_ratio, traces, mask, 0.3, lam, gamma)
    np.testing.assert_allclose(got, expected * mask, rtol=1e-5, atol=1e-5)

  def test_lambda_one_is_soft_monte_carlo(self):
    rewards, values, log_ratio, _, mask = inputs(seed=4)
    got = kernels.soft_lambda_returns(rewards, values, log_ratio, np.ones_like(mask), mask,
                                      beta=0.2, lam=1.0)
    for b in range(mask.shape[0]):
      valid = np.flatnonzero(mask[b])
      for i, t in enumerate(valid):
        later = valid[i + 1:]
        expected = rewards[b, valid[i:]].sum() - 0.2 * log_ratio[b, later].sum()
        np.testing.assert_allclose(got[b, t], expected, rtol=1e-5, atol=1e-5)

  def test_consistent_q_is_a_fixed_point(self):
    # If Q_h = βℓ_h + V_h satisfies the soft Bellman equation exactly (Q_h = r_h + V_{h+1}),
    # every λ-return equals Q_h whatever the trace weights.
    rng = np.random.default_rng(5)
    batch, time = 4, 7
    mask = np.ones((batch, time), np.float32)
    values = rng.standard_normal((batch, time)).astype(np.float32)
    log_ratio = rng.standard_normal((batch, time)).astype(np.float32)
    q = 0.5 * log_ratio + values
    next_values = np.concatenate([values[:, 1:], np.zeros((batch, 1), np.float32)], axis=1)
    rewards = q - next_values
    for lam in (0.0, 0.3, 1.0):
      got = kernels.soft_lambda_returns(rewards, values, log_ratio,
                                        rng.uniform(0, 1, (batch, time)), mask, beta=0.5,
                                        lam=lam)
      np.testing.assert_allclose(got, q, rtol=1e-5, atol=1e-5)

  def test_bad_options(self):
    rewards, values, log_ratio, traces, mask = inputs(seed=6)
    with self.assertRaisesRegex(ValueError, "lam=1.5"):
      kernels.soft_lambda_returns(rewards, values, log_ratio, traces, mask, beta=0.1, lam=1.5)
    with self.assertRaisesRegex(ValueError, "beta=0"):
      kernels.soft_lambda_returns(rewards, values, log_ratio, traces, mask, beta=0, lam=0.5)


class LossesTest(parameterized.TestCase):

  def test_importance_weights(self):
    rng = np.random.default_rng(7)
    logp, behaviour = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    mask = ragged_mask(rng, 3, 5, holes=False, empty_row=False)
    got = kernels.clipped_importance_weights(logp, behaviour, mask, clip=1.2)
    np.testing.assert_allclose(got, np.minimum(np.exp(logp - behaviour), 1.2) * mask, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_losses_and_gradients(self):
    _, values, log_ratio, _, mask = inputs(seed=8)
    targets = np.random.default_rng(9).standard_normal(mask.shape).astype(np.float32)
    beta, count = 0.4, mask.sum()
    policy = self.variant(lambda l, v: kernels.dqo_policy_loss(l, v, targets, mask,
                                                               beta=beta)[0])
    value = self.variant(lambda v, l: kernels.dqo_value_loss(v, l, targets, mask,
                                                             beta=beta)[0])
    residual = beta * log_ratio + values - targets
    np.testing.assert_allclose(policy(log_ratio, values), np.sum(residual**2 * mask) / count,
                               rtol=1e-5)
    np.testing.assert_allclose(value(values, log_ratio), np.sum(residual**2 * mask) / count,
                               rtol=1e-5)
    # Each loss moves only its own side: d/dℓ = 2β·residual/N, d/dV = 2·residual/N.
    grad_ratio, grad_values_p = jax.grad(policy, argnums=(0, 1))(log_ratio, values)
    grad_values, grad_ratio_v = jax.grad(value, argnums=(0, 1))(values, log_ratio)
    np.testing.assert_allclose(grad_ratio, 2 * beta * residual * mask / count, rtol=1e-4,
                               atol=1e-7)
    np.testing.assert_allclose(grad_values, 2 * residual * mask / count, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(grad_values_p, 0.0)
    np.testing.assert_array_equal(grad_ratio_v, 0.0)


if __name__ == "__main__":
  absltest.main()
