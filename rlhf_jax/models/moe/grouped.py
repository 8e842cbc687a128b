"""A dropless grouped matmul of our own, "tiled": the same contract as `jax.lax.ragged_dot`.

    out[i] = rows[i] @ weights[g(i)],  g(i) the group whose contiguous range holds row i

(rows past Σ group_sizes get zeros, as ragged_dot gives them). Each group's rows are padded
up to a multiple of a tile of T rows, so every tile belongs to one group; the tiles are
gathered into [num_tiles, T, K] and each multiplies its own group's weights. A group of s
rows takes ceil(s / T) tiles, so num_tiles ≤ ceil(M / T) + G, a static bound (the tiles past
the groups' last hold zeros and are skipped). The real rows are gathered back. Nothing is dropped and nothing depends on a capacity: the padding is < T rows per
group, work (ceil(M / T) + G)·T·K·N multiply-adds at most.

It is XLA code (gathers and batched dots), so it runs on every backend; on XLA:CPU it is
what `jax.lax.ragged_dot` is not, fast (docs/moe.md, `benchmarks/moe_layer.py`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Rows per tile, and tiles per chunk of the loop over tiles (see `grouped_matmul`).
TILE = 64
CHUNK = 4


class TileLayout(NamedTuple):
  """Where the sorted rows go in the padded tiles.

  Attributes:
    position: [M] int32, each row's slot in the flattened [num_tiles · T] tiles; rows past
      Σ group_sizes get num_tiles · T (out of range: dropped on the way in, zero on the
      way out).
    source: [num_tiles · T] int32, each slot's row, M for a padding slot.
    tile_group: [num_tiles] int32, each tile's group (nondecreasing; unused tiles at the
      end get the last group and hold zeros).
    used: [] int32, the tiles the groups fill (the rest are skipped).
  """
  position: jax.Array
  source: jax.Array
  tile_group: jax.Array
  used: jax.Array


def check_shapes(rows, weights, group_sizes) -> None:
  """ValueError naming the shapes unless rows [M, K], weights [G, K, N], group_sizes [G]."""
  if rows.ndim != 2 or weights.ndim != 3 or group_sizes.shape != (weights.shape[0],) or (
      rows.shape[1] != weights.shape[1]):
    raise ValueError(f"grouped_matmul: rows {rows.shape}, weights {weights.shape}, "
                     f"group_sizes {group_sizes.shape} do not match [M, K], [G, K, N], [G].")


def num_tiles(num_rows: int, num_groups: int, tile: int) -> int:
  """The static bound on the tiles of M rows in G groups: ceil(M / T) + G."""
  return -(-num_rows // tile) + num_groups


def tile_layout(group_sizes: jax.Array, num_rows: int, tile: int) -> TileLayout:
  """The tiles of `num_rows` rows sorted into groups of `group_sizes` [G] rows."""
  sizes = group_sizes.astype(jnp.int32)
  groups = sizes.shape[0]
  tiles = num_tiles(num_rows, groups, tile)
  tiles_per_group = (sizes + tile - 1) // tile
  tile_end = jnp.cumsum(tiles_per_group)
  row_end = jnp.cumsum(sizes)
  rows = jnp.arange(num_rows, dtype=jnp.int32)
  row_group = jnp.searchsorted(row_end, rows, side="right").astype(jnp.int32)
  in_group = row_group < groups
  group = jnp.minimum(row_group, groups - 1)
  offset = rows - (row_end - sizes)[group]
  position = jnp.where(in_group, (tile_end - tiles_per_group)[group] * tile + offset,
                       tiles * tile)
  source = jnp.full((tiles * tile,), num_rows, jnp.int32).at[position].set(rows, mode="drop")
  tile_group = jnp.minimum(
      jnp.searchsorted(tile_end, jnp.arange(tiles, dtype=jnp.int32), side="right"),
      groups - 1).astype(jnp.int32)
  return TileLayout(position, source, tile_group, tile_end[-1])


def to_tiles(rows: jax.Array, layout: TileLayout, tile: int) -> jax.Array:
  """[M, K] → [num_tiles, T, K], padding slots zero."""
  padded = jnp.concatenate([rows, jnp.zeros((1, rows.shape[1]), rows.dtype)])
  return padded[layout.source].reshape(-1, tile, rows.shape[1])


def from_tiles(tiles: jax.Array, layout: TileLayout) -> jax.Array:
  """[num_tiles, T, N] → [M, N], the real rows (zeros past Σ group_sizes)."""
  flat = tiles.reshape(-1, tiles.shape[-1])
  return jnp.take(flat, layout.position, axis=0, mode="fill", fill_value=0)


def _chunked(tile_group: jax.Array, chunk: int, *arrays: jax.Array):
  """Pads the tiles' axis to a multiple of `chunk` and splits it: [C·c, ...] → [C, c, ...]."""
  tiles = tile_group.shape[0]
  extra = -tiles % chunk
  out = [jnp.pad(tile_group, (0, extra), mode="edge").reshape(-1, chunk)]
  for a in arrays:
    out.append(jnp.pad(a, ((0, extra),) + ((0, 0),) * (a.ndim - 1)).reshape(
        (-1, chunk) + a.shape[1:]))
  return out


