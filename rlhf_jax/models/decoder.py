"""A Flax NNX decoder-only LM for the HF families of `config.ARCHITECTURES`, with a KV cache.

RMSNorm, RoPE (optionally Llama 3 scaled), grouped-query attention, SwiGLU MLP,
optional q/k/v bias, optional q/k RMSNorm (`DecoderConfig.qk_norm`), pre- or
post-norm blocks (`DecoderConfig.norm_placement`), tied or untied embeddings, and
one of two heads: the LM head (logits) or a scalar head (critic values /
reward-model scores at every position). Every parameter carries `logical_axes`
metadata (e.g. ("embed", "mlp")); `rlhf_jax.parallel` maps those names onto mesh
axes, so changing the parallelism never touches this file. With
`DecoderConfig.scan_layers` the layers are one block with stacked [L, ...]
parameters run by `lax.scan` (`rlhf_jax.models.layer_scan`).

Attention works on "slots": without a cache slot t is position t of the
batch; with a cache, a row's tokens are written at slots end, end+1, ... and a
query attends to filled slots at or before its own. Positions (for RoPE) are
explicit, so left- and right-padded batches both work: padding tokens are
masked out as keys and get positions that never matter.
"""

from __future__ import annotations

from typing import Literal

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp

from rlhf_jax.models.attention import cached_attention
from rlhf_jax.models.attention import grouped_query_attention
from rlhf_jax.models.config import DecoderConfig
from rlhf_jax.models.layer_scan import scan_blocks
from rlhf_jax.models.layer_scan import stack_blocks
from rlhf_jax.models.layer_scan import write_cache
from rlhf_jax.models.layer_scan import write_rows
from rlhf_jax.models.rope import apply_rope
from rlhf_jax.models.rope import rope_tables

HeadKind = Literal["lm", "scalar"]
INIT_STD = 0.02  # HF initializer_range for Qwen2 / Llama.


def _param(rngs: nnx.Rngs | None, shape, axes, config: DecoderConfig, init: str = "normal"):
  dtype = config.jnp_param_dtype
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = (INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=axes)


# ----------------------------------------------------------------------------- cache


@flax.struct.dataclass
class KVCache:
  """A fixed-size key/value cache for B rows and S slots.

  Attributes:
    keys: one [B, num_kv_heads, head_dim, S] array per layer (transposed);
      with `DecoderConfig.scan_layers` one [L, B, num_kv_heads, head_dim, S]
      array (`stacked`).
    values: one [B, num_kv_heads, S, head_dim] array per layer; stacked, one
      [L, B, num_kv_heads, S, head_dim] array.
      Head-major, so a decode step reads the cache as stored (a [B, S, K, D]
      layout cost a transposed copy of the whole cache per layer per step), and
      keys with slots minor, so the decode scores q·k are a vectorised
      multiply-add along S instead of a batch of tiny GEMVs (2.8× faster score
      computation on CPU; see `cached_attention`).
    valid: [B, S] bool, slot holds a real (non-padding) token.
    end: [B] int32, the next slot to write in each row.
    length: [B] int32, real tokens seen so far (the next token's position).
  """
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  valid: jax.Array
  end: jax.Array
  length: jax.Array

  @classmethod
  def create(cls, config: DecoderConfig, batch: int, slots: int,
             dtype=None) -> "KVCache":
    """An empty cache; `dtype` defaults to the compute dtype."""
    dtype = config.jnp_dtype if dtype is None else dtype
    heads, dim = config.num_kv_heads, config.head_dim
    # Distinct buffers for keys and values, so a donated cache can be updated in place.
    zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
    if config.scan_layers:
      zeros = lambda shape: jnp.zeros((config.num_layers,) + shape, dtype)
    return cls(keys=zeros((batch, heads, dim, slots)), values=zeros((batch, heads, slots, dim)),
               valid=jnp.zeros((batch, slots), bool),
               end=jnp.zeros((batch,), jnp.int32), length=jnp.zeros((batch,), jnp.int32))

  @property
  def slots(self) -> int:
    """S, the number of cache positions per row."""
    return self.valid.shape[1]

  @property
  def stacked(self) -> bool:
    """keys / values are single [L, B, ...] arrays (`DecoderConfig.scan_layers`), so
    their batch axis is 1, not 0."""
    return not isinstance(self.keys, (tuple, list))


