"""Baseline estimators (GRPO's group advantages, RLOO, REINFORCE++, ReMax) against plain NumPy
loops written from the papers' formulas."""

import functools

import chex
import jax
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
jitted_group_advantages = jax.jit(kernels.group_advantages,
                                  static_argnames=("group_size", "normalize_by_std"))
jitted_rloo_advantages = jax.jit(kernels.rloo_advantages, static_argnames=("group_size",))


# ---------------------------------------------------------------- references


def whiten_reference(x, mask):
  vals = x[mask > 0]
  return np.where(mask > 0, (x - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8), 0.0)


class GroupEstimatorsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(True, False)
  def test_group_advantages(self, normalize_by_std):
    scores = np.random.default_rng(9).standard_normal(12).astype(np.float32)
    fn = self.variant(functools.partial(kernels.group_advantages, group_size=4,
                                        normalize_by_std=normalize_by_std))
    out = np.asarray(fn(scores))
    for g in range(3):
      group = scores[4 * g:4 * g + 4].astype(np.float64)
      expected = group - group.mean()
      if normalize_by_std:
        expected = expected / (np.sqrt(np.sum((group - group.mean())**2) / 3) + 1e-6)
      np.testing.assert_allclose(out[4 * g:4 * g + 4], expected, rtol=1e-5, atol=1e-6)

  def test_identical_rewards_give_zero_advantage(self):
    out = kernels.group_advantages(np.ones(8, np.float32), group_size=4)
    np.testing.assert_array_equal(out, np.zeros(8))

  def test_group_of_one_keeps_score(self):
    # verl's convention: mean 0, std 1, so A = R / (1 + eps).
    scores = np.array([0.5, -2.0], np.float32)
    np.testing.assert_allclose(kernels.group_advantages(scores, group_size=1, eps=1e-6),
                               scores / (1 + 1e-6), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo_is_leave_one_out(self):
    scores = np.random.default_rng(10).standard_normal(9).astype(np.float32)
    out = np.asarray(self.variant(functools.partial(kernels.rloo_advantages,
                                                    group_size=3))(scores))
    expected = []
    for i in range(9):
      group = range(3 * (i // 3), 3 * (i // 3) + 3)
      others = [scores[j] for j in group if j != i]
      expected.append(scores[i] - np.mean(others))
    np.testing.assert_allclose(out, expected, atol=1e-6)

  def test_group_errors(self):
    with self.assertRaisesRegex(ValueError, "not a multiple of group_size=4"):
      kernels.group_advantages(np.zeros(6, np.float32), group_size=4)
    with self.assertRaisesRegex(ValueError, "group_size=0"):
      kernels.group_advantages(np.zeros(6, np.float32), group_size=0)
    with self.assertRaisesRegex(ValueError, "group_size=1 must be >= 2 for RLOO"):
      kernels.rloo_advantages(np.zeros(6, np.float32), group_size=1)

  @given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 1000), st.booleans())
  def test_zero_mean_per_group(self, groups, group_size, seed, normalize):
    scores = np.random.default_rng(seed).standard_normal(groups * group_size).astype(np.float32)
    out = np.asarray(jitted_group_advantages(scores, group_size=group_size,
                                             normalize_by_std=normalize))
    if group_size > 1:
      np.testing.assert_allclose(out.reshape(groups, group_size).mean(axis=1), 0.0, atol=1e-5)
      rloo = np.asarray(jitted_rloo_advantages(scores, group_size=group_size))
      np.testing.assert_allclose(rloo.reshape(groups, group_size).mean(axis=1), 0.0, atol=1e-5)


class DroppedRowsTest(parameterized.TestCase):
  """`valid=`: rows no reward scored leave their group's statistics (reward.unscored =
  'drop'); the reference recomputes each group from its valid members alone."""

  def _case(self, seed):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(16).astype(np.float32)
    valid = rng.random(16) > 0.35
    valid[4:8] = [True, False, False, False]  # one valid member left
    valid[8:12] = False  # none left
    return scores, valid

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(True, False)
  def test_group_statistics_over_valid_rows(self, normalize_by_std):
    scores, valid = self._case(3)
    fn = self.variant(functools.partial(kernels.group_advantages, group_size=4,
                                        normalize_by_std=normalize_by_std))
    out = np.asarray(fn(scores, valid=valid))
    for g in range(4):
      rows = [i for i in range(4 * g, 4 * g + 4) if valid[i]]
      members = scores[rows].astype(np.float64)
      for i in range(4 * g, 4 * g + 4):
        if not valid[i] or len(rows) < 2:
          expected = 0.0
        else:
          expected = scores[i] - members.mean()
          if normalize_by_std:
            expected /= np.std(members, ddof=1) + 1e-6
        np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo_over_valid_rows(self):
    scores, valid = self._case(4)
    out = np.asarray(self.variant(functools.partial(kernels.rloo_advantages,
                                                    group_size=4))(scores, valid=valid))
    for i in range(16):
      others = [scores[j] for j in range(4 * (i // 4), 4 * (i // 4) + 4)
                if j != i and valid[j]]
      expected = scores[i] - np.mean(others) if valid[i] and others else 0.0
      np.testing.assert_allclose(out[i], expected, atol=1e-6)

  def test_a_dropped_rows_score_changes_nothing(self):
    scores, valid = self._case(5)
    moved = np.where(valid, scores, 1e3).astype(np.float32)
    for fn in (kernels.group_advantages, kernels.rloo_advantages):
      np.testing.assert_array_equal(fn(scores, group_size=4, valid=valid),
                                    fn(moved, group_size=4, valid=valid))
    mask = np.ones((16, 3), np.float32) * valid[:, None]
    np.testing.assert_array_equal(
        kernels.reinforce_pp_baseline_advantages(scores, mask, group_size=4, valid=valid),
        kernels.reinforce_pp_baseline_advantages(moved, mask, group_size=4, valid=valid))

  def test_all_valid_equals_no_mask(self):
    scores = np.random.default_rng(6).standard_normal(12).astype(np.float32)
    ones = np.ones(12, bool)
    for fn in (kernels.group_advantages, kernels.rloo_advantages):
      np.testing.assert_allclose(fn(scores, group_size=3, valid=ones),
                                 fn(scores, group_size=3), rtol=1e-5, atol=1e-6)

  def test_valid_of_the_wrong_length(self):
    with self.assertRaisesRegex(ValueError, "valid must be a \\[batch\\] vector of 8"):
      kernels.group_advantages(np.zeros(8, np.float32), group_size=4, valid=np.ones(6, bool))


class ReinforceTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp(self):
    rewards, _, mask = random_batch(seed=11)
    fn = self.variant(functools.partial(kernels.reinforce_pp_advantages, gamma=0.9))
    advantages, returns = fn(rewards, mask)
    ref_ret = reward_to_go(rewards, mask, gamma=0.9)
    np.testing.assert_allclose(returns, ref_ret, atol=1e-5)
    np.testing.assert_allclose(advantages, whiten_reference(ref_ret, mask), atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline(self):
    rng = np.random.default_rng(12)
    scores = rng.standard_normal(6).astype(np.float32)
    mask = ragged_mask(rng, 6, 5, empty_row=False)
    fn = self.variant(functools.partial(kernels.reinforce_pp_baseline_advantages, group_size=3))
    out = fn(scores, mask)
    centred = scores.reshape(2, 3) - scores.reshape(2, 3).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(out, whiten_reference(centred.reshape(6, 1) * mask, mask),
                               atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_remax(self):
    rewards, _, mask = random_batch(seed=13)
    baseline = np.random.default_rng(14).standard_normal(rewards.shape[0]).astype(np.float32)
    advantages, returns = self.variant(kernels.remax_advantages)(rewards, baseline, mask)
    rtg = reward_to_go(rewards, mask)
    np.testing.assert_allclose(returns, rtg, atol=1e-5)
    np.testing.assert_allclose(advantages, (rtg - baseline[:, None]) * mask, atol=1e-5)

if __name__ == "__main__":
  absltest.main()
