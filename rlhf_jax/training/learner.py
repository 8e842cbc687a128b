"""The PPO family's learner: its roles and the on-device half of a training step.

    learn(batch):  prepare (one jit: the trainer's log π_old, reference log-probs,
                   values, rollout-correction weights, advantages, returns, β)
                   → critic update → actor update   (each one jit, state donated)

Nothing in `learn` waits for the device: it returns device arrays, and the loop
reads them once per step. A learner for another family (DPO, DQO) has the same
shape: roles, a jitted prepare, jitted updates.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax.algorithms import ppo_family
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.training.roles import FrozenRole
from rlhf_jax.training.roles import TrainedRole


def actor_role(model, params, optimizer, mesh, algorithm, train) -> TrainedRole:
  """The policy as a TrainedRole: PPO-family actor loss (`ppo_family.actor_loss`)."""

  def loss_fn(params, batch, norm):
    logprobs, entropy = rollout_lib.response_logprobs(model, params, batch, with_entropy=True)
    return ppo_family.actor_loss(algorithm, logprobs, entropy, batch, norm)

  return TrainedRole(model, params, optimizer, mesh, loss_fn=loss_fn,
                     normalizer_fn=lambda b: ppo_family.normalizers(algorithm, b),
                     has_target=lambda b: jnp.sum(b.policy_mask()) > 0,
                     epochs=train.ppo_epochs, minibatches=train.minibatches,
                     micro_batches=train.micro_batches)


def critic_role(model, params, optimizer, mesh, algorithm, train) -> TrainedRole:
  """The value model as a TrainedRole: clipped value loss on finished responses."""

  def loss_fn(params, batch, norm):
    values = rollout_lib.response_values(model, params, batch)
    return ppo_family.critic_loss(algorithm, values, batch, norm)

  return TrainedRole(model, params, optimizer, mesh, loss_fn=loss_fn,
                     normalizer_fn=lambda b: ppo_family.critic_normalizers(algorithm, b),
                     has_target=lambda b: jnp.sum(b.value_mask()) > 0,
                     epochs=train.ppo_epochs, minibatches=train.minibatches,
                     micro_batches=train.micro_batches)


class PPOLearner:
  """Actor (+ critic, + reference) and the jitted prepare of the PPO family.

  Args:
    algorithm: the `algorithm` config section.
    actor: the policy role.
    critic: the value role, or None.
    reference: the reference policy, or None.
    correction: the rollout-correction mode in force (ppo_config.correction_mode).
    group_size: G.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
  """

  def __init__(self, algorithm, actor: TrainedRole, critic: TrainedRole | None,
               reference: FrozenRole | None, *, correction: str, group_size: int, seed: int):
    self.algorithm = algorithm
    self.actor, self.critic, self.reference = actor, critic, reference
    self.correction = correction
    self.group_size = group_size
    self.kl_coef = jnp.float32(algorithm.kl.coef)  # β on device; the controller moves it
    self._key = jax.random.key(seed)
    self._prepare = jax.jit(self._prepare_fn)

  def _prepare_fn(self, actor_params, ref_params, critic_params, kl_coef, batch):
    old = rollout_lib.response_logprobs(self.actor.model, actor_params, batch)
    ref = (None if self.reference is None else
           rollout_lib.response_logprobs(self.reference.model, ref_params, batch))
    values = (None if self.critic is None else
              rollout_lib.response_values(self.critic.model, critic_params, batch))
    batch, kl_coef, metrics = ppo_family.prepare(
        self.algorithm, batch, old_logprobs=old, ref_logprobs=ref, values=values,
        kl_coef=kl_coef, correction=self.correction,
        group_size=self.group_size)
    return batch, kl_coef, dict(metrics, scores=batch.scores)

  def learn(self, batch, step: int, *, update_actor: bool = True) -> dict[str, Any]:
    """Prepares `batch` (already on the mesh) and runs the updates of step `step`.

    Returns device arrays: {"prepare": metrics, "actor": per-mini-batch metrics,
    "critic": per-mini-batch metrics}; the actor is left alone while
    `update_actor` is False (value pretraining).
    """
    batch, self.kl_coef, prepared = self._prepare(
        self.actor.params, None if self.reference is None else self.reference.params,
        None if self.critic is None else self.critic.params, self.kl_coef, batch)
    actor_key, critic_key = jax.random.split(jax.random.fold_in(self._key, step))
    out = {"prepare": prepared}
    if self.critic is not None:
      out["critic"] = self.critic.update(batch, critic_key)
    if update_actor:
      out["actor"] = self.actor.update(batch, actor_key)
    if self.reference is not None and self.algorithm.kl.reference_ema > 0:
      self.reference.move_toward(self.actor.params, self.algorithm.kl.reference_ema)
    return out

  def state(self) -> dict[str, Any]:
    """The array state for checkpoints."""
    return {"actor": self.actor.state,
            "critic": self.critic.state if self.critic is not None else {},
            "reference": self.reference.params if self.reference is not None else {},
            "kl_coef": self.kl_coef}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.actor.state = state["actor"]
    if self.critic is not None:
      self.critic.state = state["critic"]
    if self.reference is not None:
      self.reference.params = state["reference"]
    self.kl_coef = state["kl_coef"]
