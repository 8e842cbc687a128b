"""benchmarks/gpu.py's part `kern`: may we trust the fused attention kernels on this machine?

Each fused training-attention kernel (`DecoderConfig.attention_impl` "cudnn", "pallas") is
compared with the XLA path (`grouped_query_attention(impl="xla")` on the dense mask the
decoder builds) on three layouts, forward and dq / dk / dv:

  causal   full rows;
  padded   right-padded rows (each row its own length);
  packed   three segments per row and buffer padding (segment 0), as `models.packing` lays
           them out.

Queries on padding are left out of the comparison (the kernels leave them undefined) but
must be finite. The ragged decode kernel (`decode_attention="pallas"`) is compared with the
XLA decode path (`cached_attention(kernel="xla")`) on left-padded rows of different lengths.

Every case runs in a process of its own (`python benchmarks/gpu_kern.py --case IMPL
LAYOUT`): a CUDA error such as CUDA_ERROR_ILLEGAL_INSTRUCTION is sticky for the process's
CUDA context, and on the H200 (2026-11-28) one crashing cuDNN case made every later case of
the shared process fail with it. Each case record has a `status`:

  ok       finite, and within the tolerance;
  wrong    it ran, but beyond the tolerance (`errors`) or not finite;
  crashed  its process died, timed out, or raised (a CUDA error among others):
           `first_error` is the first error line;
  skipped  not run here (cuDNN off an NVIDIA GPU, a kernel not built yet).

On a GPU the inputs are bfloat16 (the model's compute dtype) at the 0.5B model's head
shape; with --tiny, or off a GPU, float32 at a tiny shape (Pallas in interpret mode). The
last record is the `verdict`: {"cudnn": true | false | null, ...} (true: every case that ran
was ok; null: none ran) and `cases` {impl: {layout: status}}. scripts/gpu_check.sh asks
`--choose g1|g2 bench.jsonl` which kernel a step may use: cuDNN for G1 only when every
layout G1 uses (`G1_LAYOUTS`) is ok, else Pallas when it is, else none (the step is skipped
with the reason); the Pallas decode only when its case is ok. Never a kernel that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# bfloat16 inputs: outputs within 2e-2 and gradients within 5e-2 of the largest magnitude.
TOLERANCE = {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2)}
LAYOUTS = ("causal", "padded", "packed")
DECODE_LAYOUT = "left_padded_ragged"
# The layouts the G1 steps give the fused kernel: the decoder always passes its token mask,
# so the unpacked rows of a RolloutBatch take the kernels' padded form (cuDNN: one segment
# per row), never the plain causal call.
G1_LAYOUTS = ("padded",)


def shapes(tiny: bool) -> dict:
  """(batch, time, heads, kv_heads, dim) of the training kernels; (slots, cache) for decode."""
  if tiny:
    return {"train": (2, 64, 4, 2, 16), "decode": (4, 64)}
  return {"train": (2, 512, 14, 2, 64), "decode": (16, 640)}


def layout(name: str, batch: int, time: int, rng) -> tuple[np.ndarray, np.ndarray | None]:
  """(token_mask [B, T] bool, segment_ids [B, T] int32 or None) of one layout."""
  if name == "causal":
    return np.ones((batch, time), bool), None
  if name == "padded":
    lengths = np.array([time - time // 4 * (b % 2) - 3 * b for b in range(batch)])
    return np.arange(time)[None, :] < lengths[:, None], None
  segments = np.zeros((batch, time), np.int32)
  for b in range(batch):
    cuts = np.sort(rng.choice(np.arange(4, time - 8), 2, replace=False))
    end = time - 5 - 2 * b
    for s, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, end])):
      segments[b, lo:hi] = s + 1 + 3 * b
  return segments > 0, segments


def compare(got, want, valid_rows) -> float:
  """max |got − want| over the valid query rows, relative to max |want| (≥ 1)."""
  got = np.asarray(got, np.float32)
  want = np.asarray(want, np.float32)
  rows = valid_rows.reshape(valid_rows.shape + (1,) * (got.ndim - 2))
  diff = np.abs(np.where(rows, got - want, 0.0)).max()
  return float(diff / max(1.0, float(np.abs(want).max())))


def train_case(impl: str, name: str, dims, dtype, rng) -> dict:
  """One (kernel, layout): forward and gradient errors against the XLA path."""
  import jax
  import jax.numpy as jnp

  from rlhf_jax.models.attention.xla import grouped_query_attention
  from rlhf_jax.models.blocks import attention_mask

  batch, time, heads, kv_heads, dim = dims
  token_mask, segment_ids = layout(name, batch, time, rng)
  draw = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
  q, k, v = draw(batch, time, heads, dim), draw(batch, time, kv_heads, dim), draw(
      batch, time, kv_heads, dim)
  d_out = draw(batch, time, heads, dim)
  slots = jnp.broadcast_to(jnp.arange(time), (batch, time))
  seg = None if segment_ids is None else jnp.asarray(segment_ids)
  mask = attention_mask(slots, jnp.asarray(token_mask), seg, None)
  valid = jnp.asarray(token_mask)[:, :, None, None]

  def run(kernel):
    def loss(q, k, v):
      out = grouped_query_attention(q, k, v, mask, impl=kernel, token_mask=jnp.asarray(token_mask),
                                    segment_ids=seg)
      return jnp.sum(jnp.where(valid, out * d_out, 0).astype(jnp.float32)), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return jax.device_get((out, grads))

  want_out, want_grads = run("xla")
  got_out, got_grads = run(impl)
  out_tol, grad_tol = TOLERANCE[jnp.dtype(dtype).name]
  errors = {"out": compare(got_out, want_out, token_mask)}
  for key, got, want, rows in zip(("dq", "dk", "dv"), got_grads, want_grads,
                                  (token_mask, token_mask, token_mask)):
    errors[key] = compare(got, want, rows)
  finite = bool(np.isfinite(np.asarray(got_out, np.float32)).all()
                and all(np.isfinite(np.asarray(g, np.float32)).all() for g in got_grads))
  ok = finite and errors["out"] <= out_tol and max(errors[k] for k in ("dq", "dk", "dv")) <= grad_tol
  return {"impl": impl, "layout": name, "dtype": jnp.dtype(dtype).name, "shape": list(dims),
          "errors": errors, "finite": finite, "tolerance": [out_tol, grad_tol], "ok": ok}


def decode_case(tiny: bool, dtype, rng) -> dict:
  """The ragged Pallas decode kernel against the XLA decode path on left-padded rows."""
  import jax
  import jax.numpy as jnp

  from rlhf_jax.models.attention.cached import cached_attention

  _, _, heads, kv_heads, dim = shapes(tiny)["train"]
  batch, slots = shapes(tiny)["decode"]
  starts = rng.integers(0, slots // 4, batch)
  ends = np.clip(starts + rng.integers(1, slots - slots // 4, batch), 1, slots)
  cols = np.arange(slots)[None, :]
  valid = jnp.asarray((cols >= starts[:, None]) & (cols < ends[:, None]))
  draw = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
  q, keys, values = draw(batch, 1, heads, dim), draw(batch, kv_heads, dim, slots), draw(
      batch, kv_heads, slots, dim)
  run = lambda kernel: np.asarray(jax.jit(lambda q, k, v, m: cached_attention(
      q, k, v, m, kernel=kernel))(q, keys, values, valid[:, None]), np.float32)
  want, got = run("xla"), run("pallas")
  error = compare(got, want, np.ones((batch, 1), bool))
  tol = TOLERANCE[jnp.dtype(dtype).name][0]
  return {"impl": "decode_pallas", "layout": DECODE_LAYOUT, "dtype": jnp.dtype(dtype).name,
          "shape": [batch, heads, kv_heads, dim, slots], "errors": {"out": error},
          "finite": bool(np.isfinite(got).all()), "tolerance": [tol], "ok": error <= tol
          and bool(np.isfinite(got).all())}


def first_error_line(text: str) -> str | None:
  """The first line of a process's stderr that names an error (a CUDA error, a failed XLA
  check, a Python exception), else its last line; None for no output. Progress lines of
  gpu.py are not errors."""
  lines = [line.strip() for line in (text or "").splitlines()
           if line.strip() and not line.startswith("[gpu.py")]
  for line in lines:
    if any(mark in line for mark in ("CUDA_ERROR", "Check failed", "Fatal Python error",
                                     "Error", "error")):
      return line[:300]
  return lines[-1][:300] if lines else None


def run_case(impl: str, name: str | None, tiny: bool, seed: int) -> dict:
  """One (kernel, layout) in this process: the comparison's record with its `status`."""
  import jax
  import jax.numpy as jnp

  on_gpu = jax.default_backend() in ("gpu", "cuda")
  dtype = jnp.bfloat16 if on_gpu and not tiny else jnp.float32
  record = {"impl": impl, "layout": name}
  if impl == "cudnn" and not on_gpu:
    return {**record, "status": "skipped",
            "skipped": f"cudnn runs only on an NVIDIA GPU (backend {jax.default_backend()})"}
  rng = np.random.default_rng(seed)
  try:
    record.update(train_case(impl, name, shapes(tiny)["train"], dtype, rng)
                  if impl != "decode_pallas" else decode_case(tiny, dtype, rng))
  except NotImplementedError as error:
    return {**record, "status": "skipped", "skipped": f"{impl} not built yet: {error}"}
  except Exception as error:  # noqa: BLE001 (a kernel that raises is a verdict, not a crash of kern)
    text = f"{type(error).__name__}: {error}"
    return {**record, "status": "crashed", "ok": False, "error": text[:2000],
            "first_error": text.splitlines()[0][:300]}
  record["status"] = "ok" if record["ok"] else "wrong"
  return record


