"""The DPO learner (algorithms/dpo_learner.py) on a tiny model: from the starting policy as its
reference, it raises the held-out reward accuracy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhf_jax.algorithms import dpo
from rlhf_jax.optim.roles import FrozenRole
from tests.algorithms.dpo_pairs import MODEL
from tests.algorithms.dpo_pairs import P
from tests.algorithms.dpo_pairs import PARAMS
from tests.algorithms.dpo_pairs import R
from tests.algorithms.dpo_pairs import TOKENIZER
from tests.algorithms.dpo_pairs import pair_batch
from tests.algorithms.dpo_pairs import pairs


@pytest.mark.slow
def test_dpo_learner_learns_the_preference_from_the_starting_policy_reference():
  from rlhf_jax.parallel import make_mesh
  from rlhf_jax.algorithms.dpo_learner import DPOLearner, dpo_actor_role
  from rlhf_jax.optim import make_optimizer
  mesh = make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  d = ml_collections.ConfigDict(dict(beta=0.1, kind="sigmoid", label_smoothing=0.0,
                                     reference="online", reference_sync_every=0))
  train = ml_collections.ConfigDict(dict(epochs=1, minibatches=1, micro_batches=1))
  actor = dpo_actor_role(MODEL, jax.tree.map(jnp.copy, PARAMS), make_optimizer(3e-3, max_grad_norm=1.0),
                         mesh, d, train)
  learner = DPOLearner(d, actor, FrozenRole(MODEL, PARAMS), group_size=2, seed=0)
  held_out = pair_batch(pairs(2, 16), PARAMS)
  objective = jax.jit(lambda params: dpo.dpo_loss_fn(MODEL, d)(params, held_out, 16.0))
  before, _ = objective(actor.params)
  assert float(before) == pytest.approx(np.log(2), abs=1e-5)  # π = π_ref: z = 0
  data = pairs(1, 48)
  for step in range(25):
    chunk = data[(step * 8) % 48:(step * 8) % 48 + 8]
    out = learner.learn(dpo.encode_preference_pairs(TOKENIZER, chunk, prefix=(),
                                                    prompt_length=P, response_length=R), step)
  assert float(out["prepare"]["dpo/pairs_with_preference"]) == 1.0
  after, metrics = objective(actor.params)
  assert float(metrics["reward_accuracy"]) >= 0.9
  assert float(after) < float(before)
