"""rlhf_jax.parallel: meshes (data, fsdp, expert, tensor), sharding rules, resharding,
multi-host."""

from rlhf_jax.parallel.chunks import run_in_chunks
from rlhf_jax.parallel.mesh import MESH_AXES
from rlhf_jax.parallel.mesh import describe
from rlhf_jax.parallel.mesh import expert_parallel_context
from rlhf_jax.parallel.distributed import HostExchange
from rlhf_jax.parallel.distributed import all_processes
from rlhf_jax.parallel.distributed import barrier
from rlhf_jax.parallel.distributed import largest_across_processes
from rlhf_jax.parallel.distributed import distributed_config
from rlhf_jax.parallel.distributed import fully_replicated_host_value
from rlhf_jax.parallel.distributed import host_values
from rlhf_jax.parallel.distributed import initialize
from rlhf_jax.parallel.distributed import is_main_process
from rlhf_jax.parallel.distributed import local_devices
from rlhf_jax.parallel.distributed import process_share
from rlhf_jax.parallel.distributed import validate_distributed_config
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
    "GENERATE_RULES", "HostExchange", "MESH_AXES", "TRAIN_RULES", "all_processes", "barrier",
    "batch_sharding", "describe", "distributed_config", "expert_parallel_context",
    "fully_replicated_host_value", "host_values", "initialize", "is_main_process",
    "largest_across_processes", "local_devices", "logical_to_spec", "make_mesh",
    "param_shardings", "process_share", "reshard", "resolve_axis_sizes", "run_in_chunks",
    "shard_params", "validate_distributed_config",
]