def case_command(impl: str, name: str, tiny: bool, seed: int,
                 compile_cache: str | None) -> list[str]:
  """The command line of one case's own process (this file with --case)."""
  command = [sys.executable, os.path.abspath(__file__), "--case", impl, name, "--seed", str(seed)]
  if tiny:
    command.append("--tiny")
  if compile_cache:
    command += ["--compile-cache", compile_cache]
  return command


def case_record(impl: str, name: str, returncode: int | None, stdout: str, stderr: str) -> dict:
  """What one case's process says: its JSON record when it printed one, else `crashed` with
  the first error line of its stderr (returncode None: it was stopped at its timeout)."""
  printed = None
  for line in (stdout or "").splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and row.get("impl") == impl:
      printed = row
  if printed is not None and "status" in printed:
    return printed
  if returncode is None:
    how = "timed out"
  elif returncode < 0:
    how = f"killed by signal {-returncode}"
  else:
    how = f"exited with status {returncode}"
  return {"impl": impl, "layout": name, "status": "crashed", "ok": False,
          "error": f"the case's process {how} without a result",
          "first_error": first_error_line(stderr) or f"the case's process {how}"}


def verdict_of(records: list[dict], impls) -> tuple[dict, dict]:
  """(verdict, cases) of the case records: verdict[impl] is True when every case of impl
  that ran was ok, False when one was wrong or crashed, None when none ran; cases[impl]
  maps each layout to its status."""
  cases, verdict = {}, {}
  for impl in (*impls, "decode_pallas"):
    statuses = {r["layout"]: r["status"] for r in records if r["impl"] == impl}
    cases[impl] = statuses
    ran = [s for s in statuses.values() if s != "skipped"]
    verdict[impl] = None if not ran else all(s == "ok" for s in ran)
  return verdict, cases


