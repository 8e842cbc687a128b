"""Index helpers over masked `[B, T]` rows: the last valid position, the next valid one."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def last_valid_index(mask: chex.Array) -> chex.Array:
  """Index of the last position with mask 1 in each row; −1 for an empty row.

  Args:
    mask: [B, T] 0/1.
  Returns:
    [B] int32.
  """
  time = mask.shape[-1]
  positions = jnp.where(jnp.asarray(mask) > 0, jnp.arange(time, dtype=jnp.int32)[None, :], -1)
  return jnp.max(positions, axis=-1)


def next_valid_values(x: chex.Array, mask: chex.Array, fill: chex.Array) -> chex.Array:
  """x at the next valid position strictly after t, or `fill` past the row's last one.

  Args:
    x: [B, T] values.
    mask: [B, T] 0/1.
    fill: [B] value used where no valid position follows.
  Returns:
    [B, T] array of x's dtype (promoted with fill's).
  """
  batch, time = x.shape
  positions = jnp.where(jnp.asarray(mask) > 0, jnp.arange(time, dtype=jnp.int32)[None, :], time)
  after = jnp.concatenate([positions[:, 1:], jnp.full((batch, 1), time, jnp.int32)], axis=1)
  next_index = jax.lax.cummin(after, axis=1, reverse=True)
  gathered = jnp.take_along_axis(x, jnp.minimum(next_index, time - 1), axis=1)
  return jnp.where(next_index < time, gathered, jnp.asarray(fill)[:, None])
