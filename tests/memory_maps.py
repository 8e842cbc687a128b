"""Keeps a long test process under the kernel's limit on memory maps (vm.max_map_count).

XLA:CPU maps three regions (code, read-only data, data) for every executable it keeps,
and an executable lives until its jitted function dies or `jax.clear_caches()` runs: a
jit called with many shapes keeps one per shape, and so do eager jax.numpy ops. The whole
one-device suite in one process kept ~20k of them; at vm.max_map_count (65530 by
default) LLVM's next mmap fails and the process dies with SIGSEGV, with no Python
traceback (three fresh-clone CI runs, each in tests/training/test_loop.py).
"""

import gc
import os

# Clear JAX's caches when a process holds this fraction of the allowed maps; stop the
# run, naming the count, when clearing leaves it above the second fraction.
CLEAR_AT = 0.5
GIVE_UP_AT = 0.85


def memory_maps(pid: int | str = "self") -> int:
  """The number of memory maps a process holds (lines of /proc/<pid>/maps)."""
  with open(f"/proc/{pid}/maps", "rb") as maps:
    return sum(1 for _ in maps)


def max_map_count() -> int | None:
  """The kernel's per-process limit on memory maps, or None where it cannot be read."""
  try:
    with open("/proc/sys/vm/max_map_count", encoding="ascii") as limit:
      return int(limit.read())
  except (OSError, ValueError):
    return None


def relieve(limit: int | None) -> tuple[int, int] | None:
  """Clears JAX's compile caches when this process holds more than CLEAR_AT * `limit`
  maps. Returns (maps before, maps after) when it cleared, else None.

  Raises:
    RuntimeError: clearing left more than GIVE_UP_AT * `limit` maps (something alive
      holds the executables; the next compile would crash the process).
  """
  if limit is None:
    return None
  before = memory_maps()
  if before <= CLEAR_AT * limit:
    return None
  import jax  # pylint: disable=import-outside-toplevel
  jax.clear_caches()
  gc.collect()
  after = memory_maps()
  if after > GIVE_UP_AT * limit:
    raise RuntimeError(
        f"process {os.getpid()} holds {after} memory maps of the kernel's "
        f"vm.max_map_count={limit} even after jax.clear_caches(): live objects keep "
        f"XLA:CPU executables (3 maps each); the next compile would die with SIGSEGV")
  return before, after
