"""The trained role's update in isolation (optim/roles.py): micro-batches give the unsplit
update, a non-finite update is skipped without a second compile, the state is donated."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.algorithms.actors import actor
from tests.algorithms.actors import random_batch
from tests.training.runs import preset

# Counts the programs jit lowers (each new compile lowers first) inside a `with` block.
from jax._src.test_util import count_jit_and_pmap_lowerings as count_lowerings  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_unsplit_update(agg):
  algorithm = preset("vapo").algorithm  # clip-higher, positive-example NLL
  algorithm.policy_loss.agg = agg
  algorithm.policy_loss.entropy_coef = 0.01
  algorithm.kl.placement, algorithm.kl.coef = "loss", 0.1  # with zero reference log-probs
  batch, key = random_batch(), jax.random.key(3)
  # Plain SGD: parameters move by the gradient itself (Adam's g/√v would magnify float32
  # summation-order differences in near-zero gradients).
  whole = actor(1, algorithm, optimizer=optax.sgd(0.1))
  expected = whole.update(batch, key)
  for micro in (2, 4):
    split = actor(micro, algorithm, optimizer=optax.sgd(0.1))
    got = split.update(batch, key)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["grad_norm"], expected["grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 split.params, whole.params)


def test_a_non_finite_update_is_skipped():
  algorithm = preset("grpo").algorithm
  role = actor(1, algorithm, minibatches=1)
  before = jax.tree.map(np.asarray, role.params)
  batch = random_batch()
  metrics = role.update(batch.replace(advantages=jnp.full_like(batch.advantages, jnp.nan)),
                        jax.random.key(0))
  assert metrics["skipped"].tolist() == [1.0] and metrics["applied"].tolist() == [0.0]
  jax.tree.map(np.testing.assert_array_equal, role.params, before)
  with count_lowerings() as lowered:
    metrics = role.update(batch, jax.random.key(0))
  assert metrics["skipped"].tolist() == [0.0]
  assert lowered() == 0  # the second call compiled nothing
  assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.all(np.asarray(a) == b)),
                                              role.params, before)))


def test_the_update_donates_the_state():
  role = actor(1, preset("grpo").algorithm, minibatches=1)
  old = role.params
  role.update(random_batch(), jax.random.key(0))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))
