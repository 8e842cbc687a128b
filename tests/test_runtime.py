"""keep_host_memory_resident: re-exec with glibc tunables, and what they buy."""

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

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")


def run_probe(**env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ("GLIBC_TUNABLES", "RLHF_JAX_RESIDENT_HOST_MEMORY")}
  environment.update(env)
  result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=environment, timeout=120, check=True)
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_reexec_sets_tunables_and_stops_refaulting():
  resident = run_probe()
  assert "glibc.malloc.mmap_max=0" in resident["tunables"]
  pages = 320e6 / 4096
  assert resident["faults"][0] > 0.9 * pages  # first touch faults...
  assert max(resident["faults"][1:]) < 0.05 * pages  # ...reuse does not


def test_opt_out_keeps_default_malloc():
  default = run_probe(RLHF_JAX_RESIDENT_HOST_MEMORY="0")
  assert default["tunables"] == ""
  pages = 320e6 / 4096
  assert min(default["faults"]) > 0.9 * pages  # glibc mmaps and unmaps each time
