"""Rollout correction: truncated / masked importance weights for the sampler–trainer mismatch."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from rlhf_jax import kernels
from tests.kernels.batches import ragged_mask

METRICS = ("logprob_mismatch_max", "logprob_mismatch_mean", "logprob_mismatch_k3",
           "is_ratio_min", "is_ratio_max",
           "is_ratio_mean", "correction_clipped_frac", "correction_masked_frac")


def correction_reference(old, sampler, mask, mode, threshold):
  """Token-by-token loops in float64, from the formulas of the module docstring."""
  old, sampler = old.astype(np.float64), sampler.astype(np.float64)
  batch, time = old.shape
  weights, keep = np.zeros((batch, time)), np.zeros((batch, time))
  ratios, mismatches, k3, clipped = [], [], [], 0
  for i in range(batch):
    log_sequence_ratio = sum(old[i, t] - sampler[i, t] for t in range(time) if mask[i, t])
    sequence_ratio = np.exp(min(max(log_sequence_ratio, -20.0), 20.0))
    for t in range(time):
      if not mask[i, t]:
        continue
      delta = old[i, t] - sampler[i, t]
      ratio = np.exp(min(max(delta, -20.0), 20.0))
      ratios.append(ratio)
      mismatches.append(abs(delta))
      k3.append(ratio - 1.0 - np.log(ratio))
      if mode == "none":
        weights[i, t], keep[i, t] = 1.0, 1.0
      elif mode == "tis":
        weights[i, t], keep[i, t] = min(ratio, threshold), 1.0
        clipped += ratio > threshold
      elif mode == "mis_token":
        keep[i, t] = float(1.0 / threshold <= ratio <= threshold)
        weights[i, t] = ratio * keep[i, t]
      else:
        keep[i, t] = float(1.0 / threshold <= sequence_ratio <= threshold)
        weights[i, t] = sequence_ratio * keep[i, t]
  n = len(ratios)
  metrics = {
      "logprob_mismatch_max": max(mismatches, default=0.0),
      "logprob_mismatch_mean": float(np.mean(mismatches)) if n else 0.0,
      "logprob_mismatch_k3": float(np.mean(k3)) if n else 0.0,
      "is_ratio_min": min(ratios, default=1.0),
      "is_ratio_max": max(ratios, default=1.0),
      "is_ratio_mean": float(np.mean(ratios)) if n else 0.0,
      "correction_clipped_frac": clipped / n if n else 0.0,
      "correction_masked_frac": 1.0 - keep.sum() / n if n else 0.0,
  }
  return weights, keep, metrics


def mismatch_batch(seed=70, batch=6, time=9):
  """Sampler log-probs near the trainer's, with large mismatches here and there.

  Rows 0 and 2 differ by ~0.01 per token (trusted as sequences at C = 2), the
  others by ~0.4 plus ±3 outliers; one token differs by 30 (past the ±20 clamp).
  The mask is ragged with holes and an empty last row.
  """
  rng = np.random.default_rng(seed)
  mask = ragged_mask(rng, batch, time)
  mask[0, :4] = mask[2, :4] = mask[1, :2] = 1.0
  old = -rng.uniform(0.05, 4.0, (batch, time))
  scale = np.where(np.isin(np.arange(batch), [0, 2]), 0.01, 0.4)[:, None]
  noise = scale * rng.standard_normal((batch, time))
  outliers = rng.uniform(size=(batch, time)) < 0.15
  outliers[[0, 2]] = False
  noise += outliers * rng.choice([-3.0, 3.0], (batch, time))
  noise[1, 1] = 30.0
  sampler = old - noise
  return old.astype(np.float32), sampler.astype(np.float32), mask


class RolloutCorrectionTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(mode=kernels.ROLLOUT_CORRECTION_MODES, threshold=[2.0, 1.5])
  def test_matches_reference(self, mode, threshold):
    old, sampler, mask = mismatch_batch()
    fn = self.variant(functools.partial(kernels.rollout_correction, mode=mode,
                                        threshold=threshold))
    weights, keep, metrics = fn(old, sampler, mask)
    ref_weights, ref_keep, ref_metrics = correction_reference(old, sampler, mask, mode,
                                                              threshold)
    self.assertEqual(weights.dtype, jnp.float32)
    self.assertEqual(keep.dtype, jnp.float32)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(keep, ref_keep)
    self.assertEqual(sorted(metrics), sorted(METRICS))
    for name in METRICS:
      self.assertEqual(metrics[name].shape, ())
      self.assertEqual(metrics[name].dtype, jnp.float32)
      np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5, atol=1e-6,
                                 err_msg=name)
    # Masked-out positions are 0 in both outputs.
    self.assertTrue(np.all(np.asarray(weights)[mask == 0] == 0))
    self.assertTrue(np.all(np.asarray(keep)[mask == 0] == 0))

  def test_batch_exercises_clipping_and_masking(self):
    # Guards the reference comparison above against a batch where nothing triggers.
    old, sampler, mask = mismatch_batch()
    for threshold in (2.0, 1.5):
      _, _, tis = correction_reference(old, sampler, mask, "tis", threshold)
      self.assertGreater(tis["correction_clipped_frac"], 0.0)
      self.assertLess(tis["correction_clipped_frac"], 1.0)
      self.assertEqual(tis["is_ratio_max"], np.exp(20.0))  # the ±20 clamp is hit
      for mode in ("mis_token", "mis_sequence"):
        _, keep, metrics = correction_reference(old, sampler, mask, mode, threshold)
        self.assertGreater(metrics["correction_masked_frac"], 0.0)
        self.assertLess(metrics["correction_masked_frac"], 1.0)
      # Sequence masking keeps whole rows: some kept, some dropped.
      _, keep, _ = correction_reference(old, sampler, mask, "mis_sequence", threshold)
      rows = mask.sum(axis=1) > 0
      kept_rows = keep.sum(axis=1) > 0
      self.assertTrue(np.any(kept_rows[rows]) and not np.all(kept_rows[rows]))
      np.testing.assert_array_equal(keep[kept_rows], mask[kept_rows])

  @parameterized.parameters(*kernels.ROLLOUT_CORRECTION_MODES)
  def test_just_inside_and_outside_the_trust_region(self, mode):
    # log r = ±log C ± 0.005: one row per token so sequence ratios equal token ratios.
    threshold = 1.7
    deltas = np.array([np.log(threshold) - 0.005, np.log(threshold) + 0.005,
                       -np.log(threshold) + 0.005, -np.log(threshold) - 0.005])
    sampler = np.full((4, 2), -1.0)
    old = sampler + np.stack([deltas, np.zeros(4)], axis=1)
    mask = np.array([[1.0, 0.0]] * 4)
    weights, keep, metrics = kernels.rollout_correction(
        old.astype(np.float32), sampler.astype(np.float32), mask, mode=mode,
        threshold=threshold)
    ratios = np.exp(deltas)
    inside = np.array([1.0, 0.0, 1.0, 0.0])
    expected_weights = {"none": np.ones(4), "tis": np.minimum(ratios, threshold),
                        "mis_token": ratios * inside, "mis_sequence": ratios * inside}[mode]
    expected_keep = inside if mode.startswith("mis") else np.ones(4)
    np.testing.assert_allclose(np.asarray(weights)[:, 0], expected_weights, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(keep)[:, 0], expected_keep)
    np.testing.assert_allclose(metrics["correction_clipped_frac"],
                               0.25 if mode == "tis" else 0.0, atol=1e-7)
    np.testing.assert_allclose(metrics["correction_masked_frac"],
                               0.5 if mode.startswith("mis") else 0.0, atol=1e-7)

  @parameterized.parameters(*kernels.ROLLOUT_CORRECTION_MODES)
  def test_no_gradient(self, mode):
    old, sampler, mask = mismatch_batch(batch=3, time=5)
    probe = np.random.default_rng(71).standard_normal(old.shape).astype(np.float32)

    def total(o, s):
      weights, keep, metrics = kernels.rollout_correction(o, s, mask, mode=mode)
      return jnp.sum(probe * weights) + jnp.sum(probe * keep) + sum(metrics.values())

    grads = jax.grad(total, argnums=(0, 1))(old, sampler)
    for grad in grads:
      np.testing.assert_array_equal(grad, np.zeros_like(old))

  @parameterized.parameters(*kernels.ROLLOUT_CORRECTION_MODES)
  def test_jit_agrees_with_eager(self, mode):
    old, sampler, mask = mismatch_batch(seed=72)
    fn = functools.partial(kernels.rollout_correction, mode=mode, threshold=1.8)
    eager, jitted = fn(old, sampler, mask), jax.jit(fn)(old, sampler, mask)
    chex.assert_trees_all_close(eager, jitted, rtol=1e-6, atol=0)

  @parameterized.parameters(*kernels.ROLLOUT_CORRECTION_MODES)
  def test_identical_logprobs_give_ratio_one(self, mode):
    old, _, mask = mismatch_batch(seed=73)
    weights, keep, metrics = kernels.rollout_correction(old, old, mask, mode=mode)
    np.testing.assert_array_equal(weights, mask)
    np.testing.assert_array_equal(keep, mask)
    for name in ("is_ratio_min", "is_ratio_max", "is_ratio_mean"):
      self.assertEqual(float(metrics[name]), 1.0, name)
    for name in ("logprob_mismatch_max", "logprob_mismatch_mean", "correction_clipped_frac",
                 "correction_masked_frac"):
      self.assertEqual(float(metrics[name]), 0.0, name)

  @parameterized.parameters(*kernels.ROLLOUT_CORRECTION_MODES)
  def test_padding_garbage_and_empty_mask(self, mode):
    # Engines may report −inf (or nothing: NaN) off the response; it must not leak.
    old, sampler, mask = mismatch_batch(seed=74)
    sampler = np.where(mask > 0, sampler, -np.inf).astype(np.float32)
    sampler[-1, 0] = np.nan
    weights, keep, metrics = kernels.rollout_correction(old, sampler, mask, mode=mode)
    ref_weights, _, ref_metrics = correction_reference(old, sampler, mask, mode, 2.0)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)
    self.assertTrue(np.all(np.asarray(keep)[mask == 0] == 0))
    for name in METRICS:
      np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5, atol=1e-6,
                                 err_msg=name)
    empty = np.zeros_like(mask)
    weights, keep, metrics = kernels.rollout_correction(old, sampler, empty, mode=mode)
    np.testing.assert_array_equal(weights, empty)
    np.testing.assert_array_equal(keep, empty)
    expected = dict(correction_reference(old, sampler, empty, mode, 2.0)[2])
    self.assertEqual(expected["is_ratio_min"], 1.0)
    self.assertEqual(expected["is_ratio_mean"], 0.0)
    self.assertEqual({k: float(v) for k, v in metrics.items()}, expected)

  def test_bad_options_name_the_option(self):
    old, sampler, mask = mismatch_batch()
    with self.assertRaisesRegex(ValueError, r"mode='is'.*'none', 'tis', 'mis_token', "
                                r"'mis_sequence'"):
      kernels.rollout_correction(old, sampler, mask, mode="is")
    for threshold in (1.0, 0.5, -2.0):
      with self.assertRaisesRegex(ValueError, f"threshold={threshold!r}"):
        kernels.rollout_correction(old, sampler, mask, mode="tis", threshold=threshold)
    with self.assertRaisesRegex(ValueError, "shape mismatch"):
      kernels.rollout_correction(old, sampler[:, :-1], mask, mode="tis")


if __name__ == "__main__":
  absltest.main()
