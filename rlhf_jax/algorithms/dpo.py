"""Direct Preference Optimisation (Rafailov et al., arXiv:2305.18290; IPO, Azar et al.
arXiv:2310.12036; hinge / SLiC; docs/formulas.md#dpo, #dpo-vs-ppo) over groups of the rollout
batch.

A step's RolloutBatch holds groups of G responses per prompt (rows adjacent): offline
pairs (G = 2, chosen then rejected: rollout.mode "offline") or our own samples ranked
by a scorer (iterative / online DPO: rollout.mode "groups"). `pairs_from_groups` makes
one pair per group on device: the highest-scored response against the lowest (a group
whose scores are all equal gives a pair of weight 0). The reference's per-token
log-probs ride in the rows (`ref_logprobs`): cached once for offline data, or computed
by the frozen reference each step.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlhf_jax import kernels
from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import encode_pairs
from rlhf_jax.batch import response_logprobs
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of

REFERENCES = ("cached", "online")


def dpo_config() -> ml_collections.ConfigDict:
  """The `algorithm.dpo` section (one comment per field)."""
  d = ml_collections.ConfigDict()
  d.beta = 0.1  # β (TRL default 0.1).
  d.kind = "sigmoid"  # 'sigmoid' (DPO), 'ipo' or 'hinge' (SLiC).
  d.label_smoothing = 0.0  # cDPO's ε, sigmoid only (TRL default 0).
  # 'cached': π_ref's log-probs of the offline data computed once at the start
  # (rollout.mode 'offline' only); 'online': the frozen reference's forward each step.
  d.reference = "cached"
  # Iterative DPO: every N steps the reference becomes the current policy (0: never).
  d.reference_sync_every = 0
  return d


def validate_dpo_fields(d: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the `algorithm.dpo.*` field whose value is out of range
  (every run: a section is checked even when another learner is picked)."""
  one_of("algorithm.dpo.kind", d.kind, kernels.DPO_KINDS)
  check_range("algorithm.dpo.beta", d.beta, low=0, low_open=True)
  check_range("algorithm.dpo.label_smoothing", d.label_smoothing, low=0, high=0.5,
              high_open=True)
  if d.label_smoothing and d.kind != "sigmoid":
    invalid("algorithm.dpo.label_smoothing", d.label_smoothing, "must be 0 unless "
            f"algorithm.dpo.kind='sigmoid' (cDPO; kind={d.kind!r})")
  one_of("algorithm.dpo.reference", d.reference, REFERENCES)
  check_range("algorithm.dpo.reference_sync_every", d.reference_sync_every, low=0,
              note="(0: never)")


def validate_run(c: ml_collections.ConfigDict, *, fixed_data: bool) -> None:
  """Raises ConfigError naming the field of an impossible DPO run (the registry's
  `LearnerSpec.validate`): how `algorithm.dpo` fits the `rollout` and `train` sections;
  `fixed_data`: the rollout mode trains on fixed data (offline pairs)."""
  d, r = c.algorithm.dpo, c.rollout
  if d.reference == "cached" and not fixed_data:
    invalid("algorithm.dpo.reference", d.reference, "must be 'online' unless "
            "rollout.mode='offline' (the samples of a sampling mode are new each step)")
  if d.reference_sync_every and d.reference == "cached":
    invalid("algorithm.dpo.reference_sync_every", d.reference_sync_every, "must be 0 with "
            "algorithm.dpo.reference='cached' (a cached reference cannot move)")
  if r.group_size < 2:
    invalid("rollout.group_size", r.group_size, "must be >= 2 for DPO (a pair per group)")
  if fixed_data and r.group_size != 2:
    invalid("rollout.group_size", r.group_size, "must be 2 for offline DPO (each labelled "
            "group is reduced to its best and worst response)")
  minibatches = c.train.minibatches
  if r.prompts_per_step % minibatches:
    invalid("train.minibatches", minibatches, f"must divide the {r.prompts_per_step} pairs "
            "per step (rollout.prompts_per_step)")
  if (r.prompts_per_step // minibatches) % c.train.micro_batches:
    invalid("train.micro_batches", c.train.micro_batches, "must divide the "
            f"{r.prompts_per_step // minibatches} pairs of a mini-batch")


@flax.struct.dataclass
class PairBatch:
  """One pair per group: chosen and rejected rows (RolloutBatch rows with `ref_logprobs`
  set) and [N] weights (1: the pair has a preference; 0: its group's scores tied)."""
  chosen: RolloutBatch
  rejected: RolloutBatch
  weights: jax.Array


def pairs_from_groups(batch: RolloutBatch, group_size: int) -> PairBatch:
  """The PairBatch of a batch of groups (rows of a group adjacent, G = `group_size`):
  per group its highest-scored row against its lowest (the first of equals)."""
  scores = batch.scores.reshape(-1, group_size)
  base = jnp.arange(scores.shape[0]) * group_size
  best, worst = jnp.argmax(scores, axis=1), jnp.argmin(scores, axis=1)
  take = lambda offset: jax.tree.map(lambda x: x[base + offset], batch)
  weights = (jnp.max(scores, axis=1) > jnp.min(scores, axis=1)).astype(jnp.float32)
  return PairBatch(chosen=take(best), rejected=take(worst), weights=weights)


def sequence_logps(model, params, batch: RolloutBatch) -> jax.Array:
  """[B] Σ_t log π(y_t | x, y_<t) over each row's response tokens (EOS included)."""
  return jnp.sum(response_logprobs(model, params, batch) * batch.response_mask, axis=1)


def encode_preference_pairs(tokenizer, pairs, *, prefix: Sequence[int], prompt_length: int,
                            response_length: int) -> RolloutBatch:
  """`PreferencePair`s as a batch of groups of two (chosen row, then rejected row; scores
  1 and 0) in the rollout layout."""
  prompts = [p.prompt for p in pairs for _ in range(2)]
  responses = [text for p in pairs for text in (p.chosen, p.rejected)]
  batch = encode_pairs(tokenizer, prompts, responses, prompt_prefix=prefix,
                       prompt_length=prompt_length, response_length=response_length)
  count = len(pairs)
  return batch.replace(scores=np.tile(np.asarray([1.0, 0.0], np.float32), count),
                       group_ids=np.repeat(np.arange(count, dtype=np.int32), 2))


def dpo_loss_fn(model, d: ml_collections.ConfigDict
                ) -> Callable[[dict, PairBatch, jax.Array], tuple[jax.Array, dict]]:
  """(params, PairBatch, normalizer) → (Σ_pairs w·ℓ / normalizer, metrics): `kernels.dpo_loss`
  of the policy's sequence log-probs (one forward over chosen and rejected rows) and the
  reference's (from the rows' `ref_logprobs`); metrics also hold the policy's mean chosen
  and rejected log-probs."""

  def loss(params, pairs: PairBatch, normalizer):
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), pairs.chosen, pairs.rejected)
    logps = sequence_logps(model, params, both)
    ref = jnp.sum(both.ref_logprobs * both.response_mask, axis=1)
    count = pairs.weights.shape[0]
    value, metrics = kernels.dpo_loss(logps[:count], logps[count:], ref[:count], ref[count:],
                                      beta=d.beta, kind=d.kind,
                                      label_smoothing=d.label_smoothing,
                                      weights=pairs.weights, normalizer=normalizer)
    weight = jnp.maximum(jnp.sum(pairs.weights), 1e-8)
    return value, dict(metrics,
                       chosen_logps=jnp.sum(pairs.weights * logps[:count]) / weight,
                       rejected_logps=jnp.sum(pairs.weights * logps[count:]) / weight)

  return loss
