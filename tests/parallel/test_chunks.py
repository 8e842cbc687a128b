"""`run_in_chunks` (parallel/chunks.py): a function over many rows in fixed-size chunks gives
what it gives over all rows at once, compiles once, and sees only full chunks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import parallel
from rlhf_jax.parallel.chunks import run_in_chunks


@pytest.mark.parametrize("rows, chunk", [(7, 3), (6, 3), (2, 5), (1, 1)])
def test_chunks_give_the_whole_rows_result_in_order(rows, chunk):
  rng = np.random.default_rng(rows * 10 + chunk)
  x = rng.standard_normal((rows, 4)).astype(np.float32)
  weights = rng.standard_normal(4).astype(np.float32)
  shapes = []

  def row_scores(a, w):
    shapes.append(a.shape)  # traced once per compiled shape
    return jnp.sum(a * w, axis=1)

  got = run_in_chunks(jax.jit(row_scores), [x, np.tile(weights, (rows, 1))], chunk)
  np.testing.assert_allclose(got, x @ weights, rtol=1e-5)
  assert shapes == [(chunk, 4)]  # one compile: the last chunk is padded to `chunk` rows


def test_pytree_arguments_and_no_rows():
  tree = {"a": np.arange(5.0), "b": np.ones(5)}
  got = run_in_chunks(lambda t: t["a"] * 2 + t["b"], [tree], 2)
  np.testing.assert_array_equal(got, np.arange(5.0) * 2 + 1)
  assert run_in_chunks(lambda a: a, [np.zeros((0, 3))], 4).shape == (0,)


def test_a_mesh_splits_chunks_that_divide_over_its_data_axes():
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  x = np.arange(10.0).reshape(5, 2)
  got = run_in_chunks(jax.jit(lambda a: jnp.sum(a, axis=1)), [x], 2, mesh=mesh)
  np.testing.assert_array_equal(got, x.sum(axis=1))
