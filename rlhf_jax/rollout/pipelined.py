"""Bounded-staleness pipelining: generation runs up to k policy versions ahead of the
learner (`rollout.max_staleness = k`; AReaL arXiv:2505.24298, docs/formulas.md#decoupled-ppo).

    step s:  collect()   submits the jobs for batches up to s + k, each pinned to the
                         newest weights (version s), then waits for batch s
             learn(s)    meanwhile a worker thread samples and scores batch s + 1 ...
             push(s+1)   stored by the VersionedSampler; jobs already submitted keep
                         their pinned version

Batch n is sampled with version max(0, n − k), fixed at submission, so a run is
reproducible whatever the threads' timing. k ≥ 1 here: the synchronous loop (k = 0) runs
the rollout mode itself (`rollout.lookahead.SynchronousRollout`). Every token carries the
version that sampled it, and `prepare` corrects stale tokens by decoupled PPO
(`algorithm.staleness`).

The scorer's per-task counters are read right after each job's scoring, into its
`Rollouts.metrics`. A checkpoint waits for the jobs in flight and stores their finished
batches, so a resumed run trains on exactly those batches.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
from typing import Any

import numpy as np

from rlhf_jax.batch import RolloutBatch
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.sampling.protocol import KeepsVersions


@dataclasses.dataclass
class _Job:
  """A finished job: its rollouts (scorer metrics included), its task mix, and the inner
  rollout's state right after it (what a checkpoint taken after this job restores)."""
  rollouts: Rollouts
  mix: dict[str, int]
  inner_state: dict[str, Any] | None = None


