"""GAE and its variants (decoupled λ, length-adaptive λ, truncation bootstrap) and the reverse
linear recurrence under them, against plain NumPy loops written from the papers' formulas."""

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
from tests.kernels.batches import random_batch
from tests.kernels.batches import ragged_mask
from tests.kernels.references import reward_to_go


# Compiled once per shape: the property tests draw many shapes, and op-by-op dispatch
# compiles every primitive anew for each of them.
jitted_gae = jax.jit(kernels.gae, static_argnames=("gamma", "lam", "method"))


# ---------------------------------------------------------------- references


def gae_reference(rewards, values, mask, gamma, lam, bootstrap=None):
  """Schulman et al. Eq. 16 over the valid positions of each row, one row at a time."""
  batch, time = rewards.shape
  lam = np.broadcast_to(np.asarray(lam, np.float64), (batch,))
  advantages = np.zeros((batch, time))
  returns = np.zeros((batch, time))
  for i in range(batch):
    valid = [t for t in range(time) if mask[i, t] > 0]
    next_value = 0.0 if bootstrap is None else float(bootstrap[i])
    running = 0.0
    for t in reversed(valid):
      delta = rewards[i, t] + gamma * next_value - values[i, t]
      running = delta + gamma * lam[i] * running
      advantages[i, t] = running
      returns[i, t] = running + values[i, t]
      next_value = values[i, t]
  return advantages, returns


# --------------------------------------------------------------------- tests


class GaeTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"], gamma=[1.0, 0.9],
                         lam=[1.0, 0.95, 0.0])
  def test_matches_reference(self, method, gamma, lam):
    rewards, values, mask = random_batch(seed=1)
    fn = self.variant(functools.partial(kernels.gae, gamma=gamma, lam=lam, method=method))
    advantages, returns = fn(rewards, values, mask)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(advantages, ref_adv, atol=1e-5)
    np.testing.assert_allclose(returns, ref_ret, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_per_row_lambda_and_bootstrap(self):
    rewards, values, mask = random_batch(seed=2)
    lam = np.linspace(0.0, 1.0, rewards.shape[0]).astype(np.float32)
    bootstrap = np.random.default_rng(3).standard_normal(rewards.shape[0]).astype(np.float32)
    fn = self.variant(functools.partial(kernels.gae, gamma=1.0))
    advantages, returns = fn(rewards, values, mask, lam=lam, bootstrap_values=bootstrap)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, 1.0, lam, bootstrap)
    np.testing.assert_allclose(advantages, ref_adv, atol=1e-5)
    np.testing.assert_allclose(returns, ref_ret, atol=1e-5)

  def test_extended_gae_truncated_row(self):
    # T-PPO: a row truncated at length l bootstraps with V(s_l) := V(s_{l-1}),
    # so with zero rewards its last TD error is 0.
    values = np.array([[0.3, 0.5, 0.7, 0.0]], np.float32)
    mask = np.array([[1, 1, 1, 0]], np.float32)
    rewards = np.zeros_like(values)
    advantages, _ = kernels.gae(rewards, values, mask, gamma=1.0, lam=1.0,
                                bootstrap_values=values[:, 2])
    np.testing.assert_allclose(advantages[0, :3], [0.4, 0.2, 0.0], atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.95, 1.0)
  def test_extended_gae_matches_the_explicit_sum(self, lam):
    # T-PPO Eq. 6: Â_t = Σ_{k=0}^{l−t−1} (γλ)^k δ_{t+k}, δ_j = r_j + γV(s_{j+1}) − V(s_j),
    # V(s_l) := V(s_{l−1}) for an unfinished row, V(s_l) = 0 for a finished one.
    rewards, values, _ = random_batch(seed=6)
    batch, time = values.shape
    lengths = np.random.default_rng(7).integers(1, time + 1, size=batch)
    lengths[0] = 0  # an empty row
    mask = (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32)
    finished = np.arange(batch) % 2 == 1
    gamma = 0.9
    bootstrap = self.variant(kernels.truncation_bootstrap_values)(values, mask, finished)
    advantages, _ = kernels.gae(rewards * mask, values, mask, gamma=gamma, lam=lam,
                                bootstrap_values=bootstrap)
    expected = np.zeros((batch, time))
    for i in range(batch):
      l = lengths[i]
      v = list(values[i, :l].astype(np.float64))
      v.append(0.0 if finished[i] or l == 0 else v[l - 1])
      deltas = [rewards[i, j] + gamma * v[j + 1] - v[j] for j in range(l)]
      for t in range(l):
        expected[i, t] = sum((gamma * lam) ** k * deltas[t + k] for k in range(l - t))
    np.testing.assert_allclose(advantages, expected, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(bootstrap)[finished], 0.0)
    self.assertEqual(float(bootstrap[0]), 0.0)

  def test_truncation_bootstrap_values_checks_shapes(self):
    with self.assertRaisesRegex(ValueError, r"finished must have shape \(2,\)"):
      kernels.truncation_bootstrap_values(np.zeros((2, 3)), np.ones((2, 3)), np.ones(3, bool))

  def test_masked_positions_are_zero_and_ignored(self):
    rewards, values, mask = random_batch(seed=4)
    advantages, returns = kernels.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    self.assertTrue(np.all(np.asarray(advantages)[mask == 0] == 0))
    self.assertTrue(np.all(np.asarray(returns)[mask == 0] == 0))
    # Changing rewards/values where mask is 0 must not change anything.
    noise = np.where(mask == 0, 100.0, 0.0).astype(np.float32)
    advantages2, returns2 = kernels.gae(rewards + noise, values - noise, mask,
                                        gamma=1.0, lam=0.95)
    np.testing.assert_array_equal(advantages, advantages2)
    np.testing.assert_array_equal(returns, returns2)

  def test_bfloat16_inputs(self):
    rewards, values, mask = random_batch(seed=5)
    advantages, _ = kernels.gae(jnp.asarray(rewards, jnp.bfloat16),
                                jnp.asarray(values, jnp.bfloat16), mask, gamma=1.0, lam=0.95)
    self.assertEqual(advantages.dtype, jnp.float32)
    rounded = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)
    ref_adv, _ = gae_reference(rounded(rewards), rounded(values), mask, 1.0, 0.95)
    np.testing.assert_allclose(advantages, ref_adv, atol=1e-5)

  def test_scan_and_associative_agree_on_long_rows(self):
    rng = np.random.default_rng(6)
    mask = ragged_mask(rng, 4, 2048)
    rewards = rng.standard_normal((4, 2048)).astype(np.float32)
    values = rng.standard_normal((4, 2048)).astype(np.float32)
    a, _ = jitted_gae(rewards, values, mask, gamma=1.0, lam=0.99, method="scan")
    b, _ = jitted_gae(rewards, values, mask, gamma=1.0, lam=0.99, method="associative")
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=1e-4)

  def test_second_call_does_not_recompile(self):
    @jax.jit
    @chex.assert_max_traces(n=1)
    def fn(rewards, values, mask):
      return kernels.gae(rewards, values, mask, gamma=1.0, lam=0.95)

    for seed in range(3):
      rewards, values, mask = random_batch(seed=seed)
      jax.block_until_ready(fn(rewards, values, mask))

  def test_bad_inputs_raise_with_names(self):
    rewards, values, mask = random_batch()
    with self.assertRaisesRegex(ValueError, "lam=1.5"):
      kernels.gae(rewards, values, mask, gamma=1.0, lam=1.5)
    with self.assertRaisesRegex(ValueError, "gamma=-0.1"):
      kernels.gae(rewards, values, mask, gamma=-0.1, lam=1.0)
    with self.assertRaisesRegex(ValueError, "shape mismatch"):
      kernels.gae(rewards, values[:, :-1], mask, gamma=1.0, lam=1.0)
    with self.assertRaisesRegex(ValueError, "bootstrap_values"):
      kernels.gae(rewards, values, mask, gamma=1.0, lam=1.0, bootstrap_values=np.zeros(2))
    with self.assertRaisesRegex(ValueError, "lam must have shape"):
      kernels.gae(rewards, values, mask, gamma=1.0, lam=np.zeros(2))
    with self.assertRaisesRegex(ValueError, "method='fast'"):
      kernels.gae(rewards, values, mask, gamma=1.0, lam=1.0, method="fast")
    with self.assertRaisesRegex(TypeError, "rewards must be a floating"):
      kernels.gae(rewards.astype(np.int32), values, mask, gamma=1.0, lam=1.0)


