"""Ragged decode attention: one query per row over a KV cache, as a Pallas kernel.

For one decode step (T = 1 query per row, N query heads in K groups of G = N / K
sharing a KV head), row b attends to the slots s < lengths[b] its mask allows:

    o[b, n] = softmax_s(q[b, n]·keys[b, n // G, :, s] / √d + mask[b, s]) · values[b, n // G, s]

(with Gemma's options, the scale a in place of 1/√d and the scores soft-capped,
c·tanh(s/c), before the mask).

with mask[b, s] = 0 where `valid[b, s]` and s < lengths[b], else −∞. The cache
is read in its stored layout (`rlhf_jax.models.decoder.KVCache`: keys
[B, K, D, S] slots minor, values [B, K, S, D]) and a row reads only the blocks
of slots below its own length: the blocks beyond are never loaded, so a decode
step costs the sum over rows of the used slots, not rows × the longest row (the
XLA path of `cached_attention` reads max-over-rows slots for every row).

Split-K (FlashDecoding, Dao et al. 2023, "Flash-Decoding for long-context
inference"): program (b, h, j) of the grid [B, K, splits] runs the online
softmax of FlashAttention (Dao et al. 2022, arXiv:2205.14135; Milakov &
Gimelshein 2018) over its share of the row's slot blocks and writes an
unnormalised partial output o_j with its running max m_j and sum l_j; the
splits are merged with a log-sum-exp combine:

    m = max_j m_j,   o = Σ_j e^(m_j − m) o_j / Σ_j e^(m_j − m) l_j.

An attention sink (gpt-oss: a learned logit z per query head that joins the softmax's
denominator and attends to nothing) joins in the combine: m = max(max_j m_j, z) and
e^(z − m) is added to the denominator.

Scores, softmax and the accumulators are float32 whatever the cache dtype.
On a GPU the kernel lowers through Pallas' Triton backend; elsewhere it runs in
Pallas interpret mode (correct, slow: for tests). Written after the idioms of
`jax.experimental.pallas.ops.gpu.decode_attention`.
"""

from __future__ import annotations

import functools
import math

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
import jax.numpy as jnp

# A finite "minus infinity": e^(NEG − m) underflows to 0 without inf − inf = NaN.
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)
# Enough programs to keep every SM of a current GPU streaming (H100: 132 SMs).
_TARGET_PROGRAMS = 512


def _slot_block(slots: int, block_size: int) -> int:
  """The largest power of two ≤ `block_size` that divides `slots` (blocks tile S exactly,
  so no load runs past a row's end)."""
  block = 1
  while block * 2 <= block_size and slots % (block * 2) == 0:
    block *= 2
  return block


def _kernel(length_ref, q_ref, k_ref, v_ref, valid_ref, o_ref, m_ref, l_ref, *,
            block: int, blocks_per_split: int, scale: float, softcap: float | None,
            precision):
  """One (row, KV head, split): online softmax over its blocks below the row's length.

  Refs: length [] int32; q [G', D]; keys [D, S]; values [S, D]; valid [S] int8;
  outputs o [G', D], m [G'], l [G'] float32 (G' = G padded to a power of two).
  """
  length = length_ref[()]
  first = pl.program_id(2) * blocks_per_split
  stop = jnp.minimum(first + blocks_per_split, pl.cdiv(length, block))
  q = q_ref[...]
  heads, dim = q.shape

  def body(index, carry):
    o, m, l = carry
    start = pl.multiple_of(index * block, block)
    k = k_ref[:, pl.ds(start, block)]  # [D, block], loaded only for blocks below length
    scores = jnp.dot(q, k, preferred_element_type=jnp.float32, precision=precision) * scale
    if softcap is not None:  # Gemma 2: c·tanh(s / c)
      scores = jnp.tanh(scores / softcap) * softcap
    slot = start + lax.broadcasted_iota(jnp.int32, (1, block), 1)
    allowed = (valid_ref[pl.ds(start, block)][None, :] != 0) & (slot < length)
    scores = jnp.where(allowed, scores, _NEG)
    m_next = jnp.maximum(m, jnp.max(scores, axis=1))
    probs = jnp.where(allowed, jnp.exp(scores - m_next[:, None]), 0.0)
    correction = jnp.exp(m - m_next)
    v = v_ref[pl.ds(start, block), :]  # [block, D]
    update = jnp.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32,
                     precision=precision)
    return (correction[:, None] * o + update, m_next,
            correction * l + jnp.sum(probs, axis=1))

  init = (jnp.zeros((heads, dim), jnp.float32), jnp.full((heads,), _NEG, jnp.float32),
          jnp.zeros((heads,), jnp.float32))
  o, m, l = lax.fori_loop(first, stop, body, init)
  o_ref[...] = o
  m_ref[...] = m
  l_ref[...] = l


