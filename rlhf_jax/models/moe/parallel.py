"""Expert parallelism: a mixture-of-experts layer whose experts are split over the `expert`
mesh axis (`parallel.MESH_AXES`), under `jax.shard_map`.

With ep devices on the expert axis, device s holds the X/ep experts s·X/ep … (s+1)·X/ep − 1
of every sparse layer, and a share of the tokens (the batch rows are split over data, fsdp
and expert alike). A sparse layer then, on each device:

  1. all-gathers its N tokens [N, E] and their routes over `expert`: each device sees the
     ep·N tokens of its expert group;
  2. runs `expert_mlp` with its own experts only: a (token, slot) routed to another
     device's expert gets the local id X/ep ("no expert here": sorted past the last group,
     its rows are zeros, as in `jax.lax.ragged_dot`'s contract) and the weight 0, so it
     adds nothing; a local one gets its id minus s·X/ep and its gate weight;
  3. sums the partial outputs back onto the tokens' own devices: a reduce-scatter
     (`psum_scatter`) over `expert`, then a `psum` over `tensor` when the experts' hidden
     width is split there (each tensor shard computed its slice of F).

Why not `jax.lax.ragged_all_to_all` (tunix's and MaxText's exchange)? XLA:CPU does not
implement it in jax 0.10.2 ("HLO opcode `ragged-all-to-all` is not supported by XLA:CPU"),
and the mesh tests run on emulated CPU devices. This all-gather exchange (Megatron-LM's
"allgather" token dispatcher) is dropless too (no capacity, nothing padded per expert) and
exact up to the order of the sums. What it costs, per device and sparse layer:
- bytes: (ep−1)·N·E activations in and as many out (the gradient's the same backwards),
  where an all-to-all moves about k·N·E·(ep−1)/ep each way: no more than all-to-all while
  ep ≤ k (Qwen3-30B-A3B: k = 8), more beyond;
- memory: the gathered tokens and the kernel's intermediates are those of ep·N tokens,
  ep times a device's own;
- work: the kernel gets ep·N·k rows of which about N·k (its experts' share) are inside its
  groups; a grouped GEMM that skips rows past Σ group sizes does only those, "dense"
  computes ep·N tokens × X/ep experts (the same as N × X unsplit).
Composition: the expert weights [X, E, F] enter as [X/ep, E, F/t] (fsdp's split of E is
all-gathered at the boundary, as XLA gathers FSDP weights for any layer); the router runs
outside, on the tokens' own devices. Gradients flow through all three steps (the
transposes of all-gather and reduce-scatter are each other).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rlhf_jax.models.moe.experts import expert_mlp
from rlhf_jax.models.moe.routing import Routes

EXPERT_AXIS = "expert"
TOKEN_AXES = ("data", "fsdp", "expert")  # parallel.sharding.BATCH_AXES
TENSOR_AXIS = "tensor"


def expert_axis_size(mesh) -> int:
  """The size of `mesh`'s expert axis (1 when it has none)."""
  return dict(mesh.shape).get(EXPERT_AXIS, 1) if mesh is not None else 1


