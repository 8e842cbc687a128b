"""What every learner shares (algorithms/learner.py): per-step keys folded from one seed, the
roles' checkpoint state and its restore, and the roles' pieces read from a config (the RL
optimizers, whose critic has no weight decay; LoRA adapters; the passes over a batch)."""

from __future__ import annotations

import jax
import numpy as np
import optax

from rlhf_jax.algorithms import learner as learner_lib
from rlhf_jax.optim import FrozenRole
from tests.algorithms.actors import actor
from tests.algorithms.actors import tiny_model
from tests.training.runs import preset


def key_values(learner, steps):
  """Each step's (actor key, critic key) as plain numbers."""
  return [tuple(str(np.asarray(jax.random.key_data(k)).tolist()) for k in learner.step_keys(s))
          for s in steps]


def test_step_keys_are_one_seeds_fold_with_the_step():
  role = actor(1, preset("grpo").algorithm)
  keys = key_values(learner_lib.LearnerBase(actor=role, seed=3), range(3))
  assert keys == key_values(learner_lib.LearnerBase(actor=role, seed=3), range(3))  # resume
  assert len({k for pair in keys for k in pair}) == 6  # every step's and role's key differs
  assert keys != key_values(learner_lib.LearnerBase(actor=role, seed=4), range(3))


def test_state_holds_each_role_and_restores_it():
  model, params = tiny_model()
  trained = actor(1, preset("grpo").algorithm, minibatches=1)
  reference = FrozenRole(model, jax.tree.map(np.asarray, params))
  learner = learner_lib.LearnerBase(actor=trained, reference=reference, seed=0)
  state = learner.state()
  assert set(state) == {"actor", "critic", "reference"} and state["critic"] == {}
  assert state["actor"] is trained.state and state["reference"] is reference.params
  assert learner.policy_params is trained.params and learner.params_of("critic") is None
  zeros = jax.tree.map(np.zeros_like, params)
  learner.restore({"actor": state["actor"], "critic": {}, "reference": zeros})
  assert reference.params is zeros and trained.state is state["actor"]


def test_the_roles_pieces_from_a_config():
  c = preset("grpo")
  c.optimizer.weight_decay, c.optimizer.warmup_steps = 0.5, 1
  actor_optimizer, critic_optimizer = learner_lib.rl_optimizers(c)
  params = {"w": np.ones(3, np.float32)}
  zero = {"w": np.zeros(3, np.float32)}
  # With no gradient, AdamW moves the actor's weights by its decay alone; the critic's stay.
  actor_update, _ = actor_optimizer.update(zero, actor_optimizer.init(params), params)
  critic_update, _ = critic_optimizer.update(zero, critic_optimizer.init(params), params)
  np.testing.assert_allclose(actor_update["w"], -c.optimizer.learning_rate * 0.5, rtol=1e-5)
  np.testing.assert_array_equal(critic_update["w"], 0.0)
  assert learner_lib.lora_of(c) is None
  c.model.lora_rank, c.model.lora_alpha = 4, 8.0
  lora, critic_lora = learner_lib.lora_of(c), learner_lib.lora_of(c, critic=True)
  assert (lora.rank, lora.alpha, lora.modules_to_save) == (4, 8.0, ())
  assert critic_lora.modules_to_save == ("scalar_head", "scalar_bias")
  c.train.epochs, c.train.minibatches, c.train.micro_batches = 2, 3, 4
  assert learner_lib.role_options(c.train) == dict(epochs=2, minibatches=3, micro_batches=4)
  assert isinstance(actor_optimizer, optax.GradientTransformation)