class PipelinedRollout:
  """Runs a rollout mode's `collect` up to `max_staleness` steps ahead (module docstring).

  Args:
    inner: the rollout mode (groups, dynamic sampling, multi-turn episodes).
    sampler: the VersionedSampler the inner rollout samples through, keeping at least
      max_staleness + 1 versions.
    scorer: the inner rollout's scorer, whose metrics each job takes.
    max_staleness: k ≥ 1.
    last_step: no job is submitted for this step or later (`train.steps`).

  Build it with its sampler from one k: `rollout.lookahead.LookAhead`.
  """

  def __init__(self, inner, sampler, scorer, *, max_staleness: int,
               last_step: int | None = None):
    if max_staleness < 1:
      raise ValueError(f"max_staleness={max_staleness}: a PipelinedRollout runs ahead "
                       "(k >= 1); k = 0 is the rollout mode itself (LookAhead.rollout)")
    if not (isinstance(sampler, KeepsVersions) and sampler.keep >= max_staleness + 1):
      kept = sampler.keep if isinstance(sampler, KeepsVersions) else "no"
      raise ValueError(f"max_staleness={max_staleness} needs a sampler keeping "
                       f"{max_staleness + 1} weight versions (LookAhead.sampler builds "
                       f"one); got {type(sampler).__name__} keeping {kept}")
    self.inner, self.sampler, self.scorer = inner, sampler, scorer
    self.max_staleness = max_staleness
    self.last_step = last_step
    self.step = 0
    self.next_job = 0
    # The inner state after the last job whose batch `collect` returned.
    self.consumed_state: dict[str, Any] | None = None
    self.pending: dict[int, concurrent.futures.Future] = {}
    self.mix: dict[str, int] = {}
    self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout")

  def set_step(self, step: int) -> None:
    """The training step whose batch the next `collect` returns."""
    self.step = step

  def collect(self) -> Rollouts:
    """Batch `step`: submits the jobs up to step + k, then waits for this one."""
    if self.consumed_state is None:  # before the first job: the starting state
      self.consumed_state = self.inner.state()
    self.next_job = max(self.next_job, self.step)
    last = self.step + self.max_staleness
    if self.last_step is not None:
      last = min(last, max(self.last_step - 1, self.step))
    while self.next_job <= last:
      self.pending[self.next_job] = self.executor.submit(self._run, self.next_job,
                                                         self.sampler.latest)
      self.next_job += 1
    job = self.pending.pop(self.step).result()
    self.consumed_state = job.inner_state
    self.mix = job.mix
    return job.rollouts

  def _run(self, step: int, version: int) -> _Job:
    self.inner.set_step(step)
    with self.sampler.pinned(version):
      rollouts = self.inner.collect()
    rollouts.metrics.update(self.scorer.pop_metrics())  # per task: accuracy, failures, time
    return _Job(rollouts, self.inner.pop_mix(), self.inner.state())

  def pop_mix(self) -> dict[str, int]:
    """Examples drawn per task for the batch last returned."""
    mix, self.mix = self.mix, {}
    return mix

  def settle(self) -> None:
    """Waits until the jobs in flight have finished (their batches are kept)."""
    for future in list(self.pending.values()):
      future.exception()

  def state(self) -> dict[str, Any]:
    """The finished batches not yet trained on and the inner rollout's state after the
    last of them. A job that failed ends the list: a resumed run generates it again (the
    error itself surfaces when `collect` reaches it)."""
    kept, inner_state = {}, self.consumed_state
    next_job = self.next_job
    for step, future in sorted(self.pending.items()):
      if future.exception() is not None:
        next_job = step
        break
      kept[step] = future.result()
      inner_state = kept[step].inner_state
    if inner_state is None:  # nothing submitted yet
      inner_state = self.inner.state()
    return {"inner": inner_state, "next_job": next_job,
            "pending": {str(step): encode_job(job) for step, job in kept.items()}}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`: the finished batches come back as done jobs. A synchronous
    run's checkpoint (the inner state alone) continues with generation ahead."""
    if "pending" not in state:  # a synchronous run's checkpoint
      state = {"inner": state, "next_job": 0, "pending": {}}
    self.inner.restore(state["inner"])
    self.consumed_state = state["inner"]
    self.next_job = int(state["next_job"])
    self.pending = {}
    for step, job in state["pending"].items():
      future = concurrent.futures.Future()
      future.set_result(decode_job(job))
      self.pending[int(step)] = future

  def close(self) -> None:
    """Stops the worker thread after its current job, then the inner rollout (its
    environment workers)."""
    self.executor.shutdown(wait=True, cancel_futures=True)
    self.inner.close()


def _encode_array(array) -> dict[str, Any]:
  array = np.ascontiguousarray(np.asarray(array))
  return {"dtype": array.dtype.str, "shape": list(array.shape),
          "data": base64.b64encode(array.tobytes()).decode("ascii")}


def _decode_array(data: dict[str, Any]) -> np.ndarray:
  flat = np.frombuffer(base64.b64decode(data["data"]), dtype=np.dtype(data["dtype"]))
  return flat.reshape(data["shape"]).copy()


# What a batch held before it was split into the rollout's fields and `prepare`'s
# (batch/train_batch.py): a checkpoint of then stores them, at the values nothing had set.
_PREPARED_FIELDS = ("old_logprobs", "values", "is_weights", "correction_mask", "advantages",
                    "returns")


def encode_job(job: _Job) -> dict[str, Any]:
  """A finished job as JSON (the batch's arrays bit-exact, base64; a field the rollout
  left None is left out)."""
  batch = {field.name: _encode_array(getattr(job.rollouts.batch, field.name))
           for field in dataclasses.fields(RolloutBatch)
           if getattr(job.rollouts.batch, field.name) is not None}
  r = job.rollouts
  return {"batch": batch, "correct": [bool(c) for c in r.correct], "failures": list(r.failures),
          "metrics": {k: float(v) for k, v in r.metrics.items()}, "mix": dict(job.mix),
          "transcripts": r.transcripts, "row_failures": r.row_failures}


def decode_job(data: dict[str, Any]) -> _Job:
  """Inverse of `encode_job`."""
  arrays = {name: _decode_array(a) for name, a in data["batch"].items()
            if name not in _PREPARED_FIELDS}
  if "scored" not in arrays:  # saved before rows could be dropped: every row was scored
    arrays["scored"] = np.ones_like(arrays["finished"], bool)
  batch = RolloutBatch(**arrays)
  rollouts = Rollouts(batch=batch, correct=list(data["correct"]),
                      failures=list(data["failures"]), metrics=dict(data["metrics"]),
                      transcripts=data.get("transcripts"),
                      row_failures=data.get("row_failures"))
  return _Job(rollouts, {k: int(v) for k, v in data["mix"].items()})
