"""Random attention inputs shared by the attention kernels' tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def inputs(seed, batch=2, time=5, slots=7, heads=4, kv_heads=2, dim=8):
  """(q [B, T, N, D], k [B, S, K, D], v [B, S, K, D], mask [B, T, S]) float32 / bool: a
  random mask in which every query sees at least key 0."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((batch, time, heads, dim)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((batch, slots, kv_heads, dim)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((batch, slots, kv_heads, dim)), jnp.float32)
  mask = rng.random((batch, time, slots)) < 0.6
  mask[..., 0] = True  # every query sees at least one key
  return q, k, v, jnp.asarray(mask)
