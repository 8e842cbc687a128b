"""A Flax NNX decoder-only LM for the HF families of `decoder_config.ARCHITECTURES`, with a KV
cache.

The embedding, the blocks (`rlhf_jax.models.blocks`: RMSNorm, RoPE, grouped-query
attention, SwiGLU MLP, and the family options of `DecoderConfig`), the final norm,
tied or untied embeddings, and one of two heads: the LM head (logits) or a scalar head (critic values /
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

import functools
from typing import Literal

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp

from rlhf_jax.models.attention.xla import soft_cap
from rlhf_jax.models.blocks import Block
from rlhf_jax.models.blocks import RMSNorm
from rlhf_jax.models.blocks import layer_kinds
from rlhf_jax.models.blocks import param
from rlhf_jax.models.blocks import stacked_layer_kinds
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.layer_scan import scan_blocks
from rlhf_jax.models.layer_scan import stack_blocks
from rlhf_jax.models.layer_scan import write_rows
from rlhf_jax.models.moe import NOT_RECORDED
from rlhf_jax.models.moe import RouterRecord
from rlhf_jax.models.moe import route_dtype
from rlhf_jax.models.rope import rope_tables

HeadKind = Literal["lm", "scalar"]


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
    self.embed = param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"),
                        config)
    blocks = [Block(config, rngs, layer) for layer in range(config.num_layers)]
    # scan_layers: one Block with [L, ...] parameters (`layer_scan`).
    self.layers = stack_blocks(blocks) if config.scan_layers else nnx.List(blocks)
    self.final_norm = RMSNorm(config)
    if head == "lm" and not config.tie_embeddings:
      self.lm_head = param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                            config)
    if head == "scalar":
      self.scalar_head = param(rngs, (config.hidden_size,), ("embed",), config)
      self.scalar_bias = param(None, (), (), config, init="zeros")

  def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None, cache: KVCache | None = None,
               num_last: int | None = None, head_positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, with_hidden: bool = False,
               apply_head: bool = True, replay_routes: jax.Array | None = None,
               with_routes: bool = False, with_router: bool = False):
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
      replay_routes: [B, T, L, k] int, the experts each token is routed to in each sparse
        layer instead of the router's top-k (routing replay, `moe.route`); a token's row
        of NOT_RECORDED (-1) in a layer is routed live there. Dense layers ignore theirs.
      with_routes: also return the experts each token was routed to, [B, T, L, k] in
        `moe.route_dtype` (NOT_RECORDED in dense layers).
      with_router: also return the whole `moe.RouterRecord` (routes, the live router's
        own choice, per-layer load and router sums for the auxiliary losses), in place of
        the routes.
    Returns:
      (outputs, cache): logits [B, T', V] (LM head, float32 whatever the compute
      dtype: `lm_logits`) or values [B, T'] (scalar head, float32), and the extended cache (None without one). With
      `head_positions`, logits [B, V] or values [B]. With `with_hidden`:
      (outputs, cache, hidden). With `with_routes` (or `with_router`), the routes (or the
      record) come last: (outputs, cache[, hidden], routes).
    """
    if num_last is not None and head_positions is not None:
      raise ValueError("Pass at most one of num_last and head_positions.")
    if segment_ids is not None and (cache is not None or positions is None):
      raise ValueError("segment_ids (packed rows) need explicit positions and no cache.")
    routed = with_routes or with_router or replay_routes is not None
    if routed and not self.config.num_experts:
      raise ValueError("with_routes / with_router / replay_routes need a mixture-of-experts "
                       f"model; architecture={self.config.architecture!r} has no experts.")
    x, cache, record = self._backbone(tokens, positions, attention_mask, cache, segment_ids,
                                      replay_routes)
    time = tokens.shape[1]
    if num_last is not None:
      x = x[:, time - num_last:]
    if head_positions is not None:
      x = jnp.take_along_axis(x, head_positions.astype(jnp.int32)[:, None, None], axis=1)[:, 0]
    x = self.final_norm(x)
    extra = (record,) if with_router else (record.routes,) if with_routes else ()
    if not apply_head:
      return (x, cache) + extra
    out = self.project(x)
    return ((out, cache, x) if with_hidden else (out, cache)) + extra

  def _backbone(self, tokens, positions, attention_mask, cache, segment_ids,
                replay_routes=None):
    """Embedding and every layer: the residual stream [B, T, E] (before the final norm),
    the extended cache, and the `moe.RouterRecord` (routes [B, T, L, k]; None without
    experts)."""
    config = self.config
    batch, time = tokens.shape
    token_mask = (jnp.ones((batch, time), bool) if attention_mask is None
                  else attention_mask.astype(bool))
    seen = jnp.cumsum(token_mask.astype(jnp.int32), axis=1) - 1
    if positions is None:
      start = jnp.zeros((batch,), jnp.int32) if cache is None else cache.length
      positions = start[:, None] + jnp.maximum(seen, 0)
    rope = (rope_tables(positions, config),)
    if config.rope_local_theta is not None:  # Gemma 3: sliding layers rotate at their base
      rope += (rope_tables(positions, config, local=True),)
    x = self.embed_tokens(tokens)

    if cache is not None:
      valid = write_rows(cache.valid, token_mask, cache.end)
    layers_cache = None if cache is None else (cache.keys, cache.values, valid, cache.end)
    block_args = (rope, token_mask, segment_ids)
    if config.scan_layers:
      replay = None if replay_routes is None else jnp.moveaxis(replay_routes, 2, 0)
      x, kv, record = scan_blocks(self.layers, x, block_args, config, layers_cache,
                                  kinds=stacked_layer_kinds(config) or layer_kinds(config)[0],
                                  replay=replay)
      if record is not None:  # [L, B, T, k] → [B, T, L, k]
        record = record._replace(routes=jnp.moveaxis(record.routes, 0, 2),
                                 live=jnp.moveaxis(record.live, 0, 2))
    else:
      x, kv, record = self._loop_layers(x, block_args, layers_cache, replay_routes)
    if cache is not None:
      cache = KVCache(keys=kv[0], values=kv[1], valid=valid, end=cache.end + time,
                      length=cache.length + jnp.sum(token_mask, axis=1, dtype=jnp.int32))
    return x, cache, record

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """The input embeddings [B, T, E] of `tokens` [B, T] in the compute dtype; Gemma's
    multiplied by √hidden_size rounded to that dtype (`embedding_scale`)."""
    config = self.config
    # Rows gathered, then cast: the backward scatter-adds into the parameter dtype's rows.
    x = self.embed[...][tokens].astype(config.jnp_dtype)
    return x * embedding_scale(config) if config.scale_embeddings else x

  def _loop_layers(self, x, block_args, cache, replay_routes=None):
    """The per-layer (unscanned) layers as a Python loop; arguments and result as
    `layer_scan.scan_blocks`, with per-layer tuples of cache keys / values; the
    `moe.RouterRecord` (NOT_RECORDED routes and zero sums in dense layers), or None
    without experts."""
    config = self.config
    rope, token_mask, segment_ids = block_args
    new_keys, new_values, routes = [], [], []
    for (index, layer), kind in zip(enumerate(self.layers), layer_kinds(config)):
      layer_cache = None if cache is None else (cache[0][index], cache[1][index], cache[2],
                                                cache[3], None)
      replay = None if replay_routes is None else replay_routes[:, :, index]
      if config.remat:
        policy = getattr(jax.checkpoint_policies, config.remat_policy)
        x, kv, experts = nnx.remat(_with_kind(kind), policy=policy)(
            layer, x, rope, token_mask, layer_cache, segment_ids, replay)
      else:
        x, kv, experts = layer(x, rope, token_mask, layer_cache, segment_ids, kind, replay)
      if kv is not None:
        new_keys.append(kv[0])
        new_values.append(kv[1])
      if config.num_experts:
        routes.append(experts if experts is not None else _dense_layer_record(
            config, x.shape[:2]))
    kv = None if cache is None else (tuple(new_keys), tuple(new_values))
    if not routes:
      return x, kv, None
    per_token = lambda *xs: jnp.stack(xs, axis=2)  # [B, T, k] each → [B, T, L, k]
    per_layer = lambda *xs: jnp.stack(xs)
    record = RouterRecord(*(
        (per_token if field in ("routes", "live") else per_layer)(*(getattr(r, field)
                                                                    for r in routes))
        for field in RouterRecord._fields))
    return x, kv, record

  def project(self, hidden: jax.Array) -> jax.Array:
    """The head on final-normed hidden states [..., E]: logits [..., V] (LM head) or
    values [...] (scalar head, float32)."""
    config = self.config
    if self.head == "scalar":
      weights = self.scalar_head[...].astype(jnp.float32)
      return (jnp.matmul(hidden.astype(jnp.float32), weights, precision=config.precision)
              + self.scalar_bias[...].astype(jnp.float32))
    return lm_logits(hidden, self.lm_head_matrix(), config.precision,
                     config.final_logit_softcapping)

  def lm_head_matrix(self) -> jax.Array:
    """The LM head as an [E, V] matrix in the compute dtype (the embedding, transposed,
    when tied)."""
    dtype = self.config.jnp_dtype
    if self.config.tie_embeddings:
      return self.embed[...].astype(dtype).T
    return self.lm_head[...].astype(dtype)


