"""Reference log-probs from the sampling servers (`rollout.reference_logprobs='sampler'`).

The KL term's log π_ref of a batch does not depend on the weights being trained, so the
servers that sampled the batch can compute it: each keeps the trainer's reference weights
(sent once, `update_reference`; sampling/serve/reference.py) and scores the batch's rows.
Wrapped around a rollout mode inside the look-ahead (`LookAhead.rollout`), the forward
runs where the mode's `collect` does: with `rollout.max_staleness` > 0 on the generation
thread, overlapping the learner's update. The trainer holds no reference copy at all.
Where log π_ref comes from is decided here and in `check_config`; the learner only sees
a batch whose `ref_logprobs` are filled.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rlhf_jax.config_errors import invalid
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.modes import rollout_mode

PLACES = ("trainer", "sampler")


def from_sampler(c) -> bool:
  """Whether the sampling servers compute the reference log-probs."""
  return c.rollout.reference_logprobs == "sampler"


def check_config(c, *, uses_reference: bool, remote: bool, sampler_reference: bool) -> None:
  """Raises ConfigError naming the field when `rollout.reference_logprobs='sampler'` cannot
  hold: it needs sampling servers, a learner that takes it (`sampler_reference`, from the
  learner's registry spec) with a reference (a KL term), a frozen reference, and servers
  computing in the trainer's dtype (the KL compares the two)."""
  place = c.rollout.reference_logprobs
  if place not in PLACES:
    invalid("rollout.reference_logprobs", place, f"must be one of {', '.join(PLACES)}")
  if place != "sampler":
    return
  why = None
  if not remote:
    why = "needs sampling servers (sampler.address or sampler.addresses)"
  elif not sampler_reference or rollout_mode(c).fixed_data:
    why = "is for the PPO family's learner on sampled rollouts"
  elif not uses_reference:
    why = "needs a reference: algorithm.kl.placement is 'none'"
  elif c.algorithm.kl.reference_ema:
    why = (f"needs a frozen reference; algorithm.kl.reference_ema="
           f"{c.algorithm.kl.reference_ema} moves it with the policy")
  elif c.sampler.dtype != c.model.dtype:
    why = (f"needs sampler.dtype == model.dtype (the KL compares the two; got "
           f"{c.sampler.dtype!r} and {c.model.dtype!r})")
  if why:
    invalid("rollout.reference_logprobs", place, why)


def send_reference(sampler, params, trainer_dtype: str) -> None:
  """Gives the servers behind `sampler` the reference weights `params`, and checks that
  every server computes in the trainer's dtype (its reply names it)."""
  replies = sampler.update_reference(params)
  for reply in replies if isinstance(replies, list) else [replies]:
    if reply.compute_dtype and reply.compute_dtype != trainer_dtype:
      invalid("rollout.reference_logprobs", "sampler", f"needs servers computing in "
              f"model.dtype={trainer_dtype!r}; a server computes in {reply.compute_dtype!r} "
              "(start it with --config.sampler.dtype to match)")


class SamplerReferenceRollout:
  """A rollout mode whose batches carry the servers' reference log-probs.

  Args:
    inner: the rollout mode.
    reference: the sampler (a SamplerClient or SamplerFleet, possibly behind a
      VersionedSampler) that computes `reference_logprobs`.
  """

  def __init__(self, inner, reference):
    self.inner, self.reference = inner, reference

  def collect(self) -> Rollouts:
    """The inner rollout's batch with `ref_logprobs` filled; metric time_reference (s)."""
    rollouts = self.inner.collect()
    batch = rollouts.batch
    start = time.perf_counter()
    ref = np.asarray(self.reference.reference_logprobs(
        batch.tokens, batch.attention_mask, batch.response_mask), np.float32)
    if ref.shape != batch.response_mask.shape:
      raise RuntimeError(f"the sampler returned reference log-probs of shape "
                         f"{list(ref.shape)} for rows {list(batch.response_mask.shape)}")
    rollouts.batch = batch.replace(ref_logprobs=ref)
    rollouts.metrics["time_reference"] = time.perf_counter() - start
    return rollouts

  def set_step(self, step: int) -> None:
    """The inner rollout's."""
    self.inner.set_step(step)

  def pop_mix(self) -> dict[str, int]:
    """The inner rollout's."""
    return self.inner.pop_mix()

  def state(self) -> dict[str, Any]:
    """The inner rollout's (this wrapper keeps nothing of its own)."""
    return self.inner.state()

  def restore(self, state: dict[str, Any]) -> None:
    """The inner rollout's."""
    self.inner.restore(state)

  def settle(self) -> None:
    """The inner rollout's."""
    self.inner.settle()

  def close(self) -> None:
    """The inner rollout's."""
    self.inner.close()