# ----------------------------------------------------------------------------- modules


def _dense(x: jax.Array, kernel: jax.Array, precision: jax.lax.Precision | None) -> jax.Array:
  """[..., K] @ [K, N] as one 2-D GEMM over the flattened leading axes, at `precision`
  (`DecoderConfig.precision`; None: the backend default).

  Every projection goes through here: with plain 2-D GEMMs XLA:CPU picks
  transpose-free layouts for the backward, while 3-D einsums ([B,T,E] x [E,H,D])
  made it write the SiLU backward and other activations in transposed copies
  (W2 PPO step: 6.8-8.2 s -> 4.7-5.3 s per step, benchmarks/train_step.py).
  """
  leading = x.shape[:-1]
  out = jnp.matmul(x.reshape(-1, x.shape[-1]), kernel, precision=precision)
  return out.reshape(*leading, kernel.shape[-1])


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x²) + eps) · w over x's trailing axes of w's shape, computed in
  float32 (Zhang & Sennrich 2019). Default w: [hidden_size]; a q/k norm passes its own
  shape ([head_dim], or [heads, head_dim] to normalise a whole projection)."""

  def __init__(self, config: DecoderConfig, shape: tuple[int, ...] | None = None,
               axes: tuple[str, ...] = ("norm",)):
    self.eps = config.rms_norm_eps
    shape = (config.hidden_size,) if shape is None else shape
    self.weight = _param(None, shape, axes, config, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    shape = self.weight.shape
    reduced = tuple(range(x.ndim - len(shape), x.ndim))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=reduced, keepdims=True) + self.eps)
    # HF casts back to the input dtype before the weight multiply.
    weight = self.weight[...].astype(x.dtype).reshape((1,) * (x.ndim - len(shape)) + shape)
    return weight * normed.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query causal self-attention with RoPE and an optional KV cache."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    e, h, k, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    self.config = config
    self.q_proj = _param(rngs, (e, h, d), ("embed", "heads", "head_dim"), config)
    self.k_proj = _param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), config)
    self.v_proj = _param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), config)
    self.o_proj = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), config)
    if config.qkv_bias:
      self.q_bias = _param(None, (h, d), ("heads", "head_dim"), config, init="zeros")
      self.k_bias = _param(None, (k, d), ("kv_heads", "head_dim"), config, init="zeros")
      self.v_bias = _param(None, (k, d), ("kv_heads", "head_dim"), config, init="zeros")
    if config.qk_norm == "head":  # Qwen3: each head's vector, one [D] weight for all heads
      self.q_norm = RMSNorm(config, (d,), ("head_dim",))
      self.k_norm = RMSNorm(config, (d,), ("head_dim",))
    elif config.qk_norm == "projection":  # OLMo 2: a token's whole projection, [H, D] weights
      self.q_norm = RMSNorm(config, (h, d), ("heads", "head_dim"))
      self.k_norm = RMSNorm(config, (k, d), ("kv_heads", "head_dim"))

  def _project(self, x, kernel, bias_name):
    dtype = self.config.jnp_dtype
    batch, time, embed = x.shape
    _, heads, dim = kernel.shape
    out = _dense(x, kernel[...].reshape(embed, heads * dim).astype(dtype),
                 self.config.precision)
    if self.config.qkv_bias:
      out = out + getattr(self, bias_name)[...].reshape(1, 1, heads * dim).astype(dtype)
    return out.reshape(batch, time, heads, dim)

  def __call__(self, x, cos, sin, token_mask, layer_cache, segment_ids=None):
    """x [B,T,E]; token_mask [B,T] bool; segment_ids [B,T] int or None (packed rows: a
    query sees only keys of its segment); layer_cache None or (keys, values, valid, end,
    layer): this layer's keys [B,K,D,S] / values [B,K,S,D] with layer None, or the
    stacked [L,B,...] caches and this layer's `layer_scan.LayerSlot`."""
    q = self._project(x, self.q_proj, "q_bias")
    k = self._project(x, self.k_proj, "k_bias")
    if self.config.qk_norm != "none":
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    v = self._project(x, self.v_proj, "v_bias")
    time = x.shape[1]
    if layer_cache is None:
      key_valid = token_mask
      query_slots = jnp.broadcast_to(jnp.arange(time), token_mask.shape)
      num_keys = time
    else:
      cache_keys, cache_values, key_valid, end, layer = layer_cache
      # New keys go in as [B, K, D, T], values as [B, K, T, D], at each row's write index.
      cache_keys, layer_keys = write_cache(cache_keys, k.transpose(0, 2, 3, 1), end, layer, 2)
      cache_values, layer_values = write_cache(cache_values, v.transpose(0, 2, 1, 3), end,
                                               layer, 1)
      query_slots = end[:, None] + jnp.arange(time)[None, :]
      num_keys = layer_values.shape[2]
    key_slots = jnp.arange(num_keys)
    causal = key_slots[None, None, :] <= query_slots[:, :, None]
    # A padding query may see no valid key; letting it see itself keeps softmax finite.
    itself = key_slots[None, None, :] == query_slots[:, :, None]
    allowed = causal & key_valid[:, None, :]
    if segment_ids is not None:
      allowed &= segment_ids[:, :, None] == segment_ids[:, None, :]
    allowed |= itself
    if layer_cache is None:
      out = grouped_query_attention(q, k, v, allowed, precision=self.config.precision)
      new_cache = None
    else:
      num_used = jnp.max(query_slots) + 1  # no query looks further
      out = cached_attention(q, layer_keys, layer_values, allowed, num_used,
                             precision=self.config.precision,
                             kernel=self.config.decode_attention)
      new_cache = (cache_keys, cache_values)
    dtype = self.config.jnp_dtype
    batch, time, heads, dim = out.shape
    o_proj = self.o_proj[...].reshape(heads * dim, -1).astype(dtype)
    return _dense(out.reshape(batch, time, heads * dim), o_proj, self.config.precision), new_cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) · up(x)) (Shazeer 2020)."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    e, f = config.hidden_size, config.intermediate_size
    self.config = config
    self.gate_proj = _param(rngs, (e, f), ("embed", "mlp"), config)
    self.up_proj = _param(rngs, (e, f), ("embed", "mlp"), config)
    self.down_proj = _param(rngs, (f, e), ("mlp", "embed"), config)

  def __call__(self, x):
    dtype, precision = self.config.jnp_dtype, self.config.precision
    gate = _dense(x, self.gate_proj[...].astype(dtype), precision)
    up = _dense(x, self.up_proj[...].astype(dtype), precision)
    return _dense(jax.nn.silu(gate) * up, self.down_proj[...].astype(dtype), precision)


