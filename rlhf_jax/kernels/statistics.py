"""Masked statistics over `[batch, time]` arrays.

Every reduction here counts only positions where `mask` is 1. They are the one
place the library computes masked means and variances: advantage whitening,
loss aggregation and metrics all call these.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v


def masked_sum(x: chex.Array, mask: chex.Array, axis=None) -> chex.Array:
  """Σ m·x over `axis` (all axes when None), in float32.

  Args:
    x: array of any shape.
    mask: 0/1 (or bool) array of the same shape.
    axis: reduction axis or axes.
  Returns:
    The masked sum; float32.
  """
  chex.assert_equal_shape([x, mask])
  x, mask = v.as_float32(x, mask)
  return jnp.sum(x * mask, axis=axis)


def masked_mean(x: chex.Array, mask: chex.Array, axis=None) -> chex.Array:
  """Σ m·x / Σ m over `axis`; 0 where the mask is empty (no NaN).

  Args:
    x: array of any shape.
    mask: 0/1 (or bool) array of the same shape.
    axis: reduction axis or axes (all when None).
  Returns:
    The masked mean; float32.
  """
  count = masked_sum(jnp.ones_like(x, jnp.float32), mask, axis=axis)
  return masked_sum(x, mask, axis=axis) / jnp.maximum(count, 1.0)


def masked_var(x: chex.Array, mask: chex.Array, *, unbiased: bool = True) -> chex.Array:
  """Variance of the masked entries of `x` (a scalar), Bessel-corrected by default.

  var = Σ m·(x − μ)² / (n − 1) with n = Σ m (or / n when `unbiased=False`).
  With n ≤ 1 the sample variance is undefined; we return 0 there instead of
  verl's exception (inside `jit` we cannot raise on a data-dependent count).

  Args:
    x: array of any shape.
    mask: 0/1 array of the same shape.
    unbiased: apply Bessel's correction n/(n−1).
  Returns:
    Scalar float32 variance.
  """
  mean = masked_mean(x, mask)
  count = masked_sum(jnp.ones_like(x, jnp.float32), mask)
  centred = jnp.asarray(x, jnp.float32) - mean
  sum_sq = masked_sum(centred * centred, mask)
  denom = count - 1.0 if unbiased else count
  return jnp.where(denom > 0, sum_sq / jnp.maximum(denom, 1.0), 0.0)


def masked_whiten(x: chex.Array, mask: chex.Array, *, shift_mean: bool = True,
                  eps: float = 1e-8) -> chex.Array:
  """Whitens the masked entries of `x` with statistics over the whole batch.

  x̂ = (x − μ) / sqrt(σ² + eps), μ and σ² the masked mean and Bessel-corrected
  variance over all valid positions (verl `masked_whiten`, used for GAE and
  REINFORCE++ advantages; Xu et al. 2404.10719 §4 "advantage normalisation").
  With `shift_mean=False` the mean is added back (only the scale changes).

  Args:
    x: [B, T] (or any shape) values.
    mask: 0/1 array of the same shape.
    shift_mean: subtract the mean (True) or keep it (False).
    eps: added to the variance.
  Returns:
    float32 array of x's shape; 0 where mask is 0.
  """
  mean = masked_mean(x, mask)
  var = masked_var(x, mask)
  x32 = jnp.asarray(x, jnp.float32)
  whitened = (x32 - mean) * jnp.reciprocal(jnp.sqrt(var + eps))
  if not shift_mean:
    whitened = whitened + mean
  return whitened * jnp.asarray(mask, jnp.float32)


def explained_variance(values: chex.Array, returns: chex.Array,
                       mask: chex.Array) -> chex.Array:
  """1 − Var[R − V] / Var[R] over valid tokens: how much of the return the critic explains.

  1 is a perfect critic, 0 a constant one, negative worse than a constant.
  Returns NaN-free 0 when Var[R] is 0.

  Args:
    values: [B, T] critic predictions.
    returns: [B, T] value targets.
    mask: [B, T] 0/1.
  Returns:
    Scalar float32.
  """
  chex.assert_equal_shape([values, returns, mask])
  var_returns = masked_var(returns, mask)
  var_residual = masked_var(jnp.asarray(returns, jnp.float32) - values, mask)
  return jnp.where(var_returns > 0, 1.0 - var_residual / jnp.maximum(var_returns, 1e-30), 0.0)
