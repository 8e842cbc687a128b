"""DPO's learner: the policy role, the reference, and the jitted prepare that turns a
batch of groups into pairs (algorithms/dpo.py).

    learn(batch):  prepare (one jit: reference log-probs unless cached, one pair per
                   group) → actor update (one jit, state donated)
                   → every `reference_sync_every` steps π_ref ← π_θ (iterative DPO)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax.algorithms import dpo
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.training.roles import FrozenRole
from rlhf_jax.training.roles import TrainedRole


def dpo_actor_role(model, params, optimizer, mesh, d, train) -> TrainedRole:
  """The policy as a TrainedRole on pair batches; the loss divides by the mini-batch's
  count of pairs with a preference."""
  return TrainedRole(model, params, optimizer, mesh, loss_fn=dpo.dpo_loss_fn(model, d),
                     normalizer_fn=lambda pairs: jnp.sum(pairs.weights),
                     has_target=lambda pairs: jnp.sum(pairs.weights) > 0,
                     epochs=train.ppo_epochs, minibatches=train.minibatches,
                     micro_batches=train.micro_batches)


class DPOLearner:
  """Actor and reference of DPO (offline or iterative).

  Args:
    d: the `algorithm.dpo` section.
    actor: the policy role (`dpo_actor_role`).
    reference: the frozen reference (the starting policy); None with a cached one.
    group_size: G, rows per group in the batch.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
  """

  def __init__(self, d, actor: TrainedRole, reference: FrozenRole | None, *, group_size: int,
               seed: int):
    self.d = d
    self.actor, self.reference = actor, reference
    self.group_size = group_size
    self._key = jax.random.key(seed)
    self._prepare = jax.jit(self._prepare_fn)

  def _prepare_fn(self, ref_params, batch):
    if self.d.reference == "cached":  # the offline rollout put π_ref's log-probs there
      ref = batch.sampler_logprobs * batch.response_mask
    else:
      ref = rollout_lib.response_logprobs(self.reference.model, ref_params, batch)
    pairs = dpo.pairs_from_groups(batch.replace(ref_logprobs=ref), self.group_size)
    return pairs, {"scores": batch.scores,
                   "dpo/pairs_with_preference": jnp.mean(pairs.weights)}

  def learn(self, batch, step: int, *, update_actor: bool = True) -> dict[str, Any]:
    """Pairs `batch` (on the mesh) and runs the actor update of step `step`; returns
    device arrays {"prepare": metrics, "actor": per-mini-batch metrics}."""
    pairs, prepared = self._prepare(
        None if self.reference is None else self.reference.params, batch)
    out = {"prepare": prepared}
    if update_actor:
      out["actor"] = self.actor.update(pairs, jax.random.fold_in(self._key, step))
    every = self.d.reference_sync_every
    if every and (step + 1) % every == 0:
      self.reference.move_toward(self.actor.params, 1.0)
    return out

  def state(self) -> dict[str, Any]:
    """The array state for checkpoints."""
    return {"actor": self.actor.state,
            "reference": {} if self.reference is None else self.reference.params}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.actor.state = state["actor"]
    if self.reference is not None:
      self.reference.params = state["reference"]
