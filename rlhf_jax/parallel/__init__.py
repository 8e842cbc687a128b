"""rlhf_jax.parallel: meshes (data, fsdp, tensor), sharding rules, resharding, multi-host."""

from rlhf_jax.parallel.chunks import run_in_chunks
from rlhf_jax.parallel.mesh import MESH_AXES
from rlhf_jax.parallel.mesh import describe
from rlhf_jax.parallel.mesh import initialize_distributed
from rlhf_jax.parallel.mesh import make_mesh
from rlhf_jax.parallel.mesh import resolve_axis_sizes
from rlhf_jax.parallel.sharding import GENERATE_RULES
from rlhf_jax.parallel.sharding import TRAIN_RULES
from rlhf_jax.parallel.sharding import batch_sharding
from rlhf_jax.parallel.sharding import logical_to_spec
from rlhf_jax.parallel.sharding import param_shardings
from rlhf_jax.parallel.sharding import reshard
from rlhf_jax.parallel.sharding import shard_params

__all__ = [
    "GENERATE_RULES", "MESH_AXES", "TRAIN_RULES", "batch_sharding", "describe",
    "initialize_distributed", "logical_to_spec", "make_mesh", "param_shardings", "reshard",
    "resolve_axis_sizes", "run_in_chunks", "shard_params",
]
