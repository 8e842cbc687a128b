"""VersionedSampler over a recording fake: which version each call samples with, what it
keeps, how a version reaches the wrapped sampler (prepared, loaded, rolled back) and the
refusals (over a real server: tests/sampling/serve/test_security.py)."""

from __future__ import annotations

import threading
import types

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.sampling.versioned import VersionedSampler


class Recording:
  """A sampler that records every load; `generate` answers the version it holds."""

  def __init__(self):
    self.loads = []  # (how, version)
    self.version = 0
    self.params = None

  def update_params(self, params, version):
    self.loads.append(("update", version))
    self.params, self.version = params, version

  def generate(self, prompts, sampling=None):
    return [[self.version] for _ in prompts]

  def cancel(self, request_id, sample_index=None):
    self.loads.append(("cancel", request_id))

  def close(self):
    self.loads.append(("close", None))


class Server(Recording):
  """A server's client: prepares weights (host copies), loads prepared ones, rolls back on
  request, and answers each load with its update policy."""

  def __init__(self, policy="finish_old"):
    super().__init__()
    self.policy = policy

  def prepare_params(self, params):
    return ("prepared", params)

  def load_prepared(self, prepared, version):
    assert prepared[0] == "prepared"
    self.loads.append(("load_prepared", version))
    self.version = version
    return types.SimpleNamespace(update_policy=self.policy)

  def update_params(self, params, version):
    raise AssertionError("a prepared version is loaded with load_prepared")

  def rollback_params(self, params, version):
    self.loads.append(("rollback", version))
    self.version = version
    return types.SimpleNamespace(update_policy=self.policy)


def params(value):
  """Weights {"w": float32[2]} filled with `value`."""
  return {"w": jnp.full((2,), value, jnp.float32)}


def test_keep_must_be_at_least_one():
  with pytest.raises(ValueError, match=r"^keep=0 must be >= 1\.$"):
    VersionedSampler(Recording(), params(0), keep=0)


def test_a_pinned_call_samples_its_version_and_an_unpinned_one_the_newest():
  inner = Recording()
  sampler = VersionedSampler(inner, params(0), keep=3)
  sampler.update_params(params(1), version=1)
  sampler.update_params(params(2), version=2)
  assert inner.loads == []  # stored, loaded only when a call needs it
  with sampler.pinned(1):
    assert sampler.generate([[5]]) == [[1]]
  np.testing.assert_array_equal(inner.params["w"], [1, 1])
  assert sampler.generate([[5]]) == [[2]]
  assert sampler.generate([[5]]) == [[2]]  # already loaded: not sent again
  with sampler.pinned(0):
    assert sampler.generate([[5]]) == [[0]]
  assert inner.loads == [("update", 1), ("update", 2), ("update", 0)]
  assert sampler.latest == 2 and sampler.loaded == 0


def test_versions_beyond_keep_are_dropped_and_asking_for_one_says_so():
  sampler = VersionedSampler(Recording(), params(0), keep=2)
  for version in (1, 2, 3):
    sampler.update_params(params(version), version)
  assert sorted(sampler.versions) == [2, 3]
  with sampler.pinned(1), pytest.raises(
      KeyError, match=r"weights version 1 is no longer kept \(kept: \[2, 3\]\); raise `keep`"):
    sampler.generate([[5]])


def test_stored_weights_are_copies_the_learner_may_donate():
  sampler = VersionedSampler(Recording(), params(0))
  new = params(1)
  sampler.update_params(new, version=1)
  assert sampler.versions[1]["w"] is not new["w"]
  np.testing.assert_array_equal(sampler.versions[1]["w"], new["w"])


def test_a_server_gets_prepared_weights_and_an_older_version_as_a_rollback():
  server = Server()
  sampler = VersionedSampler(server, ("prepared", params(0)), keep=3)
  sampler.update_params(params(1), version=1)
  assert sampler.versions[1][0] == "prepared"  # prepared on the caller's thread
  sampler.generate([[5]])
  with sampler.pinned(0):
    assert sampler.generate([[5]]) == [[0]]
  assert server.loads == [("load_prepared", 1), ("rollback", 0)]


def test_partial_rollouts_load_at_once_and_need_swap_now_servers():
  server = Server(policy="swap_now")
  sampler = VersionedSampler(server, ("prepared", params(0)), partial=True)
  sampler.update_params(params(1), version=1)
  assert server.loads == [("load_prepared", 1)] and sampler.loaded == 1
  with sampler.pinned(0):  # partial: the newest weights, whatever the pin
    assert sampler.generate([[5]]) == [[1]]
  finishing = VersionedSampler(Server(), ("prepared", params(0)), partial=True)
  with pytest.raises(ValueError, match=r"sampler\.update_policy='swap_now'; found "
                     r"\['finish_old'\]"):
    finishing.update_params(params(1), version=1)


def test_a_pin_holds_for_its_own_thread_only():
  sampler = VersionedSampler(Recording(), params(0), keep=3)
  sampler.update_params(params(1), version=1)
  pinned, other = threading.Event(), threading.Event()
  seen = {}

  def generate_unpinned():
    pinned.wait(30)
    seen["other"] = sampler.generate([[5]])
    other.set()

  thread = threading.Thread(target=generate_unpinned)
  thread.start()
  with sampler.pinned(0):
    pinned.set()
    assert other.wait(30)
    seen["pinned"] = sampler.generate([[5]])
  thread.join(30)
  assert seen == {"other": [[1]], "pinned": [[0]]}


def test_cancel_and_close_reach_the_wrapped_sampler():
  inner = Recording()
  sampler = VersionedSampler(inner, params(0))
  sampler.cancel("r1")
  sampler.close()
  assert inner.loads == [("cancel", "r1"), ("close", None)]
  assert sampler.wrapped() is inner
