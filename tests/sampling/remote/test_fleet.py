"""A fleet of three sampling servers on localhost (sampling/remote/fleet.py): the same samples as
one in-process scheduler, routing by load, versioned weights on every server, a server
killed mid-step whose requests are sent again, and a server that comes back."""

import threading
import time

import grpc
import jax
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.sampling.remote.fleet import FleetUnavailableError
from rlhf_jax.sampling.remote.fleet import SamplerFleet
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import server as server_lib
from tests.sampling.holds import Hold

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
MODEL, PARAMS = models.init_model(CONFIG, seed=0)
NEW_PARAMS = jax.tree.map(lambda x: x * 1.5, PARAMS)
BUCKETS = (8,)
PROMPTS = [[3 + i, 9, 11 + i % 5, 4] for i in range(12)]
SAMPLING = sampling.SamplingParams(n=2, max_new_tokens=24, seed=7)


# One engine per server of the fleet and one for the expected samples, for the whole file:
# a new engine traces and compiles every program again. A server that comes back takes the
# engine of the one it replaces (stopped by then: an engine serves one scheduler at a time).
ENGINES = [sampling.Engine(MODEL, num_slots=4, cache_length=32) for _ in range(3)]
EXPECTED_ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=32)


def scheduler(params=PARAMS, version=0, engine=EXPECTED_ENGINE):
  return Scheduler(engine, params, prompt_buckets=BUCKETS, steps_per_sync=1,
                   weights_version=version)


class Server:
  """One server on `port` (0: any) over `engine`; `kill` stops it at once, dropping its
  calls."""

  def __init__(self, engine, port=0):
    self.engine = engine
    self.server, self.port, self.service = server_lib.start_server(
        scheduler(engine=engine), port=port, max_workers=16)

  def kill(self):
    self.server.stop(grace=None)
    self.service.stop()


@pytest.fixture()
def fleet():
  servers = [Server(engine) for engine in ENGINES]
  logs = []
  fleet = SamplerFleet([f"localhost:{s.port}" for s in servers], timeout_s=60,
                       max_in_flight=2, probe_interval_s=0.0, log=logs.append,
                       reconnect_s=1.0)
  fleet.wait_ready()
  fleet.probe(force=True)
  yield fleet, servers, logs
  fleet.close()
  for s in servers:
    s.kill()


def tokens(out):
  return [[(c.token_ids, c.weights_version) for c in samples] for samples in out]


def expected(params=PARAMS, version=0):
  return tokens(scheduler(params, version).generate(PROMPTS, SAMPLING))


def test_a_fleet_gives_the_one_scheduler_samples_and_spreads_the_load(fleet):
  fleet, servers, _ = fleet
  assert len(fleet.live) == 3
  assert tokens(fleet.generate(PROMPTS, SAMPLING)) == expected()
  served = [s.service.metrics()["requests_completed"] for s in servers]
  assert sum(served) == len(PROMPTS) and min(served) >= 2, served


@pytest.mark.slow
def test_new_weights_reach_every_server_with_their_version(fleet):
  fleet, servers, _ = fleet
  fleet.update_params(NEW_PARAMS, version=5)
  assert [fleet.clients[a].health().weights_version for a in fleet.addresses] == [5, 5, 5]
  assert tokens(fleet.generate(PROMPTS, SAMPLING)) == expected(NEW_PARAMS, 5)


@pytest.mark.slow
def test_a_server_killed_mid_step_loses_nothing_and_a_returning_one_gets_the_weights(fleet):
  fleet, servers, logs = fleet
  fleet.update_params(NEW_PARAMS, version=3)
  victim = servers[1]
  result = {}
  worker = threading.Thread(target=lambda: result.update(out=fleet.generate(PROMPTS, SAMPLING)))
  with Hold(victim.service.scheduler) as hold:
    worker.start()
    hold.wait()  # its samples drew tokens and wait in its held loop: none can finish
    victim.server.stop(grace=None)  # killed mid-step, its calls dropped
  victim.service.stop()
  worker.join(60)
  assert not worker.is_alive()
  assert tokens(result["out"]) == expected(NEW_PARAMS, 3)
  assert fleet.counters["server_deaths"] == 1 and fleet.counters["resent_requests"] >= 1
  assert any(f"localhost:{victim.port} lost" in line for line in logs), logs
  assert len(fleet.live) == 2
  # It comes back (fresh, with the starting weights): it joins with version 3 first.
  back = Server(victim.engine, port=victim.port)
  servers.append(back)
  fleet.probe(force=True)
  assert len(fleet.live) == 3
  # Every sample, the returning server's too, reports version 3 and its tokens.
  assert tokens(fleet.generate(PROMPTS, SAMPLING)) == expected(NEW_PARAMS, 3)
  assert back.service.metrics()["requests_completed"] >= 1


@pytest.mark.slow
def test_a_server_restarted_between_two_calls_samples_with_the_fleet_weights(fleet):
  fleet, servers, logs = fleet
  fleet.update_params(NEW_PARAMS, version=4)
  victim = servers[0]
  victim.kill()
  servers.append(Server(victim.engine, port=victim.port))  # fresh: version 0, until noticed
  assert tokens(fleet.generate(PROMPTS, SAMPLING)) == expected(NEW_PARAMS, 4)
  assert any("sending them again" in line or "joined" in line for line in logs), logs