def run_kern(tiny: bool, impls, emit, base: dict, compile_cache: str | None = None,
             case_timeout: float | None = None, command=case_command) -> dict:
  """Every case in its own process, each record emitted through `emit`; returns the verdict
  record. `command(impl, layout, tiny, seed, compile_cache)` is the case's command line."""
  from gpu_common import progress

  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # small cases, quick start
  checks = [(impl, name) for impl in impls for name in LAYOUTS] + [("decode_pallas",
                                                                     DECODE_LAYOUT)]
  records, device = [], {}
  for seed, (impl, name) in enumerate(checks):
    progress(f"kern: {impl}/{name}: starting its own process")
    start = time.perf_counter()
    try:
      done = subprocess.run(command(impl, name, tiny, seed, compile_cache), capture_output=True,
                            text=True, env=env, timeout=case_timeout or 120)
      returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as stopped:
      as_text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
      returncode, stdout, stderr = None, as_text(stopped.stdout), as_text(stopped.stderr)
    sys.stderr.write(stderr[-20000:])  # the case's own log lines, in the step's log
    result = case_record(impl, name, returncode, stdout, stderr)
    device = device or {k: result[k] for k in ("device", "backend", "jax") if k in result}
    record = {**base, "part": "kern", **result, "seconds": time.perf_counter() - start}
    progress(f"kern: {impl}/{name}: {record['status']} in {record['seconds']:.1f} s"
             + (f": {record['first_error']}" if record["status"] == "crashed" else ""))
    emit(record)
    records.append(record)
  verdict, cases = verdict_of(records, impls)
  final = {**base, **device, "part": "kern", "verdict": verdict, "cases": cases}
  emit(final)
  return final


