"""The policy losses against NumPy references written from the papers' formulas: PPO's clipped
surrogate (with dual clip), GSPO, GSPO-token and CISPO (arXiv:2507.18071, arXiv:2506.13585
Eq. 4) — loss values, metrics and gradients — and the positive-example NLL and entropy
losses."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from jax.test_util import check_grads

from rlhf_jax import kernels
from tests.kernels.batches import ragged_mask
from tests.kernels.batches import random_batch
from tests.kernels.references import aggregate_reference

jax.config.update("jax_numpy_rank_promotion", "raise")

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum",
         "seq-mean-token-sum-norm")


def agg_coefficients(mask, mode):
  """[B, T] ∂aggregate/∂ℓ_{i,t}, from the aggregation formulas (horizon L = T)."""
  batch, time = mask.shape
  lengths = mask.sum(1)
  rows = max(int((lengths > 0).sum()), 1)
  coef = np.zeros(mask.shape)
  for i in range(batch):
    for t in range(time):
      if mask[i, t]:
        coef[i, t] = {"token-mean": 1 / max(mask.sum(), 1), "token-sum": 1.0,
                      "seq-mean-token-mean": 1 / (lengths[i] * rows),
                      "seq-mean-token-sum": 1 / rows,
                      "seq-mean-token-sum-norm": 1 / (rows * time)}[mode]
  return coef


def clip(x, low, high):
  return min(max(x, low), high)


def gspo_reference(logp, old, adv, mask, clip_low, clip_high, mode, weights=None,
                   token_level=False):
  """Loss, d loss / d logp and metrics, one sequence at a time (float64).

  s_i = exp(mean_{t∈M_i} Δ_t); GSPO: ℓ_i = max(−A_i s_i, −A_i clip(s_i)) on every token of
  i, ∂ℓ_i/∂log π_t = −A_i s_i / |M_i| unless the clip is active; GSPO-token: ℓ_{i,t} with
  A_{i,t} and ∂ℓ_{i,t}/∂log π_t = −A_{i,t} s_i (no cross-token term)."""
  logp, old, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
  w = np.ones_like(logp) if weights is None else np.asarray(weights, np.float64)
  coef = agg_coefficients(mask, mode)
  per_token, grad = np.zeros_like(logp), np.zeros_like(logp)
  upper = lower = rows = 0
  ratios = []
  for i in range(logp.shape[0]):
    valid = [t for t in range(logp.shape[1]) if mask[i, t]]
    if not valid:
      continue
    rows += 1
    n = len(valid)
    s = np.exp(sum(np.clip(logp[i, t] - old[i, t], -20, 20) for t in valid) / n)
    ratios.append(s)
    a_seq = sum(adv[i, t] for t in valid) / n
    seq_coef = sum(coef[i, t] * w[i, t] for t in valid)
    for t in valid:
      a = adv[i, t] if token_level else a_seq
      loss = max(-a * s, -a * clip(s, 1 - clip_low, 1 + clip_high))
      cut_up, cut_low = a > 0 and s > 1 + clip_high, a < 0 and s < 1 - clip_low
      per_token[i, t] = w[i, t] * loss
      if token_level:
        grad[i, t] = 0.0 if cut_up or cut_low else coef[i, t] * w[i, t] * (-a * s)
        upper, lower = upper + cut_up, lower + cut_low
      else:
        grad[i, t] = 0.0 if cut_up or cut_low else seq_coef * (-a * s / n)
    if not token_level:
      upper, lower = upper + cut_up, lower + cut_low
  count = max(mask.sum(), 1) if token_level else max(rows, 1)
  valid = mask > 0
  log_ratio = (logp - old)[valid]
  metrics = {"clip_frac_upper": upper / count, "clip_frac_lower": lower / count,
             "seq_ratio_mean": np.mean(ratios) if ratios else 0.0,
             "ppo_kl": -log_ratio.mean(),
             "approx_kl": (np.exp(log_ratio) - 1 - log_ratio).mean()}
  return aggregate_reference(per_token, mask, mode), grad, metrics


def cispo_reference(logp, old, adv, mask, clip_low, clip_high, mode, weights=None):
  """Loss, gradient and metrics token by token: ℓ = −ŕ·A·log π, ∂ℓ/∂log π = −ŕ·A."""
  logp, old, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
  w = np.ones_like(logp) if weights is None else np.asarray(weights, np.float64)
  coef = agg_coefficients(mask, mode)
  low = 0.0 if clip_low is None else 1 - clip_low
  per_token, grad = np.zeros_like(logp), np.zeros_like(logp)
  upper = lower = 0
  capped = []
  for i in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      if not mask[i, t]:
        continue
      r = np.exp(np.clip(logp[i, t] - old[i, t], -20, 20))
      r_hat = clip(r, low, 1 + clip_high)
      capped.append(r_hat)
      per_token[i, t] = -w[i, t] * r_hat * adv[i, t] * logp[i, t]
      grad[i, t] = coef[i, t] * w[i, t] * (-r_hat * adv[i, t])
      upper, lower = upper + (r > 1 + clip_high), lower + (r < low)
  n = max(mask.sum(), 1)
  metrics = {"clip_frac_upper": upper / n, "clip_frac_lower": lower / n,
             "is_weight_mean": np.mean(capped)}
  return aggregate_reference(per_token, mask, mode), grad, metrics


def sequence_batch(seed, batch=8, time=7, scale=0.4, noise=0.1):
  """Rows whose mean log-ratios straddle the clip range; per-row and per-token advantages."""
  rng = np.random.default_rng(seed)
  mask = ragged_mask(rng, batch, time)
  old = -rng.uniform(0.1, 3.0, (batch, time))
  offsets = np.linspace(-scale, scale, batch)[rng.permutation(batch)][:, None]
  logp = old + offsets + noise * rng.standard_normal((batch, time))
  row_adv = np.repeat(rng.standard_normal((batch, 1)), time, axis=1)
  token_adv = rng.standard_normal((batch, time))
  weights = rng.uniform(0.0, 2.0, (batch, time))
  f32 = lambda x: np.asarray(x, np.float32)
  return f32(logp), f32(old), f32(row_adv), f32(token_adv), mask, f32(weights)


def assert_metrics(metrics, expected):
  for key, value in expected.items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


class GspoTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      dict(clip_low=0.1, clip_high=0.15, agg="seq-mean-token-mean", weighted=False),
      dict(clip_low=0.1, clip_high=0.15, agg="token-mean", weighted=True),
      dict(clip_low=0.2, clip_high=0.05, agg="seq-mean-token-sum-norm", weighted=True),
      dict(clip_low=3e-4, clip_high=4e-4, agg="seq-mean-token-mean", weighted=False),
  )
  def test_matches_reference(self, clip_low, clip_high, agg, weighted):
    scale, noise = (0.4, 0.1) if clip_low > 1e-3 else (1.5e-3, 1e-4)
    logp, old, adv, _, mask, weights = sequence_batch(60, scale=scale, noise=noise)
    weights = weights if weighted else None
    loss_fn = functools.partial(kernels.gspo_policy_loss, clip_low=clip_low,
                                clip_high=clip_high, agg=agg)
    loss, metrics = self.variant(loss_fn)(logp, old, adv, mask, weights=weights)
    grad = self.variant(jax.grad(lambda lp: loss_fn(lp, old, adv, mask, weights=weights)[0]))(
        logp)
    ref_loss, ref_grad, ref_metrics = gspo_reference(logp, old, adv, mask, clip_low, clip_high,
                                                     agg, weights)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    assert_metrics(metrics, ref_metrics)
    # The batch has kept and clipped sequences, and clipped ones get no gradient.
    clipped = ref_metrics["clip_frac_upper"] + ref_metrics["clip_frac_lower"]
    self.assertTrue(0 < clipped < 1, clipped)
    self.assertGreater(np.abs(ref_grad).max(), 0)

  def test_clipped_sequences_get_no_gradient(self):
    """s_i > 1 + ε with A > 0, or s_i < 1 − ε with A < 0: the whole sequence is cut; the
    opposite signs keep the gradient −A_i s_i / |M_i| / G on every token."""
    old = np.zeros((4, 3), np.float32)
    logp = np.repeat(np.log(np.array([[1.5], [0.5], [1.5], [0.5]], np.float32)), 3, axis=1)
    adv = np.repeat(np.array([[1.0], [-1.0], [-1.0], [1.0]], np.float32), 3, axis=1)
    grad = jax.grad(lambda lp: kernels.gspo_policy_loss(
        lp, old, adv, np.ones((4, 3)), clip_low=0.2, clip_high=0.28)[0])(logp)
    expected = np.array([[0.0], [0.0], [1.5 / 3 / 4], [-0.5 / 3 / 4]]) * np.ones((1, 3))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)

  @parameterized.parameters(*MODES)
  def test_token_variant_equals_gspo_with_per_sequence_advantages(self, agg):
    """Same value and gradient when A_{i,t} = A_i and the weights are constant along a row
    (none, or mis_sequence's); per-token weights change only how GSPO-token spreads the
    sequence's gradient over its tokens."""
    logp, old, adv, _, mask, token_weights = sequence_batch(61)
    row_weights = np.repeat(token_weights[:, :1], token_weights.shape[1], axis=1)
    args = dict(clip_low=0.1, clip_high=0.15, agg=agg)
    for weights in (None, row_weights, token_weights):
      seq = lambda lp, w=weights: kernels.gspo_policy_loss(lp, old, adv, mask, weights=w,
                                                           **args)[0]
      tok = lambda lp, w=weights: kernels.gspo_token_policy_loss(lp, old, adv, mask, weights=w,
                                                                 **args)[0]
      np.testing.assert_allclose(tok(logp), seq(logp), rtol=1e-6, atol=1e-7)
      if weights is not token_weights:
        np.testing.assert_allclose(jax.grad(tok)(logp), jax.grad(seq)(logp), rtol=1e-5,
                                   atol=1e-8)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("seq-mean-token-mean", "token-mean")
  def test_token_variant_matches_reference(self, agg):
    logp, old, _, token_adv, mask, weights = sequence_batch(62)
    loss_fn = functools.partial(kernels.gspo_token_policy_loss, clip_low=0.1, clip_high=0.15,
                                agg=agg)
    loss, metrics = self.variant(loss_fn)(logp, old, token_adv, mask, weights=weights)
    grad = jax.grad(lambda lp: loss_fn(lp, old, token_adv, mask, weights=weights)[0])(logp)
    ref_loss, ref_grad, ref_metrics = gspo_reference(logp, old, token_adv, mask, 0.1, 0.15, agg,
                                                     weights, token_level=True)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    assert_metrics(metrics, ref_metrics)
    self.assertGreater(ref_metrics["clip_frac_upper"] + ref_metrics["clip_frac_lower"], 0)

  @parameterized.parameters(*MODES)
  def test_equal_token_ratios_reduce_to_ppo(self, agg):
    """Every token of a row with one ratio ρ_i: s_i = ρ_i, and GSPO is PPO-clip of ρ_i."""
    rng = np.random.default_rng(63)
    mask = ragged_mask(rng, 6, 5)
    old = (-rng.uniform(0.1, 3.0, (6, 5))).astype(np.float32)
    logp = (old + np.linspace(-0.4, 0.4, 6)[:, None]).astype(np.float32)
    adv = np.repeat(rng.standard_normal((6, 1)), 5, axis=1).astype(np.float32)
    args = dict(clip_low=0.2, clip_high=0.28, agg=agg)
    gspo = lambda lp: kernels.gspo_policy_loss(lp, old, adv, mask, **args)[0]
    ppo = lambda lp: kernels.ppo_policy_loss(lp, old, adv, mask, **args)[0]
    np.testing.assert_allclose(gspo(logp), ppo(logp), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(jax.grad(gspo)(logp), jax.grad(ppo)(logp), rtol=1e-4, atol=1e-7)

  @parameterized.parameters(
      *[(fn, agg) for fn in ("gspo_policy_loss", "gspo_token_policy_loss", "cispo_policy_loss")
        for agg in ("seq-mean-token-mean", "token-mean")])
  def test_row_splits_sum_to_the_whole_batch(self, name, agg):
    """Micro-batches split rows; with the whole batch's normalizer the pieces' losses and
    gradients add up to the unsplit ones."""
    logp, old, _, token_adv, mask, weights = sequence_batch(64)
    fn = getattr(kernels, name)
    clips = dict(clip_high=0.15) if name.startswith("cispo") else dict(clip_low=0.1,
                                                                      clip_high=0.15)
    norm = kernels.aggregation_normalizer(mask, mode=agg)

    def loss(lp, rows, normalizer):
      return fn(lp, old[rows], token_adv[rows], mask[rows], weights=weights[rows], agg=agg,
                agg_normalizer=normalizer, **clips)[0]

    whole = slice(0, 8)
    pieces = (slice(0, 3), slice(3, 8))
    total = sum(loss(logp[rows], rows, norm) for rows in pieces)
    np.testing.assert_allclose(total, loss(logp, whole, None), rtol=1e-5, atol=1e-7)
    grads = np.concatenate([jax.grad(loss)(logp[rows], rows, norm) for rows in pieces])
    np.testing.assert_allclose(grads, jax.grad(loss)(logp, whole, None), rtol=1e-5, atol=1e-8)

  @parameterized.parameters("gspo_policy_loss", "gspo_token_policy_loss", "cispo_policy_loss")
  def test_padding_log_probs_may_be_infinite(self, name):
    logp, old, _, token_adv, mask, _ = sequence_batch(65)
    fn = functools.partial(getattr(kernels, name), clip_high=0.15)
    padded = np.where(mask > 0, logp, -np.inf).astype(np.float32)
    old_padded = np.where(mask > 0, old, -np.inf).astype(np.float32)
    loss, metrics = fn(padded, old_padded, token_adv, mask)
    ref_loss, ref_metrics = fn(logp, old, token_adv, mask)
    chex.assert_trees_all_close((loss, metrics), (ref_loss, ref_metrics), rtol=1e-6)
    grad = jax.grad(lambda lp: fn(lp, old_padded, token_adv, mask)[0])(padded)
    ref_grad = jax.grad(lambda lp: fn(lp, old, token_adv, mask)[0])(logp)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-6)

  def test_bad_options(self):
    logp, old, adv, _, mask, _ = sequence_batch(66)
    for kwargs, pattern in [(dict(clip_low=1.0), "clip_low=1.0"),
                            (dict(clip_high=-1e-4), "clip_high=-0.0001"),
                            (dict(agg="mean"), "mode='mean'"),
                            (dict(weights=np.ones((8, 6), np.float32)), "shape mismatch")]:
      for fn in (kernels.gspo_policy_loss, kernels.gspo_token_policy_loss):
        with self.assertRaisesRegex(ValueError, pattern):
          fn(logp, old, adv, mask, **kwargs)
    with self.assertRaisesRegex(ValueError, "advantages must be a"):
      kernels.gspo_policy_loss(logp, old, adv[:, 0], mask)


class CispoTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      dict(clip_low=None, clip_high=0.28, agg="token-mean", weighted=False),
      dict(clip_low=0.2, clip_high=0.28, agg="seq-mean-token-mean", weighted=True),
      dict(clip_low=1.0, clip_high=4.0, agg="token-sum", weighted=True),
  )
  def test_matches_reference(self, clip_low, clip_high, agg, weighted):
    logp, old, _, adv, mask, weights = sequence_batch(70, scale=0.3, noise=0.5)
    weights = weights if weighted else None
    loss_fn = functools.partial(kernels.cispo_policy_loss, clip_low=clip_low,
                                clip_high=clip_high, agg=agg)
    loss, metrics = self.variant(loss_fn)(logp, old, adv, mask, weights=weights)
    grad = self.variant(jax.grad(lambda lp: loss_fn(lp, old, adv, mask, weights=weights)[0]))(
        logp)
    ref_loss, ref_grad, ref_metrics = cispo_reference(logp, old, adv, mask, clip_low, clip_high,
                                                      agg, weights)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-8)
    assert_metrics(metrics, ref_metrics)
    if clip_high < 1:
      self.assertGreater(ref_metrics["clip_frac_upper"], 0)  # the cap is exercised
    if clip_low is not None and clip_low < 1:
      self.assertGreater(ref_metrics["clip_frac_lower"], 0)

  def test_every_token_keeps_its_gradient(self):
    """Where PPO's clip zeroes the gradient (ρ out of range on the cut side), CISPO keeps
    −clip(r)·A / N; without a lower bound r itself."""
    old = np.zeros((1, 4), np.float32)
    logp = np.log(np.array([[1.5, 0.5, 1.1, 5.0]], np.float32))
    adv = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)
    mask = np.ones((1, 4))
    ppo = jax.grad(lambda lp: kernels.ppo_policy_loss(lp, old, adv, mask, clip_low=0.2,
                                                      clip_high=0.28)[0])(logp)
    np.testing.assert_allclose(ppo, [[0.0, 0.0, -1.1 / 4, 5.0 / 4]], rtol=1e-5, atol=1e-8)
    bounded = jax.grad(lambda lp: kernels.cispo_policy_loss(lp, old, adv, mask, clip_low=0.2,
                                                            clip_high=0.28)[0])(logp)
    np.testing.assert_allclose(bounded, [[-1.28 / 4, 0.8 / 4, -1.1 / 4, 1.28 / 4]], rtol=1e-5)
    unbounded = jax.grad(lambda lp: kernels.cispo_policy_loss(lp, old, adv, mask,
                                                              clip_high=0.28)[0])(logp)
    np.testing.assert_allclose(unbounded, [[-1.28 / 4, 0.5 / 4, -1.1 / 4, 1.28 / 4]],
                               rtol=1e-5)

  @parameterized.parameters(*MODES)
  def test_on_policy_gradient_equals_ppo(self, agg):
    _, old, _, adv, mask, weights = sequence_batch(71)
    ppo = lambda lp: kernels.ppo_policy_loss(lp, old, adv, mask, agg=agg, weights=weights)[0]
    cispo = lambda lp: kernels.cispo_policy_loss(lp, old, adv, mask, clip_low=0.9,
                                                 clip_high=10.0, agg=agg, weights=weights)[0]
    np.testing.assert_allclose(jax.grad(cispo)(old), jax.grad(ppo)(old), rtol=1e-5, atol=1e-8)

  def test_the_weight_is_a_constant(self):
    logp, old, _, adv, mask, _ = sequence_batch(72)
    grad_old = jax.grad(lambda o: kernels.cispo_policy_loss(logp, o, adv, mask,
                                                            clip_high=0.28)[0])(old)
    np.testing.assert_array_equal(grad_old, np.zeros_like(old))

  def test_bfloat16_inputs(self):
    logp, old, _, adv, mask, _ = sequence_batch(73)
    bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)
    loss, _ = kernels.cispo_policy_loss(bf16(logp), bf16(old), bf16(adv), mask, clip_high=0.28)
    rounded = lambda x: np.asarray(bf16(x), np.float32)
    ref, _, _ = cispo_reference(rounded(logp), rounded(old), rounded(adv), mask, None, 0.28,
                                "token-mean")
    self.assertEqual(loss.dtype, jnp.float32)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)

  def test_bad_options(self):
    logp, old, adv, _, mask, _ = sequence_batch(74)
    for kwargs, pattern in [(dict(clip_high=0.0), "clip_high=0.0 must be > 0"),
                            (dict(clip_high=0.2, clip_low=-0.1), "clip_low=-0.1"),
                            (dict(clip_high=0.2, agg="mean"), "mode='mean'")]:
      with self.assertRaisesRegex(ValueError, pattern):
        kernels.cispo_policy_loss(logp, old, adv, mask, **kwargs)
    with self.assertRaisesRegex(TypeError, "clip_high"):
      kernels.cispo_policy_loss(logp, old, adv, mask)  # pylint: disable=missing-kwoa


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
