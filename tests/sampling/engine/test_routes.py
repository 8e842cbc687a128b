"""A mixture-of-experts sampler records each sampled token's experts per layer (an Engine
with `record_routes`), and they are the routes a trainer's full forward over the prompt
and response computes for those tokens: what routing replay gives back to the trainer."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.models import moe
from rlhf_jax.sampling.scheduler.scheduler import Scheduler

CONFIG = models.DecoderConfig(vocab_size=48, hidden_size=16, num_layers=3, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=24,
                              architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
                              num_experts=6, experts_per_token=2, expert_intermediate_size=8,
                              normalize_expert_weights=True, dense_layers=(1,))


@pytest.fixture(scope="module")
def policy():
  model, params = models.init_model(CONFIG, seed=5)
  for layer in (0, 2):  # distinct router probabilities: no near-ties between programs
    params["layers"][layer]["mlp"]["router"] = params["layers"][layer]["mlp"]["router"] * 80
  return model, params


def test_completions_carry_the_routes_the_full_forward_computes(policy):
  model, params = policy
  engine = sampling.Engine(model, num_slots=2, cache_length=32, record_routes=True)
  scheduler = Scheduler(engine, params, prompt_buckets=(8,))
  prompts = [[3, 4, 5], [9, 8, 7, 6, 5, 4]]
  done = scheduler.generate(prompts, sampling.SamplingParams(
      temperature=1.0, max_new_tokens=7, n=2, seed=1))
  forward = jax.jit(lambda p, t: model.apply(p, t, with_routes=True)[2])
  for prompt, completions in zip(prompts, done):
    for completion in completions:
      count = len(completion.token_ids)
      assert completion.routes.shape == (count, 3, 2)
      assert completion.routes.dtype == np.int8
      full = np.asarray(forward(params, np.asarray([prompt + completion.token_ids])))[0]
      np.testing.assert_array_equal(completion.routes, full[len(prompt):])
      assert (completion.routes[:, 1] == moe.NOT_RECORDED).all()


def test_an_engine_without_record_routes_returns_none(policy):
  model, params = policy
  scheduler = Scheduler(sampling.Engine(model, num_slots=2, cache_length=32), params,
                        prompt_buckets=(8,))
  (completion,), = scheduler.generate([[3, 4]], sampling.SamplingParams(max_new_tokens=3,
                                                                          seed=0))
  assert completion.routes is None


def test_record_routes_needs_experts():
  model, _ = models.init_model(CONFIG.replace(architecture="qwen3", num_experts=0), seed=0)
  with pytest.raises(ValueError, match="record_routes needs a mixture-of-experts model"):
    sampling.Engine(model, num_slots=2, cache_length=32, record_routes=True)


def test_routes_cross_the_grpc_server_as_recorded(policy):
  pytest.importorskip("grpc")
  from rlhf_jax.sampling.remote.client import SamplerClient  # pylint: disable=import-outside-toplevel
  from rlhf_jax.sampling.serve import server as server_lib  # pylint: disable=import-outside-toplevel
  model, params = policy
  engine = sampling.Engine(model, num_slots=2, cache_length=32, record_routes=True)
  request = sampling.SamplingParams(temperature=1.0, max_new_tokens=5, n=2, seed=3)
  local = Scheduler(engine, params, prompt_buckets=(8,)).generate([[3, 4, 5]], request)[0]
  server, port, service = server_lib.start_server(
      Scheduler(engine, params, prompt_buckets=(8,)), port=0, max_workers=4)
  client = SamplerClient(f"localhost:{port}", timeout_s=60)
  try:
    client.wait_ready()
    remote = client.generate([[3, 4, 5]], request)[0]
  finally:
    client.close()
    server.stop(grace=None)
    service.stop()
  for got, want in zip(remote, local):
    assert got.token_ids == want.token_ids
    assert got.routes.dtype == want.routes.dtype
    np.testing.assert_array_equal(got.routes, want.routes)


def test_a_sample_whose_routes_do_not_fit_its_tokens_is_refused():
  pytest.importorskip("grpc")
  from rlhf_jax.sampling.remote.client import completion_from_proto  # pylint: disable=import-outside-toplevel
  from rlhf_jax.sampling.serve import wire  # pylint: disable=import-outside-toplevel
  from rlhf_jax.sampling.serve.protos import sampler_pb2  # pylint: disable=import-outside-toplevel
  sample = sampler_pb2.Sample(token_ids=[1, 2, 3],
                              routes=wire.array_to_proto(np.zeros((2, 3, 2), np.int8)))
  with pytest.raises(ValueError, match=r"Sample.routes: int8\[2, 3, 2\] is not one integer"):
    completion_from_proto("r", [1], sample)