@st.composite
def masked_batches(draw):
  seed = draw(st.integers(0, 2**16))
  batch = draw(st.integers(1, 4))
  time = draw(st.integers(1, 12))
  return random_batch(seed=seed, batch=batch, time=time,
                      holes=draw(st.booleans()), empty_row=draw(st.booleans()))


class GaePropertiesTest(absltest.TestCase):

  @given(masked_batches())
  def test_gamma_lambda_one_is_reward_to_go_minus_value(self, batch):
    rewards, values, mask = batch
    advantages, returns = jitted_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    rtg = reward_to_go(rewards, mask)
    np.testing.assert_allclose(advantages, (rtg - values) * mask, atol=1e-4)
    np.testing.assert_allclose(returns, rtg, atol=1e-4)

  @given(masked_batches())
  def test_lambda_zero_is_one_step_td(self, batch):
    rewards, values, mask = batch
    advantages, _ = jitted_gae(rewards, values, mask, gamma=0.9, lam=0.0)
    ref, _ = gae_reference(rewards, values, mask, 0.9, 0.0)
    np.testing.assert_allclose(advantages, ref, atol=1e-5)


class RecurrenceTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("scan", "associative")
  def test_matches_loop(self, method):
    rewards, decay, mask = random_batch(seed=15)
    out = self.variant(functools.partial(kernels.reverse_linear_recurrence, method=method))(
        rewards, decay, mask)
    expected = np.zeros(rewards.shape)
    for i in range(rewards.shape[0]):
      carry = 0.0
      for t in reversed(range(rewards.shape[1])):
        if mask[i, t]:
          carry = rewards[i, t] + decay[i, t] * carry
        expected[i, t] = carry
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


class DecoupledGaeTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_actor_and_critic_lambdas(self):
    rewards, values, mask = random_batch(seed=7)
    lengths = mask.sum(axis=1)
    actor_lam = np.asarray(kernels.length_adaptive_lambda(lengths, alpha=0.5))
    fn = self.variant(functools.partial(kernels.decoupled_gae, gamma=1.0, critic_lam=1.0))
    advantages, returns = fn(rewards, values, mask, actor_lam=actor_lam)
    ref_adv, _ = gae_reference(rewards, values, mask, 1.0, actor_lam)
    np.testing.assert_allclose(advantages, ref_adv, atol=1e-5)
    # λ_critic = 1 with γ = 1: Monte-Carlo targets, independent of V.
    np.testing.assert_allclose(returns, reward_to_go(rewards, mask), atol=1e-5)

  def test_critic_lambda_other_than_one(self):
    rewards, values, mask = random_batch(seed=8)
    _, returns = kernels.decoupled_gae(rewards, values, mask, gamma=0.99, actor_lam=0.9,
                                       critic_lam=0.5)
    _, ref_ret = gae_reference(rewards, values, mask, 0.99, 0.5)
    np.testing.assert_allclose(returns, ref_ret, atol=1e-5)


class LengthAdaptiveLambdaTest(absltest.TestCase):

  def test_formula_and_clamp(self):
    lengths = np.array([0, 10, 20, 21, 1000, 10000])
    lam = np.asarray(kernels.length_adaptive_lambda(lengths, alpha=0.05))
    expected = [0.0, 0.0, 0.0, 1 - 1 / (0.05 * 21), 0.98, 0.998]
    np.testing.assert_allclose(lam, expected, rtol=1e-5)
    self.assertTrue(np.all((lam >= 0) & (lam < 1)))
    huge = kernels.length_adaptive_lambda(np.array([1e12]), alpha=0.05)
    self.assertLess(float(huge[0]), 1.0)

  def test_bad_alpha(self):
    with self.assertRaisesRegex(ValueError, "alpha=0"):
      kernels.length_adaptive_lambda(np.array([10]), alpha=0)


if __name__ == "__main__":
  absltest.main()