def _combine(o: jax.Array, m: jax.Array, l: jax.Array, sinks: jax.Array | None = None
             ) -> jax.Array:
  """Log-sum-exp merge of split partials: o [B, K, J, G', D], m, l [B, K, J, G'] →
  [B, K, G', D] float32, Σ_j e^(m_j − m) o_j / Σ_j e^(m_j − m) l_j (0 for a row with
  no allowed slot); with `sinks` [K, G'] float32, + e^(z − m) in the denominator and z
  in the max."""
  m_all = jnp.max(m, axis=2)
  if sinks is not None:
    m_all = jnp.maximum(m_all, sinks[None])
  # As in jax's decode_attention: keeps the GPU compiler from fusing the max into a NaN.
  m_all = lax.optimization_barrier(m_all)
  weight = jnp.exp(m - m_all[:, :, None])
  total = jnp.sum(weight * l, axis=2)
  if sinks is not None:
    total = total + jnp.exp(sinks[None] - m_all)
  out = jnp.sum(weight[..., None] * o, axis=2)
  return jnp.where(total[..., None] > 0, out / jnp.maximum(total, 1e-30)[..., None], 0.0)


def lengths_from_mask(valid: jax.Array) -> jax.Array:
  """[B, S] bool → [B] int32: one past each row's last allowed slot (0 for an empty row)."""
  slots = jnp.arange(1, valid.shape[1] + 1, dtype=jnp.int32)
  return jnp.max(jnp.where(valid, slots[None, :], 0), axis=1)


def decode_attention(q: jax.Array, keys: jax.Array, values: jax.Array, valid: jax.Array,
                     lengths: jax.Array | None = None, *, block_size: int = 128,
                     num_splits: int | None = None, interpret: bool | None = None,
                     scale: float | None = None, softcap: float | None = None,
                     sinks: jax.Array | None = None) -> jax.Array:
  """softmax(cap(a·q·Kᵀ) + mask)·V for one decode step, each row reading only its used
  slots (a = 1/√d unless `scale`; cap(s) = c·tanh(s/c) with `softcap` c, else s).

  Row b attends to slot s iff `valid[b, s]` and s < lengths[b]; slot blocks at or
  beyond lengths[b] are not loaded (see the module docstring for the formula and
  the FlashDecoding split-K combine).

  Args:
    q: [B, N, D] the step's queries (one token per row), N a multiple of K.
    keys: [B, K, D, S] cached keys (slots minor), as `KVCache.keys[layer]`.
    values: [B, K, S, D] cached values, as `KVCache.values[layer]`.
    valid: [B, S] bool, slots a row may attend to (e.g. left padding is False).
    lengths: [B] int, slots in use per row (≤ S). None: one past each row's last
      valid slot (`lengths_from_mask`).
    block_size: most slots per loaded block; the block is the largest power of
      two ≤ this that divides S. On GPU (Triton) S must be a multiple of 16 and D
      a power of two ≥ 16.
    num_splits: slot-axis splits per (row, KV head) (split-K). None: enough that
      B·K·splits ≈ 512 programs, at most one per block.
    interpret: run in Pallas interpret mode; None: True unless the default
      backend is a GPU.
    scale: the factor a of the scores (None: 1/√D; Gemma: query_pre_attn_scalar^−½).
    softcap: Gemma 2's attention soft-capping c (None: uncapped).
    sinks: [N] attention-sink logits, one per query head (gpt-oss), or None.
  Returns:
    [B, N, D] in values' dtype (a row with no allowed slot gets zeros).
  """
  batch, heads, dim = q.shape
  num_kv_heads, slots = keys.shape[1], keys.shape[3]
  if heads % num_kv_heads or keys.shape != (batch, num_kv_heads, dim, slots) or (
      values.shape != (batch, num_kv_heads, slots, dim)) or valid.shape != (batch, slots):
    raise ValueError(f"decode_attention: q {q.shape}, keys {keys.shape}, values "
                     f"{values.shape}, valid {valid.shape} do not match [B, N, D], "
                     "[B, K, D, S], [B, K, S, D], [B, S].")
  interpret = jax.default_backend() != "gpu" if interpret is None else interpret
  block = _slot_block(slots, block_size)
  if not interpret and (block < 16 or dim < 16 or dim & (dim - 1)):
    raise ValueError(f"decode_attention: on GPU (Triton tiles) S={slots} needs a multiple "
                     f"of 16 and D={dim} a power of two ≥ 16.")
  num_blocks = slots // block
  if num_splits is None:
    num_splits = pl.cdiv(_TARGET_PROGRAMS, batch * num_kv_heads)
  num_splits = max(1, min(num_splits, num_blocks))
  blocks_per_split = pl.cdiv(num_blocks, num_splits)
  num_splits = pl.cdiv(num_blocks, blocks_per_split)  # no split left without blocks
  lengths = lengths_from_mask(valid) if lengths is None else lengths
  out = _call(q, keys, values, valid.astype(jnp.int8),
              jnp.clip(lengths.astype(jnp.int32), 0, slots), block=block,
              blocks_per_split=blocks_per_split, num_splits=num_splits,
              interpret=bool(interpret), scale=1.0 / math.sqrt(dim) if scale is None else scale,
              softcap=softcap, sinks=sinks)
  return out.reshape(batch, heads, dim).astype(values.dtype)


