"""What crosses the wire: SamplingParams and Completion ⇄ their protos, and parameters
as named tensors sent in chunks (UpdateWeights).

Needs protobuf (the `serve` extra) but not grpcio: the conversions are plain message
building, shared by the server (`serve/handlers.py`) and the client (`remote/client.py`).
"""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.sampling.params import FireSchedule
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.serve.protos import sampler_pb2

# Both ends raise gRPC's 4 MiB default: a batch of long samples with log-probs exceeds it.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def sampling_from_proto(message: sampler_pb2.SamplingParams) -> SamplingParams:
  """SamplingParams from its proto (unset fields take the defaults).

  Raises:
    ValueError: naming the field ("sampling.top_p=...").
  """
  fields = {}
  for name in ("temperature", "top_k", "top_p", "min_p", "max_new_tokens", "n", "seed"):
    if message.HasField(name):
      fields[name] = getattr(message, name)
  fields["stop_token_ids"] = tuple(message.stop_token_ids)
  fields["candidate_token_ids"] = tuple(message.candidate_token_ids)
  fields["keep_cache"] = message.keep_cache
  if message.HasField("fire"):
    fire = {name: getattr(message.fire, name) for name in ("temperature", "top_k")
            if message.fire.HasField(name)}
    fields["fire"] = FireSchedule(every_line=message.fire.every_line, **fire)
  try:
    return SamplingParams(**fields)
  except ValueError as error:
    raise ValueError(f"sampling.{error}") from None


def sampling_to_proto(params: SamplingParams) -> sampler_pb2.SamplingParams:
  """The proto of a SamplingParams (every field set)."""
  message = sampler_pb2.SamplingParams(
      temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
      min_p=params.min_p, max_new_tokens=params.max_new_tokens,
      stop_token_ids=list(params.stop_token_ids), n=params.n,
      candidate_token_ids=list(params.candidate_token_ids), keep_cache=params.keep_cache)
  if params.seed is not None:
    message.seed = params.seed
  if params.fire is not None:
    message.fire.CopyFrom(sampler_pb2.Fire(temperature=params.fire.temperature,
                                           top_k=params.fire.top_k,
                                           every_line=params.fire.every_line))
  return message


def sample_to_proto(completion: Completion, text: str = "") -> sampler_pb2.Sample:
  """The proto of one finished sample."""
  first, last = completion.weights_version
  routes = None if completion.routes is None else array_to_proto(completion.routes)
  return sampler_pb2.Sample(routes=routes,
      sample_index=completion.sample_index, token_ids=completion.token_ids,
      sampled_logprobs=completion.sampled_logprobs, model_logprobs=completion.model_logprobs,
      finish_reason=completion.finish_reason, seed=completion.seed,
      first_weights_version=first, last_weights_version=last, text=text,
      error=completion.error, candidate_logprobs=completion.candidate_logprobs,
      token_versions=completion.token_versions)


def array_to_proto(array) -> sampler_pb2.Array:
  """A dense array's proto (dtype name, shape, C-order bytes)."""
  array = np.ascontiguousarray(np.asarray(array))
  return sampler_pb2.Array(dtype=str(array.dtype), shape=array.shape, data=array.tobytes())


def array_from_proto(message: sampler_pb2.Array, field: str) -> np.ndarray:
  """The array of an Array message (a copy).

  Raises:
    ValueError naming `field`: an unknown dtype, or bytes that do not fill the shape.
  """
  try:
    dtype = np.dtype(message.dtype)
  except TypeError:
    raise ValueError(f"{field}: unknown dtype {message.dtype!r}.") from None
  shape = tuple(int(d) for d in message.shape)
  if any(d < 0 for d in shape) or len(message.data) != int(np.prod(shape)) * dtype.itemsize:
    raise ValueError(f"{field}: {len(message.data)} bytes do not hold {message.dtype}"
                     f"{list(shape)}.")
  return np.frombuffer(message.data, dtype).reshape(shape).copy()


def param_names(params) -> list[tuple[str, jax.Array]]:
  """(path, leaf) of every parameter, paths like "layers/0/mlp/up_proj"."""
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  return [("/".join(str(getattr(key, "key", key)) for key in path), leaf) for path, leaf in flat]


def _chunk_problem(chunk, template: dict, nbytes: int) -> str | None:
  """Why `chunk` does not fit the tensor it names, or None."""
  if chunk.name not in template:
    return f"unexpected tensor {chunk.name!r}"
  expected = template[chunk.name]
  if tuple(chunk.shape) != tuple(expected.shape) or chunk.dtype != str(expected.dtype):
    return (f"tensor {chunk.name!r}: got {chunk.dtype}{list(chunk.shape)}, "
            f"expected {expected.dtype}{list(expected.shape)}")
  if chunk.offset < 0 or chunk.offset + len(chunk.data) > nbytes:
    return (f"tensor {chunk.name!r}: chunk at offset {chunk.offset} overruns its "
            f"{nbytes} bytes")
  return None


def params_from_chunks(chunks: Iterable[sampler_pb2.WeightChunk], like) -> tuple[
    object, int | None, int]:
  """Reassembles parameters sent as WeightChunk messages.

  Args:
    chunks: the UpdateWeights client stream: (name, version, dtype, shape, offset,
      data) pieces of the tensors of `param_names(like)`, in any order.
    like: the parameters now served; the result has their tree, shapes, dtypes and
      shardings.
  Returns:
    (params, version, number of tensors received).
  Raises:
    ValueError naming the tensor: an unknown name, a wrong shape or dtype, a chunk
    overrunning its tensor, a version change mid-stream, or a missing tensor.
  """
  named = param_names(like)
  template = dict(named)
  buffers: dict[str, bytearray] = {}
  version = None
  for chunk in chunks:
    if version is None:
      version = chunk.version
    elif chunk.version != version:
      raise ValueError(f"version changed within one update ({version} → {chunk.version}).")
    expected = template.get(chunk.name)
    nbytes = 0 if expected is None else (
        int(np.prod(expected.shape)) * jnp.dtype(expected.dtype).itemsize)
    problem = _chunk_problem(chunk, template, nbytes)
    if problem:
      raise ValueError(f"{problem}.")
    buffer = buffers.setdefault(chunk.name, bytearray(nbytes))
    buffer[chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
  missing = sorted(set(template) - set(buffers))
  if missing:
    raise ValueError(f"missing tensors: {', '.join(missing[:8])}"
                     f"{' ...' if len(missing) > 8 else ''}.")
  leaves, treedef = jax.tree_util.tree_flatten(like)
  new_leaves = [
      jax.device_put(np.frombuffer(bytes(buffers[name]), jnp.dtype(leaf.dtype)).reshape(
          leaf.shape), leaf.sharding) for (name, _), leaf in zip(named, leaves)]
  return jax.tree_util.tree_unflatten(treedef, new_leaves), version, len(buffers)
