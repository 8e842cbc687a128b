"""benchmarks/gpu.py's shared pieces: the model shapes, the H100 peaks, FLOP counts, the JSON
record writer and the device / memory / compile-cache helpers of every part."""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import sys
import time
import traceback

import numpy as np


ROOT = pathlib.Path(__file__).resolve().parents[1]


PEAK_BF16 = 989e12  # H100 SXM, dense bf16


HBM_BW = 3.35e12  # H100 SXM HBM3, bytes/s


QWEN05 = dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
              head_dim=64, intermediate_size=4864, tie_embeddings=True, qkv_bias=True,
              rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6)


TINY = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, intermediate_size=128, tie_embeddings=True, qkv_bias=True,
            rope_theta=1000000.0, max_position_embeddings=512, rms_norm_eps=1e-6)


SHAPES = {
    False: {"g1": (16, 1024, 256), "g1b": (32, 1024, 256), "g4": ((16, 32), 1024, 256),
            "g2": (128, 128, 512, 16), "g3": (256, 128, 512, 32)},
    True: {"g1": (2, 64, 16), "g1b": (4, 64, 16), "g4": ((2,), 64, 16),
           "g2": (4, 8, 16, 4), "g3": (8, 8, 16, 8)},
}


_STDOUT = sys.stdout  # the JSON lines; anything else printed goes to stderr (see main)
_STDERR = sys.stderr  # progress lines (main may point sys.stdout at stderr too)
_STARTED = time.perf_counter()


def progress(message: str) -> None:
  """One line on stderr, `[gpu.py +12.3s] message`, at every start and end of a phase, so the
  log of a step that scripts/gpu_check.sh kills at its cap says where it stopped (its last
  such line goes into the timeout record)."""
  _STDERR.write(f"[gpu.py +{time.perf_counter() - _STARTED:.1f}s] {message}\n")
  _STDERR.flush()


def dump_stacks_on_term() -> None:
  """On SIGTERM (gpu_check.sh's `timeout`), print every Python thread's stack to stderr
  before dying: where the process was when its step ran out of time."""
  import faulthandler
  faulthandler.register(signal.SIGTERM, file=_STDERR, all_threads=True, chain=True)


def _finite(value):
  """JSON without NaN / Infinity (strict parsers reject them)."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  if isinstance(value, (np.floating, np.integer)):
    return _finite(value.item())
  return value


def emit(record: dict) -> None:
  """One JSON line on the real stdout (labelled with gpu_check.sh's step, when it runs one)."""
  step = os.environ.get("RLHF_JAX_GPU_STEP")
  record = {**record, "step": step} if step and "step" not in record else record
  _STDOUT.write(json.dumps(_finite(record)) + "\n")
  _STDOUT.flush()


def error_record(part: str, who: str, args, error: BaseException) -> dict:
  text = f"{type(error).__name__}: {error}"
  oom = any(s in text for s in ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory",
                                "OutOfMemory", "CUDA out of memory"))
  return {"part": part, "who": who, "tiny": args.tiny, "error": text[:4000], "oom": oom,
          "traceback": traceback.format_exc()[-4000:]}


def model_shape(args) -> dict:
  return dict(TINY if args.tiny else QWEN05)


def matmul_flops_per_token(shape: dict) -> tuple[float, float]:
  """(body, head) forward FLOPs per token (gpu_probe.py's count)."""
  h, i, v, layers = (shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"],
                     shape["num_layers"])
  q = shape["num_heads"] * shape["head_dim"]
  kv = shape["num_kv_heads"] * shape["head_dim"]
  per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
  return 2 * layers * per_layer, 2 * h * v


def train_flops(shape: dict, batch: int, seq: int, prompt: int) -> float:
  """Forward + backward FLOPs of one step: 3 × (body on every token, head on the response
  positions, causal attention), as gpu_probe.py counts them."""
  body, head = matmul_flops_per_token(shape)
  attention = 2 * 2 * batch * seq * seq / 2 * shape["num_heads"] * shape["head_dim"] * \
      shape["num_layers"]
  return 3 * (body * batch * seq + head * batch * (seq - prompt + 1) + attention)


def jax_device_info() -> dict:
  import jax
  device = jax.devices()[0]
  return {"device": getattr(device, "device_kind", str(device)), "backend": jax.default_backend(),
          "jax": jax.__version__}


def jax_peak_gib() -> float | None:
  import jax
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001 (backends without memory stats)
    return None
  if not stats or "peak_bytes_in_use" not in stats:
    return None
  return stats["peak_bytes_in_use"] / 2**30


def memory_analysis_gib(compiled) -> dict | None:
  """XLA's memory analysis of a compiled program, in GiB (None where the backend has none)."""
  try:
    memory = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    return None
  if memory is None:
    return None
  out = {}
  for name in ("temp", "argument", "output", "alias", "generated_code", "host_temp"):
    value = getattr(memory, f"{name}_size_in_bytes", None)
    if value is not None:
      out[f"{name}_gib"] = round(value / 2**30, 4)
  if {"temp_gib", "argument_gib", "output_gib"} <= out.keys():
    # arguments + outputs + temporaries, minus outputs that alias (donated) arguments
    out["total_gib"] = round(out["temp_gib"] + out["argument_gib"] + out["output_gib"]
                             - out.get("alias_gib", 0.0), 4)
  return out


def enable_compile_cache(directory: str | None) -> dict:
  """JAX's persistent compilation cache in `directory` (every program stored); how many
  entries it held before this process ran (0: a cold cache)."""
  if not directory:
    return {}
  import jax
  path = os.path.abspath(os.path.expanduser(directory))
  os.makedirs(path, exist_ok=True)
  entries = len(os.listdir(path))
  jax.config.update("jax_compilation_cache_dir", path)
  for name, value in (("jax_persistent_cache_min_compile_time_secs", 0.0),
                      ("jax_persistent_cache_min_entry_size_bytes", 0),
                      ("jax_persistent_cache_enable_xla_caches", "all")):
    try:
      jax.config.update(name, value)
    except Exception:  # noqa: BLE001 (an older jax without this option)
      pass
  return {"compile_cache": path, "compile_cache_entries_at_start": entries}
