"""DPO's learner (offline and iterative DPO): the policy role, the reference, and the
jitted prepare that turns a batch of groups into pairs (algorithms/dpo.py).

    learn(batch):  prepare (one jit: reference log-probs unless cached, one pair per
                   group) → actor update (one jit, state donated)
                   → every `reference_sync_every` steps π_ref ← π_θ (iterative DPO)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import dpo
from rlhf_jax.algorithms.learner import LearnerBase
from rlhf_jax.algorithms.learner import rl_optimizers
from rlhf_jax.algorithms.learner import role_options
from rlhf_jax.optim import FrozenRole
from rlhf_jax.optim import TrainedRole


def dpo_actor_role(model, params, optimizer, mesh, d, train) -> TrainedRole:
  """The policy as a TrainedRole on pair batches; the loss divides by the mini-batch's
  count of pairs with a preference."""
  return TrainedRole(model, params, optimizer, mesh, loss_fn=dpo.dpo_loss_fn(model, d),
                     normalizer_fn=lambda pairs: jnp.sum(pairs.weights),
                     has_target=lambda pairs: jnp.sum(pairs.weights) > 0,
                     **role_options(train))


class DPOLearner(LearnerBase):
  """Actor and reference of DPO (offline or iterative).

  Args:
    d: the `algorithm.dpo` section.
    actor: the policy role (`dpo_actor_role`).
    reference: the frozen reference (the starting policy); None with a cached one.
    group_size: G, rows per group in the batch.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
  """

  STATE_ROLES = ("actor", "reference")

  def __init__(self, d, actor: TrainedRole, reference: FrozenRole | None, *, group_size: int,
               seed: int):
    super().__init__(actor=actor, reference=reference, seed=seed)
    self.d = d
    self.group_size = group_size
    self._prepare = jax.jit(self._prepare_fn)

  @classmethod
  def from_config(cls, c, model, params, mesh) -> "DPOLearner":
    """The learner of config `c` (`algorithm.dpo`) for the policy on `mesh`."""
    d = c.algorithm.dpo
    actor = dpo_actor_role(model, params, rl_optimizers(c)[0], mesh, d, c.train)
    reference = None if d.reference == "cached" else FrozenRole(model, params)
    return cls(d, actor, reference, group_size=c.rollout.group_size, seed=c.seed)

  def _prepare_fn(self, ref_params, batch):
    if self.d.reference == "cached":  # the offline rollout put π_ref's log-probs there
      ref = batch.sampler_logprobs * batch.response_mask
    else:
      ref = batch_lib.response_logprobs(self.reference.model, ref_params, batch)
    pairs = dpo.pairs_from_groups(batch.replace(ref_logprobs=ref), self.group_size)
    return pairs, {"scores": batch.scores,
                   "dpo/pairs_with_preference": jnp.mean(pairs.weights)}

  def learn(self, batch, step: int) -> dict[str, Any]:
    """Pairs `batch` (on the mesh) and runs the actor update of step `step`; returns
    device arrays {"prepare": metrics, "actor": per-mini-batch metrics}."""
    pairs, prepared = self._prepare(self.params_of("reference"), batch)
    out = {"prepare": prepared,
           "actor": self.actor.update(pairs, jax.random.fold_in(self._key, step))}
    every = self.d.reference_sync_every
    if every and (step + 1) % every == 0:
      self.reference.move_toward(self.actor.params, 1.0)
    return out
