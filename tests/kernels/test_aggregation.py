"""Loss aggregation modes and split-invariance under a global normaliser."""

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
from tests.kernels.references import aggregate_reference


class AggregateTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*kernels.AGGREGATION_MODES)
  def test_matches_reference(self, mode):
    loss, _, mask = random_batch(seed=20, batch=6, time=7)
    out = self.variant(functools.partial(kernels.aggregate, mode=mode))(loss, mask)
    np.testing.assert_allclose(out, aggregate_reference(loss, mask, mode), rtol=1e-5)

  def test_horizon(self):
    loss, _, mask = random_batch(seed=21)
    out = kernels.aggregate(loss, mask, mode="seq-mean-token-sum-norm", horizon=32)
    np.testing.assert_allclose(out, aggregate_reference(loss, mask, "seq-mean-token-sum-norm",
                                                        horizon=32), rtol=1e-5)
    with self.assertRaisesRegex(ValueError, "horizon is only used"):
      kernels.aggregate(loss, mask, mode="token-mean", horizon=32)

  @parameterized.parameters(*kernels.AGGREGATION_MODES)
  def test_split_with_global_normalizer_equals_whole(self, mode):
    # Pieces of a mini-batch (micro-batches or data-parallel shards) summed with
    # the whole batch's count give exactly the whole batch's loss.
    loss, _, mask = random_batch(seed=22, batch=8, time=6)
    whole = kernels.aggregate(loss, mask, mode=mode)
    normalizer = kernels.aggregation_normalizer(mask, mode=mode)
    pieces = sum(kernels.aggregate(loss[s], mask[s], mode=mode, normalizer=normalizer)
                 for s in (slice(0, 3), slice(3, 4), slice(4, 8)))
    np.testing.assert_allclose(pieces, whole, rtol=1e-5)

  def test_psum_normalizer_under_shard_map(self):
    # Same invariance with the count psum'd across a (1-device) data axis.
    loss, _, mask = random_batch(seed=23)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.PartitionSpec("data")

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
    def sharded(loss, mask):
      count = jax.lax.psum(kernels.aggregation_normalizer(mask, mode="token-mean"), "data")
      local = kernels.aggregate(loss, mask, mode="token-mean", normalizer=count)
      return jax.lax.psum(local, "data")[None]

    np.testing.assert_allclose(sharded(loss, mask)[0],
                               kernels.aggregate(loss, mask, mode="token-mean"), rtol=1e-6)

  def test_empty_mask_gives_zero(self):
    loss = np.ones((2, 3), np.float32)
    for mode in kernels.AGGREGATION_MODES:
      self.assertEqual(float(kernels.aggregate(loss, np.zeros((2, 3)), mode=mode)), 0.0)

  def test_bad_mode(self):
    with self.assertRaisesRegex(ValueError, "mode='mean' is not supported; allowed values"):
      kernels.aggregate(np.ones((1, 2), np.float32), np.ones((1, 2)), mode="mean")

  @given(st.integers(1, 5), st.integers(1, 8), st.integers(0, 1000))
  def test_modes_agree_for_equal_lengths(self, batch, time, seed):
    rng = np.random.default_rng(seed)
    loss = rng.standard_normal((batch, time)).astype(np.float32)
    mask = np.ones((batch, time), np.float32)
    token_mean = kernels.aggregate(loss, mask, mode="token-mean")
    seq_token_mean = kernels.aggregate(loss, mask, mode="seq-mean-token-mean")
    seq_token_sum = kernels.aggregate(loss, mask, mode="seq-mean-token-sum")
    sum_norm = kernels.aggregate(loss, mask, mode="seq-mean-token-sum-norm")
    token_sum = kernels.aggregate(loss, mask, mode="token-sum")
    np.testing.assert_allclose(token_mean, seq_token_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sum_norm, token_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(seq_token_sum, token_mean * time, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(token_sum, token_mean * batch * time, rtol=1e-4, atol=1e-4)

  @given(st.integers(0, 1000))
  def test_seq_modes_ignore_padding_width(self, seed):
    rng = np.random.default_rng(seed)
    mask = ragged_mask(rng, 4, 5, holes=False, empty_row=False)
    loss = rng.standard_normal((4, 5)).astype(np.float32)
    padded_mask = np.pad(mask, ((0, 0), (0, 3)))
    padded_loss = np.pad(loss, ((0, 0), (0, 3)), constant_values=7.0)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
      np.testing.assert_allclose(kernels.aggregate(padded_loss, padded_mask, mode=mode),
                                 kernels.aggregate(loss, mask, mode=mode), rtol=1e-5)


if __name__ == "__main__":
  absltest.main()