class Block(nnx.Module):
  """A transformer block. Pre-norm (`norm_placement="pre"`): x + attn(norm(x)), then
  x + mlp(norm(x)). Post-norm ("post", OLMo 2): x + norm(attn(x)), then x + norm(mlp(x))."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    self.pre_norm = config.norm_placement == "pre"
    if self.pre_norm:
      self.input_norm = RMSNorm(config)
    self.attention = Attention(config, rngs)
    if self.pre_norm:
      self.post_attention_norm = RMSNorm(config)
    else:
      self.attention_out_norm = RMSNorm(config)
    self.mlp = MLP(config, rngs)
    if not self.pre_norm:
      self.mlp_out_norm = RMSNorm(config)

  def __call__(self, x, cos, sin, token_mask, layer_cache, segment_ids=None):
    if not self.pre_norm:
      attended, new_cache = self.attention(x, cos, sin, token_mask, layer_cache, segment_ids)
      x = x + self.attention_out_norm(attended)
      return x + self.mlp_out_norm(self.mlp(x)), new_cache
    attended, new_cache = self.attention(self.input_norm(x), cos, sin, token_mask, layer_cache,
                                         segment_ids)
    x = x + attended
    return x + self.mlp(self.post_attention_norm(x)), new_cache


class DecoderLM(nnx.Module):
  """Decoder-only transformer with an LM head or a scalar (value / reward) head.

  Args (constructor):
    config: DecoderConfig.
    rngs: nnx.Rngs for initialisation.
    head: "lm" → logits [B, T, V]; "scalar" → values [B, T] (critic or reward
      model: backbone + a linear map to one number per position).
  """

  def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs, head: HeadKind = "lm"):
    if head not in ("lm", "scalar"):
      raise ValueError(f"head={head!r}; allowed: 'lm', 'scalar'.")
    self.config = config
    self.head = head
    self.embed = _param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"),
                        config)
    blocks = [Block(config, rngs) for _ in range(config.num_layers)]
    # scan_layers: one Block with [L, ...] parameters (`layer_scan`).
    self.layers = stack_blocks(blocks) if config.scan_layers else nnx.List(blocks)
    self.final_norm = RMSNorm(config)
    if head == "lm" and not config.tie_embeddings:
      self.lm_head = _param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                            config)
    if head == "scalar":
      self.scalar_head = _param(rngs, (config.hidden_size,), ("embed",), config)
      self.scalar_bias = _param(None, (), (), config, init="zeros")

  def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None, cache: KVCache | None = None,
               num_last: int | None = None, head_positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, with_hidden: bool = False,
               apply_head: bool = True):
    """Runs the model.

    Args:
      tokens: [B, T] int token ids.
      positions: [B, T] int RoPE positions. Default: the count of real tokens
        before each token (0 at a row's first real token; left padding works),
        continuing from `cache.length` when a cache is given.
      attention_mask: [B, T] 1 for real tokens, 0 for padding (default all 1).
      cache: a KVCache to read and extend (prefill: an empty cache; decode: one
        token per row), or None for a plain forward.
      num_last: apply the head to the last `num_last` positions only (e.g. the
        response of a PPO batch, as HF's `logits_to_keep`).
      head_positions: [B] int, apply the head at one time index per row only
        (a sampler's prefill needs the logits after each prompt's last real
        token, not [B, T, V]); the time axis is then dropped from the output.
      segment_ids: [B, T] int, packed rows (`rlhf_jax.models.packing`): several
        sequences share a row and a token attends only to earlier tokens of its
        own segment. Needs explicit `positions` (restarting at 0 per segment);
        no cache.
      with_hidden: also return the final-normed hidden states the head reads
        ([B, T', E], or [B, E] with `head_positions`): the features of a guide
        (Q♯'s return-distribution head).
      apply_head: False returns those hidden states in place of the head's output
        (chunked log-probs apply the LM head a few tokens at a time:
        `rlhf_jax.models.lm_head`).
    Returns:
      (outputs, cache): logits [B, T', V] (LM head; float32 when the compute
      dtype is float32, else the compute dtype) or values [B, T'] (scalar head,
      float32), and the extended cache (None without one). With
      `head_positions`, logits [B, V] or values [B]. With `with_hidden`:
      (outputs, cache, hidden).
    """
    if num_last is not None and head_positions is not None:
      raise ValueError("Pass at most one of num_last and head_positions.")
    if segment_ids is not None and (cache is not None or positions is None):
      raise ValueError("segment_ids (packed rows) need explicit positions and no cache.")
    x, cache = self._backbone(tokens, positions, attention_mask, cache, segment_ids)
    time = tokens.shape[1]
    if num_last is not None:
      x = x[:, time - num_last:]
    if head_positions is not None:
      x = jnp.take_along_axis(x, head_positions.astype(jnp.int32)[:, None, None], axis=1)[:, 0]
    x = self.final_norm(x)
    if not apply_head:
      return x, cache
    out = self.project(x)
    return (out, cache, x) if with_hidden else (out, cache)

  def _backbone(self, tokens, positions, attention_mask, cache, segment_ids):
    """Embedding and every layer: the residual stream [B, T, E] (before the final norm)
    and the extended cache."""
    config = self.config
    batch, time = tokens.shape
    token_mask = (jnp.ones((batch, time), bool) if attention_mask is None
                  else attention_mask.astype(bool))
    seen = jnp.cumsum(token_mask.astype(jnp.int32), axis=1) - 1
    if positions is None:
      start = jnp.zeros((batch,), jnp.int32) if cache is None else cache.length
      positions = start[:, None] + jnp.maximum(seen, 0)
    cos, sin = rope_tables(positions, config)
    x = self.embed[...].astype(config.jnp_dtype)[tokens]

    if cache is not None:
      valid = write_rows(cache.valid, token_mask, cache.end)
    layers_cache = None if cache is None else (cache.keys, cache.values, valid, cache.end)
    block_args = (cos, sin, token_mask, segment_ids)
    if config.scan_layers:
      x, kv = scan_blocks(self.layers, x, block_args, config, layers_cache)
    else:
      x, kv = self._loop_layers(x, block_args, layers_cache)
    if cache is not None:
      cache = KVCache(keys=kv[0], values=kv[1], valid=valid, end=cache.end + time,
                      length=cache.length + jnp.sum(token_mask, axis=1, dtype=jnp.int32))
    return x, cache

  def _loop_layers(self, x, block_args, cache):
    """The per-layer (unscanned) layers as a Python loop; arguments and result as
    `layer_scan.scan_blocks`, with per-layer tuples of cache keys / values."""
    config = self.config
    cos, sin, token_mask, segment_ids = block_args
    new_keys, new_values = [], []
    for index, layer in enumerate(self.layers):
      layer_cache = None if cache is None else (cache[0][index], cache[1][index], cache[2],
                                                cache[3], None)
      if config.remat:
        policy = getattr(jax.checkpoint_policies, config.remat_policy)
        x, kv = nnx.remat(lambda block, *args: block(*args), policy=policy)(
            layer, x, cos, sin, token_mask, layer_cache, segment_ids)
      else:
        x, kv = layer(x, cos, sin, token_mask, layer_cache, segment_ids)
      if kv is not None:
        new_keys.append(kv[0])
        new_values.append(kv[1])
    return x, (None if cache is None else (tuple(new_keys), tuple(new_values)))

  def project(self, hidden: jax.Array) -> jax.Array:
    """The head on final-normed hidden states [..., E]: logits [..., V] (LM head) or
    values [...] (scalar head, float32)."""
    config = self.config
    if self.head == "scalar":
      weights = self.scalar_head[...].astype(jnp.float32)
      return (jnp.matmul(hidden.astype(jnp.float32), weights, precision=config.precision)
              + self.scalar_bias[...].astype(jnp.float32))
    return lm_logits(hidden, self.lm_head_matrix(), config.precision)

  def lm_head_matrix(self) -> jax.Array:
    """The LM head as an [E, V] matrix in the compute dtype (the embedding, transposed,
    when tied)."""
    dtype = self.config.jnp_dtype
    if self.config.tie_embeddings:
      return self.embed[...].astype(dtype).T
    return self.lm_head[...].astype(dtype)


def lm_logits(hidden: jax.Array, head: jax.Array,
              precision: jax.lax.Precision | None) -> jax.Array:
  """hidden [..., E] @ head [E, V] → logits [..., V] in the compute dtype."""
  return jnp.matmul(hidden, head, precision=precision)