def embedding_scale(config: DecoderConfig) -> jax.Array:
  """Gemma's embedding multiplier √hidden_size as a scalar of the compute dtype, as
  transformers computes it (`embed_scale.to(self.weight.dtype)`: the model's dtype, which
  is its activations'), and vLLM: 1152 → 33.941 in float32, 34.0 in bfloat16 (a 0.17 %
  larger residual stream than an unrounded scale, up to 0.24 % at other widths)."""
  return jnp.asarray(config.hidden_size ** 0.5, config.jnp_dtype)


def _dense_layer_record(config: DecoderConfig, shape: tuple[int, int]) -> RouterRecord:
  """A dense layer's place in a MoE model's `moe.RouterRecord`: no routes, zero sums."""
  unrouted = jnp.full(shape + (config.experts_per_token,), NOT_RECORDED,
                      route_dtype(config.num_experts))
  zeros = jnp.zeros((config.num_experts,), jnp.float32)
  return RouterRecord(routes=unrouted, live=unrouted, load=zeros, prob_sums=zeros,
                      z_sums=jnp.float32(0), tokens=jnp.float32(0))


def _with_kind(kind):
  """A layer call for `nnx.remat` with its kind static: block(x, rope, token_mask,
  layer_cache, segment_ids, replay) → block(..., segment_ids, kind, replay)."""
  return lambda block, *args: block(*args[:-1], kind, args[-1])


