"""The gRPC sampling server on localhost: results equal the in-process scheduler's,
JetStream's wire shape, errors, disconnects, failures, weight updates."""

import time

import grpc
import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.remote.client import TokenEvent
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import server as server_lib
from rlhf_jax.sampling.serve import wire
from rlhf_jax.sampling.serve.protos import jetstream_pb2
from rlhf_jax.sampling.serve.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.serve.protos import sampler_pb2
from rlhf_jax.sampling.serve.protos import sampler_pb2_grpc
from tests.sampling.holds import Hold
from tests.sampling.holds import cancel_arrived

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
MODEL, PARAMS = models.init_model(CONFIG, seed=0)
ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=48)
BUCKETS = (8, 16)
PROMPT = [5, 9, 11, 3, 17]


def in_process(prompt, params, model_params=PARAMS):
  return Scheduler(ENGINE, model_params, prompt_buckets=BUCKETS).generate([prompt], params)[0]


@pytest.fixture()
def served(request):
  options = getattr(request, "param", {})
  scheduler = Scheduler(ENGINE, PARAMS, prompt_buckets=BUCKETS,
                        max_queue=options.get("max_queue", 64), steps_per_sync=2,
                        update_policy=options.get("update_policy", "finish_old"))
  server, port, service = server_lib.start_server(scheduler, port=0, max_workers=8)
  client = SamplerClient(f"localhost:{port}", timeout_s=60)
  client.wait_ready()
  yield client, service, port
  client.close()
  server.stop(grace=None)
  service.stop()


def wait_for(condition, timeout_s=20.0):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if condition():
      return True
    time.sleep(0.05)
  return False


def test_unary_and_batched_generate_equal_the_in_process_scheduler(served):
  client, _, _ = served
  params = sampling.SamplingParams(max_new_tokens=9, seed=4, n=3, top_k=20)
  remote = client.generate_one(PROMPT, params)
  local = in_process(PROMPT, params)
  assert [c.token_ids for c in remote] == [c.token_ids for c in local]
  np.testing.assert_allclose([c.model_logprobs for c in remote],
                             [c.model_logprobs for c in local], atol=1e-6)
  batch = client.generate([PROMPT, [7, 8]], [params, params.replace(n=1)])
  assert [c.token_ids for c in batch[0]] == [c.token_ids for c in local]
  assert len(batch[1]) == 1 and len(batch[1][0].token_ids) == 9


def test_stream_delivers_tokens_then_the_finished_sample(served):
  client, _, _ = served
  params = sampling.SamplingParams(max_new_tokens=7, seed=2)
  tokens, finished = [], []
  for event in client.stream(PROMPT, params):
    if isinstance(event, TokenEvent):
      tokens.extend(event.token_ids)
    else:
      finished.append(event)
  (completion,) = finished
  assert tokens == completion.token_ids == in_process(PROMPT, params)[0].token_ids


def test_jetstream_decode_and_health_check(served):
  _, _, port = served
  with grpc.insecure_channel(f"localhost:{port}") as channel:
    stub = jetstream_pb2_grpc.OrchestratorStub(channel)
    assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30).is_live
    request = jetstream_pb2.DecodeRequest(
        max_tokens=6, token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=PROMPT),
        num_samples=2)
    per_sample = [[], []]
    responses = list(stub.Decode(request, timeout=60))
    assert responses[0].WhichOneof("content") == "initial_content"
    for response in responses[1:]:
      for index, sample in enumerate(response.stream_content.samples):
        per_sample[index].extend(sample.token_ids)
    assert [len(ids) for ids in per_sample] == [6, 6]
    bad = jetstream_pb2.DecodeRequest(max_tokens=4, text_content=jetstream_pb2.DecodeRequest.
                                      TextContent(text="no tokenizer here"))
    with pytest.raises(grpc.RpcError) as error:
      list(stub.Decode(bad, timeout=30))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tokenizer" in error.value.details()


def test_malformed_requests_answer_invalid_argument_naming_the_field(served):
  client, _, port = served
  with grpc.insecure_channel(f"localhost:{port}") as channel:
    stub = sampler_pb2_grpc.SamplerStub(channel)
    cases = {
        "sampling.top_p": sampler_pb2.GenerateRequest(
            prompt_ids=sampler_pb2.TokenIds(ids=PROMPT),
            sampling=sampler_pb2.SamplingParams(top_p=1.5, max_new_tokens=4)),
        "prompt": sampler_pb2.GenerateRequest(
            sampling=sampler_pb2.SamplingParams(max_new_tokens=4)),
        "max_new_tokens": sampler_pb2.GenerateRequest(
            prompt_ids=sampler_pb2.TokenIds(ids=PROMPT),
            sampling=sampler_pb2.SamplingParams(max_new_tokens=400)),
        "prompt_ids": sampler_pb2.GenerateRequest(
            prompt_ids=sampler_pb2.TokenIds(ids=[999]),
            sampling=sampler_pb2.SamplingParams(max_new_tokens=4)),
    }
    for field, request in cases.items():
      with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request, timeout=30)
      assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
      assert field in error.value.details(), (field, error.value.details())
  assert client.health().is_live


