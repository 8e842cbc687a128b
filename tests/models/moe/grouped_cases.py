"""The grouped matmuls' shared test cases (test_grouped.py, test_pallas_grouped.py): row
groups with an empty group, one group taking every row and rows past the groups; a NumPy
loop over the groups as the reference, values and gradients; and `check`, which runs a
grouped matmul (`jax.lax.ragged_dot`'s contract) against it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# M = 37 rows (not a multiple of any tile), K = 20, N = 19, G = 5 groups.
CASES = {"uneven_with_an_empty_group": [7, 0, 20, 1, 9],
         "one_group_takes_all": [0, 0, 37, 0, 0],
         "rows_past_the_groups": [3, 11, 0, 6, 2]}  # Σ = 22 of 37: 15 rows get zeros


def inputs(sizes, seed=0, m=37, k=20, n=19):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((m, k)), rng.standard_normal((len(sizes), k, n)),
          np.asarray(sizes), rng.standard_normal((m, n)))


def reference(rows, weights, sizes):
  """out[i] = rows[i] @ weights[g] for the rows of group g (contiguous, in order), zero
  past Σ sizes; float64."""
  out = np.zeros((rows.shape[0], weights.shape[2]))
  start = 0
  for g, size in enumerate(sizes):
    out[start:start + size] = rows[start:start + size] @ weights[g]
    start += size
  return out


def reference_grads(rows, weights, sizes, cotangent):
  """d/d rows and d/d weights of Σ out · cotangent: rows' = c · W_gᵀ, W_g' = X_gᵀ · c_g."""
  drows, dweights = np.zeros_like(rows), np.zeros_like(weights)
  start = 0
  for g, size in enumerate(sizes):
    part = slice(start, start + size)
    drows[part] = cotangent[part] @ weights[g].T
    dweights[g] = rows[part].T @ cotangent[part]
    start += size
  return drows, dweights


def check(matmul, sizes, dtype=jnp.float32, rtol=2e-5, atol=2e-5):
  rows, weights, sizes, cotangent = inputs(sizes)
  cast = lambda a: jnp.asarray(a, dtype)

  @jax.jit
  def run(r, w):  # one program: the values and their VJP with the cotangent
    out, vjp = jax.vjp(lambda r, w: matmul(r, w, jnp.asarray(sizes, jnp.int32)), r, w)
    return out, vjp(cast(cotangent))

  got, grads = run(cast(rows), cast(weights))
  assert got.dtype == dtype and got.shape == (rows.shape[0], weights.shape[2])
  np.testing.assert_allclose(np.asarray(got, np.float64), reference(rows, weights, sizes),
                             rtol=rtol, atol=atol)
  for name, a, b in zip(("rows", "weights"), grads,
                        reference_grads(rows, weights, sizes, cotangent)):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol, atol=atol,
                               err_msg=name)
