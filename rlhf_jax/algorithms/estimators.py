"""Advantage estimators as records: one table, read by the loss and by validation.

An estimator is a function with one signature,

    fn(batch, token_rewards, algorithm, *, group_size) -> (advantages, returns)

  batch          the TrainBatch of `ppo_family.prepare` before its advantages: the
                 rollout's scores, lengths, finished and masks, and old_logprobs (π_old,
                 or the student's own), ref_logprobs (when a reference or teacher
                 exists), values (with a critic) and the correction's weights set;
  token_rewards  [B, R] the score at the last token, plus step / turn rewards and −β·KL
                 when the KL is in the reward (`ppo_family.token_rewards`);
  algorithm      the whole `algorithm` config section (its λ, γ, ... in `advantage`);
  group_size     G: the rows of a group are adjacent; a row whose `batch.scored` is False
                 (no reward scored it, `reward.unscored = "drop"`) has an empty
                 response_mask and should stay out of its group's statistics, as the
                 built-in group estimators keep it (`valid=` of the kernels);
  advantages     [B, R] float32, 0 off `batch.response_mask`;
  returns        [B, R] the critic's targets, or None without a critic.

and capabilities that the rest of the library reads instead of the estimator's name:
needs_critic (values and returns: a value model is trained), group_based (a baseline
from the group: rollout.group_size >= 2), reads_token_rewards (per-token rewards: a
PRM's steps, KL in the reward, an environment's turn rewards), token_advantages (its
advantages vary along a response, so a loss that takes one advantage per response, GSPO,
cannot use them; true whenever reads_token_rewards is) and needs_reference (reads
batch.ref_logprobs: a reference policy or a teacher is kept).

`algorithm.advantage.estimator` names a built-in below, one added with
`register_estimator`, or "package.module:name" (an `Estimator`, or a function with the
signature above and no capabilities), imported and checked when the config is validated.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from rlhf_jax import kernels
from rlhf_jax.batch import TrainBatch
from rlhf_jax.registry import Registry
from rlhf_jax.registry import check_call

FIELD = "algorithm.advantage.estimator"


@dataclasses.dataclass(frozen=True)
class Estimator:
  """An advantage estimator and what it needs (see the module docstring)."""
  name: str
  fn: Callable
  needs_critic: bool = False
  group_based: bool = False
  reads_token_rewards: bool = False
  needs_reference: bool = False
  token_advantages: bool = False

  def __post_init__(self):
    if self.reads_token_rewards:  # per-token rewards give per-token advantages
      object.__setattr__(self, "token_advantages", True)


def gae(batch: TrainBatch, token_rewards: jax.Array, algorithm, *, group_size: int):
  """(Decoupled) GAE with λ_actor (or VAPO's length-adaptive λ) for the advantages and
  λ_critic for the returns; rows not `finished` (T-PPO) bootstrap from their last value
  (Extended GAE)."""
  del group_size
  v, mask = algorithm.advantage, batch.response_mask
  actor_lam = v.actor_lam
  if v.lam_schedule == "length_adaptive":
    actor_lam = kernels.length_adaptive_lambda(batch.lengths, alpha=v.length_adaptive_alpha)
  bootstrap = kernels.truncation_bootstrap_values(batch.values, mask, batch.finished)
  return kernels.decoupled_gae(token_rewards, batch.values, mask, gamma=v.gamma,
                               actor_lam=actor_lam, critic_lam=v.critic_lam,
                               bootstrap_values=bootstrap)


def grpo(batch: TrainBatch, token_rewards: jax.Array, algorithm, *, group_size: int):
  """GRPO: the score minus the group's mean, over the group's std, on every token."""
  del token_rewards, algorithm
  advantages = kernels.group_advantages(batch.scores, group_size=group_size,
                                        normalize_by_std=True, valid=batch.scored)
  return advantages[:, None] * batch.response_mask, None


def dr_grpo(batch: TrainBatch, token_rewards: jax.Array, algorithm, *, group_size: int):
  """Dr. GRPO: the score minus the group's mean (no std), on every token."""
  del token_rewards, algorithm
  advantages = kernels.group_advantages(batch.scores, group_size=group_size,
                                        normalize_by_std=False, valid=batch.scored)
  return advantages[:, None] * batch.response_mask, None


def rloo(batch: TrainBatch, token_rewards: jax.Array, algorithm, *, group_size: int):
  """RLOO: the score minus the mean of the group's other scores, on every token."""
  del token_rewards, algorithm
  advantages = kernels.rloo_advantages(batch.scores, group_size=group_size,
                                       valid=batch.scored)
  return advantages[:, None] * batch.response_mask, None


def reinforce_pp(batch: TrainBatch, token_rewards: jax.Array, algorithm, *,
                 group_size: int):
  """REINFORCE++: batch-whitened discounted returns of the token rewards."""
  del group_size
  advantages, _ = kernels.reinforce_pp_advantages(token_rewards, batch.response_mask,
                                                  gamma=algorithm.advantage.gamma)
  return advantages, None


def reinforce_pp_baseline(batch: TrainBatch, token_rewards: jax.Array, algorithm, *,
                          group_size: int):
  """REINFORCE++-baseline: the group-mean baseline, then global whitening."""
  del token_rewards, algorithm
  return kernels.reinforce_pp_baseline_advantages(batch.scores, batch.response_mask,
                                                  group_size=group_size,
                                                  valid=batch.scored), None


def _check_signature(record: Estimator, name: str, field: str) -> None:
  """ConfigError unless the record's function takes the signature above."""
  check_call(record.fn, field, name, "(batch, token_rewards, algorithm, *, group_size)",
             None, None, None, group_size=2)


# The table of `algorithm.advantage.estimator`; a plain function is an Estimator with no
# capabilities.
ESTIMATORS: Registry[Estimator] = Registry(
    "estimator", FIELD, Estimator, what="Estimator or function", wrap=Estimator,
    check=_check_signature)
for _record in (
    Estimator("gae", gae, needs_critic=True, reads_token_rewards=True),
    Estimator("grpo", grpo, group_based=True),
    Estimator("dr_grpo", dr_grpo, group_based=True),
    Estimator("rloo", rloo, group_based=True),
    Estimator("reinforce_pp", reinforce_pp, reads_token_rewards=True),
    Estimator("reinforce_pp_baseline", reinforce_pp_baseline, group_based=True),
):
  ESTIMATORS.register(_record.name, _record, built_in=True)
BUILT_IN = ESTIMATORS.built_ins()


def register_estimator(name: str, fn: Callable, *, needs_critic: bool = False,
                       group_based: bool = False, reads_token_rewards: bool = False,
                       needs_reference: bool = False, token_advantages: bool = False
                       ) -> Estimator:
  """Adds (or replaces) the estimator `name`, so `algorithm.advantage.estimator=name`
  trains with `fn` (the signature of the module docstring): `ESTIMATORS.register` with
  the capabilities given. Built-ins cannot be replaced; a name holds no ':' (that spells
  a module path)."""
  return ESTIMATORS.register(name, Estimator(
      name, fn, needs_critic=needs_critic, group_based=group_based,
      reads_token_rewards=reads_token_rewards, needs_reference=needs_reference,
      token_advantages=token_advantages))


def names() -> tuple[str, ...]:
  """The estimators known by name: built-ins, then registered ones."""
  return tuple(ESTIMATORS)


def estimator(name: str, field: str = FIELD) -> Estimator:
  """The record of `algorithm.advantage.estimator` (or of another field that names an
  estimator, `field`): a built-in, a registered name, or "package.module:name" (an
  `Estimator`, or a function taken with no capabilities); `ESTIMATORS.resolve`.

  Raises:
    ConfigError: one line naming `field`, for an unknown name, a module that does not
      import, an attribute that is neither, or a function of another signature.
  """
  return ESTIMATORS.resolve(name, field)
