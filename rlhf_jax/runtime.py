"""Process-level settings that must be in place before the program starts.

Keeping XLA:CPU's temporary buffers resident
--------------------------------------------
XLA:CPU packs an executable's temporaries into one allocation per call (3.3 GB
for the W2 PPO step on the benchmark model). glibc serves such a request with
`mmap` and unmaps it on free, so every step page-faults and zero-fills the
whole buffer again: ~820k minor faults and 3-5 s of system time per W2 step
on 2 cores. Telling glibc never to `mmap`, never to trim, and to use one arena
keeps the freed memory in the heap, and the next step reuses it without a
fault. These are `GLIBC_TUNABLES`, read only at process start (the trim
threshold needs more than `mallopt`'s 2 GiB `int`), so `keep_host_memory_resident`
re-executes the current program once with them set. The price: the process
keeps its peak host memory until it exits, which is what a training process
does anyway.

Opt out with RLHF_JAX_RESIDENT_HOST_MEMORY=0. Not glibc (macOS, musl): no-op.
"""

from __future__ import annotations

import os
import platform
import sys

RESIDENT_MALLOC_TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                            "glibc.malloc.trim_threshold=1099511627776")
_OPT_OUT = "RLHF_JAX_RESIDENT_HOST_MEMORY"


def keep_host_memory_resident(arguments: list[str] | None = None) -> bool:
  """Re-executes this program once with RESIDENT_MALLOC_TUNABLES in GLIBC_TUNABLES.

  Call it first thing in a launcher's `__main__` (before JAX allocates). Returns
  False without doing anything when the tunables are already set, when opted
  out (RLHF_JAX_RESIDENT_HOST_MEMORY=0), or off glibc; otherwise does not return.

  Args:
    arguments: the interpreter arguments to re-run with (default: this
      process's own, `sys.orig_argv[1:]`, so `python -m ...` and `python -c ...`
      survive).
  """
  if os.environ.get(_OPT_OUT) == "0" or platform.libc_ver()[0] != "glibc":
    return False
  current = os.environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.mmap_max=0" in current:
    return False
  env = dict(os.environ)
  env["GLIBC_TUNABLES"] = ":".join(filter(None, [current, RESIDENT_MALLOC_TUNABLES]))
  env[_OPT_OUT] = "1"
  arguments = list(sys.orig_argv[1:] if arguments is None else arguments)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *arguments], env)
  return True  # unreachable


DEFAULT_COMPILE_CACHE = "~/.cache/rlhf_jax/xla"


def enable_compile_cache(directory: str, min_compile_s: float = 1.0) -> str | None:
  """Turns on JAX's persistent compilation cache in `directory` ('' = leave it off).

  A second run of the same programs (same shapes, flags, jax version) loads the
  compiled executables instead of compiling them again: on GPU the first generate
  call of a 0.5B model took 65-69 s to compile in every run. XLA's own caches
  (GPU autotuning results, kernel cache) are kept there too. Programs that compile
  in under `min_compile_s` seconds are not stored.

  Returns:
    The absolute directory, or None when off.
  """
  if not directory:
    return None
  import jax  # pylint: disable=import-outside-toplevel
  path = os.path.abspath(os.path.expanduser(directory))
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  jax.config.update("jax_persistent_cache_enable_xla_caches", "all")
  return path


def quiet_library_logs() -> None:
  """Shows only warnings from absl logging (Orbax logs every save at INFO) unless
  the user passed --verbosity / -v. Call at the start of an absl `main`."""
  from absl import flags
  from absl import logging
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
