"""The critic's clipped value loss."""

from __future__ import annotations

import chex
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v
from rlhf_jax.kernels import aggregation
from rlhf_jax.kernels import statistics


def value_loss(values: chex.Array, old_values: chex.Array, returns: chex.Array,
               mask: chex.Array, *, clip: float | None = 0.5,
               agg: aggregation.AggregationMode = "token-mean",
               agg_normalizer: chex.Array | float | None = None
               ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Clipped value loss with the ½ factor.

      V^clip = V_old + clip(V − V_old, −ε_v, ε_v)
      ℓ = ½·max((V − R)², (V^clip − R)²)                 (PPO2 baselines; verl `compute_value_loss`)
      loss = aggregate(ℓ, mask, mode=agg)

  verl's default ε_v is 0.5 (`critic.cliprange_value`); `clip=None` gives the
  plain ½·(V − R)².

  Metrics: `value_clip_frac` (fraction of valid tokens where the clipped term
  is the larger, i.e. the gradient is cut) and `value_mean`.

  Args:
    values: [B, T] current critic predictions (differentiated).
    old_values: [B, T] predictions at rollout time.
    returns: [B, T] targets.
    mask: [B, T] 0/1.
    clip: ε_v > 0, or None for no clipping.
    agg: aggregation mode.
    agg_normalizer: optional global count for `aggregate`.
  Returns:
    (loss, metrics).
  """
  if clip is not None:
    v.check_range("clip", clip, low=0.0, low_inclusive=False)
  v.check_batch_time(values, old_values, returns, mask,
                     names=("values", "old_values", "returns", "mask"))
  for array, name in ((values, "values"), (old_values, "old_values"), (returns, "returns")):
    v.check_floating(array, name)
  values, old_values, returns, mask = v.as_float32(values, old_values, returns, mask)
  unclipped = jnp.square(values - returns)
  if clip is None:
    per_token = unclipped
    clipped_frac = jnp.float32(0.0)
  else:
    clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped = jnp.square(clipped_values - returns)
    per_token = jnp.maximum(unclipped, clipped)
    clipped_frac = statistics.masked_mean(clipped > unclipped, mask)
  loss = 0.5 * aggregation.aggregate(per_token, mask, mode=agg, normalizer=agg_normalizer)
  return loss, {"value_clip_frac": clipped_frac,
                "value_mean": statistics.masked_mean(values, mask)}
