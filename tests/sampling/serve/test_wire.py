"""What crosses the wire: SamplingParams and arrays through their protos and back, and
weights sent as chunks reassembled in any order, each refusal naming its field or tensor
(a Completion's round trip: tests/sampling/remote/test_client.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.serve import wire
from rlhf_jax.sampling.serve.protos import sampler_pb2

# Served weights of several shapes and dtypes (device arrays, as a server holds them).
PARAMS = {"embed": jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) / 7,
          "layers": {"0": {"up": jnp.ones((8, 12), jnp.bfloat16),
                           "norm": jnp.full((8,), 0.5, jnp.float32)},
                     "1": {"up": jnp.zeros((8, 12), jnp.bfloat16),
                           "norm": jnp.ones((8,), jnp.float32)}},
          "step": jnp.asarray([3], jnp.int32)}


def weight_chunks(params, version, chunk_bytes):
  """WeightChunk messages of `params`, cut here (not by the client) at `chunk_bytes`."""
  for name, leaf in wire.param_names(params):
    data = np.ascontiguousarray(np.asarray(leaf)).tobytes()
    for offset in range(0, len(data), chunk_bytes):
      yield sampler_pb2.WeightChunk(version=version, name=name, dtype=str(leaf.dtype),
                                    shape=leaf.shape, offset=offset,
                                    data=data[offset:offset + chunk_bytes])


def test_params_from_chunks_reassembles_any_order_and_names_the_bad_tensor():
  new_params = jax.tree.map(lambda x: x + 1, PARAMS)
  chunks = list(weight_chunks(new_params, 5, chunk_bytes=700))
  rebuilt, version, tensors = wire.params_from_chunks(chunks[::-1], PARAMS)
  names = wire.param_names(new_params)
  assert version == 5 and tensors == len(names)
  for (name, expected), (rebuilt_name, leaf) in zip(names, wire.param_names(rebuilt)):
    assert name == rebuilt_name
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected))
  first = chunks[0]
  overrun = sampler_pb2.WeightChunk()
  overrun.CopyFrom(first)
  overrun.offset = 10**9
  cases = {
      "version changed": [first, sampler_pb2.WeightChunk(
          version=6, name=first.name, dtype=first.dtype, shape=first.shape)],
      f"{first.name!r}: chunk at offset": [overrun],
      "missing tensors": chunks[:1],
      "unexpected tensor 'nowhere'": [sampler_pb2.WeightChunk(version=5, name="nowhere")],
  }
  for message, stream in cases.items():
    with pytest.raises(ValueError, match=re.escape(message)):
      wire.params_from_chunks(stream, PARAMS)


def test_param_names_are_slash_paths_of_the_tree():
  assert [name for name, _ in wire.param_names(PARAMS)] == [
      "embed", "layers/0/norm", "layers/0/up", "layers/1/norm", "layers/1/up", "step"]


def test_a_tensor_of_the_wrong_shape_or_dtype_is_named():
  leaf = np.zeros((8,), np.float16)
  chunk = sampler_pb2.WeightChunk(version=1, name="layers/0/norm", dtype="float16",
                                  shape=[8], data=leaf.tobytes())
  with pytest.raises(ValueError, match=re.escape(
      "tensor 'layers/0/norm': got float16[8], expected float32[8].")):
    wire.params_from_chunks([chunk], PARAMS)


@pytest.mark.parametrize("params", [
    sampling.SamplingParams(),
    sampling.SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.125, max_new_tokens=9,
                            stop_token_ids=(1, 2), n=3, seed=0, keep_cache=True,
                            candidate_token_ids=(4, 60)),
    sampling.SamplingParams(seed=2**32 - 1, fire=sampling.FireSchedule()),
    sampling.SamplingParams(fire=sampling.FireSchedule(temperature=2.5, top_k=0,
                                                       every_line=True)),
])
def test_sampling_params_cross_the_wire_unchanged(params):
  """The proto's floats are 32-bit: the values here are exact in float32."""
  message = wire.sampling_to_proto(params)
  again = sampler_pb2.SamplingParams.FromString(message.SerializeToString())
  assert wire.sampling_from_proto(again) == params
  assert message.HasField("seed") == (params.seed is not None)


def test_unset_fields_take_the_defaults_and_a_bad_one_is_named():
  assert wire.sampling_from_proto(sampler_pb2.SamplingParams()) == sampling.SamplingParams()
  assert wire.sampling_from_proto(sampler_pb2.SamplingParams(
      fire=sampler_pb2.Fire(every_line=True))) == sampling.SamplingParams(
          fire=sampling.FireSchedule(every_line=True))
  for message, error in (
      (sampler_pb2.SamplingParams(top_p=1.5), "sampling.top_p=1.5 must be <= 1.0."),
      (sampler_pb2.SamplingParams(n=0), "sampling.n=0 must be >= 1.")):
    with pytest.raises(ValueError, match="^" + re.escape(error) + "$"):
      wire.sampling_from_proto(message)
  with pytest.raises(ValueError, match=re.escape("fire.top_k=-1 must be >= 0.")):
    wire.sampling_from_proto(sampler_pb2.SamplingParams(fire=sampler_pb2.Fire(top_k=-1)))


@pytest.mark.parametrize("array", [
    np.arange(24, dtype=np.int8).reshape(2, 3, 4), np.linspace(-1, 1, 6, dtype=np.float32),
    np.asarray(jnp.arange(5, dtype=jnp.bfloat16)), np.zeros((0, 3), np.int64),
    np.asfortranarray(np.arange(6.0).reshape(2, 3))])
def test_arrays_cross_the_wire_unchanged(array):
  message = sampler_pb2.Array.FromString(wire.array_to_proto(array).SerializeToString())
  back = wire.array_from_proto(message, "field")
  assert back.dtype == array.dtype and back.shape == array.shape
  np.testing.assert_array_equal(back, array)
  assert back.flags.writeable  # a copy, not a view of the message's bytes


@pytest.mark.parametrize("message, error", [
    (sampler_pb2.Array(dtype="float99", shape=[1], data=bytes(4)),
     "tokens: unknown dtype 'float99'."),
    (sampler_pb2.Array(dtype="int32", shape=[3], data=bytes(10)),
     "tokens: 10 bytes do not hold int32[3]."),
    (sampler_pb2.Array(dtype="int32", shape=[-1, -4], data=bytes(16)),
     "tokens: 16 bytes do not hold int32[-1, -4]."),
])
def test_an_array_whose_bytes_do_not_hold_it_is_named(message, error):
  with pytest.raises(ValueError, match="^" + re.escape(error) + "$"):
    wire.array_from_proto(message, "tokens")
