"""The `distributed` section, process shares and the host exchange in one process (the
job of several processes: tests/multidevice/test_distributed.py)."""

import pytest

from rlhf_jax import parallel
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.parallel import distributed


def config(**fields):
  c = parallel.distributed_config()
  c.update(fields)
  return c


@pytest.mark.parametrize("fields, field", [
    ({"num_processes": -1}, "distributed.num_processes"),
    ({"process_id": -2}, "distributed.process_id"),
    ({"num_processes": 2, "process_id": 2, "coordinator_address": "h:1"},
     "distributed.process_id"),
    ({"num_processes": 2, "process_id": 0}, "distributed.coordinator_address"),
    ({"coordinator_address": "nohost", "num_processes": 2, "process_id": 0},
     "distributed.coordinator_address"),
    ({"coordinator_address": "h:1"}, "distributed.num_processes"),
    ({"coordinator_address": "h:1", "num_processes": 2}, "distributed.process_id"),
    ({"local_device_count": -1}, "distributed.local_device_count"),
    ({"initialization_timeout_s": 0}, "distributed.initialization_timeout_s"),
])
def test_bad_fields_are_named(fields, field, monkeypatch):
  monkeypatch.setattr(distributed, "cluster_detected", lambda: False)
  with pytest.raises(ConfigError, match=f"config.{field}"):
    parallel.validate_distributed_config(config(**fields))


def test_defaults_are_one_process_without_a_cluster(monkeypatch):
  monkeypatch.setattr(distributed, "cluster_detected", lambda: False)
  parallel.validate_distributed_config(config())
  assert not parallel.initialize(config())
  assert not parallel.initialize(config(num_processes=1))


def test_opt_in_cluster_methods_are_not_a_cluster(monkeypatch):
  """jax skips opt-in methods (mpi4py, present wherever it is installed) unless asked:
  a machine with mpi4py and nothing else is one process, as jax would see it."""
  from jax._src import clusters

  class OptIn(clusters.ClusterEnv):
    opt_in_only_method = True

    @classmethod
    def is_env_present(cls):
      return True

  clusters.ClusterEnv._cluster_types.remove(OptIn)  # registered by __init_subclass__
  monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types",
                      [OptIn] + [c for c in clusters.ClusterEnv._cluster_types
                                 if c.opt_in_only_method])
  assert not distributed.cluster_detected()
  assert not parallel.initialize(config())


@pytest.mark.parametrize("count, processes", [(8, 2), (7, 3), (2, 4), (0, 2), (33, 8)])
def test_process_shares_cover_every_item_once_in_order(count, processes):
  shares = [parallel.process_share(count, p, processes) for p in range(processes)]
  items = [i for share in shares for i in range(count)[share]]
  assert items == list(range(count))
  sizes = [share.stop - share.start for share in shares]
  assert max(sizes) - min(sizes) <= 1


def test_one_process_exchange_and_host_values():
  import jax.numpy as jnp
  assert parallel.HostExchange("t").all_gather({"a": 1}) == [{"a": 1}]
  assert parallel.host_values({"x": jnp.arange(3)})["x"].tolist() == [0, 1, 2]
  assert parallel.is_main_process()
  parallel.barrier("alone")  # no job: returns at once
