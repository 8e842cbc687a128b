"""The scheduler's program set (sampling/scheduler/programs.py): few variants, all compiled by
warmup, none after it, and the same completions as dispatching one step at a time."""

import contextlib
import logging
import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.scheduler import programs
from rlhf_jax.sampling.scheduler import swaps as swap
from tests.sampling.tiny_engine import MODEL
from tests.sampling.tiny_engine import PARAMS
from tests.sampling.tiny_engine import peaked_params
from tests.sampling.tiny_engine import prompts

BUCKETS = (8, 16)
ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=40)  # shared compiled programs


def test_step_counts_are_one_and_steps_per_sync():
  assert programs.step_counts(8) == [1, 8]
  assert programs.step_counts(6) == [1, 6]
  assert programs.step_counts(1) == [1]


def test_steps_for_runs_whole_syncs_then_single_steps():
  assert [programs.steps_for(r, 8) for r in (20, 8, 7, 1)] == [8, 8, 1, 1]


def test_prefill_batch_sizes_pad_at_most_four_times():
  assert programs.prefill_batch_sizes(8) == [1, 4, 8]
  assert programs.prefill_batch_sizes(1) == [1]
  assert programs.prefill_batch_sizes(2) == [1, 2]
  assert programs.prefill_batch_sizes(64) == [1, 4, 16, 64]
  for prompts_ in range(1, 65):
    padded = programs.padded_batch(prompts_, 64)
    assert prompts_ <= padded <= 4 * prompts_ and padded in (1, 4, 16, 64)


class CompileLog(logging.Handler):
  """The XLA compilations JAX logs (`jax.log_compiles`), by jitted function name."""

  def __init__(self):
    super().__init__()
    self.names = []

  def emit(self, record):
    found = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
    if found:
      self.names.append(found.group(1))

  def count(self, name):
    return self.names.count(name)


@contextlib.contextmanager
def compile_log():
  handler, logger = CompileLog(), logging.getLogger("jax")
  logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      yield handler
  finally:
    logger.removeHandler(handler)


def varied_load(sched):
  """Prompts of both buckets, 1-6 prefills at a time, n > 1, stops, short and long."""
  sched.generate(prompts(6, seed=6), sampling.SamplingParams(max_new_tokens=9, seed=0))
  sched.generate(prompts(3, seed=7), [sampling.SamplingParams(
      max_new_tokens=n, seed=1, temperature=0.5, top_p=0.8, n=n % 3 + 1) for n in (2, 5, 13)])
  sched.generate(prompts(1, seed=8) + [list(range(8, 22))], sampling.SamplingParams(
      max_new_tokens=3, seed=2, stop_token_ids=(9, 10)))


@pytest.mark.slow
def test_warmup_compiles_the_whole_set_and_serving_compiles_nothing():
  """With the params on a mesh, as the launchers place them: the first state is placed
  as the programs' (else the first insert compiles twice, the state not yet committed)."""
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
  params = jax.device_put(PARAMS, NamedSharding(mesh, PartitionSpec()))
  engine = sampling.Engine(MODEL, num_slots=4, cache_length=40)
  names = ("init_decode_state", "_prefill_impl", "_insert_impl", "_generate_impl",
           "broadcast_in_dim")
  with compile_log() as log:
    sched = Scheduler(engine, params, prompt_buckets=BUCKETS, steps_per_sync=4,
                      max_prefill_batch=8)
    compiled = sched.warmup()
    warm = {name: log.count(name) for name in names}
    varied_load(sched)
    served = {name: log.count(name) for name in names}
  # 2 buckets × batch sizes {1, 4, 8}; one insert; generate for 1 and 4 steps, each
  # with and without truncation (top_p below).
  assert compiled == {"prefill": 6, "insert": 1, "generate[1]": 1, "generate[4]": 1,
                      "generate[1]+truncate": 1, "generate[4]+truncate": 1}
  assert warm == {"init_decode_state": 1, "_prefill_impl": 6, "_insert_impl": 1,
                  "_generate_impl": 4, "broadcast_in_dim": 0}
  assert served == warm
  assert engine.compilations() == compiled


