"""Reference log-probs on the sampling servers (sampling/serve/reference.py, rollout/reference.py):
a server scores padded rollout rows under the reference weights it was sent, as a NumPy
log-softmax over each unpadded row says; the served weights never leak into them; errors
name the field; a fleet answers through a killed server and re-sends the reference to one
that restarted; the config refuses what cannot hold."""

import re

import grpc
import jax
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rollout import reference as reference_lib
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.remote.fleet import SamplerFleet
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import reference as serve_reference
from rlhf_jax.sampling.serve import server as server_lib

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
MODEL, SERVED = models.init_model(CONFIG, seed=0)
_, REFERENCE = models.init_model(CONFIG, seed=5)
PROMPT_LENGTH, RESPONSE_LENGTH = 6, 5
PROMPTS = [[5, 9, 11], [7, 8, 9, 10, 11, 12], [3]]
RESPONSES = [[4, 20, 33], [61, 2, 2, 9, 1], [17]]


def rows():
  """A rollout batch of three rows of different prompt and response lengths."""
  return batch_lib.build_rollout_batch(
      PROMPTS, RESPONSES, [[0.0] * len(r) for r in RESPONSES], [0.0] * 3, [False] * 3,
      [0, 1, 2], prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, pad_id=0)


# Jitted: run op by op, the model's first forward compiled each of its ops (20 s under load).
FORWARD = jax.jit(lambda params, tokens: MODEL.apply(params, tokens)[0])