@pytest.mark.parametrize("served", [{"max_queue": 1}], indirect=True)
def test_overload_answers_resource_exhausted(served):
  client, service, _ = served
  with Hold(service.scheduler, when=lambda metrics: True) as hold:  # before any decode
    first = client.submit(PROMPT, sampling.SamplingParams(max_new_tokens=3, seed=0),
                          request_id="first")
    hold.wait()  # the first request holds the only queue place
    with pytest.raises(grpc.RpcError) as error:
      client.generate_one(PROMPT, sampling.SamplingParams(max_new_tokens=3))
  assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  assert len(first.result(timeout=60)[0].token_ids) == 3
  assert service.metrics()["requests_rejected"] == 1


def test_a_disconnecting_client_frees_its_slot(served, monkeypatch):
  client, service, _ = served
  cancelled = cancel_arrived(service.scheduler, monkeypatch, "gone")
  params = sampling.SamplingParams(max_new_tokens=40, seed=0, n=2, stop_token_ids=())
  with Hold(service.scheduler):  # the samples stay mid-way until the cancel is in
    stream = client.stream(PROMPT, params, request_id="gone")
    next(stream)
    assert service.metrics()["slots_busy"] == 2
    stream.close()  # cancels the RPC
    assert cancelled.wait(30)
  assert wait_for(lambda: not service.scheduler.has_work())
  metrics = service.metrics()
  assert metrics["slots_busy"] == 0 and metrics["generated_tokens"] < 2 * 40


def test_cancel_over_grpc_ends_one_sample_and_the_rest_finish(served):
  client, service, _ = served
  params = sampling.SamplingParams(max_new_tokens=40, seed=3, n=3, stop_token_ids=())
  with Hold(service.scheduler) as hold:  # the cancel lands while the samples run
    future = client.submit(PROMPT, params, request_id="r1")
    hold.wait()
    client.cancel("r1", sample_index=1)
  samples = future.result(timeout=60)
  assert [s.finish_reason for s in samples] == ["length", "cancelled", "length"]
  assert len(samples[1].token_ids) < 40
  # The others are the samples an uncancelled request draws.
  alone = in_process(PROMPT, params)
  assert [samples[i].token_ids for i in (0, 2)] == [alone[i].token_ids for i in (0, 2)]
  with pytest.raises(grpc.RpcError) as error:
    client.cancel("r1", sample_index=-1)
  assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  client.cancel("unknown", sample_index=0)  # ignored


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(served, monkeypatch):
  client, service, _ = served
  original = ENGINE.generate_steps
  calls = {"n": 0}

  def fail_once(*args):
    calls["n"] += 1
    if calls["n"] == 1:
      raise RuntimeError("injected device failure")
    return original(*args)

  monkeypatch.setattr(ENGINE, "generate_steps", fail_once)
  with pytest.raises(grpc.RpcError) as error:
    client.generate_one(PROMPT, sampling.SamplingParams(max_new_tokens=4, seed=0))
  assert error.value.code() == grpc.StatusCode.INTERNAL
  assert "injected device failure" in error.value.details()
  params = sampling.SamplingParams(max_new_tokens=4, seed=1)
  assert client.generate_one(PROMPT, params)[0].token_ids == in_process(PROMPT, params)[0].token_ids
  assert service.metrics()["step_failures"] == 1


def test_weight_update_changes_the_served_model(served):
  client, _, _ = served
  _, new_params = models.init_model(CONFIG, seed=7)
  response = client.update_weights(new_params, version=2, chunk_bytes=1000)
  assert response.version == 2 and response.update_policy == "finish_old"
  client.update_params(new_params, version=3)  # the trainer's name for it
  assert wait_for(lambda: client.health().weights_version == 3)
  params = sampling.SamplingParams(max_new_tokens=8, seed=5, temperature=0)
  (completion,) = client.generate_one(PROMPT, params)
  assert completion.weights_version == (3, 3)
  assert completion.token_ids == in_process(PROMPT, params, new_params)[0].token_ids
  assert client.metrics()["weights_version"] == 3


@pytest.mark.parametrize("served", [{"update_policy": "swap_now"}], indirect=True)
def test_a_swap_under_a_running_sample_reports_each_tokens_version(served):
  """Partial rollouts over gRPC: new weights reach a sample in flight, and the sample
  says which tokens each version drew."""
  client, service, _ = served
  params = sampling.SamplingParams(max_new_tokens=40, seed=3, stop_token_ids=())
  _, new_params = models.init_model(CONFIG, seed=7)
  with Hold(service.scheduler) as hold:  # the swap lands after the first tokens
    future = client.submit(PROMPT, params, request_id="partial")
    hold.wait()
    assert client.update_params(new_params, version=1).update_policy == "swap_now"
  (sample,) = future.result(timeout=60)
  versions = sample.token_versions
  assert len(versions) == 40 and sample.weights_version == (0, 1)
  assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1


