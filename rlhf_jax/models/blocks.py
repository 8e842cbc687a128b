"""The layers of a decoder LM (`DecoderLM`): RMSNorm, grouped-query attention with RoPE,
optional q/k norms and a KV cache, the gated MLP (SwiGLU, or GeGLU for Gemma) or a mixture
of such MLPs (`SparseMoE`, models/moe/), and the block that joins them with its norms
placed before (Llama), after (OLMo 2) or around (Gemma) each sub-layer. A layer's own window and RoPE tables come in a `LayerKind`
(Gemma interleaves sliding-window and global layers).

Every parameter carries `logical_axes` metadata for `rlhf_jax.parallel`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention.cached import cached_attention
from rlhf_jax.models.attention.xla import grouped_query_attention
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.layer_scan import write_cache
from rlhf_jax.models.moe import layer_record
from rlhf_jax.models.moe import route
from rlhf_jax.models.moe import route_dtype
from rlhf_jax.models.moe.parallel import experts_on_mesh
from rlhf_jax.models.rope import apply_rope
from rlhf_jax.models.rope import layer_rope

INIT_STD = 0.02  # HF initializer_range for Qwen2 / Llama.
# A scanned full-attention layer's window: longer than any sequence.
NO_WINDOW = 2 ** 30


class LayerKind(NamedTuple):
  """What differs between layers of one model: `window`, the sliding window (None: full
  attention; a traced int32 in a scan over mixed layers, NO_WINDOW for a full one) and
  `local_rope`, whether the layer rotates with the sliding layers' RoPE base (a bool, or
  a traced bool in a scan)."""
  window: Any
  local_rope: Any


def layer_kinds(config: DecoderConfig) -> list[LayerKind]:
  """Each layer's LayerKind, from `config.layer_types` and `rope_local_theta`."""
  return [LayerKind(config.layer_window(i), config.layer_local_rope(i))
          for i in range(config.num_layers)]


def stacked_layer_kinds(config: DecoderConfig) -> LayerKind | None:
  """The layers' kinds as [L] arrays to scan with stacked layers, or None when every layer
  is alike (then `layer_kinds(config)[0]` serves all, statically)."""
  kinds = layer_kinds(config)
  if len(set(kinds)) == 1:
    return None
  return LayerKind(jnp.asarray([NO_WINDOW if k.window is None else k.window for k in kinds],
                               jnp.int32),
                   jnp.asarray([k.local_rope for k in kinds], bool))


def param(rngs: nnx.Rngs | None, shape, axes, config: DecoderConfig, init: str = "normal"):
  """An nnx.Param of `shape` in the parameter dtype with logical `axes`: N(0, INIT_STD²)
  ("normal", needs rngs), "ones" or "zeros"."""
  dtype = config.jnp_param_dtype
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = (INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=axes)


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


