"""Running a jitted function over many rows in fixed-size chunks (one compile)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import numpy as np

from rlhf_jax.parallel.distributed import host_values
from rlhf_jax.parallel.sharding import BATCH_AXES
from rlhf_jax.parallel.sharding import batch_sharding


def run_in_chunks(fn: Callable, arrays: Sequence, chunk: int,
                  mesh: jax.sharding.Mesh | None = None) -> np.ndarray:
  """`fn(*arrays)` over rows in chunks of exactly `chunk` rows (the last one padded by
  repeating row 0, so `fn` compiles once), concatenated on the host. Each argument is
  an array or a pytree of arrays (e.g. a RolloutBatch) with rows on the leading axis.
  With a mesh, each chunk's rows are split over (data, fsdp, expert) when they divide
  evenly."""
  rows = jax.tree.leaves(arrays)[0].shape[0]
  shards = 1 if mesh is None else math.prod(mesh.shape[axis] for axis in BATCH_AXES)
  outputs = []
  for start in range(0, rows, chunk):
    part = jax.tree.map(lambda a: np.asarray(a)[start:start + chunk], list(arrays))
    missing = chunk - min(chunk, rows - start)
    if missing:
      part = jax.tree.map(lambda p: np.concatenate([p, np.repeat(p[:1], missing, axis=0)]),
                          part)
    if mesh is not None and chunk % shards == 0:
      part = jax.tree.map(lambda p: jax.device_put(p, batch_sharding(mesh, p.ndim)),
                          part)
    outputs.append(np.asarray(host_values(fn(*part)))[:chunk - missing])
  return np.concatenate(outputs) if outputs else np.zeros((0,), np.float32)