def tiled_products(x_tiles: jax.Array, weights: jax.Array, layout: TileLayout, *,
                   chunk: int, precision=None) -> jax.Array:
  """[num_tiles, T, K] tiles times their groups' weights [G, K, N] → [num_tiles, T, N];
  `chunk` tiles at a time, so at most [chunk, K, N] of gathered weights exist at once, and
  chunks past the used tiles are zeros, not computed."""
  tiles, tile = x_tiles.shape[:2]
  groups_c, x_c = _chunked(layout.tile_group, chunk, x_tiles)
  starts = jnp.arange(groups_c.shape[0], dtype=jnp.int32) * chunk
  zeros = jnp.zeros((chunk, tile, weights.shape[-1]),
                    jnp.result_type(x_tiles.dtype, weights.dtype))

  def one(args):
    start, group, x = args
    return jax.lax.cond(
        start < layout.used,
        lambda: jnp.einsum("ctk,ckn->ctn", x, weights[group], precision=precision),
        lambda: zeros)

  out = jax.lax.map(one, (starts, groups_c, x_c))
  return out.reshape((-1,) + out.shape[2:])[:tiles]


def tiled_weight_grad(x_tiles: jax.Array, dout_tiles: jax.Array, layout: TileLayout,
                      num_groups: int, *, chunk: int, precision=None) -> jax.Array:
  """dW[g] = Σ over g's tiles x_tileᵀ · dout_tile: [G, K, N] in float32, summed `chunk`
  tiles at a time into one [G, K, N] accumulator (chunks past the used tiles skipped)."""
  groups_c, x_c, d_c = _chunked(layout.tile_group, chunk, x_tiles, dout_tiles)
  starts = jnp.arange(groups_c.shape[0], dtype=jnp.int32) * chunk
  init = jnp.zeros((num_groups, x_tiles.shape[-1], dout_tiles.shape[-1]), jnp.float32)

  def step(total, args):
    start, group, x, d = args

    def add():
      products = jnp.einsum("ctk,ctn->ckn", x, d, precision=precision,
                            preferred_element_type=jnp.float32)
      return total.at[group].add(products)

    return jax.lax.cond(start < layout.used, add, lambda: total), None

  return jax.lax.scan(step, init, (starts, groups_c, x_c, d_c))[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _grouped(rows, weights, group_sizes, tile, chunk, precision):
  layout = tile_layout(group_sizes, rows.shape[0], tile)
  products = tiled_products(to_tiles(rows, layout, tile), weights, layout, chunk=chunk,
                            precision=precision)
  return from_tiles(products, layout)


def _grouped_fwd(rows, weights, group_sizes, tile, chunk, precision):
  return _grouped(rows, weights, group_sizes, tile, chunk, precision), (rows, weights,
                                                                        group_sizes)


def _grouped_bwd(tile, chunk, precision, saved, dout):
  rows, weights, group_sizes = saved
  layout = tile_layout(group_sizes, rows.shape[0], tile)
  dout_tiles = to_tiles(dout, layout, tile)
  # d rows = dout · Wᵀ of the row's group: the same tiles against the transposed weights.
  drows = from_tiles(tiled_products(dout_tiles, jnp.swapaxes(weights, 1, 2), layout,
                                     chunk=chunk, precision=precision), layout)
  dweights = tiled_weight_grad(to_tiles(rows, layout, tile), dout_tiles, layout,
                               weights.shape[0], chunk=chunk, precision=precision)
  return (drows.astype(rows.dtype), dweights.astype(weights.dtype),
          jnp.zeros(group_sizes.shape, jax.dtypes.float0))


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array, *,
                   tile: int = TILE, chunk: int = CHUNK,
                   precision: jax.lax.Precision | None = None) -> jax.Array:
  """rows [M, K] sorted by group times their group's weights [G, K, N] → [M, N], as
  `jax.lax.ragged_dot(rows, weights, group_sizes)`, computed in padded tiles.

  Memory: the tiles [num_tiles, T, K] of the rows and [num_tiles, T, N] of the products
  (≤ (M + G·T) rows each), and [chunk, K, N] of gathered weights at a time: the tiles
  multiply their weights `chunk` tiles at a time in a `lax.map`, never all
  [num_tiles, K, N] at once (at the benchmark's shapes, 384 tiles of 512 × 256, that would
  be 192 MiB per projection, and it was slower on XLA:CPU: 0.80 s per forward of one
  projection against 0.07-0.09 s in chunks of 2-8 tiles; docs/moe.md). Chunks past the
  used tiles are skipped (a `lax.cond`), so the bound's spare G tiles cost nothing.

  Gradients are a custom VJP: d rows is the same tiled product of the output's cotangent
  with the transposed weights, d weights[g] = Σ over g's tiles rowsᵀ · d out, accumulated
  `chunk` tiles at a time into one [G, K, N] float32 sum. On XLA:CPU it took 1.08 s per
  forward and backward of one projection against 3.06 s for autodiff through the gathers
  and the loop (which scatters every chunk's [chunk, K, N] weight cotangent).

  Args:
    rows: [M, K], group 0's rows first, then group 1's, ...
    weights: [G, K, N].
    group_sizes: [G] int, rows per group (Σ ≤ M; rows past the sum get zeros).
    tile: rows per tile T (the padding is < T rows per group).
    chunk: tiles multiplied per step of the loop over tiles.
    precision: the products' precision (`DecoderConfig.precision`).
  Returns:
    [M, N] in rows' dtype.
  """
  check_shapes(rows, weights, group_sizes)
  return _grouped(rows, weights, group_sizes, tile, chunk, precision).astype(rows.dtype)
