"""Grouped-query attention with a hand-written backward.

    S = (Q/√d)·Kᵀ (masked),  P = softmax(S),  O = P·V
    backward:  dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − rowsum(dO ∘ O)),
               dQ = dS·K/√d,  dK = dSᵀ·Q/√d

With a scale a in place of 1/√d (Gemma's query_pre_attn_scalar), a replaces it
throughout. With attention sinks (gpt-oss: a learned logit z_h per query head that joins
each row's softmax denominator and attends to nothing), P = e^S / (Σ e^S + e^z): the
rows no longer sum to one, dS keeps its form (the sink's value is 0, so it adds nothing
to dP or to rowsum(dO∘O)), and dz_h = −Σ_rows p_sink · rowsum(dO∘O) over the head's rows,
p_sink = e^z / (Σ e^S + e^z). With soft-capping (Gemma 2), S = c·tanh(R/c) of the raw scores
R = a·Q·Kᵀ, and dR = dS ∘ (1 − tanh²(R/c)); the backward recomputes R (one more
GEMM) rather than keep a second [B, heads, T, S] array from the forward.

The backward uses rowsum(dO∘O) = rowsum(dP∘P) (as FlashAttention does), so it
makes fewer passes over the [B, heads, T, S] arrays than autodiff of softmax.
Query heads of one KV group are stacked into a [B, K, G·T, D] batch, so every
product is one batched GEMM and K/V are never repeated. On the W2 PPO step
(CPU) this was 0.3-0.5 s per step faster than `jax.nn.dot_product_attention`
under autodiff. Scores and softmax are float32 whatever the compute dtype.

Every product takes a `precision` (a `jax.lax.Precision` or None for the
backend default; the decoder passes `DecoderConfig.precision`), applied to the
forward and to each GEMM of the hand-written backward alike.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention.cudnn import cudnn_attention
from rlhf_jax.models.attention.pallas_flash import pallas_attention


def _group_queries(x: jax.Array, num_kv_heads: int) -> jax.Array:
  """[B, T, N, D] → [B, K, G·T, D], G = N / K query heads per KV head."""
  batch, time, heads, dim = x.shape
  group = heads // num_kv_heads
  x = x.reshape(batch, time, num_kv_heads, group, dim).transpose(0, 2, 3, 1, 4)
  return x.reshape(batch, num_kv_heads, group * time, dim)


def _ungroup_queries(x: jax.Array, time: int) -> jax.Array:
  """[B, K, G·T, D] → [B, T, N, D]."""
  batch, num_kv_heads, group_time, dim = x.shape
  group = group_time // time
  x = x.reshape(batch, num_kv_heads, group, time, dim).transpose(0, 3, 1, 2, 4)
  return x.reshape(batch, time, num_kv_heads * group, dim)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
  """cap·tanh(x / cap) (Gemma 2's logit soft-capping), in x's dtype; x when cap is None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


def grouped_sinks(sinks: jax.Array, num_kv_heads: int, time: int) -> jax.Array:
  """Per-query-head sink logits [N] → [K, G·T] float32, the rows of `_group_queries`."""
  group = sinks.shape[0] // num_kv_heads
  return jnp.repeat(sinks.astype(jnp.float32).reshape(num_kv_heads, group), time, axis=1)


def softmax_with_sink(scores: jax.Array, allowed: jax.Array, sinks: jax.Array | None
                      ) -> tuple[jax.Array, jax.Array | None]:
  """softmax over the last axis of float32 `scores` where `allowed`, with a sink logit per
  row (`sinks` broadcast to scores[..., 0], or None: a plain softmax) joining the
  denominator only: (probs, the sink's share of each row or None)."""
  masked = jnp.where(allowed, scores, -1e30)
  if sinks is None:
    return jax.nn.softmax(masked, axis=-1), None
  top = jnp.maximum(jnp.max(masked, axis=-1), sinks)
  exp = jnp.exp(masked - top[..., None])
  sink = jnp.exp(sinks - top)
  total = jnp.sum(exp, axis=-1) + sink
  return exp / total[..., None], sink / total


def _forward(precision, scale, softcap, q, k, v, mask, sinks=None):
  batch, time, heads, dim = q.shape
  num_kv_heads = k.shape[2]
  scale = 1.0 / math.sqrt(dim) if scale is None else scale
  q_grouped = _group_queries(q * jnp.asarray(scale, q.dtype), num_kv_heads)
  k_heads = k.transpose(0, 2, 1, 3)  # [B, K, S, D]
  v_heads = v.transpose(0, 2, 1, 3)
  scores = soft_cap(jnp.einsum("bkqd,bksd->bkqs", q_grouped, k_heads,
                               preferred_element_type=jnp.float32, precision=precision),
                    softcap)
  allowed = jnp.tile(mask[:, None], (1, 1, heads // num_kv_heads, 1))  # [B, 1, G·T, S]
  row_sinks = None if sinks is None else grouped_sinks(sinks, num_kv_heads, time)[None]
  probs, sink_share = softmax_with_sink(scores, allowed, row_sinks)
  probs = probs.astype(v.dtype)
  out = jnp.einsum("bkqs,bksd->bkqd", probs, v_heads, precision=precision)
  residuals = (q_grouped, k_heads, v_heads, probs, out, scale, sink_share, sinks)
  return _ungroup_queries(out, time), residuals


def grouped_query_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
                            precision: jax.lax.Precision | None = None,
                            scale: float | None = None, softcap: float | None = None,
                            impl: str = "xla", token_mask: jax.Array | None = None,
                            segment_ids: jax.Array | None = None, window: int | None = None,
                            sinks: jax.Array | None = None) -> jax.Array:
  """softmax(cap(a·Q·Kᵀ) + mask)·V with K/V shared by groups of query heads.

  Args:
    q: [B, T, N, D] queries.
    k: [B, S, K, D] keys, N a multiple of K.
    v: [B, S, K, D] values.
    mask: [B, T, S] bool, True where query t may attend to key s. Every row
      must allow at least one key (the decoder always allows a query itself).
    precision: `jax.lax.Precision` of every product, forward and backward
      (None: the backend default).
    scale: a, the factor of the scores (None: 1/√D).
    softcap: c, scores become c·tanh(s/c) before the mask (None: uncapped).
    impl: the kernel: "xla" (this module), a fused flash kernel ("cudnn":
      `cudnn.cudnn_attention`; "pallas": `pallas_flash.pallas_attention`; FlashAttention,
      Dao et al. 2022/2023), or "auto" (`kernel_choice.training_attention` decides from
      the backend, dtype, head size, length, softcap and window). The fused kernels
      take the layout (token_mask, segment_ids, window), never the dense mask, give 0
      on padding queries, and refuse (ValueError) what they cannot compute.
    token_mask: [B, S] bool, the keys that are real tokens (None: all); with
      `segment_ids` and `window` the layout `mask` was built from (causal within a
      segment), for the fused kernels, which never see the dense mask.
    segment_ids: [B, S] int, packed rows (None: one row per batch entry).
    window: sliding-window width (None: full causal attention).
    sinks: [N] attention-sink logits, one per query head (gpt-oss), or None. The
      "pallas" kernel takes them; cuDNN's cannot and refuses.
  Returns:
    [B, T, N, D] in v's dtype.
  """
  if impl == "auto":
    impl = kernel_choice.training_attention(impl, dtype=q.dtype, head_dim=q.shape[-1],
                                            time=q.shape[1], softcap=softcap, window=window,
                                            sinks=sinks is not None)
  layout = dict(token_mask=token_mask, segment_ids=segment_ids, window=window, scale=scale,
                softcap=softcap)
  if impl == "xla":
    return _attention(precision, scale, softcap, q, k, v, mask, sinks)
  if impl == "pallas":
    return pallas_attention(q, k, v, sinks=sinks, **layout).astype(v.dtype)
  if impl == "cudnn":
    if sinks is not None:
      raise ValueError("attention_impl='cudnn' cannot compute attention sinks (gpt-oss); "
                       "use attention_impl='pallas' or 'xla'.")
    return cudnn_attention(q, k, v, **layout).astype(v.dtype)
  raise ValueError(f"attention_impl={impl!r}; allowed: 'auto', 'xla', 'cudnn', 'pallas'.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(precision, scale, softcap, q, k, v, mask, sinks):
  return _forward(precision, scale, softcap, q, k, v, mask, sinks)[0]


def _backward(precision, _, softcap, residuals, d_out):
  q_grouped, k_heads, v_heads, probs, out, scale, sink_share, sinks = residuals
  time = d_out.shape[1]
  d_out_grouped = _group_queries(d_out, k_heads.shape[1])
  d_v = jnp.einsum("bkqs,bkqd->bksd", probs, d_out_grouped, precision=precision)
  d_probs = jnp.einsum("bkqd,bksd->bkqs", d_out_grouped, v_heads,
                       preferred_element_type=jnp.float32, precision=precision)
  row_term = jnp.sum(d_out_grouped.astype(jnp.float32) * out.astype(jnp.float32), axis=-1,
                     keepdims=True)
  d_scores = probs.astype(jnp.float32) * (d_probs - row_term)
  d_sinks = None
  if sink_share is not None:  # [B, K, G·T] → per query head [K·G]
    num_kv_heads = k_heads.shape[1]
    d_rows = -jnp.sum(sink_share * row_term[..., 0], axis=0)
    d_sinks = d_rows.reshape(num_kv_heads, -1, time).sum(axis=-1).reshape(-1).astype(
        sinks.dtype)
  if softcap is not None:  # through c·tanh(r/c): the raw scores recomputed
    raw = jnp.einsum("bkqd,bksd->bkqs", q_grouped, k_heads,
                     preferred_element_type=jnp.float32, precision=precision)
    d_scores = d_scores * (1.0 - jnp.square(jnp.tanh(raw / softcap)))
  d_scores = d_scores.astype(q_grouped.dtype)
  d_q = (jnp.einsum("bkqs,bksd->bkqd", d_scores, k_heads, precision=precision)
         * jnp.asarray(scale, q_grouped.dtype))
  # q_grouped already carries 1/√d.
  d_k = jnp.einsum("bkqs,bkqd->bksd", d_scores, q_grouped, precision=precision)
  return (_ungroup_queries(d_q, time), d_k.transpose(0, 2, 1, 3), d_v.transpose(0, 2, 1, 3),
          None, d_sinks)


_attention.defvjp(_forward, _backward)