def experts_on_mesh(x: jax.Array, routes: Routes, gate: jax.Array, up: jax.Array,
                    down: jax.Array, **options) -> jax.Array:
  """`expert_mlp` (same arguments and result), expert-parallel when the mesh being traced
  under (`jax.set_mesh`) has an expert axis > 1 (`expert_parallel_mlp`), else `expert_mlp`
  itself. The one place a sparse layer learns about the mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or expert_axis_size(mesh) == 1:
    return expert_mlp(x, routes, gate, up, down, **options)
  return expert_parallel_mlp(x, routes, gate, up, down, mesh=mesh, **options)


def expert_parallel_mlp(x: jax.Array, routes: Routes, gate: jax.Array, up: jax.Array,
                        down: jax.Array, *, mesh,
                        biases: tuple[jax.Array, jax.Array, jax.Array] | None = None,
                        **options) -> jax.Array:
  """The routed experts' MLPs of tokens x [N, E] with the experts split over `mesh`'s
  expert axis (the module docstring: all-gather, local experts, reduce-scatter).

  Args:
    x: [N, E] tokens, split over the mesh's data × fsdp × expert (padded to split evenly).
    routes: experts [N, k] (global ids) and weights [N, k].
    gate: [X, E, F]; X divides by the expert axis.
    up: [X, E, F].
    down: [X, F, E].
    mesh: a mesh (or abstract mesh) with an `expert` axis.
    biases: (gate [X, F], up [X, F], down [X, E]) or None, as `expert_mlp`'s.
    **options: `expert_mlp`'s keyword arguments (kernel, activation, precision, ...).
  Returns:
    [N, E] in x's dtype, equal to `expert_mlp` on one device.
  Raises:
    ValueError naming the sizes when the X experts do not split over the expert axis.
  """
  names = tuple(mesh.axis_names)
  sizes = dict(mesh.shape)
  shards = sizes[EXPERT_AXIS]
  num_experts, tokens = gate.shape[0], x.shape[0]
  if num_experts % shards:
    raise ValueError(f"expert parallelism: {num_experts} experts do not split over the mesh's "
                     f"expert axis of {shards}.")
  token_axes = tuple(axis for axis in TOKEN_AXES if axis in names)
  token_shards = math.prod(sizes[axis] for axis in token_axes)
  # Tokens that do not split evenly (a micro-batch of odd shape) are padded with rows
  # routed to no expert (id X, weight 0: nothing computed for them, nothing added).
  pad = -tokens % token_shards
  experts, weights = routes.experts, routes.weights
  if pad:
    x = jnp.pad(x, ((0, pad), (0, 0)))
    experts = jnp.pad(experts, ((0, pad), (0, 0)), constant_values=num_experts)
    weights = jnp.pad(weights, ((0, pad), (0, 0)))
  tensor = TENSOR_AXIS if sizes.get(TENSOR_AXIS, 1) > 1 else None
  per_shard = num_experts // shards

  def local(x, experts, weights, gate, up, down, *bias):
    shard = jax.lax.axis_index(EXPERT_AXIS)
    x = jax.lax.all_gather(x, EXPERT_AXIS, tiled=True)
    experts = jax.lax.all_gather(experts, EXPERT_AXIS, tiled=True) - shard * per_shard
    weights = jax.lax.all_gather(weights, EXPERT_AXIS, tiled=True)
    mine = (experts >= 0) & (experts < per_shard)
    routes = Routes(jnp.where(mine, experts, per_shard).astype(experts.dtype),
                    jnp.where(mine, weights, 0).astype(weights.dtype))
    if bias:
      # The down bias is added once per token: on the first tensor shard only.
      first = 1 if tensor is None else (jax.lax.axis_index(tensor) == 0)
      bias = (bias[0], bias[1], bias[2] * jnp.asarray(first, bias[2].dtype))
    out = expert_mlp(x, routes, gate, up, down, biases=tuple(bias) if bias else None,
                     **options)
    out = jax.lax.psum_scatter(out, EXPERT_AXIS, tiled=True)
    return out if tensor is None else jax.lax.psum(out, tensor)

  rows = PartitionSpec(token_axes, None)
  in_specs = [rows, rows, rows, PartitionSpec(EXPERT_AXIS, None, tensor),
              PartitionSpec(EXPERT_AXIS, None, tensor), PartitionSpec(EXPERT_AXIS, tensor, None)]
  arguments = [x, experts, weights, gate, up, down]
  if biases is not None:
    in_specs += [PartitionSpec(EXPERT_AXIS, tensor), PartitionSpec(EXPERT_AXIS, tensor),
                 PartitionSpec(EXPERT_AXIS, None)]
    arguments += list(biases)
  # check_vma=False: the expert kernels are written for whole arrays (a kernel's lax.cond
  # with a constant branch is not typed per device); the outputs' layout is stated here.
  out = jax.shard_map(local, mesh=mesh, in_specs=tuple(in_specs), out_specs=rows,
                      check_vma=False)(*arguments)
  return out[:tokens]
