"""PPO policy loss, value loss, positive-example NLL and entropy loss."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from jax.test_util import check_grads

from rlhf_jax import kernels
from tests.kernels.batches import random_batch
from tests.kernels.references import aggregate_reference


def ppo_reference(logp, old_logp, adv, mask, clip_low, clip_high, dual_clip, mode,
                  weights=None):
  """Per token: PPO-clip with decoupled ε and dual clip, times the weight, then the aggregation."""
  batch, time = logp.shape
  per_token = np.zeros((batch, time))
  upper = lower = dual = 0
  for i in range(batch):
    for t in range(time):
      ratio = np.exp(np.clip(logp[i, t] - old_logp[i, t], -20, 20))
      a = adv[i, t]
      loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
      if dual_clip is not None and a < 0:
        loss = min(loss, -a * dual_clip)
      per_token[i, t] = loss if weights is None else weights[i, t] * loss
      if mask[i, t]:
        upper += a > 0 and ratio > 1 + clip_high
        lower += a < 0 and ratio < 1 - clip_low
        dual += dual_clip is not None and a < 0 and ratio > dual_clip
  n = max(mask.sum(), 1)
  return aggregate_reference(per_token, mask, mode), (upper / n, lower / n, dual / n)


def ppo_batch(seed, batch=5, time=8):
  rewards, values, mask = random_batch(seed=seed, batch=batch, time=time)
  rng = np.random.default_rng(seed + 100)
  old_logp = -rng.uniform(0.1, 3.0, (batch, time)).astype(np.float32)
  # Ratios spread over [e^-1.5, e^1.5] so every clip branch is exercised.
  logp = (old_logp + rng.uniform(-1.5, 1.5, (batch, time))).astype(np.float32)
  return logp, old_logp, rewards, mask


class PpoPolicyLossTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      dict(clip_low=0.2, clip_high=None, dual_clip=None, agg="token-mean"),
      dict(clip_low=0.2, clip_high=0.28, dual_clip=None, agg="token-mean"),
      dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="seq-mean-token-mean"),
      dict(clip_low=0.1, clip_high=0.5, dual_clip=1.5, agg="seq-mean-token-sum-norm"),
  )
  def test_matches_reference(self, clip_low, clip_high, dual_clip, agg):
    logp, old_logp, adv, mask = ppo_batch(seed=40)
    fn = self.variant(functools.partial(kernels.ppo_policy_loss, clip_low=clip_low,
                                        clip_high=clip_high, dual_clip=dual_clip, agg=agg))
    loss, metrics = fn(logp, old_logp, adv, mask)
    high = clip_low if clip_high is None else clip_high
    ref_loss, (upper, lower, dual) = ppo_reference(logp, old_logp, adv, mask, clip_low, high,
                                                   dual_clip, agg)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac_upper"], upper, atol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac_lower"], lower, atol=1e-6)
    np.testing.assert_allclose(metrics["dual_clip_frac"], dual, atol=1e-6)
    self.assertGreater(upper + lower, 0)  # the batch does exercise clipping
    valid = mask > 0
    log_ratio = (logp - old_logp)[valid]
    np.testing.assert_allclose(metrics["ppo_kl"], -log_ratio.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["approx_kl"],
                               (np.exp(log_ratio) - 1 - log_ratio).mean(), rtol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      dict(dual_clip=None, agg="token-mean"),
      dict(dual_clip=3.0, agg="seq-mean-token-mean"),
      dict(dual_clip=1.5, agg="token-sum"),
  )
  def test_importance_weights(self, dual_clip, agg):
    logp, old_logp, adv, mask = ppo_batch(seed=49)
    rng = np.random.default_rng(149)
    # TIS-like weights in [0, 2] with some dropped (0) tokens.
    weights = (rng.uniform(0.0, 2.0, logp.shape) * (rng.uniform(size=logp.shape) > 0.2)
               ).astype(np.float32)
    fn = self.variant(functools.partial(kernels.ppo_policy_loss, clip_low=0.2, clip_high=0.28,
                                        dual_clip=dual_clip, agg=agg))
    loss, metrics = fn(logp, old_logp, adv, mask, weights=weights)
    ref_loss, _ = ppo_reference(logp, old_logp, adv, mask, 0.2, 0.28, dual_clip, agg,
                                weights=weights)
    unweighted, _ = ppo_reference(logp, old_logp, adv, mask, 0.2, 0.28, dual_clip, agg)
    self.assertGreater(abs(ref_loss - unweighted), 1e-3)  # the weights do matter here
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    # weights=None is weights=ones, metrics included.
    plain = fn(logp, old_logp, adv, mask)
    ones = fn(logp, old_logp, adv, mask, weights=np.ones_like(weights))
    chex.assert_trees_all_close(plain, ones, rtol=1e-6, atol=0)
    np.testing.assert_allclose(plain[0], unweighted, rtol=1e-5, atol=1e-6)
    # Weights are constants; the policy gradient is scaled token by token.
    grad_logp, grad_weights = jax.grad(
        lambda lp, w: fn(lp, old_logp, adv, mask, weights=w)[0], argnums=(0, 1))(logp, weights)
    np.testing.assert_array_equal(grad_weights, np.zeros_like(weights))
    grad_plain = jax.grad(lambda lp: fn(lp, old_logp, adv, mask)[0])(logp)
    np.testing.assert_allclose(grad_logp, weights * grad_plain, rtol=1e-5, atol=1e-7)

  def test_gradient_against_finite_differences(self):
    logp, old_logp, adv, mask = ppo_batch(seed=41, batch=3, time=4)
    # Keep ratios away from the clip kinks, where the loss is not differentiable.
    logp = old_logp + np.array([[0.05, -0.3, 0.4, -0.02]] * 3, np.float32)

    def loss_of(lp):
      return kernels.ppo_policy_loss(lp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28,
                                     dual_clip=3.0)[0]

    check_grads(loss_of, (logp,), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)

  def test_clipped_tokens_get_no_gradient(self):
    old_logp = np.zeros((1, 4), np.float32)
    logp = np.log(np.array([[1.5, 0.5, 1.1, 5.0]], np.float32))
    adv = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)
    grad = jax.grad(lambda lp: kernels.ppo_policy_loss(
        lp, old_logp, adv, np.ones((1, 4)), clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0])(logp)
    # ρ=1.5>1.28 with A>0: clipped; ρ=0.5<0.8 with A<0: clipped; ρ=1.1 inside: −A·ρ/4;
    # ρ=5>c=3 with A<0: dual-clipped.
    np.testing.assert_allclose(grad, [[0.0, 0.0, -1.1 / 4, 0.0]], rtol=1e-5, atol=1e-7)

  def test_bfloat16_inputs(self):
    logp, old_logp, adv, mask = ppo_batch(seed=42)
    bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)
    loss, _ = kernels.ppo_policy_loss(bf16(logp), bf16(old_logp), bf16(adv), mask)
    rounded = lambda x: np.asarray(bf16(x), np.float32)
    ref, _ = ppo_reference(rounded(logp), rounded(old_logp), rounded(adv), mask, 0.2, 0.2, None,
                           "token-mean")
    self.assertEqual(loss.dtype, jnp.float32)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)

  def test_bad_options(self):
    logp, old_logp, adv, mask = ppo_batch(seed=43)
    for kwargs, pattern in [(dict(clip_low=1.0), "clip_low=1.0"),
                            (dict(clip_high=-0.1), "clip_high=-0.1"),
                            (dict(dual_clip=1.0), "dual_clip=1.0"),
                            (dict(agg="mean"), "mode='mean'"),
                            (dict(weights=np.ones((5, 7), np.float32)), "shape mismatch")]:
      with self.assertRaisesRegex(ValueError, pattern):
        kernels.ppo_policy_loss(logp, old_logp, adv, mask, **kwargs)


class ValueLossTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((0.5, "token-mean"), (0.2, "seq-mean-token-mean"),
                            (None, "token-mean"))
  def test_matches_reference(self, clip, agg):
    returns, old_values, mask = random_batch(seed=44)
    values = old_values + np.random.default_rng(45).uniform(-1, 1, old_values.shape).astype(
        np.float32)
    loss, metrics = self.variant(functools.partial(kernels.value_loss, clip=clip, agg=agg))(
        values, old_values, returns, mask)
    unclipped = (values - returns)**2
    if clip is None:
      per_token, clipped_more = unclipped, np.zeros_like(unclipped, bool)
    else:
      clipped_values = old_values + np.clip(values - old_values, -clip, clip)
      clipped = (clipped_values - returns)**2
      per_token, clipped_more = np.maximum(unclipped, clipped), clipped > unclipped
    np.testing.assert_allclose(loss, 0.5 * aggregate_reference(per_token, mask, agg), rtol=1e-5)
    np.testing.assert_allclose(metrics["value_clip_frac"],
                               clipped_more[mask > 0].mean(), atol=1e-6)

  def test_gradient_against_finite_differences(self):
    returns, old_values, mask = random_batch(seed=46, batch=3, time=4)
    values = old_values + 0.1
    check_grads(lambda v: kernels.value_loss(v, old_values, returns, mask, clip=0.5)[0],
                (values,), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)


class AuxiliaryLossesTest(absltest.TestCase):

  def test_positive_nll(self):
    logp, _, _, mask = ppo_batch(seed=47)
    is_positive = np.array([True, False, True, False, True])
    positive_mask = mask * is_positive[:, None]
    expected = -np.sum(logp * positive_mask) / positive_mask.sum()
    np.testing.assert_allclose(kernels.positive_nll_loss(logp, mask, is_positive), expected,
                               rtol=1e-5)
    self.assertEqual(float(kernels.positive_nll_loss(logp, mask, np.zeros(5, bool))), 0.0)
    grad = jax.grad(lambda lp: kernels.positive_nll_loss(lp, mask, is_positive))(logp)
    self.assertTrue(np.all(np.asarray(grad)[~is_positive] == 0))

  def test_entropy_loss_is_negative_mean_entropy(self):
    entropy, _, mask = random_batch(seed=48)
    entropy = np.abs(entropy)
    np.testing.assert_allclose(kernels.entropy_loss(entropy, mask),
                               -entropy[mask > 0].mean(), rtol=1e-5)


if __name__ == "__main__":
  absltest.main()
