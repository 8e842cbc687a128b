"""A grouped GEMM for GPUs as a Pallas kernel: `jax.lax.ragged_dot`'s contract,

    out[i] = rows[i] @ weights[g(i)],  g(i) the group whose contiguous range holds row i,

tiled as megablox (`jax.experimental.pallas.ops.tpu.megablox`) tiles it: each group's rows
are padded up to a multiple of the row tile (`grouped.tile_layout`: at most ceil(M / T) + G
tiles, each holding one group's rows), and the grid runs over (row tile, column tile). The
program of row tile i reads its group g = tile_group[i] from a scalar array and multiplies
its [T, K] rows by weights[g]'s [K, bn] block, K in steps of `block_k`, accumulating in
float32. Tiles past the groups' last are not computed. On a GPU it lowers through Pallas'
Triton backend (upstream `ragged_dot` falls back to a dense computation on NVIDIA GPUs, and
its Mosaic kernels need a Hopper); elsewhere it runs in interpret mode (correct, slow: for
tests), so CPU tests run the same kernel code.

Gradients (custom VJP): d rows with the same kernel on the transposed weights; d weights
[g] = Σ over g's tiles rowsᵀ · d out with the tiled XLA path (`grouped.tiled_weight_grad`).
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
import jax.numpy as jnp

from rlhf_jax.models.moe import grouped

# The tiles: rows per tile (T), output columns per program (bn), and the K step.
BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32
# Triton's dot needs at least 16 along every side.
_TRITON_MIN = 16


def _kernel(group_ref, x_ref, w_ref, o_ref, *, num_groups, block_k, num_k_blocks,
            precision):
  """One (row tile, column tile): o [T, bn] = x [T, K] @ weights[group][:, column block]."""
  group = group_ref[()]

  @pl.when(group < num_groups)
  def _():
    def body(step, acc):
      start = pl.multiple_of(step * block_k, block_k)
      x = x_ref[:, pl.ds(start, block_k)]
      w = w_ref[group, pl.ds(start, block_k), :]
      return acc + jnp.dot(x, w, preferred_element_type=jnp.float32, precision=precision)

    acc = lax.fori_loop(0, num_k_blocks, body,
                        jnp.zeros((x_ref.shape[0], w_ref.shape[-1]), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)

  @pl.when(group >= num_groups)  # a tile past the groups' last: its rows are padding
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def _pad_to(a: jax.Array, axis: int, multiple: int) -> jax.Array:
  extra = -a.shape[axis] % multiple
  if not extra:
    return a
  widths = [(0, 0)] * a.ndim
  widths[axis] = (0, extra)
  return jnp.pad(a, widths)


def tile_products(x_tiles: jax.Array, weights: jax.Array, tile_group: jax.Array, *,
                  block_n: int, block_k: int, interpret: bool, precision=None) -> jax.Array:
  """The kernel: [num_tiles, T, K] tiles times weights [G, K, N] of each tile's group
  (tile_group [num_tiles]; G or more: a tile of padding, zeros) → [num_tiles, T, N]."""
  tiles, tile, depth = x_tiles.shape
  num_groups, _, width = weights.shape
  x_tiles = _pad_to(x_tiles, 2, block_k)  # zero columns of x meet zero rows of w
  weights = _pad_to(_pad_to(weights, 1, block_k), 2, block_n)
  padded_k, padded_n = weights.shape[1:]
  kernel = functools.partial(_kernel, num_groups=num_groups, block_k=block_k,
                             num_k_blocks=padded_k // block_k, precision=precision)
  squeeze = pl.squeezed
  out = pl.pallas_call(
      kernel,
      grid=(tiles, padded_n // block_n),
      in_specs=[
          pl.BlockSpec((squeeze,), lambda i, j: (i,)),
          pl.BlockSpec((squeeze, tile, padded_k), lambda i, j: (i, 0, 0)),
          pl.BlockSpec((num_groups, padded_k, block_n), lambda i, j: (0, 0, j)),
      ],
      out_specs=pl.BlockSpec((squeeze, tile, block_n), lambda i, j: (i, 0, j)),
      out_shape=jax.ShapeDtypeStruct((tiles, tile, padded_n),
                                     jnp.result_type(x_tiles.dtype, weights.dtype)),
      # Triton CompilerParams select the Triton lowering (not Mosaic GPU) on a GPU.
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name="grouped_matmul",
  )(tile_group, x_tiles, weights)
  del depth
  return out[..., :width]


def _check_blocks(block_m: int, block_n: int, block_k: int, interpret: bool) -> None:
  for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
    if value < 1 or value & (value - 1) or (not interpret and value < _TRITON_MIN):
      raise ValueError(f"pallas grouped_matmul: {name}={value} must be a power of two"
                       + ("" if interpret else f" ≥ {_TRITON_MIN} on a GPU (Triton's dot)")
                       + ".")


def _products(rows, weights, layout, block_m, block_n, block_k, interpret, precision):
  """[M, K] rows through the kernel against [G, K, N] weights → [M, N]."""
  # Tiles past the used ones get the group G: the kernel writes zeros there.
  tile_group = jnp.where(jnp.arange(layout.tile_group.shape[0]) < layout.used,
                         layout.tile_group, weights.shape[0]).astype(jnp.int32)
  out = tile_products(grouped.to_tiles(rows, layout, block_m), weights, tile_group,
                      block_n=block_n, block_k=block_k, interpret=interpret,
                      precision=precision)
  return grouped.from_tiles(out, layout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _grouped(rows, weights, group_sizes, block_m, block_n, block_k, interpret, precision):
  layout = grouped.tile_layout(group_sizes, rows.shape[0], block_m)
  return _products(rows, weights, layout, block_m, block_n, block_k, interpret, precision)


def _grouped_fwd(rows, weights, group_sizes, block_m, block_n, block_k, interpret,
                 precision):
  out = _grouped(rows, weights, group_sizes, block_m, block_n, block_k, interpret, precision)
  return out, (rows, weights, group_sizes)


def _grouped_bwd(block_m, block_n, block_k, interpret, precision, saved, dout):
  rows, weights, group_sizes = saved
  layout = grouped.tile_layout(group_sizes, rows.shape[0], block_m)
  drows = _products(dout, jnp.swapaxes(weights, 1, 2), layout, block_m, block_n, block_k,
                    interpret, precision)
  dweights = grouped.tiled_weight_grad(
      grouped.to_tiles(rows, layout, block_m), grouped.to_tiles(dout, layout, block_m),
      layout, weights.shape[0], chunk=grouped.CHUNK, precision=precision)
  return (drows.astype(rows.dtype), dweights.astype(weights.dtype),
          jnp.zeros(group_sizes.shape, jax.dtypes.float0))


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array, *,
                   block_m: int = BLOCK_M, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
                   interpret: bool | None = None,
                   precision: jax.lax.Precision | None = None) -> jax.Array:
  """rows [M, K] sorted by group times their group's weights [G, K, N] → [M, N], as
  `jax.lax.ragged_dot(rows, weights, group_sizes)`, by the Pallas kernel.

  Args:
    rows: [M, K], group 0's rows first, then group 1's, ...
    weights: [G, K, N].
    group_sizes: [G] int, rows per group (Σ ≤ M; rows past the sum get zeros).
    block_m: rows per tile (each group is padded to a multiple of it).
    block_n: output columns per program.
    block_k: the contraction's step (K is zero-padded to a multiple of it).
    interpret: run in Pallas interpret mode; None: True unless the default backend is a
      GPU.
    precision: the kernel's dots' precision (None: the backend's default, TF32 for
      float32 on an NVIDIA GPU; HIGHEST: full float32).
  Returns:
    [M, N] in rows' dtype.
  """
  grouped.check_shapes(rows, weights, group_sizes)
  interpret = jax.default_backend() != "gpu" if interpret is None else bool(interpret)
  _check_blocks(block_m, block_n, block_k, interpret)
  return _grouped(rows, weights, group_sizes, block_m, block_n, block_k, interpret,
                  precision).astype(rows.dtype)
