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

GPU autotune results carried as a file
--------------------------------------
XLA:GPU autotunes every distinct GEMM fusion at compile time (tens of Triton
configurations each, compiled and timed): most of a first GPU compile, paid again
on every bare machine. `--xla_gpu_dump_autotune_results_to` writes what a run chose
and `--xla_gpu_load_autotune_results_from` reuses it; the results are only valid for
one device and one XLA, so the file is named by both (`autotune_file`). XLA reads
XLA_FLAGS once, when the first backend starts: `set_xla_flags` adds ours to the
user's (a flag the user set wins) and refuses once a backend is up.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable

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


def compile_cache_directory(directory: str, xla_flags: str | None = None) -> str:
  """The absolute cache directory for `directory` in a process started with `xla_flags`
  (default: $XLA_FLAGS): a sub-directory `host-devices-N` when the flags force N CPU host
  devices. JAX leaves `--xla_force_host_platform_device_count` out of its cache key, so
  without this a one-device process would load the executables an N-device process
  compiled for the same program."""
  path = os.path.abspath(os.path.expanduser(directory))
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  forced = [f.split("=", 1)[1] for f in flags.split()
            if f.startswith("--xla_force_host_platform_device_count=")]
  return os.path.join(path, f"host-devices-{forced[-1]}") if forced else path


def enable_compile_cache(directory: str, min_compile_s: float = 1.0) -> str | None:
  """Turns on JAX's persistent compilation cache in `directory` ('' = leave it off; a
  sub-directory per forced host-device count: `compile_cache_directory`).

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
  path = compile_cache_directory(directory)
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


def xla_version() -> str:
  """'jaxlib<version>': the XLA a process compiles with (autotune results are only valid
  for it), read without starting a JAX backend."""
  try:
    return "jaxlib" + importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    import jaxlib  # pylint: disable=import-outside-toplevel
    return "jaxlib" + jaxlib.__version__


def gpu_device_name() -> str | None:
  """The first NVIDIA GPU's name from nvidia-smi ('NVIDIA H100 80GB HBM3', as JAX's
  device_kind), without starting a backend; None without nvidia-smi or a GPU."""
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return None
  try:
    out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return None
  names = [line.strip() for line in out.splitlines() if line.strip()]
  return names[0] if names else None


def autotune_key(device: str, version: str) -> str:
  """'<device>-<version>' as a file stem of letters, digits, '.', '_' and '-' (the device
  tool's rule for returned files): ('NVIDIA H100 80GB HBM3', 'jaxlib0.11.2') →
  'nvidia-h100-80gb-hbm3-jaxlib0.11.2'."""
  if not device.strip() or not version.strip():
    raise ValueError(f"autotune_key: device {device!r} and version {version!r} must be named")
  slug = lambda text: re.sub(r"[^a-z0-9._]+", "-", text.strip().lower()).strip("-")
  return f"{slug(device)}-{slug(version)}"


def autotune_file(directory: str | os.PathLike, device: str,
                  version: str | None = None) -> pathlib.Path:
  """The autotune results file for (device, XLA version) in `directory`, whether it exists
  or not: `<directory>/<autotune_key>.textproto` (version: this process's `xla_version`)."""
  return pathlib.Path(directory) / f"{autotune_key(device, version or xla_version())}.textproto"


def autotune_flags(directory: str | os.PathLike | None, device: str | None,
                   version: str | None = None, *, dump_dir: str | os.PathLike | None = None,
                   level: int | None = None) -> list[str]:
  """XLA flags for GPU autotuning: load the carried results for this device and XLA when
  `directory` holds them, write this run's results into `dump_dir` under the same name,
  and set `--xla_gpu_autotune_level` (0: no autotuning, the library defaults) when given.
  No device (no GPU): no load or dump flag."""
  flags = []
  if device:
    carried = autotune_file(directory, device, version) if directory else None
    if carried is not None and carried.is_file():
      flags.append(f"--xla_gpu_load_autotune_results_from={carried.resolve()}")
    if dump_dir is not None:
      target = autotune_file(dump_dir, device, version)
      flags.append(f"--xla_gpu_dump_autotune_results_to={target.resolve()}")
  if level is not None:
    if not 0 <= int(level) <= 4:
      raise ValueError(f"--xla_gpu_autotune_level={level}: must be 0..4")
    flags.append(f"--xla_gpu_autotune_level={int(level)}")
  return flags


def _flag_name(flag: str) -> str:
  return flag.split("=", 1)[0].strip()


def compose_xla_flags(user: str, ours: Iterable[str]) -> str:
  """The user's XLA_FLAGS followed by each of `ours` whose name the user did not set (the
  user's value wins; one of ours repeated keeps its last value)."""
  taken = {_flag_name(f) for f in user.split()}
  added = {}
  for flag in ours:
    flag = flag.strip()
    if not flag.startswith("--"):
      raise ValueError(f"XLA flag {flag!r} must start with '--'")
    if _flag_name(flag) not in taken:
      added[_flag_name(flag)] = flag
  return " ".join([*user.split(), *added.values()])


def set_xla_flags(flags: Iterable[str], environ=None) -> str:
  """Adds `flags` to XLA_FLAGS in `environ` (default os.environ) by `compose_xla_flags`
  and returns the result. Call before JAX starts a backend: XLA reads XLA_FLAGS once, so
  flags set later would be ignored without a word, and this raises instead."""
  flags = list(flags)
  backends = getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None)
  if flags and environ is None and backends:
    raise RuntimeError(f"set_xla_flags({flags}): a JAX backend is already running; set "
                       "XLA_FLAGS before the first JAX computation.")
  environ = os.environ if environ is None else environ
  environ["XLA_FLAGS"] = compose_xla_flags(environ.get("XLA_FLAGS", ""), flags)
  return environ["XLA_FLAGS"]
