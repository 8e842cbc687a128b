"""benchmarks/gpu.py's process set-up and profiles: XLA flags before JAX starts, and one
step under the profiler as a Perfetto trace.

XLA reads XLA_FLAGS once, when the first backend starts, so `apply_xla_flags` runs before
any JAX computation of a measurement: the flags given with --xla-flag, the autotune flags
of `rlhf_jax.runtime.autotune_flags` (the carried results file for this GPU and XLA from
--autotune-dir, this run's results into --autotune-dump, --autotune-level), all added to the
user's XLA_FLAGS without replacing a flag the user set.

`profiled(directory, name)` runs its body under `jax.profiler.trace(...,
create_perfetto_trace=True)` and keeps `<directory>/profile_<name>.json.gz` (open it at
ui.perfetto.dev) when it is at most 15 MiB (the device tool returns files up to 16 MiB).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile

MAX_TRACE_BYTES = 15 * 2**20


def apply_xla_flags(args) -> dict:
  """Sets XLA_FLAGS for this process from the arguments; what it set, for the records."""
  from rlhf_jax import runtime

  device = runtime.gpu_device_name()
  flags = list(args.xla_flag or [])
  flags += runtime.autotune_flags(args.autotune_dir, device, dump_dir=args.autotune_dump,
                                  level=args.autotune_level)
  if args.autotune_dump and device:
    os.makedirs(args.autotune_dump, exist_ok=True)
  xla_flags = runtime.set_xla_flags(flags) if flags else os.environ.get("XLA_FLAGS", "")
  info = {"xla_flags": xla_flags}
  loaded = [f for f in flags if f.startswith("--xla_gpu_load_autotune_results_from=")]
  info["autotune_loaded"] = loaded[0].split("=", 1)[1] if loaded else None
  return info


@contextlib.contextmanager
def profiled(directory: str | None, name: str, record: dict):
  """Runs the body under the JAX profiler when `directory` is set; record["profile"] says
  where the Perfetto trace went (or why it was not kept)."""
  if not directory:
    yield
    return
  import jax

  scratch = tempfile.mkdtemp(prefix=f"profile_{name}_")
  try:
    with jax.profiler.trace(scratch, create_perfetto_trace=True):
      yield
    traces = sorted(pathlib.Path(scratch).rglob("perfetto_trace.json.gz"))
    if not traces:
      record["profile"] = {"error": f"no perfetto_trace.json.gz under {scratch}"}
      return
    size = traces[-1].stat().st_size
    target = pathlib.Path(directory) / f"profile_{name}.json.gz"
    if size > MAX_TRACE_BYTES:
      record["profile"] = {"dropped_bytes": size, "limit_bytes": MAX_TRACE_BYTES}
      return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(traces[-1], target)
    record["profile"] = {"file": str(target), "bytes": size}
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
