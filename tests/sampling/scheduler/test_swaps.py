"""The scheduler's weight swaps as plain functions (sampling/scheduler/swaps.py): when a
swap is due and what it drops, against the rules written out below, with stand-ins for
the engine's side (no model: the refill of running samples is tested end to end in
tests/sampling/test_partial_rollouts.py)."""

from __future__ import annotations

import itertools

import pytest

from rlhf_jax.sampling.scheduler import swaps
from rlhf_jax.sampling.scheduler.scheduler import Scheduler


def expected_due(policy: str, pending: bool, running: bool, in_flight: bool) -> bool:
  """The rule: nothing to swap without pending weights; 'finish_old' waits until no sample
  runs; 'swap_now' swaps at once, but under running samples only once the dispatch in
  flight has been read (the refill needs every emitted token)."""
  if not pending:
    return False
  if policy == "finish_old":
    return not running
  return not running or not in_flight


@pytest.mark.parametrize("policy,pending,running,in_flight", [
    (policy, *flags) for policy in ("finish_old", "swap_now")
    for flags in itertools.product((False, True), repeat=3)])
def test_a_swap_is_due_as_the_update_policy_says(policy, pending, running, in_flight):
  assert swaps.swap_due(policy, pending, running, in_flight) == expected_due(
      policy, pending, running, in_flight)
  # `step` reads the dispatch in flight first only when 'swap_now' has weights waiting.
  assert swaps.reads_first(policy, pending, in_flight) == (
      policy == "swap_now" and pending and in_flight)


class RecordingPrefixCache:
  """Records the versions whose parked rows must go."""

  def __init__(self):
    self.dropped = []

  def drop_stale(self, version):
    self.dropped.append(version)


class StartedRequest:
  """A request whose samples wait for a slot, with a prefill (or a parked row) of
  weights `prefix_version`."""

  def __init__(self, prefix_version):
    self.prefix_version = prefix_version
    self.prefix = self.parked = f"made by version {prefix_version}"


def test_a_swap_with_no_sample_running_drops_what_other_weights_made_and_refills_nothing():
  cache, state = RecordingPrefixCache(), object()
  stale, fresh = StartedRequest(3), StartedRequest(4)
  new_state, refilled = swaps.swap_weights(engine=None, params=None, version=4, state=state,
                                           running={}, requests=[stale, fresh],
                                           prefix_cache=cache, plan={})
  assert (new_state, refilled) == (state, 0)  # no running row: the state is untouched
  assert cache.dropped == [4]  # parked rows of any other version go
  assert stale.prefix is None and stale.parked is None  # starts from a new prefill
  assert fresh.prefix == fresh.parked == "made by version 4"


def test_the_scheduler_is_no_mixin():
  """Its swaps are functions it calls with what they need, not a base class working on
  its private state."""
  assert Scheduler.__mro__ == (Scheduler, object)
