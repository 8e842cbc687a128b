"""The process-sharded sampler keeps the trainer's gather of new weights and the worker
thread's local generation apart (`devices_lock`): in a job of several processes the two
threads never dispatch into the process's devices at once, whatever their timing. One
process here; the ordering is per process."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import parallel
from rlhf_jax.sampling.process_shards import ProcessShardedSampler

PARAMS = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)}
WAIT_S = 1.0  # how long the other thread gets to (wrongly) run; a pass waits this long once


class BlockingLocal:
  """A local sampler whose `generate` records its end after `release` is set."""

  def __init__(self, events: list[str]):
    self.events = events
    self.started, self.release = threading.Event(), threading.Event()

  def generate(self, prompts, samplings):
    self.started.set()
    assert self.release.wait(timeout=30)
    self.events.append("generated")
    return [[f"completion of {list(p)}"] for p in prompts]


def sampler_with(local, to_local) -> ProcessShardedSampler:
  """A one-process sampler over `local`, its gather compiled already (so that a gather
  not held by the lock ends well within WAIT_S)."""
  mesh = parallel.make_mesh(data=-1, devices=jax.devices()[:1])
  parallel.fully_replicated_host_value(PARAMS, mesh)  # compiled before the race
  return ProcessShardedSampler(local, mesh, to_local)


def test_a_gather_of_new_weights_waits_for_the_local_generation_in_flight():
  events = []
  local = BlockingLocal(events)

  def to_local(params):
    events.append("gathered")
    return params

  sampler = sampler_with(local, to_local)
  results = {}
  worker = threading.Thread(target=lambda: results.update(
      generated=sampler.generate([[1, 2], [3]])))
  worker.start()
  assert local.started.wait(timeout=30)
  trainer = threading.Thread(target=lambda: results.update(
      prepared=sampler.prepare_params(PARAMS)))
  trainer.start()
  trainer.join(timeout=WAIT_S)  # without the lock the gather ends here, mid-generation
  local.release.set()
  worker.join(timeout=30)
  trainer.join(timeout=30)
  assert events == ["generated", "gathered"]
  assert results["generated"] == [["completion of [1, 2]"], ["completion of [3]"]]
  np.testing.assert_array_equal(results["prepared"]["w"], PARAMS["w"])


def test_a_generation_waits_for_the_gather_in_flight():
  events = []
  local = BlockingLocal(events)
  local.release.set()
  gathering, gathered = threading.Event(), threading.Event()

  def to_local(params):
    gathering.set()
    assert gathered.wait(timeout=30)
    events.append("gathered")
    return params

  sampler = sampler_with(local, to_local)
  trainer = threading.Thread(target=sampler.prepare_params, args=(PARAMS,))
  trainer.start()
  assert gathering.wait(timeout=30)
  worker = threading.Thread(target=sampler.generate, args=([[1]],))
  worker.start()
  worker.join(timeout=WAIT_S)  # without the lock the generation ends here, mid-gather
  gathered.set()
  trainer.join(timeout=30)
  worker.join(timeout=30)
  assert events == ["gathered", "generated"]