def test_a_fleet_with_no_server_left_says_so(fleet):
  fleet, servers, _ = fleet
  for s in servers:
    s.kill()
  start = time.monotonic()
  with pytest.raises(FleetUnavailableError, match="every sampler server is gone"):
    fleet.generate(PROMPTS, SAMPLING)
  assert 1.0 <= time.monotonic() - start < 10  # it waited reconnect_s for one
  assert fleet.metrics()["fleet/reconnect_waits"] == 1
  assert fleet.metrics()["fleet/live_servers"] == 0


def test_a_fleet_waits_for_a_server_to_come_back(fleet):
  fleet, servers, logs = fleet
  fleet.reconnect_s = 60.0
  for s in servers:
    s.kill()
  back = []

  def log(line):
    logs.append(line)
    if "waiting up to" in line:  # the fleet knows every server is gone: one comes back
      back.append(Server(servers[0].engine, port=servers[0].port))

  fleet.log = log
  try:
    assert tokens(fleet.generate(PROMPTS[:2], SAMPLING)) == expected()[:2]
  finally:
    for s in back:
      s.kill()
  assert any("waiting up to 60 s" in line for line in logs), logs
  assert any("back after" in line for line in logs), logs
  metrics = fleet.metrics()
  assert metrics["fleet/reconnect_waits"] == 1 and metrics["fleet/server_joins"] >= 4


def test_a_continuation_goes_to_the_server_that_kept_its_cache():
  """Turn 2 of each conversation lands on the server that parked turn 1's cache: the fleet
  reuses as many tokens as one scheduler serving both turns, and draws the same tokens."""
  def long_scheduler():
    return Scheduler(sampling.Engine(MODEL, num_slots=8, cache_length=32), PARAMS,
                     prompt_buckets=(8, 16), steps_per_sync=1)

  servers = []
  for _ in range(2):
    server, port, service = server_lib.start_server(long_scheduler(), port=0, max_workers=16)
    servers.append((server, port, service))
  fleet = SamplerFleet([f"localhost:{port}" for _, port, _ in servers], timeout_s=60,
                       max_in_flight=8, probe_interval_s=0.0, log=lambda line: None)
  try:
    fleet.wait_ready()
    fleet.probe(force=True)
    prompts = PROMPTS[:6]
    first = sampling.SamplingParams(n=1, max_new_tokens=5, seed=3, keep_cache=True)
    second = sampling.SamplingParams(n=1, max_new_tokens=5, seed=4)
    turn1 = fleet.generate(prompts, first)
    # In reverse order: least-loaded routing alone would send each to the other server.
    continued = [p + list(c[0].token_ids) + [5, 6] for p, c in zip(prompts, turn1)][::-1]
    turn2 = fleet.generate(continued, second)
    assert fleet.metrics()["fleet/cache_routed"] == len(prompts)
    reused = sum(service.metrics()["reused_tokens"] for _, _, service in servers)
    one = long_scheduler()
    assert tokens(turn1) == tokens(one.generate(prompts, first))
    assert tokens(turn2) == tokens(one.generate(continued, second))
    assert reused == one.metrics()["reused_tokens"] > 0
  finally:
    fleet.close()
    for server, _, service in servers:
      server.stop(grace=None)
      service.stop()


def test_a_server_back_from_a_blip_takes_the_fleets_older_pinned_weights(fleet):
  """A server lost while the fleet rolled back to a pinned job's older version still
  holds the newer one: it joins again with the fleet's weights, not locked out."""
  fleet, servers, logs = fleet
  fleet.update_params(NEW_PARAMS, version=4)
  fleet.live.discard(fleet.addresses[0])  # a blip: the rollback below does not reach it
  fleet.rollback_params(PARAMS, version=2)
  fleet.probe(force=True)
  assert fleet.addresses[0] in fleet.live, logs
  assert [s.service.scheduler.newest_version() for s in servers] == [2, 2, 2]


def test_a_pending_rollback_is_the_version_the_next_update_is_checked_against():
  """Weights handed over and not yet swapped in count, even when older than the served
  ones: right after a rollback a server reports it (no race with its serving loop), and
  the trainer's next version above the rollback is not refused as older."""
  one = scheduler(NEW_PARAMS, version=4)
  assert one.newest_version() == 4
  one.update_params(PARAMS, 2)
  assert one.newest_version() == 2 and one.weights_version == 4


class HungServer(grpc.RpcError):
  """A client whose server accepts connections and never answers: each call blocks for
  its deadline (capped at 3 s, the test's patience), then fails DEADLINE_EXCEEDED."""

  def __init__(self, address):
    super().__init__()
    self.timeouts = []

  def health(self, timeout_s=None):
    self.timeouts.append(timeout_s)
    time.sleep(min(3.0, 600.0 if timeout_s is None else timeout_s))
    raise self

  def code(self):
    return grpc.StatusCode.DEADLINE_EXCEEDED

  def details(self):
    return "Deadline Exceeded"

  def close(self):
    pass


def test_hung_servers_hold_a_reconnect_wait_no_longer_than_reconnect_s():
  fleet = SamplerFleet(["a:1", "b:2"], timeout_s=600, probe_interval_s=0.0,
                       log=lambda line: None, client_factory=HungServer, reconnect_s=1.0)
  start = time.monotonic()
  with pytest.raises(FleetUnavailableError, match="none came back in 1 s: a:1, b:2"):
    fleet.await_server("generate")
  assert time.monotonic() - start < 2.5
  assert all(0 < t <= 1.0 for c in fleet.clients.values() for t in c.timeouts)
  fleet.close()
