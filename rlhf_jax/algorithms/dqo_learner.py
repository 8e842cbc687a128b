"""DQO's learner: policy (the Q-function up to V), value head and reference
(algorithms/dqo.py).

    learn(batch):  prepare (one jit: π_θ, π_ref unless cached, V_φ → soft λ-return
                   targets) → value update → policy update (each one jit, donated)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import dqo
from rlhf_jax.algorithms.learner import LearnerBase
from rlhf_jax.algorithms.learner import initial_critic
from rlhf_jax.algorithms.learner import rl_optimizers
from rlhf_jax.algorithms.learner import role_options
from rlhf_jax.optim import FrozenRole
from rlhf_jax.optim import TrainedRole


def dqo_roles(policy_model, policy_params, critic_model, critic_params, optimizers, mesh, d,
              train) -> tuple[TrainedRole, TrainedRole]:
  """(policy role, value role) with DQO's losses, both normalised by the mini-batch's
  response-token count."""
  tokens = lambda batch: jnp.sum(batch.response_mask)
  has_tokens = lambda batch: jnp.sum(batch.response_mask) > 0
  common = dict(normalizer_fn=tokens, has_target=has_tokens, **role_options(train))
  actor = TrainedRole(policy_model, policy_params, optimizers[0], mesh,
                      loss_fn=dqo.policy_loss_fn(policy_model, d), **common)
  critic = TrainedRole(critic_model, critic_params, optimizers[1], mesh,
                       loss_fn=dqo.value_loss_fn(critic_model, d), **common)
  return actor, critic


class DQOLearner(LearnerBase):
  """Policy, value and reference roles of DQO.

  Args:
    d: the `algorithm.dqo` section.
    actor: from `dqo_roles`.
    critic: from `dqo_roles`.
    reference: the frozen reference (the starting policy); None with a cached one.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
  """

  def __init__(self, d, actor: TrainedRole, critic: TrainedRole, reference: FrozenRole | None,
               *, seed: int):
    super().__init__(actor=actor, critic=critic, reference=reference, seed=seed)
    self.d = d
    self._prepare = jax.jit(self._prepare_fn)

  @classmethod
  def from_config(cls, c, model, params, mesh) -> "DQOLearner":
    """The learner of config `c` (`algorithm.dqo`) for the policy on `mesh`."""
    d = c.algorithm.dqo
    critic_model, critic_params = initial_critic(c, model, params, mesh)
    actor, critic = dqo_roles(model, params, critic_model, critic_params, rl_optimizers(c),
                              mesh, d, c.train)
    reference = None if d.reference == "cached" else FrozenRole(model, params)
    return cls(d, actor, critic, reference, seed=c.seed)

  def _prepare_fn(self, actor_params, critic_params, ref_params, batch):
    logprobs = batch_lib.response_logprobs(self.actor.model, actor_params, batch)
    if self.d.reference == "cached":  # the offline rollout put π_ref's log-probs there
      ref = batch.sampler_logprobs
    else:
      ref = batch_lib.response_logprobs(self.reference.model, ref_params, batch)
    values = batch_lib.response_values(self.critic.model, critic_params, batch)
    return dqo.prepare(self.d, batch, logprobs=logprobs, ref_logprobs=ref, values=values)

  def learn(self, batch, step: int) -> dict[str, Any]:
    """Prepares `batch` (on the mesh) and runs the updates of step `step`; returns device
    arrays {"prepare", "critic", "actor"}."""
    batch, prepared = self._prepare(self.actor.params, self.critic.params,
                                    self.params_of("reference"), batch)
    actor_key, critic_key = self.step_keys(step)
    return {"prepare": prepared, "critic": self.critic.update(batch, critic_key),
            "actor": self.actor.update(batch, actor_key)}
