"""The batch split (batch/rollout_batch.py, batch/train_batch.py): a rollout batch holds
what the rollout returns and nothing `prepare` computes; a TrainBatch adds exactly those
fields, starts them at the values that leave them out of the loss, and masks the policy
loss as the formula says."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import batch as batch_lib
from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import TrainBatch

PREPARED = {"old_logprobs", "values", "is_weights", "correction_mask", "advantages",
            "returns"}


def rollouts(window_starts=(0, 0, 2)):
  """Three rows of ragged responses (R = 4) with their sampler log-probs."""
  return batch_lib.build_rollout_batch(
      [[5], [5, 6], [7]], [[1, 2], [1, 2, 3, 4], [3, 3, 3]],
      [[-0.5, -1.0], [-0.1, -0.2, -0.3, -0.4], [-2.0, -2.5, -3.0]], [1.0, 0.0, 0.5],
      [False, True, False], [0, 0, 1], prompt_length=2, response_length=4, pad_id=0,
      window_starts=list(window_starts))


def names(cls) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def test_a_rollout_batch_holds_no_field_prepare_computes():
  assert not names(RolloutBatch) & PREPARED
  assert names(TrainBatch) == names(RolloutBatch) | PREPARED
  batch = rollouts()
  assert batch.ref_logprobs is None  # no rollout brought a reference
  assert not any(hasattr(batch, name) for name in PREPARED)
  # The rollout's leaves travel to the device and through jit; None (no reference
  # log-probs, no recorded routes) is no leaf.
  assert batch.routes is None
  assert len(jax.tree.leaves(batch)) == len(names(RolloutBatch)) - 2
  doubled = jax.jit(lambda b: b.replace(scores=2 * b.scores))(batch)
  assert isinstance(doubled, RolloutBatch) and doubled.ref_logprobs is None
  np.testing.assert_array_equal(doubled.scores, [2.0, 0.0, 1.0])


def test_a_train_batch_starts_with_the_values_that_leave_its_fields_out_of_the_loss():
  batch = rollouts()
  mask = np.asarray(batch.response_mask)
  train = TrainBatch.from_rollout(batch)
  np.testing.assert_array_equal(train.old_logprobs, batch.sampler_logprobs)  # π_old = μ
  for name, value in (("ref_logprobs", 0.0), ("values", 0.0), ("advantages", 0.0),
                      ("returns", 0.0), ("is_weights", 1.0), ("correction_mask", 1.0)):
    np.testing.assert_array_equal(getattr(train, name), np.full(mask.shape, value), name)
  for name in names(RolloutBatch) - {"ref_logprobs"}:
    np.testing.assert_array_equal(getattr(train, name), getattr(batch, name), name)
  # A rollout's own reference log-probs (the sampling servers') are kept ...
  theirs = np.full(mask.shape, -1.5, np.float32)
  kept = TrainBatch.from_rollout(batch.replace(ref_logprobs=theirs))
  np.testing.assert_array_equal(kept.ref_logprobs, theirs)
  # ... unless prepare gives the trainer's; a given field is taken as it is.
  ours = np.full(mask.shape, -0.25, np.float32)
  given = TrainBatch.from_rollout(batch.replace(ref_logprobs=theirs), ref_logprobs=ours,
                                  advantages=2 * mask)
  np.testing.assert_array_equal(given.ref_logprobs, ours)
  np.testing.assert_array_equal(given.advantages, 2 * mask)
  # A TrainBatch prepared again starts from its rollout fields only.
  again = TrainBatch.from_rollout(given)
  np.testing.assert_array_equal(again.advantages, np.zeros(mask.shape))


def test_the_policy_mask_is_the_sampled_tokens_the_correction_keeps():
  """policy_mask[b, t] = response_mask · [t ≥ window_start_b] · correction_mask, from the
  definition, on a T-PPO row whose first two tokens are context."""
  batch = rollouts(window_starts=(0, 1, 2))
  keep = np.asarray([[1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]], np.float32)
  train = jax.jit(lambda b, k: TrainBatch.from_rollout(b, correction_mask=k).policy_mask())(
      batch_lib.as_device(batch), jnp.asarray(keep))
  lengths, starts = [2, 4, 3], [0, 1, 2]
  expected = np.zeros((3, 4), np.float32)
  for b in range(3):
    for t in range(4):
      expected[b, t] = float(t < lengths[b] and t >= starts[b]) * keep[b, t]
  np.testing.assert_array_equal(np.asarray(train), expected)
