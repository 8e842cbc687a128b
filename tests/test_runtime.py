"""keep_host_memory_resident (re-exec with glibc tunables, and what they buy); the GPU
autotune file chosen per device and XLA version, and XLA_FLAGS composed around the user's."""

import json
import os
import platform
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, os, resource
from rlhf_jax.runtime import keep_host_memory_resident
keep_host_memory_resident()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 320_000_000  # like XLA's per-call temporary buffer: malloc, touch, free
faults = []
for _ in range(4):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  pointer = libc.malloc(size)
  ctypes.memset(pointer, 1, size)
  libc.free(pointer)
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tunables": os.environ.get("GLIBC_TUNABLES", ""), "faults": faults}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")


def run_probe(**env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ("GLIBC_TUNABLES", "RLHF_JAX_RESIDENT_HOST_MEMORY")}
  environment.update(env)
  result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=environment, timeout=120, check=True)
  return json.loads(result.stdout.strip().splitlines()[-1])


@glibc_only
def test_reexec_sets_tunables_and_stops_refaulting():
  resident = run_probe()
  assert "glibc.malloc.mmap_max=0" in resident["tunables"]
  pages = 320e6 / 4096
  assert resident["faults"][0] > 0.9 * pages  # first touch faults...
  assert max(resident["faults"][1:]) < 0.05 * pages  # ...reuse does not


@glibc_only
def test_opt_out_keeps_default_malloc():
  default = run_probe(RLHF_JAX_RESIDENT_HOST_MEMORY="0")
  assert default["tunables"] == ""
  pages = 320e6 / 4096
  assert min(default["faults"]) > 0.9 * pages  # glibc mmaps and unmaps each time


H100 = "NVIDIA H100 80GB HBM3"


def test_autotune_file_is_named_by_device_and_xla_version(tmp_path):
  from rlhf_jax import runtime
  path = runtime.autotune_file(tmp_path, H100, "jaxlib0.11.2")
  assert path == tmp_path / "nvidia-h100-80gb-hbm3-jaxlib0.11.2.textproto"
  assert runtime.autotune_file(tmp_path, "NVIDIA H200", "jaxlib0.11.2") != path
  assert runtime.autotune_file(tmp_path, H100, "jaxlib0.11.3") != path
  assert runtime.xla_version().startswith("jaxlib0.")
  with pytest.raises(ValueError, match="device"):
    runtime.autotune_key("", "jaxlib0.11.2")


def test_autotune_flags_load_only_the_matching_file(tmp_path):
  from rlhf_jax import runtime
  carried = tmp_path / "carried"
  carried.mkdir()
  (carried / "nvidia-h100-80gb-hbm3-jaxlib0.11.2.textproto").write_text("version: 3\n")
  flags = runtime.autotune_flags(carried, H100, "jaxlib0.11.2", dump_dir=tmp_path / "out",
                                 level=0)
  assert flags == [
      f"--xla_gpu_load_autotune_results_from={carried}/nvidia-h100-80gb-hbm3-jaxlib0.11.2.textproto",
      f"--xla_gpu_dump_autotune_results_to={tmp_path}/out/nvidia-h100-80gb-hbm3-jaxlib0.11.2.textproto",
      "--xla_gpu_autotune_level=0"]
  # another XLA (or device): nothing to load, this run's results written under its own name
  other = runtime.autotune_flags(carried, H100, "jaxlib0.12.0", dump_dir=tmp_path / "out")
  assert other == [f"--xla_gpu_dump_autotune_results_to={tmp_path}/out/"
                   "nvidia-h100-80gb-hbm3-jaxlib0.12.0.textproto"]
  assert runtime.autotune_flags(carried, None, "jaxlib0.11.2", dump_dir=tmp_path) == []
  with pytest.raises(ValueError, match="autotune_level=7"):
    runtime.autotune_flags(None, H100, level=7)


def test_xla_flags_keep_the_users_own():
  from rlhf_jax import runtime
  env = {"XLA_FLAGS": "--xla_gpu_autotune_level=4 --xla_dump_to=/tmp/d"}
  out = runtime.set_xla_flags(["--xla_gpu_autotune_level=0",
                               "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"], env)
  assert out == env["XLA_FLAGS"] == ("--xla_gpu_autotune_level=4 --xla_dump_to=/tmp/d "
                                     "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL")
  assert runtime.set_xla_flags(["--xla_gpu_autotune_level=1"], {}) == \
      "--xla_gpu_autotune_level=1"
  with pytest.raises(ValueError, match="must start with"):
    runtime.compose_xla_flags("", ["xla_gpu_autotune_level=1"])


def test_xla_flags_refused_once_a_backend_runs():
  """XLA reads XLA_FLAGS once: setting them later would be silently ignored."""
  import jax
  from rlhf_jax import runtime
  jax.numpy.zeros(1).block_until_ready()
  with pytest.raises(RuntimeError, match="already running"):
    runtime.set_xla_flags(["--xla_gpu_autotune_level=0"])


def test_a_forced_host_device_count_gets_a_cache_directory_of_its_own(tmp_path):
  """JAX leaves the forced CPU device count out of its cache key: one-device and emulated
  mesh processes must not share executables."""
  from rlhf_jax.runtime import compile_cache_directory  # pylint: disable=import-outside-toplevel
  base = str(tmp_path / "cache")
  assert compile_cache_directory(base, "") == base
  assert compile_cache_directory(base, "--xla_cpu_enable_fast_math=false") == base
  eight = compile_cache_directory(
      base, "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8")
  assert eight == os.path.join(base, "host-devices-8")
  assert compile_cache_directory(base, "--xla_force_host_platform_device_count=2") != eight
  assert compile_cache_directory("~/c", "").startswith(os.path.expanduser("~"))