def numpy_reference(params) -> np.ndarray:
  """log π(y_t | x, y_<t) from the model's logits over each unpadded row, in float64."""
  out = np.zeros((len(PROMPTS), RESPONSE_LENGTH))
  for row, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
    logits = FORWARD(params, np.asarray([prompt + response], np.int32))
    logits = np.asarray(logits[0], np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    log_softmax = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    for t, token in enumerate(response):
      out[row, t] = log_softmax[len(prompt) + t - 1, token]
  return out


class Server:
  """A server of SERVED on `port` (0: any); `kill` stops it at once."""

  def __init__(self, port=0):
    scheduler = Scheduler(sampling.Engine(MODEL, num_slots=2, cache_length=16), SERVED,
                          prompt_buckets=(8,))
    self.server, self.port, self.service = server_lib.start_server(scheduler, port=port,
                                                                   max_workers=4)

  def kill(self):
    self.server.stop(grace=None)
    self.service.stop()


@pytest.fixture()
def served():
  server = Server()
  client = SamplerClient(f"localhost:{server.port}", timeout_s=60)
  client.wait_ready()
  yield client, server
  client.close()
  server.kill()


def score(client, batch=None):
  batch = rows() if batch is None else batch
  return client.reference_logprobs(batch.tokens, batch.attention_mask, batch.response_mask)


@pytest.mark.slow
def test_a_server_scores_rows_under_the_reference_it_was_sent(served):
  client, _ = served
  with pytest.raises(grpc.RpcError) as error:
    score(client)  # nothing sent yet: a restarted server says so
  assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
  reply = client.update_reference(REFERENCE)
  assert reply.compute_dtype == "float32"
  out = score(client)
  assert out.shape == (3, RESPONSE_LENGTH) and out.dtype == np.float32
  np.testing.assert_allclose(out, numpy_reference(REFERENCE), atol=2e-5)
  assert np.all(out[rows().response_mask == 0] == 0)
  # New served weights leave the reference alone.
  client.update_weights(jax.tree.map(lambda x: x * 1.5, SERVED), version=3)
  np.testing.assert_allclose(score(client), out, atol=1e-6)
  # The trainer's own forward over the same rows agrees.
  trainer = batch_lib.response_logprobs(MODEL, REFERENCE, rows())
  np.testing.assert_allclose(out, np.asarray(trainer), atol=1e-6)


@pytest.mark.parametrize("field, change, match", [
    ("tokens", lambda b: b.replace(tokens=b.tokens[0]), "tokens: must be an int array"),
    ("tokens", lambda b: b.replace(tokens=b.tokens + 64), r"tokens: ids must lie in \[0, 64\)"),
    ("attention_mask", lambda b: b.replace(attention_mask=b.attention_mask[:, 1:]),
     "attention_mask: must be int"),
    ("response_mask", lambda b: b.replace(response_mask=b.response_mask[:2]),
     "response_mask: must be float32"),
])
def test_malformed_rows_answer_invalid_argument_naming_the_field(served, field, change, match):
  client, _ = served
  client.update_reference(REFERENCE)
  with pytest.raises(grpc.RpcError) as error:
    score(client, change(rows()))
  assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert field in error.value.details()
  assert re.search(match, error.value.details())


def test_a_fleet_scores_through_a_killed_server_and_a_restarted_one():
  servers = [Server(), Server()]
  logs = []
  fleet = SamplerFleet([f"localhost:{s.port}" for s in servers], timeout_s=30,
                       probe_interval_s=0.0, log=logs.append)
  try:
    fleet.wait_ready()
    fleet.probe(force=True)
    assert len(fleet.update_reference(REFERENCE)) == 2
    expected = numpy_reference(REFERENCE)
    np.testing.assert_allclose(score(fleet), expected, atol=2e-5)
    servers[0].kill()
    np.testing.assert_allclose(score(fleet), expected, atol=2e-5)
    # The other one restarts on its port with no reference, and the first stays dead.
    servers[1].kill()
    servers[1] = Server(port=servers[1].port)
    np.testing.assert_allclose(score(fleet), expected, atol=2e-5)
    assert any("lost the reference" in line or "joined" in line for line in logs)
  finally:
    fleet.close()
    for s in servers:
      s.kill()


class Recorder:
  """A stand-in sampler: the rows it was asked to score, and a constant answer."""

  def __init__(self):
    self.asked = []

  def reference_logprobs(self, tokens, attention_mask, response_mask):
    self.asked.append(np.asarray(tokens))
    return np.full(response_mask.shape, -1.5, np.float32)


class OneBatch:
  """A rollout mode that returns `rows()` and counts the calls it forwards."""

  def __init__(self):
    self.calls = []

  def collect(self):
    return Rollouts(batch=rows(), correct=[], failures=[], metrics={})

  def __getattr__(self, name):
    return lambda *args: self.calls.append((name, args)) or {"at": 4}


def test_the_rollout_wrapper_fills_the_batch_and_forwards_the_seam():
  sampler, inner = Recorder(), OneBatch()
  rollout = reference_lib.SamplerReferenceRollout(inner, sampler)
  out = rollout.collect()
  np.testing.assert_array_equal(sampler.asked[0], rows().tokens)
  np.testing.assert_array_equal(out.batch.ref_logprobs, np.full((3, RESPONSE_LENGTH), -1.5))
  assert out.metrics["time_reference"] >= 0
  rollout.set_step(3)
  assert rollout.state() == {"at": 4}
  rollout.restore({"at": 4})
  assert [name for name, _ in inner.calls] == ["set_step", "state", "restore"]


def trainer_config(**changes):
  from configs import grpo  # pylint: disable=import-outside-toplevel
  c = grpo.get_config("arith")
  c.sampler.address = "localhost:1"
  c.rollout.reference_logprobs = "sampler"
  c.update_from_flattened_dict(changes)
  return c


@pytest.mark.parametrize("changes, match", [
    ({"rollout.reference_logprobs": "critic"}, "must be one of trainer, sampler"),
    ({"sampler.address": ""}, "needs sampling servers"),
    ({"algorithm.kl.placement": "none"}, "needs a reference"),
    ({"algorithm.kl.reference_ema": 0.1}, "needs a frozen reference"),
    ({"sampler.dtype": "bfloat16"}, "sampler.dtype == model.dtype"),
])
def test_the_config_refuses_what_cannot_hold(changes, match):
  from rlhf_jax.training.config import validate_config  # pylint: disable=import-outside-toplevel
  with pytest.raises(ConfigError, match="rollout.reference_logprobs") as error:
    validate_config(trainer_config(**changes))
  assert match in str(error.value)
  validate_config(trainer_config())  # the unchanged config holds


def test_a_server_in_another_dtype_is_refused_when_the_reference_is_sent():
  class Reply:
    compute_dtype = "bfloat16"

  class Sampler:
    def update_reference(self, params):
      return [Reply()]

  with pytest.raises(ConfigError, match="a server computes in 'bfloat16'"):
    reference_lib.send_reference(Sampler(), REFERENCE, "float32")


def test_reference_rows_are_capped_and_bucketed():
  policy = serve_reference.ReferencePolicy(MODEL, max_length=32)
  policy.load(SERVED)

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
  unpadded = serve_reference.ReferencePolicy(MODEL)._forward(SERVED, tokens, mask, response)
  np.testing.assert_allclose(first, np.asarray(unpadded), atol=1e-5)
