"""`train.packing` (algorithms/row_packer.py): an update from packed buffers equals the one
from padded rows, and the packing figures say how much padding it removed."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.algorithms.actors import actor
from tests.algorithms.actors import random_batch
from tests.training.runs import preset


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_packed_update_equals_the_padded_one(micro_batches):
  """One update (2 mini-batches) from packed buffers: the same loss, gradient norm and
  parameters as from the padded rows; micro-batches split rows by token count."""
  from rlhf_jax.algorithms.row_packer import RowPacker
  algorithm = preset("grpo").algorithm
  algorithm.policy_loss.entropy_coef = 0.01
  rng = np.random.default_rng(5)
  prompt_lengths = rng.integers(1, 5, 8)
  batch = random_batch(prompt=4, response=12, seed=5)
  # ragged prompts too: left-pad by blanking the first columns of the attention mask
  columns = np.arange(4)[None, :]
  prompt_mask = (columns >= 4 - prompt_lengths[:, None]).astype(np.int32)
  mask = np.asarray(batch.attention_mask).copy()
  mask[:, :4] = prompt_mask
  batch = batch.replace(attention_mask=jnp.asarray(mask),
                        tokens=jnp.where(jnp.asarray(mask) > 0, batch.tokens, 0))
  key = jax.random.key(7)
  padded = actor(micro_batches, algorithm, optimizer=optax.sgd(0.1))
  packed = actor(micro_batches, algorithm, optimizer=optax.sgd(0.1))
  expected = padded.update(batch, key)
  packing = RowPacker(minibatches=2, micro_batches=micro_batches).for_batch(batch)
  got = packed.update(batch, key, packing.update_plan)
  np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got["grad_norm"], expected["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               packed.params, padded.params)
  figures = packing.metrics()
  # 8 rows of 16 tokens (77 real) need ≥ 5 buffers of 16, so get the bucket of 8
  assert figures["packing/padding_fraction_prepare"] <= figures[
      "packing/padding_fraction_padded"]
  assert figures["packing/padding_fraction_update"] <= figures[
      "packing/padding_fraction_padded"]