def test_weight_update_with_a_wrong_tensor_is_rejected(served):
  client, _, _ = served
  bad = dict(PARAMS)
  bad["embed"] = np.zeros((3, 3), np.float32)
  with pytest.raises(grpc.RpcError) as error:
    client.update_weights(bad, version=1)
  assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  # A server without a token tells an anonymous caller nothing of the model's tensors.
  assert "embed" not in error.value.details() and "64" not in error.value.details()
  assert client.health().weights_version == 0


@pytest.mark.slow
def test_launch_serve_runs_and_stops_cleanly():
  import json
  import os
  import pathlib
  import signal
  import subprocess
  import sys
  root = pathlib.Path(__file__).resolve().parents[3]
  process = subprocess.Popen(
      [sys.executable, str(root / "launch" / "serve.py"), "--config=configs/serve.py:tiny",
       "--config.server.port=0", "--config.sampler.num_slots=2",
       "--config.server.http_port=0"],
      cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    started = json.loads(process.stdout.readline())
    assert started["event"] == "serving"
    with SamplerClient(started["address"], timeout_s=120) as client:
      client.wait_ready()
      (completion,) = client.generate_one([1, 2, 3], sampling.SamplingParams(max_new_tokens=4))
      assert len(completion.token_ids) == 4
      with grpc.insecure_channel(started["address"]) as channel:
        stub = jetstream_pb2_grpc.OrchestratorStub(channel)
        assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30).is_live
    openai = pytest.importorskip("openai")  # the HTTP face beside gRPC, same scheduler
    http = openai.OpenAI(base_url=started["openai_base_url"], api_key="none", max_retries=0)
    assert http.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=4,
                                   temperature=0).usage.completion_tokens == 4
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    stopped = json.loads(process.stdout.readline())
    assert stopped["event"] == "stopped" and stopped["generated_tokens"] == 8
  finally:
    if process.poll() is None:
      process.kill()


def test_generated_protocol_modules_are_up_to_date(tmp_path):
  protoc = pytest.importorskip("grpc_tools.protoc")
  import pathlib
  import shutil
  root = pathlib.Path(__file__).resolve().parents[3]
  protos = root / "rlhf_jax" / "sampling" / "serve" / "protos"
  copy = tmp_path / "rlhf_jax" / "sampling" / "serve" / "protos"
  copy.mkdir(parents=True)
  sources = sorted(protos.glob("*.proto"))
  assert [p.name for p in sources] == ["jetstream.proto", "sampler.proto"], sources
  for proto in sources:
    shutil.copy(proto, copy)
    relative = proto.relative_to(root)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(relative)]) == 0
  generated_files = sorted(copy.glob("*_pb2*.py*"))
  assert len(generated_files) == 6, generated_files  # _pb2.py, _pb2.pyi, _pb2_grpc.py each
  for generated in generated_files:
    assert generated.read_text() == (protos / generated.name).read_text(), (
        f"{generated.name} is stale: run python scripts/gen_protos.py")


def test_candidate_logprobs_are_the_first_position_softmax_in_process_and_served(served):
  client, _, _ = served
  params = sampling.SamplingParams(max_new_tokens=3, seed=2, n=2,
                                   candidate_token_ids=(3, 7, 60))
  assert wire.sampling_from_proto(wire.sampling_to_proto(params)) == params
  remote = client.generate_one(PROMPT, params)
  local = in_process(PROMPT, params)
  logits, _ = jax.jit(MODEL.apply)(PARAMS, np.asarray([PROMPT], np.int32))  # not op by op
  logits = np.asarray(logits[0, -1], np.float64)
  expected = logits[[3, 7, 60]] - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
  for sample in [*remote, *local]:
    np.testing.assert_allclose(sample.candidate_logprobs, expected, atol=1e-5)
  plain = in_process(PROMPT, sampling.SamplingParams(max_new_tokens=2, seed=2))
  assert plain[0].candidate_logprobs == []
  with pytest.raises(ValueError, match="candidate_token_ids"):
    sampling.SamplingParams(candidate_token_ids=(-1,))


def test_the_sampling_core_imports_without_grpc():
  import os
  import subprocess
  import sys
  code = ("import sys; import rlhf_jax.sampling; "
          "from rlhf_jax.sampling import config; "
          "from rlhf_jax.sampling.scheduler import options; "
          "from rlhf_jax.sampling.serve import config, loop, reference, security; "
          "assert 'grpc' not in sys.modules, 'grpc imported'; "
          "from rlhf_jax.sampling.serve import server; assert 'grpc' in sys.modules")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