def _call(q, keys, values, valid, lengths, *, block, blocks_per_split, num_splits,
          interpret, scale, softcap, sinks=None):
  """Groups and pads the query heads, runs the kernel over [B, K, splits], combines.
  Returns [B, K, G, D] float32."""
  batch, heads, dim = q.shape
  num_kv_heads, slots = keys.shape[1], keys.shape[3]
  group = heads // num_kv_heads
  # Triton tiles are powers of two and its dot wants ≥ 16 rows; the pad rows are zeros.
  padded = max(pl.next_power_of_2(group), 1 if interpret else 16)
  q = q.reshape(batch, num_kv_heads, group, dim)
  q = jnp.pad(q, ((0, 0), (0, 0), (0, padded - group), (0, 0)))
  float32 = values.dtype == jnp.float32
  kernel = functools.partial(
      _kernel, block=block, blocks_per_split=blocks_per_split, scale=scale, softcap=softcap,
      precision=lax.Precision.HIGHEST if float32 else None)
  squeeze = pl.squeezed
  partial_shape = (batch, num_kv_heads, num_splits, padded)
  o, m, l = pl.pallas_call(
      kernel,
      grid=(batch, num_kv_heads, num_splits),
      in_specs=[
          pl.BlockSpec((squeeze,), lambda b, h, j: (b,)),
          pl.BlockSpec((squeeze, squeeze, padded, dim), lambda b, h, j: (b, h, 0, 0)),
          pl.BlockSpec((squeeze, squeeze, dim, slots), lambda b, h, j: (b, h, 0, 0)),
          pl.BlockSpec((squeeze, squeeze, slots, dim), lambda b, h, j: (b, h, 0, 0)),
          pl.BlockSpec((squeeze, slots), lambda b, h, j: (b, 0)),
      ],
      out_specs=[
          pl.BlockSpec((squeeze, squeeze, squeeze, padded, dim),
                       lambda b, h, j: (b, h, j, 0, 0)),
          pl.BlockSpec((squeeze, squeeze, squeeze, padded), lambda b, h, j: (b, h, j, 0)),
          pl.BlockSpec((squeeze, squeeze, squeeze, padded), lambda b, h, j: (b, h, j, 0)),
      ],
      out_shape=[jax.ShapeDtypeStruct(partial_shape + (dim,), jnp.float32),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
      # Triton CompilerParams select the Triton lowering (not Mosaic GPU) on a GPU.
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name="ragged_decode_attention",
  )(lengths, q, keys, values, valid)
  if sinks is not None:  # [N] → [K, G'] (the pad rows' sinks are dropped with them)
    sinks = jnp.pad(sinks.astype(jnp.float32).reshape(num_kv_heads, group),
                    ((0, 0), (0, padded - group)))
  return _combine(o, m, l, sinks)[:, :, :group]
