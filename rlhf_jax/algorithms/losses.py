"""Policy losses (the actor's surrogate) as records: one table, read by `ppo_family.actor_loss`
and by validation.

A policy loss is a function with the built-in kernels' signature,

    fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg,
       agg_normalizer, agg_horizon, weights) -> (loss, metrics)

  logprobs      [b, R] log π_θ of the sampled tokens (differentiated);
  old_logprobs  [b, R] log π_old (π_prox of stale tokens);
  advantages    [b, R] (one value per row for sequence-level losses);
  mask          [b, R] the tokens in the loss (`TrainBatch.policy_mask`);
  clip_low, clip_high   `algorithm.policy_loss.clip_low / clip_high`;
  agg, agg_normalizer, agg_horizon   the aggregation mode and the whole mini-batch's
                count (`kernels.aggregate`), so micro-batches sum to the unsplit loss;
  weights       [b, R] the rollout correction / decoupled-PPO weights;
  loss          a scalar; metrics: a dict of scalars (logged beside `pg_loss`).

and capabilities that validation reads instead of the loss's name: sequence_advantages
(one advantage per response: GSPO's sequence clip; refused with an estimator of per-token
advantages), check_clip (what clip_low / clip_high mean: a ratio clip by default, CISPO's
IS-weight bounds) and options (further `algorithm.policy_loss` fields passed as keywords:
PPO's dual_clip).

`algorithm.policy_loss.kind` names a built-in below, one added with `register_policy_loss`,
or "package.module:name" (a `PolicyLoss`, or a function with the signature above), imported
and checked when the config is validated.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from rlhf_jax import kernels
from rlhf_jax.config_errors import check_range
from rlhf_jax.registry import Registry
from rlhf_jax.registry import check_call

FIELD = "algorithm.policy_loss.kind"
_SIGNATURE = ("(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg, "
              "agg_normalizer, agg_horizon, weights)")


def check_ratio_clip(p) -> None:
  """A ratio clip 1 − ε_low ≤ r ≤ 1 + ε_high: 0 ≤ ε_low < 1, ε_high ≥ ε_low
  (`p`: the `algorithm.policy_loss` section)."""
  check_range("algorithm.policy_loss.clip_low", p.clip_low, low=0, high=1, high_open=True)
  check_range("algorithm.policy_loss.clip_high", p.clip_high, low=p.clip_low,
              note="(algorithm.policy_loss.clip_low)")


def check_weight_bounds(p) -> None:
  """CISPO's IS-weight bounds 1 − ε_low ≤ r̂ ≤ 1 + ε_high: ε_low ≥ 0 (≥ 1: no lower
  bound), ε_high > 0."""
  check_range("algorithm.policy_loss.clip_low", p.clip_low, low=0, note="(CISPO's ε_low^IS)")
  check_range("algorithm.policy_loss.clip_high", p.clip_high, low=0, low_open=True,
              note="(CISPO's ε_high^IS)")


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  """A policy loss and what it reads (see the module docstring)."""
  name: str
  fn: Callable
  sequence_advantages: bool = False
  check_clip: Callable = check_ratio_clip
  options: tuple[str, ...] = ()


def _check_signature(record: PolicyLoss, name: str, field: str) -> None:
  """ConfigError unless the loss takes the signature above (and its options)."""
  check_call(record.fn, field, name, _SIGNATURE, None, None, None, None, clip_low=0.2,
             clip_high=0.2, agg="token-mean", agg_normalizer=None, agg_horizon=None,
             weights=None, **{o: None for o in record.options})


# The table of `algorithm.policy_loss.kind`; a plain function is a PolicyLoss with the
# default capabilities.
POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss", FIELD, PolicyLoss, what="PolicyLoss or function", wrap=PolicyLoss,
    check=_check_signature)
for _record in (
    PolicyLoss("ppo", kernels.ppo_policy_loss, options=("dual_clip",)),
    PolicyLoss("gspo", kernels.gspo_policy_loss, sequence_advantages=True),
    PolicyLoss("gspo_token", kernels.gspo_token_policy_loss),
    PolicyLoss("cispo", kernels.cispo_policy_loss, check_clip=check_weight_bounds),
):
  POLICY_LOSSES.register(_record.name, _record, built_in=True)
BUILT_IN = POLICY_LOSSES.built_ins()


def register_policy_loss(name: str, fn: Callable, *, sequence_advantages: bool = False,
                         check_clip: Callable = check_ratio_clip,
                         options: tuple[str, ...] = ()) -> PolicyLoss:
  """Adds (or replaces) the policy loss `name`, so `algorithm.policy_loss.kind=name` trains
  with `fn` (the signature of the module docstring): `POLICY_LOSSES.register` with the
  capabilities given. Built-ins cannot be replaced; a name holds no ':' (that spells a
  module path)."""
  return POLICY_LOSSES.register(name, PolicyLoss(
      name, fn, sequence_advantages=sequence_advantages, check_clip=check_clip,
      options=tuple(options)))


def names() -> tuple[str, ...]:
  """The policy losses known by name: built-ins, then registered ones."""
  return tuple(POLICY_LOSSES)


def policy_loss(name: str) -> PolicyLoss:
  """The record of `algorithm.policy_loss.kind`: a built-in, a registered name, or
  "package.module:name" (a `PolicyLoss`, or a function taken with the default
  capabilities); `POLICY_LOSSES.resolve`.

  Raises:
    ConfigError: one line naming algorithm.policy_loss.kind, for an unknown name, a module
      that does not import, an attribute that is neither, or a function of another
      signature.
  """
  return POLICY_LOSSES.resolve(name)
