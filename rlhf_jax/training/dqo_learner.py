"""DQO's learner: policy (the Q-function up to V), value head and reference
(algorithms/dqo.py).

    learn(batch):  prepare (one jit: π_θ, π_ref unless cached, V_φ → soft λ-return
                   targets) → value update → policy update (each one jit, donated)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax.algorithms import dqo
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.training.roles import FrozenRole
from rlhf_jax.training.roles import TrainedRole


def dqo_roles(policy_model, policy_params, critic_model, critic_params, optimizers, mesh, d,
              train) -> tuple[TrainedRole, TrainedRole]:
  """(policy role, value role) with DQO's losses, both normalised by the mini-batch's
  response-token count."""
  tokens = lambda batch: jnp.sum(batch.response_mask)
  has_tokens = lambda batch: jnp.sum(batch.response_mask) > 0
  common = dict(normalizer_fn=tokens, has_target=has_tokens, epochs=train.ppo_epochs,
                minibatches=train.minibatches, micro_batches=train.micro_batches)
  actor = TrainedRole(policy_model, policy_params, optimizers[0], mesh,
                      loss_fn=dqo.policy_loss_fn(policy_model, d), **common)
  critic = TrainedRole(critic_model, critic_params, optimizers[1], mesh,
                       loss_fn=dqo.value_loss_fn(critic_model, d), **common)
  return actor, critic


class DQOLearner:
  """Policy, value and reference roles of DQO.

  Args:
    d: the `algorithm.dqo` section.
    actor, critic: from `dqo_roles`.
    reference: the frozen reference (the starting policy); None with a cached one.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
  """

  def __init__(self, d, actor: TrainedRole, critic: TrainedRole, reference: FrozenRole | None,
               *, seed: int):
    self.d = d
    self.actor, self.critic, self.reference = actor, critic, reference
    self._key = jax.random.key(seed)
    self._prepare = jax.jit(self._prepare_fn)

  def _prepare_fn(self, actor_params, critic_params, ref_params, batch):
    logprobs = rollout_lib.response_logprobs(self.actor.model, actor_params, batch)
    if self.d.reference == "cached":  # the offline rollout put π_ref's log-probs there
      ref = batch.sampler_logprobs
    else:
      ref = rollout_lib.response_logprobs(self.reference.model, ref_params, batch)
    values = rollout_lib.response_values(self.critic.model, critic_params, batch)
    return dqo.prepare(self.d, batch, logprobs=logprobs, ref_logprobs=ref, values=values)

  def learn(self, batch, step: int, *, update_actor: bool = True) -> dict[str, Any]:
    """Prepares `batch` (on the mesh) and runs the updates of step `step`; returns device
    arrays {"prepare", "critic", "actor"}; the policy waits while `update_actor` is False."""
    batch, prepared = self._prepare(
        self.actor.params, self.critic.params,
        None if self.reference is None else self.reference.params, batch)
    actor_key, critic_key = jax.random.split(jax.random.fold_in(self._key, step))
    out = {"prepare": prepared, "critic": self.critic.update(batch, critic_key)}
    if update_actor:
      out["actor"] = self.actor.update(batch, actor_key)
    return out

  def state(self) -> dict[str, Any]:
    """The array state for checkpoints."""
    return {"actor": self.actor.state, "critic": self.critic.state,
            "reference": {} if self.reference is None else self.reference.params}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.actor.state, self.critic.state = state["actor"], state["critic"]
    if self.reference is not None:
      self.reference.params = state["reference"]
