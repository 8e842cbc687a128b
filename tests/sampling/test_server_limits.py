"""A server that one request cannot freeze: capped `n` / `num_samples`, bounded ids and
token lists, finite temperatures, reference rows capped and bucketed, cancellation of
queued samples (completed "cancelled", in linear time), refusals counted, the port bound
before the model, and a small client's latency beside the largest request."""

import threading
import time

import grpc
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling import reference as reference_lib
from rlhf_jax.sampling import serve_config as serve_config_lib
from rlhf_jax.sampling import server as server_lib
from rlhf_jax.sampling.client import SamplerClient
from rlhf_jax.sampling.protos import jetstream_pb2
from rlhf_jax.sampling.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.protos import sampler_pb2
from rlhf_jax.sampling.protos import sampler_pb2_grpc
from rlhf_jax.sampling.scheduler import Scheduler
from tests.sampling.serve_configs import serve_config

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
MODEL, PARAMS = models.init_model(CONFIG, seed=0)
ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=32)
PROMPT = [5, 9, 11]
MAX_SAMPLES = 16


@pytest.fixture()
def served():
  scheduler = Scheduler(ENGINE, PARAMS, prompt_buckets=(8,), steps_per_sync=2)
  server, port, service = server_lib.start_server(scheduler, port=0, max_workers=4,
                                                  max_samples_per_request=MAX_SAMPLES)
  yield f"localhost:{port}", service
  server.stop(grace=None)
  service.stop()


def refusal(call):
  with pytest.raises(grpc.RpcError) as error:
    call()
  return error.value.code(), error.value.details()


