"""Several processes (hosts) running one program: the `distributed` config section,
start-up, and host values shared between processes.

    distributed.coordinator_address   "host:port" of process 0's coordinator
    distributed.num_processes         processes in the job; 0 = detect (SLURM, Open MPI,
                                      TPU pods, Kubernetes: `jax.distributed`'s detection)
    distributed.process_id            this process's index; -1 = detect
    distributed.local_device_count    CPU only: devices each process emulates (0 = 1)

With the defaults a plain launch is one process, and a launch under a cluster manager
that JAX recognises joins the job with no flags. Every process runs the same program:
the same config, the same data order and seeds; what differs by process is decided by
`jax.process_index()` in two places only: the sampler's share of the prompts
(sampling/process_shards.py), and who writes files (`is_main_process`).
"""

from __future__ import annotations

import functools
import itertools
import os
import pickle
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from rlhf_jax.config_errors import invalid
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section

_EXCHANGE_TIMEOUT_MS = 30 * 60 * 1000  # a peer's share of a long rollout may take a while


def distributed_config() -> ml_collections.ConfigDict:
  """The `distributed` config section with its defaults (one comment per field)."""
  config = ml_collections.ConfigDict()
  config.coordinator_address = ""  # "host:port" of process 0 ('' = detected, or one process).
  config.num_processes = 0  # Processes in the job; 0 = detect (1 when no cluster is found).
  config.process_id = -1  # This process's index in [0, num_processes); -1 = detect.
  config.local_device_count = 0  # CPU only: devices per process (0 = the platform's one).
  config.initialization_timeout_s = 300  # How long to wait for every process to join.
  return config


def validate_distributed_config(config: ml_collections.ConfigDict,
                                prefix: str = "distributed") -> None:
  """Raises ConfigError naming the `config.<prefix>.*` field that cannot start a job."""
  if not isinstance(config.num_processes, int) or config.num_processes < 0:
    invalid(f"{prefix}.num_processes", config.num_processes, "must be an int >= 0 "
            "(0 = detect)")
  if not isinstance(config.process_id, int) or config.process_id < -1:
    invalid(f"{prefix}.process_id", config.process_id, "must be an int >= 0, or -1 (detect)")
  if config.num_processes and config.process_id >= config.num_processes:
    invalid(f"{prefix}.process_id", config.process_id,
            f"must be < distributed.num_processes={config.num_processes}")
  if config.num_processes > 1 and not config.coordinator_address and not cluster_detected():
    invalid(f"{prefix}.coordinator_address", "", f"needs 'host:port' for "
            f"distributed.num_processes={config.num_processes} when no cluster manager "
            "(SLURM, Open MPI, TPU pod, Kubernetes) is detected")
  if config.coordinator_address and not cluster_detected():
    for field, unset in (("num_processes", 0), ("process_id", -1)):
      if config[field] == unset:
        invalid(f"{prefix}.{field}", unset, f"must be set with distributed.coordinator_address"
                f"={config.coordinator_address!r} when no cluster manager is detected")
  if config.coordinator_address and ":" not in config.coordinator_address:
    invalid(f"{prefix}.coordinator_address", config.coordinator_address, "must be 'host:port'")
  if not isinstance(config.local_device_count, int) or config.local_device_count < 0:
    invalid(f"{prefix}.local_device_count", config.local_device_count, "must be an int >= 0")
  if config.initialization_timeout_s < 1:
    invalid(f"{prefix}.initialization_timeout_s", config.initialization_timeout_s,
            "must be >= 1")


def check_distributed_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `distributed` section (several processes or hosts: docs/scaling.md)."""
  del checking
  validate_distributed_config(c.distributed)


SECTION = Section("distributed", at="distributed", fields=distributed_config,
                  check=check_distributed_section)


def cluster_detected() -> bool:
  """Whether `jax.distributed.initialize()` would find a cluster manager by itself.

  Mirrors jax's own auto-detection, which skips opt-in methods: an installed `mpi4py`
  is "present" everywhere, yet jax uses it only when asked, so counting it would start
  a job with no coordinator on any machine that has mpi4py.
  """
  from jax._src import clusters  # pylint: disable=import-outside-toplevel
  return any(not cluster.opt_in_only_method and cluster.is_env_present()
             for cluster in clusters.ClusterEnv._cluster_types)  # pylint: disable=protected-access


def initialize(config: ml_collections.ConfigDict, *, platform: str | None = None) -> bool:
  """Joins the job that `config` (the `distributed` section) describes; returns whether
  it started `jax.distributed` (False: one process). Call before anything touches a device.

  On CPU it selects gloo collectives, so a jitted program spans the processes, and
  `local_device_count` emulated devices per process.
  """
  validate_distributed_config(config)
  platform = platform or os.environ.get("JAX_PLATFORMS", "").split(",")[0]
  if config.local_device_count:
    jax.config.update("jax_num_cpu_devices", config.local_device_count)
  if config.num_processes == 1 or (config.num_processes == 0 and not cluster_detected()
                                   and not config.coordinator_address):
    return False
  if platform in ("", "cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=config.coordinator_address or None,
      num_processes=config.num_processes or None,
      process_id=None if config.process_id < 0 else config.process_id,
      initialization_timeout=int(config.initialization_timeout_s))
  return True


def is_main_process() -> bool:
  """Whether this process writes the run's files (metrics, logs, the final policy)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process of the job reaches `barrier(name)` (no-op alone)."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  distributed.global_state.client.wait_at_barrier(f"rlhf_jax/{name}", _EXCHANGE_TIMEOUT_MS)


