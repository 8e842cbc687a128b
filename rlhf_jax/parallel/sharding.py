"""Logical axis names → mesh axes, by one rules table per layout.

Model parameters carry logical axis names (`embed`, `mlp`, `heads`, ...). A
rules table maps each name to a mesh axis (or None: replicated). Changing the
parallelism is changing the table, never the model (the maxtext idea).

TRAIN_RULES is FSDP-heavy: every matrix is split over `fsdp` along `embed`
(parameters and optimizer state shard; XLA all-gathers them per layer) and
over `tensor` along heads / mlp / vocab. GENERATE_RULES is tensor-heavy and
replicated over `data` and `fsdp`: decoding wants whole weights next to each
batch shard. Both leave the leading "layers" axis of stacked layers
(`DecoderConfig.scan_layers`) unsplit: each scan step reads one whole layer
slice. `reshard` moves a parameter tree between the two on device
(ReaLHF's parameter reallocation), never through the host.

Both split a mixture of experts' [X, ...] expert weights over the `expert` mesh axis
(expert parallelism: `models/moe/parallel.py` exchanges the tokens), their other
dimensions as a dense MLP's. The batch rows are split over `expert` too, as over data and
fsdp: outside the experts' layers the expert axis is one more data-parallel axis.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

Rules = Mapping[str, Any]

TRAIN_RULES: Rules = {
    "vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor",
    "head_dim": None, "mlp": "tensor", "norm": None, "layers": None,
    "lora_rank": None, "expert": "expert",
}
GENERATE_RULES: Rules = {
    "vocab": "tensor", "embed": None, "heads": "tensor", "kv_heads": "tensor",
    "head_dim": None, "mlp": "tensor", "norm": None, "layers": None,
    "lora_rank": None, "expert": "expert",
}
BATCH_AXES = ("data", "fsdp", "expert")  # the batch dimension is split over all three


def logical_to_spec(axes: tuple, rules: Rules) -> PartitionSpec:
  """PartitionSpec for one parameter's logical axis names."""
  for name in axes:
    if name not in rules:
      raise ValueError(f"logical axis {name!r} has no rule; rules cover "
                       f"{', '.join(sorted(rules))}.")
  return PartitionSpec(*(rules[name] for name in axes))


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def param_shardings(abstract_params, logical_axes, mesh: jax.sharding.Mesh,
                    rules: Rules = TRAIN_RULES):
  """A params-shaped tree of NamedShardings.

  Args:
    abstract_params: params (arrays or ShapeDtypeStructs).
    logical_axes: params-shaped tree of logical-axis tuples
      (`FunctionalModel.logical_axes()`).
    mesh: the device mesh.
    rules: logical name → mesh axis (or None).
  Returns:
    The shardings.
  Raises:
    ValueError naming the parameter when a dimension does not divide by the
    mesh axes it is split over (change the mesh or the rules).
  """
  def one(path, leaf, axes):
    spec = logical_to_spec(tuple(axes), rules)
    shape = leaf.shape
    if len(spec) != len(shape):
      raise ValueError(f"parameter {_path_name(path)}: {len(axes)} logical axes {axes} for "
                       f"shape {shape}.")
    for dim, name, mesh_axes in zip(shape, axes, spec):
      if mesh_axes is None:
        continue
      names = mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)
      parts = 1
      for mesh_axis in names:
        parts *= mesh.shape[mesh_axis]
      if dim % parts:
        raise ValueError(f"parameter {_path_name(path)} of shape {shape}: dimension {dim} "
                         f"({name!r} → {mesh_axes!r}) does not divide "
                         f"into {parts} shards; change the mesh or the rules.")
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(
      one, abstract_params, logical_axes,
      is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 2) -> NamedSharding:
  """Sharding for a [batch, ...] array: batch over (data, fsdp, expert), the rest
  replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def shard_params(params, shardings):
  """Places every parameter on its sharding."""
  return jax.device_put(params, shardings)


def reshard(params, target_shardings, *, donate: bool = False):
  """Moves a parameter tree to another layout on device (no host round trip).

  Values are unchanged bit for bit. With `donate=True` the source buffers may
  be reused (do not touch `params` afterwards).
  """
  return jax.device_put(params, target_shardings, donate=donate)