def run_load(steps_per_sync, overlap_host):
  sched = Scheduler(ENGINE, PARAMS, prompt_buckets=BUCKETS, steps_per_sync=steps_per_sync,
                    max_prefill_batch=4, overlap_host=overlap_host)
  batch = prompts(7, seed=11)
  samplings = [sampling.SamplingParams(max_new_tokens=m, seed=s, n=1 + s % 2,
                                       temperature=t, stop_token_ids=stops)
               for m, s, t, stops in ((11, 0, 1.0, ()), (3, 1, 0.7, (12,)), (9, 2, 1.0, (20, 30)),
                                      (1, 3, 0.0, ()), (6, 4, 1.0, ()), (13, 5, 0.9, (40,)),
                                      (5, 6, 1.0, ()))]
  out = sched.generate(batch, samplings)
  return [(c.token_ids, c.sampled_logprobs, c.model_logprobs, c.finish_reason)
          for group in out for c in group]


def test_completions_equal_one_step_dispatches():
  reference = run_load(steps_per_sync=1, overlap_host=False)  # no multi-step program
  assert sum(len(tokens) for tokens, *_ in reference) > 40  # long enough to span syncs
  for overlap in (False, True):
    got = run_load(steps_per_sync=4, overlap_host=overlap)
    assert [g[0] for g in got] == [r[0] for r in reference]
    assert [g[3] for g in got] == [r[3] for r in reference]
    for (_, sampled, model, _), (_, ref_sampled, ref_model, _) in zip(got, reference):
      assert sampled == pytest.approx(ref_sampled, abs=1e-5)
      assert model == pytest.approx(ref_model, abs=1e-5)


def test_warmup_compiles_the_swap_refill_and_a_first_swap_compiles_nothing():
  """Under 'swap_now' warmup compiles the refill (sampling/scheduler/swaps.py: one prefill and one
  row write per refill length), so the first swap with samples in flight, which runs
  under the scheduler's lock, compiles nothing (else submit and metrics wait for it)."""
  engine = sampling.Engine(MODEL, num_slots=3, cache_length=16)  # shapes of its own
  names = ("_prefill_impl", "_insert_impl", "_generate_impl", "_refill_rows", "refill")
  with compile_log() as log:
    sched = Scheduler(engine, PARAMS, prompt_buckets=(8,), steps_per_sync=2,
                      max_prefill_batch=2, update_policy="swap_now")
    sched.warmup(truncation=False)
    warm = {name: log.count(name) for name in names}
    ids = [sched.submit(p, sampling.SamplingParams(max_new_tokens=6, seed=0))
           for p in ([9, 10, 11], [12] * 5, [20] * 7)]  # refilled at lengths 8 and 16
    sched.step()
    sched.update_params(peaked_params(seed=1)[1], version=1)
    done = sched.run()
    served = {name: log.count(name) for name in names}
  assert sched.metrics()["refilled_tokens"] > 0  # a swap found samples in flight
  assert sorted(c.request_id for c in done) == sorted(ids)
  # buckets (8,) × batch sizes {1, 2}, and per refill length (8, 16) one prefill + write.
  lengths = len(swap.refill_plan(engine, 2, 8))
  assert warm == {"_prefill_impl": 2 + lengths, "_insert_impl": 1, "_generate_impl": 2,
                  "_refill_rows": lengths, "refill": 0}
  assert served == warm


def test_schedulers_built_on_one_engine_share_one_compiled_empty_state():
  """The empty decode state is one program per engine (and params mesh): a second
  Scheduler on the engine compiles nothing, and each still gets a state of its own."""
  engine = sampling.Engine(MODEL, num_slots=2, cache_length=16)  # no state program yet
  with compile_log() as log:
    first = Scheduler(engine, PARAMS, prompt_buckets=(8,))
    second = Scheduler(engine, PARAMS, prompt_buckets=(8,))
  assert log.count("init_decode_state") == 1
  assert first._state is not second._state  # pylint: disable=protected-access
  done = first.generate([[5, 6]], sampling.SamplingParams(max_new_tokens=3, seed=1))
  assert second.generate([[5, 6]], sampling.SamplingParams(max_new_tokens=3, seed=1)) == done
