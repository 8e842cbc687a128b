"""DQO: the LM trained as a soft Q-function (Liu et al., arXiv:2410.09302;
docs/formulas.md#dqo; the targets and losses are our reconstruction, see kernels/q_learning.py).

    Q_θ(s_h, a_h) = β·log π_θ(a_h|s_h)/π_ref(a_h|s_h) + V_φ(s_h)

`prepare` computes, once per step with the pre-update θ and φ, the soft λ-return targets
G_h of every response token (the outcome reward at the last token), with clipped
importance weights of π_θ against the behaviour policy that sampled the rows (their
`sampler_logprobs`: the SFT policy for the offline data). The policy then regresses
β·ℓ_h + sg V_h on G_h and the value head V_h + sg β·ℓ_h on G_h.
"""

from __future__ import annotations

import jax
import ml_collections

from rlhf_jax import kernels
from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import TrainBatch
from rlhf_jax.batch import response_logprobs
from rlhf_jax.batch import response_values
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of

REFERENCES = ("cached", "online")


def dqo_config() -> ml_collections.ConfigDict:
  """The `algorithm.dqo` section (one comment per field)."""
  d = ml_collections.ConfigDict()
  d.beta = 0.1  # β of the KL-regularised objective (a community TRL fork: 0.03).
  d.lam = 1.0  # λ of the soft λ-return (1: Monte Carlo; the same fork: 1.0).
  d.gamma = 1.0  # γ.
  d.trace_clip = 1.0  # c̄ in c_h = min(π_θ/μ, c̄) (Retrace's 1).
  # 'cached': π_ref's log-probs of the offline data computed once (rollout.mode
  # 'offline'); 'online': the frozen reference's forward each step. Offline data is
  # taken to be sampled by the starting policy (= π_ref, the behaviour policy μ of the
  # importance weights) at temperature 1 without truncation, as launch/label_samples.py
  # does; μ is recomputed from its text, so other data (external pairs, other sampling
  # settings) makes the weights approximate.
  d.reference = "cached"
  return d


def validate_dqo_fields(d: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the `algorithm.dqo.*` field whose value is out of range
  (every run: a section is checked even when another learner is picked)."""
  check_range("algorithm.dqo.beta", d.beta, low=0, low_open=True)
  for field in ("lam", "gamma"):
    check_range(f"algorithm.dqo.{field}", d[field], low=0, high=1)
  check_range("algorithm.dqo.trace_clip", d.trace_clip, low=0, low_open=True)
  one_of("algorithm.dqo.reference", d.reference, REFERENCES)


def validate_run(c: ml_collections.ConfigDict, *, fixed_data: bool) -> None:
  """Raises ConfigError naming the field of an impossible DQO run (the registry's
  `LearnerSpec.validate`): how `algorithm.dqo` fits the `rollout` and `data` sections;
  `fixed_data`: the rollout mode trains on fixed data (labelled offline groups)."""
  d, r = c.algorithm.dqo, c.rollout
  if d.reference == "cached" and not fixed_data:
    invalid("algorithm.dqo.reference", d.reference, "must be 'online' unless "
            "rollout.mode='offline' (the samples of a sampling mode are new each step)")
  if fixed_data and not c.data.offline_file and r.group_size != c.data.offline_samples:
    invalid("rollout.group_size", r.group_size, "must equal data.offline_samples="
            f"{c.data.offline_samples} for DQO on the generated offline data (whole groups)")


def prepare(d: ml_collections.ConfigDict, batch: RolloutBatch, *, logprobs: jax.Array,
            ref_logprobs: jax.Array, values: jax.Array) -> tuple[TrainBatch, dict]:
  """The TrainBatch of the rollout `batch` with `old_logprobs` (π_θ), `ref_logprobs`,
  `values` (V_φ) and `returns` (the targets G_h of `kernels.soft_lambda_returns`); and
  metrics."""
  mask = batch.response_mask
  log_ratio = (logprobs - ref_logprobs) * mask
  traces = kernels.clipped_importance_weights(logprobs, batch.sampler_logprobs, mask,
                                              clip=d.trace_clip)
  targets = kernels.soft_lambda_returns(batch.token_rewards(), values, log_ratio, traces, mask,
                                        beta=d.beta, lam=d.lam, gamma=d.gamma)
  count = mask.sum()
  metrics = {"dqo/target_mean": (targets * mask).sum() / count,
             "dqo/trace_mean": (traces * mask).sum() / count,
             "dqo/kl_k1": (log_ratio * mask).sum() / batch.scores.shape[0],
             "scores": batch.scores}
  return TrainBatch.from_rollout(batch, old_logprobs=logprobs * mask,
                                 ref_logprobs=ref_logprobs * mask, values=values * mask,
                                 returns=targets), metrics


def policy_loss_fn(model, d: ml_collections.ConfigDict):
  """(params, batch, normalizer) → (L_π, metrics) of `kernels.dqo_policy_loss`."""

  def loss(params, batch: TrainBatch, normalizer):
    logprobs = response_logprobs(model, params, batch)
    return kernels.dqo_policy_loss(logprobs - batch.ref_logprobs, batch.values, batch.returns,
                                   batch.response_mask, beta=d.beta, agg_normalizer=normalizer)

  return loss


def value_loss_fn(critic, d: ml_collections.ConfigDict):
  """(params, batch, normalizer) → (L_V, metrics) of `kernels.dqo_value_loss` (ℓ from the
  prepare-time π_θ)."""

  def loss(params, batch: TrainBatch, normalizer):
    values = response_values(critic, params, batch)
    return kernels.dqo_value_loss(values, batch.old_logprobs - batch.ref_logprobs,
                                  batch.returns, batch.response_mask, beta=d.beta,
                                  agg_normalizer=normalizer)

  return loss
