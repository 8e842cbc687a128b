"""Attention over a KV cache as stored: the generation path (prefill and decode steps).

A decode step's scores are a multiply-add along the slot axis (see `cached_attention`);
a one-query step can instead run the ragged Pallas kernel (`decode_attention`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention.pallas_decode import decode_attention
from rlhf_jax.models.attention.xla import _group_queries
from rlhf_jax.models.attention.xla import _ungroup_queries
from rlhf_jax.models.attention.xla import grouped_sinks
from rlhf_jax.models.attention.xla import soft_cap
from rlhf_jax.models.attention.xla import softmax_with_sink


def cached_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
                     num_used: jax.Array | None = None, *,
                     precision: jax.lax.Precision | None = None, kernel: str = "xla",
                     scale: float | None = None, softcap: float | None = None,
                     sinks: jax.Array | None = None) -> jax.Array:
  """softmax(cap(a·Q·Kᵀ) + mask)·V reading a KV cache as stored (the generation path).

  No hand-written backward, and K/V are never transposed or repeated. For a
  decode step (a few queries per KV head) the scores are a multiply-add along
  the slot axis, which XLA:CPU vectorises (as a batch of [G, D]×[D, S] GEMMs
  they ran 2.8× slower), and only the first `num_used` slots, rounded up to a
  block, are read: a decode step early in a long cache does not pay for the
  empty rest (one static slice per block count, chosen with `lax.switch`). On a GPU
  (`kernel_choice.decode_span_switch`) every slot is read instead: a conditional there
  is a host synchronisation per layer and step.

  Args:
    q: [B, T, N, D] queries.
    keys: [B, K, D, S] cached keys (slots minor), N a multiple of K.
    values: [B, K, S, D] cached values.
    mask: [B, T, S] bool (every row allows at least one key; no key at or
      beyond `num_used` may be allowed).
    num_used: int scalar, slots in use by any row (None: all S).
    precision: `jax.lax.Precision` of the prefill einsums (None: the backend
      default). The decode path has no matmul: its products are elementwise
      float32, exact at any precision.
    kernel: "xla" (below) or "pallas": a one-query step (T = 1) runs the ragged Pallas
      kernel (`decode_attention`): each row reads only up to its last allowed slot.
    scale: a (None: 1/√D); softcap: c (None: uncapped); sinks: [N] attention-sink
      logits (gpt-oss) or None, as `grouped_query_attention`.
  Returns:
    [B, T, N, D] in values' dtype.
  """
  if kernel not in ("xla", "pallas"):
    raise ValueError(f"cached_attention: kernel={kernel!r}; allowed: 'xla', 'pallas'.")
  if kernel == "pallas" and q.shape[1] == 1:
    return decode_attention(q[:, 0], keys, values, mask[:, 0], scale=scale,
                            softcap=softcap, sinks=sinks)[:, None]
  batch, time, heads, dim = q.shape
  num_kv_heads, slots = keys.shape[1], keys.shape[3]
  scale = 1.0 / math.sqrt(dim) if scale is None else scale
  q_grouped = _group_queries(q * jnp.asarray(scale, q.dtype), num_kv_heads)
  decode = q_grouped.shape[2] <= _FEW_QUERIES
  row_sinks = None if sinks is None else grouped_sinks(sinks, num_kv_heads, time)[None]

  def attend(length):
    k, v, m = keys[..., :length], values[:, :, :length], mask[..., :length]
    if decode:
      scores = jnp.sum(q_grouped[..., :, None].astype(jnp.float32)
                       * k[:, :, None].astype(jnp.float32), axis=3)
    else:
      scores = jnp.einsum("bkqd,bkds->bkqs", q_grouped, k, preferred_element_type=jnp.float32,
                          precision=precision)
    scores = soft_cap(scores, softcap)
    allowed = jnp.tile(m[:, None], (1, 1, heads // num_kv_heads, 1))  # [B, 1, G·T, S]
    probs = softmax_with_sink(scores, allowed, row_sinks)[0].astype(v.dtype)
    if decode:  # a reduction reads the slice in place; a dot would copy it first
      out = jnp.sum(probs[..., None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32),
                    axis=3).astype(v.dtype)
    else:
      out = jnp.einsum("bkqs,bksd->bkqd", probs, v, precision=precision)
    return _ungroup_queries(out, time)

  lengths = _block_lengths(slots)
  if (num_used is None or not decode or len(lengths) == 1
      or not kernel_choice.decode_span_switch()):
    return attend(slots)
  block = lengths[0]
  index = jnp.clip((num_used + block - 1) // block - 1, 0, len(lengths) - 1)
  return jax.lax.switch(index, [lambda length=length: attend(length) for length in lengths])


# Up to this many queries per KV head, decode-style scores (see cached_attention).
_FEW_QUERIES = 8


def _block_lengths(slots: int, max_branches: int = 8, granule: int = 64) -> list[int]:
  """Slot counts a decode step may read: multiples of a block (≥ `granule`, at
  most `max_branches` of them), the last one `slots`."""
  block = granule * max(1, math.ceil(slots / (max_branches * granule)))
  return [min(slots, block * i) for i in range(1, math.ceil(slots / block) + 1)]
