"""SamplerClient's parts that need no server: call timeouts under a deadline, errors in
one line, samples and weights as they cross the wire (the client against a live server:
tests/sampling/serve/test_server.py)."""

from __future__ import annotations

import time

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.remote import client as client_lib
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.serve import wire


class Refused(grpc.RpcError):
  """A failed call's status."""

  def code(self):
    return grpc.StatusCode.UNAVAILABLE

  def details(self):
    return "connection refused"


def test_a_call_timeout_is_the_cap_and_the_deadline_s_time_left():
  assert client_lib.call_timeout(None, 30.0) == 30.0
  assert client_lib.call_timeout(None, None) is None
  far = time.monotonic() + 1000.0
  assert client_lib.call_timeout(far, 30.0) == 30.0
  for deadline, cap in ((far, None), (time.monotonic() + 5.0, 30.0)):
    before = time.monotonic()
    left = client_lib.call_timeout(deadline, cap)
    after = time.monotonic()
    assert deadline - after <= left <= deadline - before  # the time left, whatever the load
  past = time.monotonic() - 10.0  # a call made at its deadline still gets a moment
  assert client_lib.call_timeout(past, 30.0) == client_lib.MIN_CALL_S


def test_errors_are_described_in_one_line():
  assert client_lib.describe_error(Refused()) == "UNAVAILABLE: connection refused"
  assert client_lib.describe_error(ValueError("bad")) == "ValueError('bad')"


def test_a_completion_crosses_the_wire_unchanged():
  completion = Completion(
      request_id="r7", sample_index=2, prompt_ids=[4, 5], token_ids=[9, 1, 3],
      sampled_logprobs=[-0.5, -1.25, -0.125], model_logprobs=[-0.75, -1.5, -0.25],
      finish_reason="stop", seed=123, weights_version=(3, 4), error="",
      candidate_logprobs=[-2.0, -0.5], token_versions=[3, 3, 4],
      routes=np.arange(3 * 2 * 2, dtype=np.int32).reshape(3, 2, 2))
  message = wire.sample_to_proto(completion, text="decoded")
  assert message.text == "decoded"
  back = client_lib.completion_from_proto("r7", [4, 5], message)
  np.testing.assert_array_equal(back.routes, completion.routes)
  assert back.routes.dtype == np.int32
  back.routes = completion.routes
  assert back == completion
  plain = wire.sample_to_proto(Completion("r", 0, [1], [2], [-0.1], [-0.2], "length", 0,
                                          (0, 0)))
  assert client_lib.completion_from_proto("r", [1], plain).routes is None


def test_weights_go_in_chunks_that_the_server_reassembles():
  params = {"embed": np.arange(40, dtype=np.float32).reshape(10, 4),
            "layers": {"0": {"scale": np.full((3,), 2.0, np.float32)},
                       "1": {"empty": np.zeros((0, 2), np.float32)}}}
  weight_chunks = client_lib._weight_chunks  # pylint: disable=protected-access
  chunks = list(weight_chunks(params, 9, chunk_bytes=48))
  per_tensor = {}
  for chunk in chunks:
    per_tensor.setdefault(chunk.name, []).append(chunk.offset)
  # 160 bytes in chunks of 48; 12 bytes in one; an empty tensor still says it is there.
  assert per_tensor == {"embed": [0, 48, 96, 144], "layers/0/scale": [0],
                        "layers/1/empty": [0]}
  assert {c.version for c in chunks} == {9}
  like = jax.tree.map(jnp.zeros_like, params)  # the served weights: device arrays
  rebuilt, version, tensors = wire.params_from_chunks(chunks, like)
  assert version == 9 and tensors == 3
  np.testing.assert_array_equal(rebuilt["embed"], params["embed"])
  np.testing.assert_array_equal(rebuilt["layers"]["0"]["scale"],
                                params["layers"]["0"]["scale"])


def test_a_client_needs_room_for_one_request():
  with pytest.raises(ValueError, match=r"^max_in_flight=0 must be >= 1\.$"):
    SamplerClient("localhost:1", max_in_flight=0)