def largest_across_processes(value: int) -> int:
  """The largest of every process's `value` (its own alone): one decision for the job
  where each process has its own view (a signal that reached one process)."""
  if jax.process_count() == 1:
    return int(value)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def all_processes(flag: bool) -> bool:
  """Whether `flag` holds on every process of the job (itself alone): e.g. a checkpoint
  that one host could not read is unreadable for the job."""
  return not largest_across_processes(int(not flag))


def process_share(count: int, index: int | None = None, processes: int | None = None
                  ) -> slice:
  """The contiguous part of `count` items that process `index` handles: equal parts,
  the first `count % processes` processes one item more."""
  index = jax.process_index() if index is None else index
  processes = jax.process_count() if processes is None else processes
  base, extra = divmod(count, processes)
  start = index * base + min(index, extra)
  return slice(start, start + base + (1 if index < extra else 0))


_EXCHANGES = itertools.count()


class HostExchange:
  """All-gathers picklable host values between the processes of a job through
  `jax.distributed`'s key-value store (no device memory, no collective program).

  Every process creates its exchanges in the same order and calls `all_gather` the same
  number of times in the same order; the n-th call of each process meets the n-th of the
  others. Each exchange has keys of its own (a second one never meets the first's).
  """

  def __init__(self, name: str):
    self.name = f"{name}{next(_EXCHANGES)}"
    self.calls = 0

  def all_gather(self, value: Any) -> list[Any]:
    """[value of process 0, value of process 1, ...] on every process."""
    processes = jax.process_count()
    if processes == 1:
      return [value]
    from jax._src import distributed  # pylint: disable=import-outside-toplevel
    client = distributed.global_state.client
    key = f"rlhf_jax/{self.name}/{self.calls}"
    self.calls += 1
    me = jax.process_index()
    client.key_value_set_bytes(f"{key}/{me}", pickle.dumps(value))
    values = [value if p == me else pickle.loads(
        client.blocking_key_value_get_bytes(f"{key}/{p}", _EXCHANGE_TIMEOUT_MS))
              for p in range(processes)]
    # Everyone has read every value before the keys go: a late reader never misses one.
    client.wait_at_barrier(f"{key}/read", _EXCHANGE_TIMEOUT_MS)
    client.key_value_delete(f"{key}/{me}")
    return values


@functools.lru_cache(maxsize=None)
def _replicate(sharding: jax.sharding.Sharding):
  """A jitted identity whose output is `sharding` (one compile per shape, not per call)."""
  return jax.jit(lambda value: value, out_shardings=sharding)


def fully_replicated_host_value(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """The whole value of every (possibly cross-process) array of `tree` on this host:
  replicated over `mesh` by a jitted copy, leaf by leaf (one leaf's copy at a time on
  each device), then read from a local device.

  Every process must call it (the copy is a collective program)."""
  replicate = _replicate(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  return jax.tree.map(lambda x: replicate(x).addressable_data(0), tree)


def host_values(tree: Any) -> Any:
  """`jax.device_get(tree)` that also reads arrays spread over several processes (each
  replicated first by a jitted copy: every process must call it, in the same order)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      whole = jax.sharding.NamedSharding(x.sharding.mesh, jax.sharding.PartitionSpec())
      return np.asarray(_replicate(whole)(x).addressable_data(0))
    return jax.device_get(x)
  return jax.tree.map(one, tree)


def local_devices(devices: Sequence[jax.Device]) -> list[jax.Device]:
  """The devices of `devices` that this process drives."""
  me = jax.process_index()
  return [d for d in devices if d.process_index == me]
