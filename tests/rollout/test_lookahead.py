"""Staleness decided once (rollout/lookahead.py): the plan builds the versioned sampler and
the look-ahead rollout from one k; the samplers' extras are asked by protocol
(sampling/protocol.py), also behind a wrapper."""

import types

import jax.numpy as jnp
import ml_collections
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rollout.lookahead import LookAhead
from rlhf_jax.rollout.lookahead import SynchronousRollout
from rlhf_jax.rollout.multi_turn import MultiTurnRollout
from rlhf_jax.rollout.pipelined import PipelinedRollout
from rlhf_jax.sampling import protocol
from rlhf_jax.sampling.versioned import VersionedSampler
from tests.fakes import FakeRollout
from tests.fakes import FakeSampler
from tests.fakes import FakeScorer


def config(k, partial=False, steps=100):
  c = ml_collections.ConfigDict()
  c.rollout = dict(max_staleness=k, partial_rollouts=partial)
  c.train = dict(steps=steps)
  return c


@pytest.mark.parametrize("k, expected", [(0, [0, 1, 2, 3]), (2, [0, 0, 0, 1])])
def test_one_plan_builds_the_sampler_and_the_rollout_with_one_k(k, expected):
  plan = LookAhead.of(config(k))
  raw = FakeSampler()
  sampler = plan.sampler(raw, {"w": jnp.zeros(2)})
  assert (sampler is raw) == (k == 0)
  assert k == 0 or (isinstance(sampler, protocol.KeepsVersions) and sampler.keep == k + 1)
  rollout = plan.rollout(FakeRollout(sampler), sampler, FakeScorer())
  assert isinstance(rollout, SynchronousRollout if k == 0 else PipelinedRollout)
  versions = []
  for step in range(4):  # the loop's calls: collect, learn, push
    rollout.set_step(step)
    versions.append(int(rollout.collect().metrics["version"]))
    sampler.update_params({"w": jnp.full(2, step + 1.0)}, version=step + 1)
  rollout.close()
  assert versions == expected  # batch n samples with version max(0, n - k)


@pytest.mark.parametrize("keep", [None, 2])
def test_a_rollout_ahead_of_what_its_sampler_keeps_is_refused(keep):
  """k = 2 pins jobs to versions up to 2 behind: a sampler keeping 2 would drop one."""
  sampler = FakeSampler() if keep is None else VersionedSampler(FakeSampler(), {}, keep=keep)
  with pytest.raises(ValueError, match="needs a sampler keeping 3 weight versions"):
    PipelinedRollout(FakeRollout(sampler), sampler, FakeScorer(), max_staleness=2)
  with pytest.raises(ValueError, match="keeping 3 weight versions"):
    LookAhead(steps=2).rollout(FakeRollout(sampler), sampler, FakeScorer())
  with pytest.raises(ValueError, match="max_staleness=0: a PipelinedRollout runs ahead"):
    PipelinedRollout(FakeRollout(sampler), sampler, FakeScorer(), max_staleness=0)


class CountingScorer(FakeScorer):
  """A scorer whose metrics are the batches scored since they were last popped."""

  def __init__(self):
    super().__init__()
    self.batches = 0

  def pop_metrics(self):
    batches, self.batches = self.batches, 0
    return {"batches_scored": float(batches)}


def test_the_synchronous_plan_runs_the_mode_itself_with_its_scorer_s_metrics():
  """k = 0: each of the seam's calls reaches the mode once, inline; each batch carries
  the scorer's figures of its own scoring; a checkpoint of a run ahead is refused."""
  scorer, mode = CountingScorer(), FakeRollout()
  collect = mode.collect

  def scored():
    scorer.batches += 1
    return collect()

  mode.collect = scored
  rollout = LookAhead(steps=0).rollout(mode, mode.sampler, scorer)
  for step in range(2):
    rollout.set_step(step)
    assert rollout.collect().metrics["batches_scored"] == 1
    assert rollout.pop_mix() == {"arith": 1}
  rollout.settle()
  assert rollout.state() == {"position": 2}
  rollout.restore({"position": 1})
  assert mode.position == 1
  with pytest.raises(ConfigError, match="max_staleness: invalid value 0: the checkpoint holds "
                     "2 batches generated ahead") as error:
    rollout.restore({"inner": {"position": 3}, "next_job": 5, "pending": {"3": {}, "4": {}}})
  assert error.value.field == "rollout.max_staleness"
  rollout.close()
  assert mode.calls == ["set_step", "pop_mix", "set_step", "pop_mix", "settle", "state",
                        "restore", "close"]


