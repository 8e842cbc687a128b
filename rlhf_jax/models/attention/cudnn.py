"""Fused (flash) attention for training and scoring forwards: cuDNN's kernel.

cuDNN's fused flash attention (FlashAttention, Dao et al. 2022; FlashAttention-2,
Dao 2023, as NVIDIA builds it) through JAX's lower-level
`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`, which takes the
packed ("THD") description the public `jax.nn.dot_product_attention` does not
expose yet: per batch entry the start offset and length of each of at most M
segments (github.com/jax-ml/jax/pull/25812 and pull/29731). One form serves every
layout the decoder has:

- no padding and no segments: plain causal (no lengths, the cheapest call);
- padded rows (left, right or both): one segment per row, the run of its real
  tokens (M = 2, the packed form needs M > 1);
- packed buffers (`packing.PackedRows.segments`): one segment per run of equal
  segment ids, causal inside it by index (M = `MAX_SEGMENTS`).

A query outside every segment (padding) gets an undefined row from cuDNN: q, k, v
are zeroed there before the call and the output after. A segment's real tokens
must be contiguous (they are in `packing` and in [left pad | prompt | response |
right pad] rows); the Pallas kernel has no such condition. A row the description
cannot hold (more than M runs, or a segment split by padding) gets NaN outputs,
loudly, rather than attention under another mask (`describable`).

cuDNN takes bf16/fp16, even T, head_dim ≤ 256 (Hopper; 128 before) and a multiple
of 8, and the packed form needs Hopper: `refusal` says which condition fails, and
`choice.training_attention` uses it so "auto" never asks for what cuDNN cannot do.
"""

from __future__ import annotations

import jax
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
import jax.numpy as jnp

from rlhf_jax.models.attention.pallas_flash import check_options
from rlhf_jax.models.attention.pallas_flash import kernel_segments
from rlhf_jax.models.attention.pallas_flash import valid_tokens
from rlhf_jax.models.packing import MAX_ROWS_PER_BUFFER

# Segments per packed buffer the cuDNN call describes (a static bound: its softmax
# statistics are [B·M, N, T] float32); packing puts no more rows in a buffer.
MAX_SEGMENTS = MAX_ROWS_PER_BUFFER


def refusal(dtype, head_dim: int, time: int, softcap: float | None = None,
            window=None, sinks: bool = False) -> str | None:
  """Why cuDNN flash attention cannot take this attention, as one line, or None when
  it can: dtype not bf16/fp16, odd length `time`, `head_dim` > 256 or not a multiple
  of 8, soft-capping, a sliding window narrower than `time`, or attention `sinks`
  (gpt-oss: JAX's cuDNN call has no sink logits)."""
  if sinks:
    return "cuDNN flash attention has no attention sinks (gpt-oss)"
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return f"cuDNN flash attention needs bfloat16 or float16, got {jnp.dtype(dtype).name}"
  if time % 2:
    return f"cuDNN flash attention needs an even sequence length, got {time}"
  if head_dim > 256 or head_dim % 8:
    return f"cuDNN flash attention needs head_dim <= 256 and a multiple of 8, got {head_dim}"
  try:
    check_options("cudnn", time, softcap, window)
  except ValueError as error:
    return str(error)
  return None


def packed_description(valid: jax.Array, segment_ids: jax.Array | None, max_segments: int
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """cuDNN's packed description of a layout: each run of real tokens with one segment
  id is a segment.

  Args:
    valid: [B, T] bool, real tokens.
    segment_ids: [B, T] int or None (one segment per row).
    max_segments: M, the static bound on segments per row.
  Returns:
    offsets [B, M + 1] int32 (each segment's first index, −1 after the last and in
    column M, as `fused_attention_stablehlo.dot_product_attention` documents),
    lengths [B, M] int32 (tokens per segment, −1 for unused), and runs [B] int32,
    the segments each row has (> M: the description is truncated).
  """
  batch, time = valid.shape
  ids = kernel_segments(valid, segment_ids)
  before = jnp.pad(ids[:, :-1], ((0, 0), (1, 0)))
  starts = valid & (ids != before)
  run = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1
  runs = jnp.sum(starts, axis=1, dtype=jnp.int32)
  rows = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, time))
  slots = jnp.broadcast_to(jnp.arange(time, dtype=jnp.int32)[None, :], (batch, time))
  drop = max_segments + 1  # an out-of-range column: the write is dropped
  offsets = jnp.full((batch, max_segments + 1), -1, jnp.int32).at[
      rows, jnp.where(starts & (run < max_segments), run, drop)].set(slots, mode="drop")
  lengths = jnp.zeros((batch, max_segments), jnp.int32).at[
      rows, jnp.where(valid & (run < max_segments), run, drop)].add(1, mode="drop")
  used = jnp.arange(max_segments)[None, :] < runs[:, None]
  return offsets, jnp.where(used, lengths, -1), runs


