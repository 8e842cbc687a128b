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
from rlhf_jax.config_errors import invalid
from rlhf_jax.models import moe
from rlhf_jax.optim import FrozenRole
from rlhf_jax.optim import TrainedRole
from rlhf_jax.optim.roles import on_mesh


def actor_role(model, params, optimizer, mesh, algorithm, train) -> TrainedRole:
  """The policy as a TrainedRole: PPO-family actor loss (`ppo_family.actor_loss`)."""

  moe = bool(model.config.num_experts)

  def loss_fn(params, batch, norm, packed=None):
    if packed is not None:
      batch = batch_lib.only_packed_rows(batch, packed)
    out = batch_lib.response_logprobs(model, params, batch, with_entropy=True, packed=packed,
                                      with_router=moe)
    loss, metrics = ppo_family.actor_loss(algorithm, *out[:2], batch, norm)
    if moe:
      aux, aux_metrics = router_loss(algorithm.moe, out[2], model.config, norm)
      loss, metrics = loss + aux, {**metrics, **aux_metrics}
    return loss, metrics

  return TrainedRole(model, params, optimizer, mesh, loss_fn=loss_fn,
                     normalizer_fn=lambda b: ppo_family.normalizers(algorithm, b),
                     has_target=lambda b: jnp.sum(b.policy_mask()) > 0, **role_options(train))


def _sparse_layers(decoder_config) -> jax.Array:
  """[L] bool: the layers whose MLP is a mixture of experts, the mask the router's
  per-layer losses and flip rates average over."""
  return jnp.asarray([decoder_config.sparse_layer(i)
                      for i in range(decoder_config.num_layers)])


def router_loss(moe_config, record, decoder_config, norm):
  """The auxiliary router losses of one (micro-)batch's forward (`moe.record_losses`),
  weighted by `algorithm.moe.aux_loss_coef` and `z_loss_coef`, as the micro-batch's share
  of the mini-batch's (its tokens over `norm.tokens`), so micro-batches sum to the whole;
  and their metrics: the two losses' shares and the most uneven layer's max/mean tokens
  per expert (`moe/load_imbalance_max`)."""
  sparse = _sparse_layers(decoder_config)
  losses = moe.record_losses(record, sparse)
  share = jnp.max(record.tokens) / jnp.maximum(norm.tokens, 1.0)
  balance, z = share * losses["load_balancing"], share * losses["z"]
  loss = moe_config.aux_loss_coef * balance + moe_config.z_loss_coef * z
  return loss, {"moe/load_balancing_loss": balance, "moe/z_loss": z,
                "moe/load_imbalance_max": jnp.max(losses["load_imbalance"])}


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


def _check_moe_options(moe_config, decoder_config) -> None:
  """Refuses `algorithm.moe` options that a dense policy cannot honour, naming the field."""
  if decoder_config.num_experts:
    return
  for field, unset in (("routing_replay", "off"), ("measure_route_flips", False),
                       ("aux_loss_coef", 0.0), ("z_loss_coef", 0.0)):
    if moe_config[field] != unset:
      invalid(f"algorithm.moe.{field}", moe_config[field],
              f"needs a mixture-of-experts policy; architecture="
              f"{decoder_config.architecture!r} has no experts")


def _unrecorded(shapes):
  """A `moe.RouterRecord` of `shapes` (from `jax.eval_shape`) that recorded nothing."""
  return jax.tree.map(lambda s: jnp.full(s.shape, moe.NOT_RECORDED if jnp.issubdtype(
      s.dtype, jnp.integer) else 0, s.dtype), shapes)


def route_flip_metrics(sampler_routes, trainer_routes, decoder_config, skipped):
  """`moe/route_flip_rate`: over the sparse layers, the mean fraction of response tokens
  whose experts differ between the sampler's routes and the trainer's live router's
  ([B, P+R, L, k] each; `moe.route_flip_rate`), and `_max` the worst layer's; NaN when
  the trainer's forward was `skipped` (π_old reused from the sampler)."""
  sparse = _sparse_layers(decoder_config)
  rates = moe.route_flip_rate(sampler_routes, trainer_routes)
  mean = jnp.sum(jnp.where(sparse, rates, 0.0)) / jnp.maximum(jnp.sum(sparse), 1)
  worst = jnp.max(jnp.where(sparse, rates, 0.0))
  nan = jnp.float32(jnp.nan)
  return {"moe/route_flip_rate": jnp.where(skipped, nan, mean),
          "moe/route_flip_rate_max": jnp.where(skipped, nan, worst)}


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
    _check_moe_options(a.moe, model.config)
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
    # `batch.routes` are the sampler's (or None); the π_old forward replays them under R3.
    replay = self.algorithm.moe.routing_replay
    moe_policy = bool(self.actor.model.config.num_experts)
    sampler_routes = batch.routes
    policy_rows = batch if replay == "R3" else batch.replace(routes=None)
    forward = lambda: batch_lib.response_logprobs(self.actor.model, actor_params, policy_rows,
                                                  packed=packed, with_router=moe_policy)
    reused = jnp.zeros((), bool)
    if self.reuse_sampler_logprobs:  # the taken branch alone runs
      stale = batch.stale_mask(version) > 0  # the one rule (RolloutBatch.stale_mask)
      reused = ~jnp.any(stale)
      sampler_old = batch.sampler_logprobs * batch.response_mask
      # Without a forward there is no router record: routes NOT_RECORDED (R2's updates
      # then route live, which is π_old's routing while the weights have not moved).
      skipped = ((lambda: (sampler_old, _unrecorded(jax.eval_shape(forward)[1])))
                 if moe_policy else lambda: sampler_old)
      old = jax.lax.cond(reused, skipped, forward)
    else:
      old = forward()
    moe_metrics = {}
    if moe_policy:
      old, record = old
      batch = batch.replace(routes={"off": None, "R2": record.routes,
                                    "R3": sampler_routes}[replay])
      if sampler_routes is not None:
        moe_metrics = route_flip_metrics(sampler_routes, record.live,
                                         self.actor.model.config, reused)
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
    return batch, kl_coef, dict(metrics, **moe_metrics, scores=batch.scores,
                                reused_sampler_logprobs=reused.astype(jnp.float32))

  def _routes_to_replay(self, batch):
    """The batch as `prepare` takes it: the sampler's routes kept for a mixture-of-experts
    policy (replayed under `algorithm.moe.routing_replay='R3'`, compared with the
    trainer's under every mode: `moe/route_flip_rate`); a batch without them under R3 is
    refused."""
    if not self.actor.model.config.num_experts:
      return batch if batch.routes is None else batch.replace(routes=None)
    if self.algorithm.moe.routing_replay != "R3":
      return batch
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