def test_the_plan_refuses_what_cannot_hold():
  with pytest.raises(ValueError, match="steps=-1"):
    LookAhead(steps=-1)
  with pytest.raises(ValueError, match="partial needs steps >= 1"):
    LookAhead(steps=0, partial=True)
  assert LookAhead.of(config(1, partial=True, steps=7)) == LookAhead(1, True, 7)
  assert LookAhead(0).synchronous and not LookAhead(1).synchronous


class PreparingSampler(FakeSampler):
  """A sampler whose weights are prepared (a server's host copies, a process job's
  replicas), then loaded as they are; it rolls back on purpose when told."""

  def __init__(self):
    super().__init__()
    self.loaded, self.rolled_back = [], []

  def prepare_params(self, params):
    return {"prepared": params}

  def load_prepared(self, prepared, version):
    self.loaded.append(prepared)
    self.version = version

  def rollback_params(self, params, version):
    self.rolled_back.append(version)
    self.version = version


def test_the_versioned_sampler_asks_its_sampler_s_extras_by_protocol():
  inner = PreparingSampler()
  assert isinstance(inner, protocol.LoadsPrepared) and isinstance(inner, protocol.RollsBack)
  sampler = LookAhead(steps=1).sampler(inner, "w0")
  assert sampler.versions == {0: {"prepared": "w0"}}  # the initial weights prepared too
  sampler.update_params("w1", version=1)
  sampler.generate([[1]])  # the newest: loaded as prepared, not prepared again
  assert inner.loaded == [{"prepared": "w1"}]
  with sampler.pinned(0):
    (samples,), = sampler.generate([[1]])
  assert inner.rolled_back == [0] and samples.weights_version == (0, 0)
  # A bare Sampler: copies kept, update_params loads them.
  bare = LookAhead(steps=1).sampler(FakeSampler(), {"w": jnp.zeros(2)})
  bare.update_params({"w": jnp.ones(2)}, version=1)
  bare.generate([[1]])
  assert bare.inner.updates == [1]


class Counting(FakeSampler):
  """A sampler that reports figures (an in-process scheduler's prefill counts)."""

  def metrics(self):
    return {"prefilled_tokens": 7.0, "reused_tokens": 2.0, "queue": 1.0}


def test_extras_are_found_behind_a_wrapper_and_a_missing_one_is_named():
  inner = Counting()
  versioned = VersionedSampler(inner, {}, keep=2)
  assert not isinstance(versioned, protocol.ReportsMetrics)  # forwards the seam only
  assert protocol.find_extra(versioned, protocol.ReportsMetrics) is inner
  assert protocol.find_extra(versioned, protocol.ReferenceSampler) is None
  with pytest.raises(TypeError, match="needs a sampler that is a ReferenceSampler; "
                     "VersionedSampler is not, nor wraps one"):
    protocol.require_extra(versioned, protocol.ReferenceSampler, "the test")
  # A multi-turn rollout's prefill counts come from behind the wrapper.
  episodes = types.SimpleNamespace(generator=types.SimpleNamespace(sampler=versioned))
  assert MultiTurnRollout.prefill_counts(episodes) == {"prefilled_tokens": 7.0,
                                                       "reused_tokens": 2.0}
  episodes.generator.sampler = VersionedSampler(FakeSampler(), {}, keep=2)
  assert MultiTurnRollout.prefill_counts(episodes) == {}