def lm_logits(hidden: jax.Array, head: jax.Array, precision: jax.lax.Precision | None,
              softcap: float | None = None) -> jax.Array:
  """hidden [..., E] @ head [E, V] → float32 logits [..., V], soft-capped c·tanh(z/c)
  with `softcap` c (Gemma 2's final_logit_softcapping).

  The GEMM accumulates and emits float32 whatever the operands' dtype: bf16 logits of
  magnitude 16-32 are rounded to 0.125-0.25, which lands whole in log π (~0.01-0.03
  nats per token on average; tests/models/test_chunked_head.py). The trainer's chunked
  head, its unchunked head and the sampler all read their logits from here, so they
  agree with each other. The backward's two GEMMs stay in the operands' dtype
  (`_head_matmul`)."""
  if jnp.dtype(jnp.result_type(hidden, head)).itemsize >= 4:
    logits = jnp.matmul(hidden, head, precision=precision)
  else:
    logits = _head_matmul(hidden, head, precision)
  return soft_cap(logits, softcap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _head_matmul(hidden, head, precision):
  """hidden [..., E] @ head [E, V] of 16-bit operands, accumulated and emitted in
  float32. Autodiff of a dot with a float32 `preferred_element_type` upcasts the
  16-bit operands of both backward GEMMs (dh, dW) to float32: two float32 GEMMs of the
  largest matrix of the model. Here the float32 cotangent is rounded to the operands'
  dtype first (as the bf16 head's cotangent was), and both GEMMs accumulate in float32."""
  return jnp.matmul(hidden, head, precision=precision, preferred_element_type=jnp.float32)


def _head_matmul_fwd(hidden, head, precision):
  return _head_matmul(hidden, head, precision), (hidden, head)


def _head_matmul_bwd(precision, residuals, d_logits):
  hidden, head = residuals
  d_logits = d_logits.astype(jnp.result_type(hidden, head))
  flat_hidden = hidden.reshape(-1, hidden.shape[-1])
  flat_d = d_logits.reshape(-1, d_logits.shape[-1])
  d_hidden = jnp.matmul(d_logits, head.T, precision=precision,
                        preferred_element_type=jnp.float32)
  d_head = jnp.matmul(flat_hidden.T, flat_d, precision=precision,
                      preferred_element_type=jnp.float32)
  return d_hidden.astype(hidden.dtype), d_head.astype(head.dtype)


_head_matmul.defvjp(_head_matmul_fwd, _head_matmul_bwd)
