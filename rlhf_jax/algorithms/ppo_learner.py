"""The PPO family's learner (PPO, GRPO, DAPO, VC-PPO, VAPO, T-PPO, ...): its roles and
the on-device half of a training step.

    learn(batch):  prepare (one jit: the RolloutBatch becomes a TrainBatch with the
                   trainer's log π_old, reference log-probs, values, rollout-correction
                   weights, advantages, returns; and β)
                   → critic update → actor update   (each one jit, state donated)

The actor waits for `algorithm.value.pretrain_steps` steps while the critic learns
alone (VC-PPO's value pretraining); the learner decides that, not the loop.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.algorithms.learner import LearnerBase
from rlhf_jax.algorithms.learner import initial_critic
from rlhf_jax.algorithms.learner import lora_of
from rlhf_jax.algorithms.learner import rl_optimizers
from rlhf_jax.algorithms.learner import role_options
from rlhf_jax.algorithms.learner import with_adapters
from rlhf_jax.algorithms.row_packer import RowPacker
from rlhf_jax.optim import FrozenRole
from rlhf_jax.optim import TrainedRole
from rlhf_jax.optim.roles import on_mesh


def actor_role(model, params, optimizer, mesh, algorithm, train) -> TrainedRole:
  """The policy as a TrainedRole: PPO-family actor loss (`ppo_family.actor_loss`)."""

  def loss_fn(params, batch, norm, packed=None):
    if packed is not None:
      batch = batch_lib.only_packed_rows(batch, packed)
    logprobs, entropy = batch_lib.response_logprobs(model, params, batch, with_entropy=True,
                                                    packed=packed)
    return ppo_family.actor_loss(algorithm, logprobs, entropy, batch, norm)

  return TrainedRole(model, params, optimizer, mesh, loss_fn=loss_fn,
                     normalizer_fn=lambda b: ppo_family.normalizers(algorithm, b),
                     has_target=lambda b: jnp.sum(b.policy_mask()) > 0, **role_options(train))


def critic_role(model, params, optimizer, mesh, algorithm, train) -> TrainedRole:
  """The value model as a TrainedRole: clipped value loss on finished responses."""

  def loss_fn(params, batch, norm, packed=None):
    if packed is not None:
      batch = batch_lib.only_packed_rows(batch, packed)
    values = batch_lib.response_values(model, params, batch, packed=packed)
    return ppo_family.critic_loss(algorithm, values, batch, norm)

  return TrainedRole(model, params, optimizer, mesh, loss_fn=loss_fn,
                     normalizer_fn=lambda b: ppo_family.critic_normalizers(algorithm, b),
                     has_target=lambda b: jnp.sum(b.value_mask()) > 0, **role_options(train))


def reference_role(c, model, params, mesh) -> FrozenRole | None:
  """The frozen reference the trainer holds: a teacher loaded from
  `algorithm.distill.teacher` (on-policy distillation; any size, the policy's tokenizer),
  else a copy of the initial policy; None when nothing reads it here (no KL term or
  distillation, or the sampling servers bring log π_ref: rollout.reference_logprobs)."""
  if not ppo_config.trainer_holds_reference(c):
    return None
  if distillation.teacher_checkpoint(c):
    return FrozenRole(*distillation.load_teacher(c, model, mesh))
  return FrozenRole(model, params)


def validate_run(c, *, fixed_data: bool) -> None:
  """The PPO learner's rules on the whole config beyond its `algorithm` sub-sections:
  the teacher of `algorithm.distill` (`distillation.validate_distill`)."""
  del fixed_data  # the registry's validation rules out offline data for this learner
  distillation.validate_distill(c)


class PPOLearner(LearnerBase):
  """Actor (+ critic, + reference) and the jitted prepare of the PPO family.

  Args:
    algorithm: the `algorithm` config section.
    actor: the policy role.
    critic: the value role, or None.
    reference: the reference policy, or None (no KL term, or log π_ref comes with the
      batch from the sampling servers: rollout.reference_logprobs).
    correction: the rollout-correction mode in force (ppo_config.correction_mode).
    group_size: G.
    seed: seeds the mini-batch shuffles (folded with the step: resume-safe).
    packing: packs rows into token buffers for every forward (`train.packing`), or
      None for the padded rows.
    reuse_sampler_logprobs: take π_old from the sampler when every token is fresh
      (`ppo_config.reuses_sampler_logprobs`), skipping the trainer's forward.
  """

  def __init__(self, algorithm, actor: TrainedRole, critic: TrainedRole | None,
               reference: FrozenRole | None, *, correction: str, group_size: int, seed: int,
               packing: RowPacker | None = None, reuse_sampler_logprobs: bool = False):
    super().__init__(actor=actor, critic=critic, reference=reference, seed=seed)
    self.algorithm = algorithm
    self.packing = packing
    self.reuse_sampler_logprobs = reuse_sampler_logprobs
    self.correction = correction
    self.group_size = group_size
    # β on device, where the controller moves it.
    self.kl_coef = on_mesh(jnp.float32(algorithm.kl.coef), actor.mesh)
    self._prepare = jax.jit(self._prepare_fn)

  @classmethod
  def from_config(cls, c, model, params, mesh) -> "PPOLearner":
    """The learner of config `c` for the policy (`model`, `params` on `mesh`): a critic
    with estimator 'gae' (or a value head), a reference with a KL term."""
    a = c.algorithm
    actor_optimizer, critic_optimizer = rl_optimizers(c)
    # The reference first: FrozenRole copies, and the actor's update donates its tree. With
    # rollout.reference_logprobs='sampler' the servers hold it and the batch brings log π_ref.
    reference = reference_role(c, model, params, mesh)
    critic = None
    if ppo_config.uses_critic(a):
      critic_parts = with_adapters(*initial_critic(c, model, params, mesh), critic_optimizer,
                                   mesh, lora_of(c, critic=True), c.seed + 1)
      critic = critic_role(*critic_parts, mesh, a, c.train)
    actor = actor_role(*with_adapters(model, params, actor_optimizer, mesh, lora_of(c), c.seed),
                       mesh, a, c.train)
    correction = ppo_config.correction_mode(a, trainer_dtype=c.model.dtype,
                                            sampler_dtype=c.sampler.dtype)
    packing = RowPacker(c.train.minibatches, c.train.micro_batches) if c.train.packing else None
    learner = cls(a, actor, critic, reference, correction=correction,
                  group_size=c.rollout.group_size, seed=c.seed, packing=packing,
                  reuse_sampler_logprobs=ppo_config.reuses_sampler_logprobs(a, c.train,
                                                                            correction))
    if distillation.teacher_checkpoint(c):
      # A teacher never moves and is loaded from the config: checkpoints leave it out (it
      # may be larger than the student), and a resumed run loads the configured one.
      learner.STATE_ROLES = tuple(r for r in cls.STATE_ROLES if r != "reference")
    return learner

  def _prepare_fn(self, actor_params, ref_params, critic_params, kl_coef, version, batch,
                  packed):
    # The current weights' log-probs: π_old of fresh tokens, π_prox of stale ones.
    forward = lambda: batch_lib.response_logprobs(self.actor.model, actor_params, batch,
                                                  packed=packed)
    reused = jnp.zeros((), bool)
    if self.reuse_sampler_logprobs:  # the taken branch alone runs
      stale = batch.stale_mask(version) > 0  # the one rule (RolloutBatch.stale_mask)
      reused = ~jnp.any(stale)
      old = jax.lax.cond(reused, lambda: batch.sampler_logprobs * batch.response_mask, forward)
    else:
      old = forward()
    ref = (None if self.reference is None else
           batch_lib.response_logprobs(self.reference.model, ref_params, batch, packed=packed,
                                       replay=False))  # the reference routes on its own
    values = (None if self.critic is None else
              batch_lib.response_values(self.critic.model, critic_params, batch,
                                        packed=packed))
    batch, kl_coef, metrics = ppo_family.prepare(
        self.algorithm, batch, old_logprobs=old, ref_logprobs=ref, values=values,
        kl_coef=kl_coef, correction=self.correction,
        group_size=self.group_size, version=version)
    return batch, kl_coef, dict(metrics, scores=batch.scores,
                                reused_sampler_logprobs=reused.astype(jnp.float32))

  def _routes_to_replay(self, batch):
    """The batch with the routes the policy's forwards replay: the sampler's under
    `algorithm.moe.routing_replay='R3'` (a batch without them is refused), none otherwise."""
    if self.algorithm.moe.routing_replay != "R3":
      return batch if batch.routes is None else batch.replace(routes=None)
    if batch.routes is None:
      raise ValueError("algorithm.moe.routing_replay='R3': the rollout brought no routes "
                       "(a mixture-of-experts policy's sampler records them; sampling servers "
                       "need --config.sampler.record_routes=True)")
    return batch

  def updates_actor(self, step: int) -> bool:
    """False during value pretraining (`algorithm.value.pretrain_steps`)."""
    return step >= self.algorithm.value.pretrain_steps

  def learn(self, batch, step: int) -> dict[str, Any]:
    """Prepares `batch` (a RolloutBatch already on the mesh) and runs the updates of
    step `step` on the TrainBatch `prepare` makes of it.

    `step` is also the current policy version: the loop hands the sampler the weights
    learned in step s − 1 as version s, so rows sampled for step s carry version s
    (fresh) and rows of any other version are stale (decoupled PPO in `prepare`).

    Returns device arrays: {"prepare": metrics, "actor": per-mini-batch metrics,
    "critic": per-mini-batch metrics}; no "actor" during value pretraining; with
    packing, "learner": host floats (the padding fractions).
    """
    batch = self._routes_to_replay(batch)
    packer = None if self.packing is None else self.packing.for_batch(batch)
    packed = None if packer is None else on_mesh(packer.whole_batch(), self.actor.mesh)
    batch, self.kl_coef, prepared = self._prepare(
        self.actor.params, self.params_of("reference"), self.params_of("critic"),
        self.kl_coef, jnp.int32(step), batch, packed)
    actor_key, critic_key = self.step_keys(step)
    out = {"prepare": prepared}
    plan = None if packer is None else packer.update_plan
    if self.critic is not None:
      out["critic"] = self.critic.update(batch, critic_key, plan)
    if self.updates_actor(step):
      out["actor"] = self.actor.update(batch, actor_key, plan)
    if packer is not None:
      out["learner"] = packer.metrics()
    if self.reference is not None and self.algorithm.kl.reference_ema > 0:
      # The policy's weights in the reference's layout: with LoRA the merged base and
      # adapters, not the {adapters, base} tree the actor trains.
      self.reference.move_toward(self.policy_params, self.algorithm.kl.reference_ema)
    return out

  def extra_state(self) -> dict[str, Any]:
    return {"kl_coef": self.kl_coef}

  def restore_extra(self, state: dict[str, Any]) -> None:
    self.kl_coef = on_mesh(state["kl_coef"], self.actor.mesh)