def describable(valid: jax.Array, segment_ids: jax.Array | None, runs: jax.Array,
                max_segments: int) -> jax.Array:
  """[B] bool, rows whose layout `packed_description` (with `runs` from it) describes
  exactly: at most M runs, and one run per segment id (a segment's real tokens
  contiguous; a gap would split it into two segments that cannot see each other)."""
  ordered = jnp.sort(kernel_segments(valid, segment_ids), axis=1)
  before = jnp.pad(ordered[:, :-1], ((0, 0), (1, 0)))
  distinct = jnp.sum((ordered != before) & (ordered > 0), axis=1, dtype=jnp.int32)
  return (runs == distinct) & (runs <= max_segments)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                    token_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
                    window=None, scale: float | None = None, softcap: float | None = None,
                    max_segments: int | None = None) -> jax.Array:
  """Causal grouped-query attention by cuDNN's fused flash kernel (FlashAttention, Dao
  et al. 2022/2023), the result of `grouped_query_attention` on real tokens.

  Args:
    q: [B, T, N, D] queries; k, v: [B, T, K, D] (cuDNN groups the heads itself, but
      the packed form gets K/V repeated to N heads: github.com/jax-ml/jax/pull/39521);
      bf16/fp16, T even, D ≤ 256 and a multiple of 8 (else a ValueError naming it).
    token_mask: [B, T] bool, real tokens (None: all); each row's real tokens of one
      segment contiguous.
    segment_ids: [B, T] int, packed rows.
    window: only None or ≥ T; softcap: only None.
    scale: the scores' factor (None: 1/√D).
    max_segments: M, segments per row described (None: 2 without segment_ids,
      MAX_SEGMENTS with); rows with more, or with a segment split by padding, get NaN.
  Returns:
    [B, T, N, D] in q's dtype, 0 on padding queries.
  """
  batch, time, _, dim = q.shape
  reason = refusal(q.dtype, dim, time, softcap, window)
  if reason is not None:
    raise ValueError(f"attention_impl='cudnn': {reason}.")
  scale = dim ** -0.5 if scale is None else float(scale)
  if token_mask is None and segment_ids is None:
    return cudnn_fa.dot_product_attention(q, k, v, scale=scale,
                                          mask_type=cudnn_fa.MaskType.CAUSAL)
  valid = valid_tokens(token_mask, batch, time)
  bound = (2 if segment_ids is None else MAX_SEGMENTS) if max_segments is None else max_segments
  bound = max(2, bound)  # the packed form needs M > 1
  offsets, lengths, runs = packed_description(valid, segment_ids, bound)
  keep = valid[:, :, None, None]
  q, k, v = (jnp.where(keep, x, jnp.zeros((), x.dtype)) for x in (q, k, v))
  # The packed form scales kv offsets by the query's heads (jax before pull/39521: silently
  # wrong keys under GQA), so K/V go in with N heads; autodiff sums the repeats back.
  group = q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(x, group, axis=2) for x in (k, v)) if group > 1 else (k, v)
  out = cudnn_fa.dot_product_attention(
      q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets, kv_offsets=offsets,
      scale=scale, mask_type=cudnn_fa.MaskType.PADDING_CAUSAL)
  out = jnp.where(keep, out, jnp.zeros((), out.dtype))
  # A layout the description cannot hold: NaN, loudly, not attention over other segments.
  exact = describable(valid, segment_ids, runs, bound)
  return jnp.where(exact[:, None, None, None], out, jnp.nan).astype(q.dtype)
