"""Rotary position embeddings (RoPE, Su et al. 2021), optionally Llama 3 or YaRN scaled."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.decoder_config import YarnScaling


def rope_inverse_frequencies(config: DecoderConfig, local: bool = False) -> jax.Array:
  """[rotary_dim/2] inverse frequencies θ^(−2i/d), d = `config.rotary_dim` (head_dim
  unless partial), with Llama 3 scaling when configured; `local`: those of sliding
  layers, θ = `config.rope_local_theta` and unscaled (Gemma 3).

  Llama 3 (HF `_compute_llama3_parameters`): wavelengths longer than
  L/low_freq_factor are divided by `factor`, shorter than L/high_freq_factor
  kept, and the band between interpolated smoothly.
  """
  dim = config.rotary_dim
  theta = config.rope_local_theta if local else config.rope_theta
  inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  scaling = config.rope_scaling
  if scaling is None or local:
    return inv
  if isinstance(scaling, YarnScaling):
    return _yarn_inverse_frequencies(inv, scaling, dim, theta)
  old = scaling.original_max_position_embeddings
  low_wavelen = old / scaling.low_freq_factor
  high_wavelen = old / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > low_wavelen, inv / scaling.factor, inv)
  smooth = (old / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def _yarn_inverse_frequencies(inv: jax.Array, scaling: YarnScaling, dim: int, theta: float
                              ) -> jax.Array:
  """YaRN's blend (transformers' `_compute_yarn_parameters`): dims rotating fewer than
  `beta_slow` times over the original context are interpolated (/ factor), more than
  `beta_fast` times kept, a linear ramp between."""
  def correction_dim(rotations):
    return dim * math.log(scaling.original_max_position_embeddings / (
        rotations * 2 * math.pi)) / (2 * math.log(theta))
  low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
  if scaling.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  high = high + 0.001 if low == high else high  # no division by zero
  ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
  extrapolated = 1 - ramp
  return inv / scaling.factor * (1 - extrapolated) + inv * extrapolated


def rope_tables(positions: jax.Array, config: DecoderConfig, local: bool = False):
  """RoPE tables for [B, T] positions: cos, sin of shape [B, T, 1, rotary_dim]
  (rotate-half layout), times YaRN's attention factor when scaled by it; `local`: with the
  sliding layers' frequencies."""
  inverse = rope_inverse_frequencies(config, local)
  angles = positions.astype(jnp.float32)[..., None] * inverse[None, None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  scaling = config.rope_scaling
  if isinstance(scaling, YarnScaling) and not local and scaling.attention_factor != 1.0:
    return jnp.cos(angles) * scaling.attention_factor, jnp.sin(angles) * scaling.attention_factor
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, H, D] rotated by the tables of `rope_tables` (rotate-half layout), in x's
  dtype: its first R = cos.shape[-1] dims (partial RoPE, as Phi-3); the rest pass as is."""
  rotary = cos.shape[-1]
  x32 = x.astype(jnp.float32)
  x_rot, x_pass = x32[..., :rotary], x32[..., rotary:]
  half = rotary // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  out = x_rot * cos + rotated * sin
  if rotary < x.shape[-1]:
    out = jnp.concatenate([out, x_pass], axis=-1)
  return out.astype(x.dtype)


def layer_rope(tables: tuple, local) -> tuple[jax.Array, jax.Array]:
  """A layer's (cos, sin) from `tables` ((cos, sin) of every layer, then of the sliding
  layers when they differ): `local` a bool, or a traced bool of a scanned layer."""
  if len(tables) == 1 or local is False:
    return tables[0]
  if local is True:
    return tables[1]
  return tuple(jnp.where(local, l, g) for g, l in zip(tables[0], tables[1]))
