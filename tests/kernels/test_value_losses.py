"""The clipped value loss (PPO's value head) against a NumPy reference, and its gradient."""

import functools

import chex
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from jax.test_util import check_grads

from rlhf_jax import kernels
from tests.kernels.batches import random_batch
from tests.kernels.references import aggregate_reference


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

if __name__ == "__main__":
  absltest.main()