def choose(kind: str, records: list[dict]) -> str:
  """The kernel a step may use after kern, or 'skip: <reason>': for `g1` (the G1 steps'
  fused training attention) cudnn when every layout of G1_LAYOUTS is ok for it, else
  pallas when they are for it; for `g2` (the Pallas decode steps) pallas when its case is
  ok. A kernel that was wrong, crashed or did not run is never chosen."""
  found = [r for r in records if r.get("part") == "kern" and "verdict" in r]
  if not found:
    return ("skip: kern gave no verdict in this call (not run, or stopped before its end); "
            "name kern before the step")
  cases = found[-1].get("cases") or {}
  status = lambda impl, name: (cases.get(impl) or {}).get(name) or "not run"
  if kind == "g1":
    for impl in ("cudnn", "pallas"):
      if all(status(impl, name) == "ok" for name in G1_LAYOUTS):
        return impl
    said = ", ".join(f"{impl} {name} {status(impl, name)}" for impl in ("cudnn", "pallas")
                     for name in G1_LAYOUTS)
    return f"skip: no fused kernel passed kern on the layout G1 uses ({said})"
  if kind == "g2":
    if status("decode_pallas", DECODE_LAYOUT) == "ok":
      return "pallas"
    return f"skip: the Pallas decode did not pass kern ({status('decode_pallas', DECODE_LAYOUT)})"
  raise ValueError(f"--choose {kind!r}: one of g1, g2")


def main() -> int:
  """--case IMPL LAYOUT: one case, its record as a JSON line; --choose g1|g2 BENCH_JSONL:
  the kernel scripts/gpu_check.sh may use for a step."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--case", nargs=2, metavar=("IMPL", "LAYOUT"))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--tiny", action="store_true")
  parser.add_argument("--compile-cache", default=None)
  parser.add_argument("--choose", nargs=2, metavar=("KIND", "BENCH_JSONL"))
  args = parser.parse_args()
  if args.choose:
    kind, path = args.choose
    rows = []
    for line in open(path, encoding="utf-8"):
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue
    print(choose(kind, [r for r in rows if isinstance(r, dict)]))
    return 0
  if not args.case:
    parser.error("--case IMPL LAYOUT or --choose KIND BENCH_JSONL")
  from gpu_common import dump_stacks_on_term, enable_compile_cache, jax_device_info, progress
  dump_stacks_on_term()
  impl, name = args.case
  progress(f"kern case {impl}/{name}: starting the backend")
  enable_compile_cache(args.compile_cache)
  record = {**jax_device_info(), **run_case(impl, name, args.tiny, args.seed)}
  progress(f"kern case {impl}/{name}: {record['status']}")
  sys.stdout.write(json.dumps(record) + "\n")
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # no teardown: after a sticky CUDA error it only adds errors, or hangs


if __name__ == "__main__":
  sys.exit(main())