def join_per_kv_head(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """q [..., H, D], k and v [..., K, D] (kernels [E, ., D] or biases [., D]) → [...,
  K·(G+2)·D]: per KV head k, its G = H / K query heads (k·G ... k·G+G−1, the attention's
  grouping), then its key, then its value. Any contiguous split of the result into n
  blocks (n dividing K) is the join of the heads of one block of a split of H and K: a
  split over `tensor` stays on each device."""
  kv_heads = k.shape[-2]
  leading = q.shape[:-2]
  joined = jnp.concatenate([part.reshape(*leading, kv_heads, -1) for part in (q, k, v)],
                           axis=-1)
  return joined.reshape(*leading, -1)


def interleave_columns(a: jax.Array, b: jax.Array) -> jax.Array:
  """a, b [..., F] → [..., 2F] with column 2f = a's f and 2f+1 = b's f: a contiguous
  split into n blocks (n dividing F) is the interleave of the same blocks of a and b."""
  return jnp.stack([a, b], axis=-1).reshape(*a.shape[:-1], 2 * a.shape[-1])


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x²) + eps) · w over x's trailing axes of w's shape, computed in
  float32 (Zhang & Sennrich 2019). Default w: [hidden_size]; a q/k norm passes its own
  shape ([head_dim], or [heads, head_dim] to normalise a whole projection). With
  `config.norm_offset` (Gemma) y = x / sqrt(...) · (offset + w), all in float32; gpt-oss
  also multiplies by w in float32 before the cast (transformers' GptOssRMSNorm)."""

  def __init__(self, config: DecoderConfig, shape: tuple[int, ...] | None = None,
               axes: tuple[str, ...] = ("norm",)):
    self.eps = config.rms_norm_eps
    self.offset = config.norm_offset
    self.multiply_in_float32 = bool(self.offset) or config.architecture == "gpt_oss"
    shape = (config.hidden_size,) if shape is None else shape
    self.weight = param(None, shape, axes, config, init="zeros" if self.offset else "ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    shape = self.weight.shape
    reduced = tuple(range(x.ndim - len(shape), x.ndim))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=reduced, keepdims=True) + self.eps)
    broadcast = (1,) * (x.ndim - len(shape)) + shape
    if self.multiply_in_float32:  # Gemma and gpt-oss multiply in float32, then cast
      weight = self.offset + self.weight[...].astype(jnp.float32).reshape(broadcast)
      return (normed * weight).astype(x.dtype)
    # HF casts back to the input dtype before the weight multiply.
    weight = self.weight[...].astype(x.dtype).reshape(broadcast)
    return weight * normed.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query causal self-attention: q/k RMSNorm (`DecoderConfig.qk_norm`), then RoPE
  (on all or the first `rotary_dim` dims of each head), an optional sliding window
  (`attention_mask`), Gemma's score scale and soft-capping, gpt-oss's attention sinks and
  output bias, and an optional KV cache."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    e, h, k, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    self.config = config
    self.q_proj = param(rngs, (e, h, d), ("embed", "heads", "head_dim"), config)
    self.k_proj = param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), config)
    self.v_proj = param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), config)
    self.o_proj = param(rngs, (h, d, e), ("heads", "head_dim", "embed"), config)
    if config.qkv_bias:
      self.q_bias = param(None, (h, d), ("heads", "head_dim"), config, init="zeros")
      self.k_bias = param(None, (k, d), ("kv_heads", "head_dim"), config, init="zeros")
      self.v_bias = param(None, (k, d), ("kv_heads", "head_dim"), config, init="zeros")
    if config.attention_out_bias:
      self.o_bias = param(None, (e,), ("embed",), config, init="zeros")
    if config.attention_sinks:  # gpt-oss: one logit per query head (HF inits N(0, 0.02²))
      self.sinks = param(rngs, (h,), ("heads",), config)
    if config.qk_norm == "head":  # Qwen3: each head's vector, one [D] weight for all heads
      self.q_norm = RMSNorm(config, (d,), ("head_dim",))
      self.k_norm = RMSNorm(config, (d,), ("head_dim",))
    elif config.qk_norm == "projection":  # OLMo 2: a token's whole projection, [H, D] weights
      self.q_norm = RMSNorm(config, (h, d), ("heads", "head_dim"))
      self.k_norm = RMSNorm(config, (k, d), ("kv_heads", "head_dim"))

  def qkv(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [B,T,E] → q [B,T,H,D], k and v [B,T,K,D], as ONE GEMM of N = (H+2K)·D instead of
    three (k's and v's N = K·D are far below the sizes that reach tensor-core peak).

    The kernels (and biases) are joined at use, so the parameter tree and the HF
    conversion keep q_proj / k_proj / v_proj (LoRA merges into each before the forward).
    They are joined per KV head (`join_per_kv_head`), not as [q | k | v]: with heads and
    kv_heads split over `tensor`, each device joins and splits its own heads (a plain
    concatenation along the split axis made XLA move columns between devices: in a
    1-layer probe at tensor=4, 3 all-gathers and 12 collective-permutes in the forward;
    none this way)."""
    config = self.config
    dtype = config.jnp_dtype
    batch, time, _ = x.shape
    _, heads, dim = self.q_proj.shape
    kv_heads = self.k_proj.shape[1]
    group = heads // kv_heads
    parts = lambda names: [getattr(self, name)[...].astype(dtype) for name in names]
    out = _dense(x, join_per_kv_head(*parts(("q_proj", "k_proj", "v_proj"))),
                 config.precision)
    if config.qkv_bias:
      bias = join_per_kv_head(*parts(("q_bias", "k_bias", "v_bias")))
      out = out + bias.reshape(1, 1, -1)
    out = out.reshape(batch, time, kv_heads, (group + 2) * dim)
    q = out[..., :group * dim].reshape(batch, time, heads, dim)
    return q, out[..., group * dim:(group + 1) * dim], out[..., (group + 1) * dim:]

  def __call__(self, x, rope, token_mask, layer_cache, segment_ids, kind: LayerKind):
    """x [B,T,E]; rope: (cos, sin) tables [B,T,1,R] of every layer, then of sliding layers
    when they differ (`rope.layer_rope`); token_mask [B,T] bool; segment_ids [B,T] int or
    None (packed rows: a query sees only keys of its segment); layer_cache None or (keys,
    values, valid, end, layer): this layer's keys [B,K,D,S] / values [B,K,S,D] with layer
    None, or the stacked [L,B,...] caches and this layer's `layer_scan.LayerSlot`; kind:
    this layer's window and RoPE."""
    q, k, v = self.qkv(x)
    if self.config.qk_norm != "none":
      q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = layer_rope(rope, kind.local_rope)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    time = x.shape[1]
    if layer_cache is None:
      key_valid = token_mask
      query_slots = jnp.broadcast_to(jnp.arange(time), token_mask.shape)
    else:
      cache_keys, cache_values, key_valid, end, layer = layer_cache
      # New keys go in as [B, K, D, T], values as [B, K, T, D], at each row's write index.
      cache_keys, layer_keys = write_cache(cache_keys, k.transpose(0, 2, 3, 1), end, layer, 2)
      cache_values, layer_values = write_cache(cache_values, v.transpose(0, 2, 1, 3), end,
                                               layer, 1)
      query_slots = end[:, None] + jnp.arange(time)[None, :]
    allowed = attention_mask(query_slots, key_valid, segment_ids, kind.window)
    scores = dict(precision=self.config.precision, scale=self.config.attention_scale,
                  softcap=self.config.attn_logit_softcapping,
                  sinks=self.sinks[...] if self.config.attention_sinks else None)
    if layer_cache is None:
      # The fused kernels take the layout (padding, segments, window), not the dense mask.
      out = grouped_query_attention(
          q, k, v, allowed, impl=self.config.attention_impl,
          token_mask=token_mask, segment_ids=segment_ids, window=kind.window, **scores)
      new_cache = None
    else:
      num_used = jnp.max(query_slots) + 1  # no query looks further
      out = cached_attention(q, layer_keys, layer_values, allowed, num_used,
                             kernel=kernel_choice.decode_attention(
                                 self.config.decode_attention), **scores)
      new_cache = (cache_keys, cache_values)
    dtype = self.config.jnp_dtype
    batch, time, heads, dim = out.shape
    o_proj = self.o_proj[...].reshape(heads * dim, -1).astype(dtype)
    out = _dense(out.reshape(batch, time, heads * dim), o_proj, self.config.precision)
    if self.config.attention_out_bias:
      out = out + self.o_bias[...].astype(dtype).reshape(1, 1, -1)
    return out, new_cache


def attention_mask(query_slots: jax.Array, key_valid: jax.Array, segment_ids: jax.Array | None,
                   window: int | jax.Array | None) -> jax.Array:
  """[B, T, S] bool, query t may attend to slot s: s is a real token (key_valid [B, S])
  at or before the query's slot (query_slots [B, T]), of the query's segment
  (segment_ids [B, T] with T = S, packed rows), and, with a sliding `window`, fewer
  than `window` real tokens after it up to the query (position(q) − position(s) <
  window, HF's sliding-window mask); a query always sees itself."""
  key_slots = jnp.arange(key_valid.shape[1])
  allowed = (key_slots[None, None, :] <= query_slots[:, :, None]) & key_valid[:, None, :]
  if segment_ids is not None:
    allowed &= segment_ids[:, :, None] == segment_ids[:, None, :]
  if window is not None:
    # Real tokens are counted, not slots: left padding and the invalid slots a cache
    # leaves between turns must not push keys out of the window.
    seen = jnp.cumsum(key_valid, axis=1, dtype=jnp.int32)
    at_query = jnp.take_along_axis(seen, jnp.minimum(query_slots, seen.shape[1] - 1), axis=1)
    allowed &= at_query[:, :, None] - seen[:, None, :] < window
  # A padding query may see no valid key; letting it see itself keeps softmax finite.
  return allowed | (key_slots[None, None, :] == query_slots[:, :, None])


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) · up(x)) (Shazeer 2020); GeGLU with gelu's tanh
  approximation in place of silu (`DecoderConfig.activation`, Gemma)."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    e, f = config.hidden_size, config.intermediate_size
    self.config = config
    self.gate_proj = param(rngs, (e, f), ("embed", "mlp"), config)
    self.up_proj = param(rngs, (e, f), ("embed", "mlp"), config)
    self.down_proj = param(rngs, (f, e), ("mlp", "embed"), config)

  def gate_up(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., E] → (gate, up) [..., F] as ONE GEMM on the kernels joined at use into
    [E, F, 2] → [E, 2F] (column 2f is gate's f, 2f+1 up's; the parameter tree keeps
    gate_proj and up_proj). Interleaved rather than concatenated so the mlp axis stays
    whole: split over `tensor`, each device joins and splits its own columns (a [gate |
    up] concatenation along a split axis made XLA move the halves between devices)."""
    dtype, width = self.config.jnp_dtype, self.gate_proj.shape[-1]
    fused = interleave_columns(self.gate_proj[...].astype(dtype),
                               self.up_proj[...].astype(dtype))
    out = _dense(x, fused, self.config.precision)
    out = out.reshape(*out.shape[:-1], width, 2)
    return out[..., 0], out[..., 1]

  def __call__(self, x):
    dtype, precision = self.config.jnp_dtype, self.config.precision
    gate, up = self.gate_up(x)
    if self.config.activation == "silu":
      gate = jax.nn.silu(gate)
    else:  # gelu_pytorch_tanh
      gate = jax.nn.gelu(gate, approximate=True)
    return _dense(gate * up, self.down_proj[...].astype(dtype), precision)


class SparseMoE(nnx.Module):
  """A mixture-of-experts MLP (Qwen3-MoE's sparse block): each token goes to its k experts
  by the router (`moe.route`: softmax, top-k, optionally renormalised), and their gated
  MLPs are summed with the gate weights (`moe.expert_mlp`, dropless; expert-parallel
  under a mesh with an expert axis: `moe.parallel`)."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
    e, f, x = config.hidden_size, config.expert_intermediate_size, config.num_experts
    self.config = config
    self.router = param(rngs, (e, x), ("embed", "expert"), config)
    self.gate_proj = param(rngs, (x, e, f), ("expert", "embed", "mlp"), config)
    self.up_proj = param(rngs, (x, e, f), ("expert", "embed", "mlp"), config)
    self.down_proj = param(rngs, (x, f, e), ("expert", "mlp", "embed"), config)
    if config.expert_biases:  # gpt-oss: the router's logits and each expert projection
      self.router_bias = param(None, (x,), ("expert",), config, init="zeros")
      self.gate_bias = param(None, (x, f), ("expert", "mlp"), config, init="zeros")
      self.up_bias = param(None, (x, f), ("expert", "mlp"), config, init="zeros")
      self.down_bias = param(None, (x, e), ("expert", "embed"), config, init="zeros")

  def __call__(self, x, replay=None, token_mask=None):
    """x [..., E] → (out [..., E], the layer's `moe.RouterRecord` without the layer axis:
    routes and live routes [..., k] in `moe.route_dtype`, load and router sums over the
    tokens of `token_mask` [...] (all when None)). `replay` [..., k]: experts to route to
    instead of the router's top-k (routing replay; a row holding NOT_RECORDED is routed
    live)."""
    c = self.config
    dtype, tokens = c.jnp_dtype, x.reshape(-1, x.shape[-1])
    k = c.experts_per_token
    logits = _dense(tokens, self.router[...].astype(dtype), c.precision)
    biases = None
    if c.expert_biases:
      logits = logits + self.router_bias[...].astype(dtype)[None]
      biases = tuple(getattr(self, name)[...].astype(dtype)
                     for name in ("gate_bias", "up_bias", "down_bias"))
    routes = route(logits, k, normalize=c.normalize_expert_weights,
                   replay=None if replay is None else replay.reshape(-1, k))
    out = experts_on_mesh(tokens, routes, self.gate_proj[...].astype(dtype),
                          self.up_proj[...].astype(dtype), self.down_proj[...].astype(dtype),
                          kernel=c.expert_kernel, activation=c.activation,
                          precision=c.precision, biases=biases, swiglu_limit=c.swiglu_limit)
    valid = (jnp.ones(tokens.shape[:1], bool) if token_mask is None
             else token_mask.reshape(-1))
    record = layer_record(logits, routes, k, valid, route_dtype(c.num_experts))
    record = record._replace(routes=record.routes.reshape(*x.shape[:-1], k),
                             live=record.live.reshape(*x.shape[:-1], k))
    return out.reshape(x.shape), record


class Block(nnx.Module):
  """A transformer block. Pre-norm (`norm_placement="pre"`): x + attn(norm(x)), then
  x + mlp(norm(x)). Post-norm ("post", OLMo 2): x + norm(attn(x)), then x + norm(mlp(x)).
  Sandwich ("sandwich", Gemma): x + norm(attn(norm(x))), then x + norm(mlp(norm(x)))."""

  def __init__(self, config: DecoderConfig, rngs: nnx.Rngs, layer: int = 0):
    self.placement = config.norm_placement
    if self.placement != "post":
      self.input_norm = RMSNorm(config)
    self.attention = Attention(config, rngs)
    if self.placement == "pre":
      self.post_attention_norm = RMSNorm(config)
    else:
      self.attention_out_norm = RMSNorm(config)
    if self.placement == "sandwich":
      self.mlp_in_norm = RMSNorm(config)
    self.mlp = SparseMoE(config, rngs) if config.sparse_layer(layer) else MLP(config, rngs)
    if self.placement != "pre":
      self.mlp_out_norm = RMSNorm(config)

  def __call__(self, x, rope, token_mask, layer_cache, segment_ids, kind: LayerKind,
               replay=None):
    """x [B,T,E] → (x [B,T,E], the layer's new (keys, values) or None, a sparse MLP's
    `moe.RouterRecord` (routes [B,T,k]; None for a dense MLP)); `replay` [B,T,k]: the
    experts a sparse MLP replays (`SparseMoE`); the other arguments as `Attention`'s."""
    inner = x if self.placement == "post" else self.input_norm(x)
    attended, new_cache = self.attention(inner, rope, token_mask, layer_cache, segment_ids,
                                         kind)
    if self.placement != "pre":
      attended = self.attention_out_norm(attended)
    x = x + attended
    inner = {"pre": lambda: self.post_attention_norm(x), "post": lambda: x,
             "sandwich": lambda: self.mlp_in_norm(x)}[self.placement]()
    if isinstance(self.mlp, SparseMoE):
      out, experts = self.mlp(inner, replay, token_mask)
    else:
      out, experts = self.mlp(inner), None
    if self.placement != "pre":
      out = self.mlp_out_norm(out)
    return x + out, new_cache, experts
