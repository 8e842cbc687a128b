"""The `Learner` seam: the on-device half of a training step, one per algorithm family.

    out = learner.learn(batch, step)   one jitted prepare, then the roles' donated updates
    learner.policy_params              what the sampler is sent after the step
    learner.state() / restore(state)   every role's arrays, for checkpoints

A learner holds its roles (optim/roles.py) and decides by itself when the actor
updates (VC-PPO's value pretraining), so the loop is the same for every family.
`learn` never waits for the device: it returns device arrays that the loop reads
once per step. The registry (algorithms/registry.py) picks one by `algorithm.learner`.
`LearnerBase` holds the bookkeeping every family shares (roles, the per-step keys,
state and restore), and the builders below the one way roles come from a config.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.config_errors import invalid
from rlhf_jax.models import lora as lora_lib
from rlhf_jax.optim import FrozenRole
from rlhf_jax.optim import TrainedRole
from rlhf_jax.optim import make_optimizer
from rlhf_jax.optim import rl_schedule


@runtime_checkable
class Learner(Protocol):
  """What the loop needs of a learner (see the module docstring)."""

  def learn(self, batch, step: int) -> dict[str, Any]:
    """Prepares `batch` (on the mesh) and runs step `step`'s updates; returns device
    arrays {"prepare": metrics, "actor": per-mini-batch metrics, ...}; "actor" is
    absent on a step that leaves the policy alone."""

  def state(self) -> dict[str, Any]:
    """The array state of every role, for checkpoints."""

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""

  @property
  def policy_params(self) -> Any:
    """The current policy parameters (the sampler's next weights)."""


class LearnerBase:
  """Roles, per-step keys and checkpoint state shared by every learner.

  `STATE_ROLES` names the roles a family checkpoints (absent roles save as {}), so
  each family's checkpoint layout stays fixed whatever its options.

  Args:
    actor: the policy role.
    critic: a value role, or None.
    reference: the frozen reference, or None.
    seed: seeds the mini-batch shuffles, folded with the step (resume-safe).
  """

  STATE_ROLES: tuple[str, ...] = ("actor", "critic", "reference")

  def __init__(self, *, actor: TrainedRole, critic: TrainedRole | None = None,
               reference: FrozenRole | None = None, seed: int):
    self.actor, self.critic, self.reference = actor, critic, reference
    self._merge = (jax.jit(actor.model.merged_params)
                   if isinstance(actor.model, lora_lib.LoraModel) else None)
    self._key = jax.random.key(seed)

  @property
  def policy_params(self):
    """The actor's current parameters (with LoRA: the base with the adapters merged,
    in the plain model's layout)."""
    if self._merge is None:
      return self.actor.params
    return self._merge(self.actor.params)

  def step_keys(self, step: int) -> tuple[jax.Array, jax.Array]:
    """(actor key, critic key) of step `step`."""
    actor_key, critic_key = jax.random.split(jax.random.fold_in(self._key, step))
    return actor_key, critic_key

  def params_of(self, role: str):
    """The parameters of role `role`, or None when the learner has no such role."""
    held = getattr(self, role)
    return None if held is None else held.params

  def extra_state(self) -> dict[str, Any]:
    """Arrays besides the roles' (e.g. the adaptive KL coefficient)."""
    return {}

  def restore_extra(self, state: dict[str, Any]) -> None:
    """Restores `extra_state()`."""

  def state(self) -> dict[str, Any]:
    """{role: TrainState or frozen params or {}} plus `extra_state()`."""
    out = {}
    for name in self.STATE_ROLES:
      role = getattr(self, name)
      out[name] = ({} if role is None else
                   role.state if isinstance(role, TrainedRole) else role.params)
    return {**out, **self.extra_state()}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    for name in self.STATE_ROLES:
      role = getattr(self, name)
      if isinstance(role, TrainedRole):
        role.state = state[name]
      elif role is not None:
        role.params = state[name]
    self.restore_extra(state)


# ----------------------------------------------------------------- roles from a config

def rl_optimizers(c):
  """(actor, critic) optimizers of the `optimizer` section (`rl_schedule`), decaying
  over the run's updates when the schedule is cosine; the critic has no weight decay."""
  o = c.optimizer
  decay = dict(decay_updates=(c.train.steps * c.train.epochs * c.train.minibatches
                              if o.schedule == "cosine" else 0),
               final_fraction=o.final_fraction)
  actor = make_optimizer(rl_schedule(o.learning_rate, o.warmup_steps, **decay),
                         weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm)
  critic = make_optimizer(rl_schedule(o.critic_learning_rate, o.warmup_steps, **decay),
                          weight_decay=0.0, max_grad_norm=o.max_grad_norm)
  return actor, critic


def lora_of(c, *, critic: bool = False) -> lora_lib.LoraConfig | None:
  """The `model.lora_*` adapters (None when `model.lora_rank` is 0); a critic's also
  trains its value head in full."""
  m = c.model
  if not m.lora_rank:
    return None
  return lora_lib.LoraConfig(rank=m.lora_rank, alpha=m.lora_alpha, targets=tuple(m.lora_targets),
                             modules_to_save=("scalar_head", "scalar_bias") if critic else ())


def with_adapters(model, params, optimizer, mesh, lora: lora_lib.LoraConfig | None, seed: int):
  """(model, params, optimizer) of a role that trains only LoRA adapters: a LoraModel,
  its {"adapters", "base"} tree on the mesh, and an optimizer whose state covers the
  adapters alone (Hu et al. 2021, arXiv:2106.09685). Unchanged when `lora` is None."""
  if lora is None:
    return model, params, optimizer
  adapted = lora_lib.LoraModel(model, lora)
  tree = adapted.init_params(params, seed=seed)
  tree = parallel.shard_params(tree, parallel.param_shardings(tree, adapted.logical_axes(), mesh))
  return adapted, tree, lora_lib.adapter_optimizer(optimizer)


def role_options(train) -> dict[str, int]:
  """A TrainedRole's passes over the batch from the `train` section."""
  return dict(epochs=train.epochs, minibatches=train.minibatches,
              micro_batches=train.micro_batches)


def critic_from_checkpoint(directory: str, policy_model) -> tuple[object, dict]:
  """A critic whose weights are a scalar-head checkpoint's (a PRM; Dai et al.): its
  values start as the PRM's success-probability estimates. The architecture must be
  the policy's (the critic reads the policy's token ids)."""
  model, params = models.load_hf_checkpoint(directory, head="scalar",
                                            scan_layers=policy_model.config.scan_layers)
  if model.config.vocab_size != policy_model.config.vocab_size:
    invalid("critic.init_from", directory, f"its vocabulary {model.config.vocab_size} "
            f"differs from the policy's {policy_model.config.vocab_size}")
  return models.with_numerics(model, dtype=policy_model.config.dtype,
                              matmul_precision=policy_model.config.matmul_precision), params


def initial_critic(c, policy_model, policy_params, mesh):
  """(critic model, params on the mesh): from `critic.init_from` (a PRM) or the policy's
  backbone with a zero value head."""
  if c.critic.init_from:
    model, params = critic_from_checkpoint(c.critic.init_from, policy_model)
  else:
    model, params = models.critic_from_policy(policy_model, policy_params)
  # A copy: the actor's update donates (frees) the backbone arrays they share.
  params = parallel.shard_params(jax.tree.map(lambda x: x.copy(), params),
                                 parallel.param_shardings(params, model.logical_axes(), mesh))
  return model, params
