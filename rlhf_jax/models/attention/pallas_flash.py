"""Fused (flash) attention for training and scoring forwards: the Pallas/Triton kernel.

FlashAttention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness"; Dao 2023, "FlashAttention-2") computes softmax(S)·V
block by block with an online softmax and keeps only the output and the per-row
log-sum-exp for the backward, which recomputes the probabilities block by block:
no [B, heads, T, S] array is ever written. Here it is
`jax.experimental.pallas.ops.gpu.attention.mha` (Triton forward and backward on a
GPU, interpret mode elsewhere, so CPU tests run the same kernel code).

The layout the decoder attends under (`blocks.attention_mask`: causal, keys that
are real tokens, queries of a packed segment see only their segment) is given to
the kernel as segment ids: real tokens keep their segment (shifted to ≥ 1), padding
tokens get 0, which no real token has, so a real query never sees padding. The rows
the kernel computes for padding queries are meaningless; q, k, v are zeroed there
before the call and the output after, so nothing of them reaches dQ/dK/dV.

The kernel has no grouped-query attention: K and V are repeated ×G (autodiff sums
the repeats back). It has no soft-capping and no sliding window: asked for them,
`check_options` refuses with the option's name.

Attention sinks (gpt-oss: a logit z per query head in the softmax's denominator only)
rescale the kernel's output: with its per-row log-sum-exp λ, O_sink = w·O where
w = e^λ / (e^λ + e^z) = σ(λ − z). The backward is the kernel's own, handed w·dO as the
output gradient and O_sink as the output: its dS = P∘(dP − rowsum(dO∘O)) is then the
sink softmax's (dS = w·P∘(dP_sink − rowsum(dO_sink∘O_sink))); dz = −Σ_rows (1 − w)·
rowsum(dO_sink∘O_sink).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.pallas.ops.gpu import attention as pallas_mha
import jax.numpy as jnp

# The forward kernel's tile; a longer sequence is padded to a multiple of it.
BLOCK = 128
# The backward kernels' tiles (jax's defaults).
BACKWARD_BLOCK = 32


def check_options(kernel: str, time: int, softcap: float | None, window) -> None:
  """Raise a one-line ValueError naming the option a fused kernel cannot compute:
  soft-capping (Gemma 2's attn_logit_softcapping) or a sliding window narrower than
  the sequence (`time` tokens; a wider one masks nothing and is accepted)."""
  if softcap is not None:
    raise ValueError(f"attention_impl={kernel!r} cannot soft-cap scores "
                     f"(attn_logit_softcapping={softcap}, Gemma 2); use attention_impl='xla'.")
  if window is None:
    return
  if isinstance(window, jax.core.Tracer) or int(window) < time:
    raise ValueError(f"attention_impl={kernel!r} has no sliding window (window={window}, "
                     "Gemma/Mistral local layers); use attention_impl='xla'.")


def valid_tokens(token_mask: jax.Array | None, batch: int, time: int) -> jax.Array:
  """[B, T] bool, the real tokens (all when token_mask is None)."""
  if token_mask is None:
    return jnp.ones((batch, time), bool)
  return token_mask.astype(bool)


def kernel_segments(valid: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
  """[B, T] int32 segment ids for a segment-masking kernel: each real token's segment
  shifted to ≥ 1 (1 for all when `segment_ids` is None) and 0 on padding, so padding
  is a segment of its own that no real query attends to."""
  if segment_ids is None:
    return valid.astype(jnp.int32)
  ids = segment_ids.astype(jnp.int32)
  return jnp.where(valid, ids - jnp.min(ids) + 1, 0)


def padded_length(time: int) -> tuple[int, pallas_mha.BlockSizes]:
  """The kernel's sequence length for `time` tokens and its tiles: a power of two
  (≥ 16, Triton's smallest dot) up to BLOCK, else a multiple of BLOCK."""
  if time <= BLOCK:
    padded = max(16, 1 << (time - 1).bit_length())
  else:
    padded = -(-time // BLOCK) * BLOCK
  small = min(BACKWARD_BLOCK, padded)
  sizes = pallas_mha.BlockSizes(block_q=min(BLOCK, padded), block_k=min(BLOCK, padded),
                                block_q_dkv=small, block_kv_dkv=small, block_q_dq=small,
                                block_kv_dq=small)
  return padded, sizes


def _pad_time(x: jax.Array, extra: int) -> jax.Array:
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, extra)
  return jnp.pad(x, widths)


def pallas_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                     token_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
                     window=None, scale: float | None = None, softcap: float | None = None,
                     interpret: bool | None = None, sinks: jax.Array | None = None
                     ) -> jax.Array:
  """Causal grouped-query attention by the Pallas/Triton flash kernel (FlashAttention,
  Dao et al. 2022/2023), the result of `grouped_query_attention` on real tokens.

  Args:
    q: [B, T, N, D] queries; k, v: [B, T, K, D], N a multiple of K. T may be odd or
      any length: it is padded to the kernel's tile and sliced back.
    token_mask: [B, T] bool, real tokens (None: all). Padding may be anywhere (left,
      right, between segments).
    segment_ids: [B, T] int, packed rows: a query sees only keys of its id.
    window: a sliding window; only None or ≥ T (no effect) is accepted.
    scale: the scores' factor (None: 1/√D).
    softcap: must be None (the kernel cannot soft-cap).
    interpret: run the kernel in Pallas' interpret mode (None: off a GPU only).
      On a GPU, float32 products are Triton's default (TF32); in interpret mode
      they are the backend's.
    sinks: [N] attention-sink logits, one per query head (gpt-oss), or None.
  Returns:
    [B, T, N, D] in q's dtype, 0 on padding queries.
  """
  batch, time, heads, dim = q.shape
  check_options("pallas", time, softcap, window)
  group = heads // k.shape[2]
  valid = valid_tokens(token_mask, batch, time)
  segments = kernel_segments(valid, segment_ids)
  keep = valid[:, :, None, None]
  # Padding rows zeroed before (no garbage into the kernel) and after (no gradient).
  q, k, v = (jnp.where(keep, x, jnp.zeros((), x.dtype)) for x in (q, k, v))
  padded, sizes = padded_length(time)
  extra = padded - time
  k = jnp.repeat(k, group, axis=2) if group > 1 else k
  v = jnp.repeat(v, group, axis=2) if group > 1 else v
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  options = (1.0 / math.sqrt(dim) if scale is None else float(scale), sizes, bool(interpret))
  padded_inputs = (_pad_time(q, extra), _pad_time(k, extra), _pad_time(v, extra),
                   _pad_time(segments, extra))
  if sinks is None:
    out = pallas_mha.mha(*padded_inputs, sm_scale=options[0], causal=True,
                         block_sizes=sizes, interpret=options[2])
  else:
    out = _mha_with_sinks(options, *padded_inputs, sinks)
  return jnp.where(keep, out[:, :time], jnp.zeros((), out.dtype))


def _mha_sink_forward(options, q, k, v, segments, sinks):
  scale, sizes, interpret = options
  out, lse = pallas_mha.mha(q, k, v, segments, sm_scale=scale, causal=True,
                            block_sizes=sizes, interpret=interpret, return_residuals=True)
  # The kernel's log-sum-exp is base 2 ([B, N, T]); w = σ(λ − z) per (row, head).
  weight = jax.nn.sigmoid(lse * math.log(2.0) - sinks.astype(jnp.float32)[None, :, None])
  weight = weight.transpose(0, 2, 1)[..., None]  # [B, T, N, 1]
  sunk = (out.astype(jnp.float32) * weight).astype(out.dtype)
  return sunk, (q, k, v, segments, sunk, lse, weight, sinks)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mha_with_sinks(options, q, k, v, segments, sinks):
  """The Pallas kernel's causal attention with a sink logit per head [N] (module
  docstring); options = (scale, block sizes, interpret)."""
  return _mha_sink_forward(options, q, k, v, segments, sinks)[0]


def _mha_sink_backward(options, residuals, d_out):
  scale, sizes, interpret = options
  q, k, v, segments, sunk, lse, weight, sinks = residuals
  d_kernel_out = (d_out.astype(jnp.float32) * weight).astype(d_out.dtype)
  # pylint: disable-next=protected-access  (the kernel's own backward, given O_sink)
  d_q, d_k, d_v, _ = pallas_mha._mha_backward(
      scale, True, sizes, "triton", None, 2, None, interpret, False, False,
      (q, k, v, segments, sunk, lse), d_kernel_out)
  row = jnp.sum(d_out.astype(jnp.float32) * sunk.astype(jnp.float32), axis=-1)  # [B, T, N]
  d_sinks = -jnp.sum((1.0 - weight[..., 0]) * row, axis=(0, 1)).astype(sinks.dtype)
  return d_q, d_k, d_v, None, d_sinks


_mha_with_sinks.defvjp(_mha_sink_forward, _mha_sink_backward)