def test_requests_beyond_the_limits_are_refused_and_counted(served):
  address, service = served
  with grpc.insecure_channel(address) as channel:
    stub = sampler_pb2_grpc.SamplerStub(channel)

    def generate(request_id="", **fields):
      return stub.Generate(sampler_pb2.GenerateRequest(
          request_id=request_id, prompt_ids=sampler_pb2.TokenIds(ids=PROMPT),
          sampling=sampler_pb2.SamplingParams(max_new_tokens=2, **fields)), timeout=30)

    cases = {"sampling.n": dict(n=MAX_SAMPLES + 1),
             "request_id": dict(request_id="x" * 129),
             "candidate_token_ids": dict(candidate_token_ids=[1] * 257),
             "sampling.temperature": dict(temperature=float("inf")),
             "fire.temperature": dict(fire=sampler_pb2.Fire(temperature=float("inf")))}
    for field, fields in cases.items():
      code, details = refusal(lambda: generate(**fields))
      assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, (field, details)
    assert len(generate(n=MAX_SAMPLES).samples) == MAX_SAMPLES
    jetstream = jetstream_pb2_grpc.OrchestratorStub(channel)
    request = jetstream_pb2.DecodeRequest(
        max_tokens=2, num_samples=10**6,
        token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=PROMPT))
    code, details = refusal(lambda: list(jetstream.Decode(request, timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_samples_per_request" in details
  metrics = service.metrics()
  assert metrics["requests_over_limit"] == 3 and metrics["requests_invalid"] == 3


def test_more_calls_than_workers_are_refused_and_counted(served, monkeypatch):
  address, service = served
  original = ENGINE.generate_steps
  monkeypatch.setattr(ENGINE, "generate_steps", lambda *a: (time.sleep(0.05), original(*a))[1])
  long = sampling.SamplingParams(max_new_tokens=29, stop_token_ids=())  # the most that fit
  with SamplerClient(address, timeout_s=60) as client:
    streams = [client.stream(PROMPT, long) for _ in range(4)]  # the 4 workers
    for stream in streams:
      next(stream)
    code, _ = refusal(lambda: client.generate_one(PROMPT, long))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    for stream in streams:
      stream.close()
  assert service.metrics()["rpcs_refused_busy"] == 1


def test_a_cancelled_request_returns_with_every_sample_cancelled(served, monkeypatch):
  """Queued samples too (docs/sampling.md): the unary Generate returns instead of
  waiting for its deadline."""
  address, service = served
  original = ENGINE.generate_steps
  monkeypatch.setattr(ENGINE, "generate_steps", lambda *a: (time.sleep(0.02), original(*a))[1])
  params = sampling.SamplingParams(max_new_tokens=25, n=10, seed=1, stop_token_ids=())
  with SamplerClient(address, timeout_s=60) as client:
    future = client.submit(PROMPT, params, request_id="many")
    deadline = time.monotonic() + 30
    while service.metrics()["slots_busy"] < 4 and time.monotonic() < deadline:
      time.sleep(0.01)
    client.cancel("many", sample_index=9)  # a queued sample alone
    service.cancel("many")  # the Cancel RPC without sample_index: the whole request
    samples = future.result(timeout=10)
  assert [s.sample_index for s in samples] == list(range(10))
  assert {s.finish_reason for s in samples} == {"cancelled"}
  assert samples[9].token_ids == [] and len(samples[0].token_ids) < 25


def test_cancelling_a_huge_queued_request_takes_linear_time():
  scheduler = Scheduler(ENGINE, PARAMS, prompt_buckets=(8,), steps_per_sync=1)
  request_id = scheduler.submit(PROMPT, sampling.SamplingParams(n=40_000, max_new_tokens=4))
  scheduler.step()
  scheduler.cancel(request_id, sample_index=39_999)
  scheduler.cancel(request_id)
  start = time.perf_counter()
  completions = scheduler.step()
  elapsed = time.perf_counter() - start
  assert len(completions) == 40_000 - 0  # 4 running + 39 996 queued, all "cancelled"
  assert {c.finish_reason for c in completions} == {"cancelled"}
  assert elapsed < 4.0, elapsed  # the list filter took ~12 s here (issue 34)
  assert not scheduler.has_work()


def test_reference_rows_are_capped_and_bucketed():
  policy = reference_lib.ReferencePolicy(MODEL, max_length=32)
  policy.load(PARAMS)

  def rows(batch, prompt, response, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 64, (batch, prompt + response)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[0, :2] = 0  # a left-padded prompt
    return tokens, mask, np.ones((batch, response), np.float32)

  with pytest.raises(ValueError, match="at most 32"):
    policy.logprobs(*rows(1, 30, 3, 0))
  first = policy.logprobs(*rows(3, 6, 4, 1))
  second = policy.logprobs(*rows(4, 7, 3, 2))
  assert first.shape == (3, 4) and second.shape == (4, 3)
  assert policy._forward._cache_size() == 1  # both: 4 rows, prompt 8, response 4
  tokens, mask, response = rows(3, 6, 4, 1)
  unpadded = reference_lib.ReferencePolicy(MODEL)._forward(PARAMS, tokens, mask, response)
  np.testing.assert_allclose(first, np.asarray(unpadded), atol=1e-5)


def test_serve_config_refuses_an_infinite_temperature_and_unbounded_samples():
  for field, value in (("jetstream_temperature", float("inf")),
                       ("max_samples_per_request", 0),
                       ("max_samples_per_request", 10**6)):
    config = serve_config()
    config.server[field] = value
    with pytest.raises(ConfigError, match=rf"config\.server\.{field}"):
      serve_config_lib.validate_serve_config(config)


def test_a_port_in_use_is_one_error_before_the_model_is_built(monkeypatch):
  monkeypatch.setattr(serve_config_lib, "load_served_model",
                      lambda config: pytest.fail("the model was built"))
  taken, port, _ = server_lib.listen("localhost", 0)  # another server holds the port
  try:
    config = serve_config()
    config.server.port = port
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^config\.server\.port: "):
      server_lib.serve_from_config(config)
    assert time.perf_counter() - start < 5
  finally:
    taken.stop(None)


def test_a_small_client_stays_fast_beside_the_largest_request(served):
  """Another client sends the largest request allowed (n = max_samples_per_request, the
  longest generation) and disconnects; a one-token request keeps answering in < 1 s."""
  address, _ = served
  largest = sampling.SamplingParams(n=MAX_SAMPLES, max_new_tokens=32 - len(PROMPT),
                                    stop_token_ids=())
  small = sampling.SamplingParams(max_new_tokens=1, seed=0)
  latencies = []
  with SamplerClient(address, timeout_s=30) as big, SamplerClient(address, timeout_s=30
                                                                  ) as client:
    client.generate_one(PROMPT, small)  # compiled
    stream = big.stream(PROMPT, largest)
    next(stream)
    for _ in range(5):
      start = time.perf_counter()
      client.generate_one(PROMPT, small)
      latencies.append(time.perf_counter() - start)
    stream.close()  # the big client goes away
    for _ in range(5):
      start = time.perf_counter()
      client.generate_one(PROMPT, small)
      latencies.append(time.perf_counter() - start)
  assert max(latencies) < 1.0, latencies


@pytest.mark.slow
def test_launch_serve_reports_a_port_in_use_in_one_line():
  import os
  import pathlib
  import subprocess
  import sys
  root = pathlib.Path(__file__).resolve().parents[2]
  taken, port, _ = server_lib.listen("localhost", 0)
  try:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(root / "launch" / "serve.py"), "--config=configs/serve.py:tiny",
         f"--config.server.port={port}"], cwd=root, capture_output=True, text=True,
        timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    elapsed = time.perf_counter() - start
  finally:
    taken.stop(None)
  lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith("error: config.server.port: ") and elapsed < 60
