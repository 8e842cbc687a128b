"""Decoder layers as one stacked block run by `jax.lax.scan` (`DecoderConfig.scan_layers`).

With `scan_layers=True` every parameter of the L decoder blocks is stored once,
stacked on a leading layer axis (`params["layers"]["mlp"]["up_proj"]` is
[L, E, F], logical axes ("layers", "embed", "mlp")), and the forward traces one
block and scans it over that axis, so compile time no longer grows with depth.
With `scan_layers=False` (the default) `params["layers"][i]` holds layer i.
`stack_layer_params` / `unstack_layer_params` convert a parameter dict between
the two layouts (same values, so a checkpoint written by one loads in the other).

The KV cache follows the parameters: stacked, `KVCache.keys` is one
[L, B, K, D, S] array (values [L, B, K, S, D]) carried through the scan; each
layer scatters its new tokens into its own slice in place (`write_cache`) and
reads that slice. (On XLA:CPU a 16-bit cache is carried as its uint16 bits, which
XLA writes in place; see `_slow_scatter`.)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rlhf_jax.models.decoder_config import DecoderConfig


def stack_blocks(blocks: list[nnx.Module]) -> nnx.Module:
  """One block whose parameters are those of `blocks`, stacked on a leading [L] axis.

  Each parameter's `logical_axes` gain a leading "layers" axis. Built from
  per-layer blocks, so a stacked model initialised with a seed holds exactly the
  stacked parameters of the unstacked model with that seed.

  Args:
    blocks: L structurally identical modules.
  Returns:
    A module of the same type with [L, ...] parameters (call it only via
    `scan_blocks`).
  """
  graphdef, first = nnx.split(blocks[0])
  rest = [nnx.split(block)[1] for block in blocks[1:]]

  def stack(head, *tail):
    axes = head.get_metadata().get("logical_axes")
    values = jnp.stack([head[...]] + [variable[...] for variable in tail])
    return type(head)(values, logical_axes=("layers",) + tuple(axes))

  state = jax.tree.map(stack, first, *rest, is_leaf=lambda x: isinstance(x, nnx.Variable))
  return nnx.merge(graphdef, state)


class LayerSlot(NamedTuple):
  """Where a scanned layer's cache lives in the stacked [L, B, ...] buffers.

  Attributes:
    index: int32 scalar, the layer.
    dtype: the cache's dtype; the carried buffers hold its bits as uint16 when that
      differs from theirs (`_slow_scatter`).
  """
  index: jax.Array
  dtype: Any


def scan_blocks(layers: nnx.Module, x: jax.Array, block_args: tuple, config: DecoderConfig,
                cache: tuple | None = None, *, kinds: Any, replay: jax.Array | None = None
                ) -> tuple[jax.Array, tuple | None, jax.Array | None]:
  """Runs a stacked block (`stack_blocks`) over its layer axis with one `lax.scan`.

  The scanned body is rematerialised (`jax.checkpoint` with
  `config.remat_policy`) when `config.remat`.

  Args:
    layers: the stacked block; its call is block(x, rope, token_mask, layer_cache,
      segment_ids, kind, replay) → (x, (keys, values) or None, a `moe.RouterRecord` or
      None).
    x: [B, T, E] residual stream.
    block_args: (rope, token_mask, segment_ids), the same for every layer.
    config: the DecoderConfig.
    cache: None, or (keys [L, B, K, D, S], values [L, B, K, S, D], valid [B, S],
      end [B]); each layer gets (keys, values, valid, end, LayerSlot).
    kinds: the layers' `blocks.LayerKind`: one for every layer (static), or one of [L]
      arrays scanned with the layers (Gemma's interleaved sliding and global layers).
    replay: [L, B, T, k] experts each (sparse) layer replays, or None.
  Returns:
    (x [B, T, E], (keys, values) updated or None without a cache, the layers' stacked
    `moe.RouterRecord` (routes [L, B, T, k]) of sparse layers or None).
  """
  rope, token_mask, segment_ids = block_args
  graphdef, state = nnx.split(layers)
  num_layers = jax.tree.leaves(state)[0].shape[0]
  per_layer = isinstance(kinds[0], jax.Array)
  dtype = None if cache is None else cache[0].dtype
  bits = cache is not None and _slow_scatter(dtype)

  def body(carry, xs):
    x, kv = carry
    layer_state, index, layer_kind, layer_replay = xs
    block = nnx.merge(graphdef, layer_state)
    layer_cache = None if kv is None else (*kv, cache[2], cache[3], LayerSlot(index, dtype))
    x, kv, experts = block(x, rope, token_mask, layer_cache, segment_ids,
                           layer_kind if per_layer else kinds, layer_replay)
    return (x, kv), experts

  if config.remat:
    policy = getattr(jax.checkpoint_policies, config.remat_policy)
    body = jax.checkpoint(body, policy=policy, prevent_cse=False)  # safe inside scan
  kv = None if cache is None else tuple(cache[:2])
  if bits:
    kv = tuple(jax.lax.bitcast_convert_type(c, jnp.uint16) for c in kv)
  (x, kv), experts = jax.lax.scan(
      body, (x, kv), (state, jnp.arange(num_layers, dtype=jnp.int32),
                      kinds if per_layer else None, replay))
  if bits:
    kv = tuple(jax.lax.bitcast_convert_type(c, dtype) for c in kv)
  return x, kv, experts


def write_rows(buffer: jax.Array, update: jax.Array, start: jax.Array,
               axis: int = 0) -> jax.Array:
  """buffer[b, ..., start[b]:start[b]+T, ...] = update[b] for every row b (T on `axis`,
  counted without the batch axis). buffer [B, ...], update [B, ...], start [B]."""
  def write(row, new, at):
    return jax.lax.dynamic_update_slice_in_dim(row, new.astype(row.dtype), at, axis=axis)
  return jax.vmap(write)(buffer, update, start)


def _slow_scatter(dtype) -> bool:
  """Whether a scatter or dynamic-update-slice into a `dtype` buffer is slow: XLA:CPU
  runs 16-bit float ones through a float32 copy of the whole buffer (convert, write,
  convert back). Writing one token per row into 24 layers of a 128 × 640-slot bf16
  cache took 570 ms that way, 28 ms as a select; a stacked [L, ...] cache paid for a
  copy of all layers at every layer. Integer buffers of the same bits are written in
  place."""
  dtype = jnp.dtype(dtype)
  return (jax.default_backend() == "cpu" and jnp.issubdtype(dtype, jnp.floating)
          and dtype.itemsize < 4)


def _write_layer(buffer: jax.Array, update: jax.Array, start: jax.Array,
                 axis: int) -> jax.Array:
  """`write_rows` of one layer's [B, ...] cache; one new entry per row on XLA:CPU in
  16 bits is a select over the slot axis instead (same result: the slot clamped)."""
  slots = buffer.shape[axis + 1]
  if update.shape[axis + 1] != 1 or not _slow_scatter(buffer.dtype):
    return write_rows(buffer, update, start, axis)
  at = jnp.clip(start, 0, slots - 1)
  shape = [buffer.shape[0]] + [1] * (buffer.ndim - 1)
  shape[axis + 1] = slots
  hit = (jnp.arange(slots)[None, :] == at[:, None]).reshape(shape)
  return jnp.where(hit, update.astype(buffer.dtype), buffer)


def write_cache(buffer: jax.Array, update: jax.Array, start: jax.Array,
                layer: LayerSlot | None, axis: int) -> tuple[jax.Array, jax.Array]:
  """Writes one layer's new keys or values into its cache and returns what to read.

  Args:
    buffer: the layer's cache [B, ...] (layer None), or the stacked cache
      [L, B, ...] of every layer (as uint16 bits when `layer.dtype` is not its dtype).
    update: [B, ...] the T new entries of each row (T on `axis`, counted without
      the batch axis), written at slots start[b]...start[b]+T-1 (the start is
      clamped so the window fits, as `lax.dynamic_update_slice` does).
    start: [B] int, each row's first slot to write.
    layer: None, or this layer's LayerSlot in the stacked cache.
    axis: the slot axis of a row ([K, D, S] keys: 2; [K, S, D] values: 1).
  Returns:
    (the updated buffer, this layer's [B, ...] cache to attend over, in its dtype).
  """
  if layer is None:
    buffer = _write_layer(buffer, update, start, axis)
    return buffer, buffer
  update = update.astype(layer.dtype)
  if buffer.dtype != layer.dtype:
    update = jax.lax.bitcast_convert_type(update, buffer.dtype)
  # One in-place scatter into the [L, B, ...] buffer (a vmap over its batch axis 1 would
  # transpose the whole cache).
  batch = update.shape[0]
  indices = jnp.stack([jnp.broadcast_to(layer.index.astype(jnp.int32), (batch,)),
                       start.astype(jnp.int32)], axis=1)
  numbers = jax.lax.ScatterDimensionNumbers(
      update_window_dims=tuple(range(1, update.ndim)), inserted_window_dims=(0,),
      scatter_dims_to_operand_dims=(0, 2 + axis), operand_batching_dims=(1,),
      scatter_indices_batching_dims=(0,))
  buffer = jax.lax.scatter(buffer, indices, update, numbers, indices_are_sorted=True,
                           unique_indices=True, mode=jax.lax.GatherScatterMode.CLIP)
  rows = jax.lax.dynamic_index_in_dim(buffer, layer.index, keepdims=False)
  if buffer.dtype != layer.dtype:
    rows = jax.lax.bitcast_convert_type(rows, layer.dtype)
  return buffer, rows


def is_stacked(params: dict[str, Any]) -> bool:
  """Whether a parameter dict holds its layers stacked (`scan_layers=True`)."""
  return not any(isinstance(key, int) for key in params["layers"])


def stack_layer_params(params: dict[str, Any]) -> dict[str, Any]:
  """The `scan_layers=True` layout of a parameter dict: `params["layers"][i][...]` of
  shape [...] → `params["layers"][...]` of shape [L, ...]. Other entries are shared, not copied; a dict
  already stacked is returned as is."""
  if is_stacked(params):
    return params
  layers = params["layers"]
  per_layer = [layers[i] for i in range(len(layers))]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)
  return {**params, "layers": stacked}


def unstack_layer_params(params: dict[str, Any]) -> dict[str, Any]:
  """The `scan_layers=False` layout of a parameter dict: `params["layers"][...]` of
  shape [L, ...] → `params["layers"][i][...]` of shape [...] (the inverse of
  `stack_layer_params`)."""
  if not is_stacked(params):
    return params
  stacked = params["layers"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  layers = {i: jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(num_layers)}
  return {**params, "layers": layers}


def layer_params(params: dict[str, Any], index: int) -> dict[str, Any]:
  """Layer `index`'s parameter dict ({"attention": ..., "mlp": ..., ...}) in either
  layout (a slice of the stacked arrays when stacked)."""
  if is_stacked(params):
    return jax.tree.map(lambda x: x[index], params["layers"])
  return params["layers"][index]
