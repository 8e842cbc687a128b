"""The batch a learner trains on: a rollout batch plus what `prepare` computes from it.

    rollout  →  RolloutBatch    what the rollout returns: tokens, masks, the sampler's
                                log-probs, scores, versions (batch/rollout_batch.py)
    prepare  →  TrainBatch      + π_old, π_ref, values, importance weights, the
                                correction's mask, advantages, returns

A TrainBatch is a RolloutBatch with those fields added (one flat record, not a rollout
nested inside), so the losses read `batch.tokens` and `batch.advantages` alike, and the
forwards and masks of a rollout batch serve both.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from rlhf_jax.batch.rollout_batch import RolloutBatch


@flax.struct.dataclass(kw_only=True)
class TrainBatch(RolloutBatch):
  """A rollout batch prepared for the updates (B rows, R response columns).

  Attributes (besides RolloutBatch's):
    ref_logprobs: [B, R] log π_ref (the rollout's, or the trainer's reference forward;
      zeros when nothing reads a reference). Never None here.
    old_logprobs: [B, R] log π_old of each response token: the trainer's forward
      under the weights being learned (π_prox of a stale token), or the sampler's
      where `prepare` keeps it (`ppo_family.behaviour_correction`).
    values: [B, R] critic values V(s_t) before each response token (zeros without a
      critic).
    is_weights: [B, R] rollout-correction importance weights (`kernels.rollout_correction`;
      1 without a correction).
    correction_mask: [B, R] 0 on the tokens masked importance sampling drops.
    advantages: [B, R] the actor's advantages.
    returns: [B, R] the critic's targets (zeros without a critic).
  """
  old_logprobs: jax.Array
  values: jax.Array
  is_weights: jax.Array
  correction_mask: jax.Array
  advantages: jax.Array
  returns: jax.Array

  @classmethod
  def from_rollout(cls, batch: RolloutBatch, *, old_logprobs: jax.Array | None = None,
                   ref_logprobs: jax.Array | None = None, values: jax.Array | None = None,
                   is_weights: jax.Array | None = None,
                   correction_mask: jax.Array | None = None,
                   advantages: jax.Array | None = None,
                   returns: jax.Array | None = None) -> TrainBatch:
    """`batch` with the prepared fields; each one not given takes the value that leaves
    it out of the loss: π_old = the sampler's log-probs, π_ref = the rollout's (else
    zeros), values, advantages and returns 0, weights and mask 1."""
    zeros = lambda: jnp.zeros(jnp.shape(batch.response_mask), jnp.float32)
    ones = lambda: jnp.ones(jnp.shape(batch.response_mask), jnp.float32)
    if ref_logprobs is None:
      ref_logprobs = zeros() if batch.ref_logprobs is None else batch.ref_logprobs
    rollout = {f.name: getattr(batch, f.name) for f in dataclasses.fields(RolloutBatch)}
    return cls(**{**rollout, "ref_logprobs": ref_logprobs},
               old_logprobs=batch.sampler_logprobs if old_logprobs is None else old_logprobs,
               values=zeros() if values is None else values,
               is_weights=ones() if is_weights is None else is_weights,
               correction_mask=ones() if correction_mask is None else correction_mask,
               advantages=zeros() if advantages is None else advantages,
               returns=zeros() if returns is None else returns)

  def policy_mask(self) -> jax.Array:
    """[B, R] the tokens the policy loss uses: those sampled in this step and not
    dropped by the rollout correction."""
    return self.sampled_mask() * self.correction_mask
