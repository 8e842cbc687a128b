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

On a GPU the inputs are bfloat16 (the model's compute dtype) at the 0.5B model's head
shape; with --tiny, or off a GPU, float32 at a tiny shape (Pallas in interpret mode). cuDNN
runs only on an NVIDIA GPU: elsewhere it is skipped with a note, as is a kernel that is not
built yet (NotImplementedError). One JSON record per (kernel, layout), then one `verdict`
record: {"cudnn": true | false | null, "pallas": ..., "decode_pallas": ...} (null: not
run), which scripts/gpu_check.sh reads to pick the G1 steps' kernel.
"""

from __future__ import annotations

import numpy as np

# bfloat16 inputs: outputs within 2e-2 and gradients within 5e-2 of the largest magnitude.
TOLERANCE = {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2)}
LAYOUTS = ("causal", "padded", "packed")


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

  from rlhf_jax.models.attention import grouped_query_attention
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

  from rlhf_jax.models.cached_attention import cached_attention

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
  return {"impl": "decode_pallas", "layout": "left_padded_ragged", "dtype": jnp.dtype(dtype).name,
          "shape": [batch, heads, kv_heads, dim, slots], "errors": {"out": error},
          "finite": bool(np.isfinite(got).all()), "tolerance": [tol], "ok": error <= tol
          and bool(np.isfinite(got).all())}


def run_kern(tiny: bool, impls, emit, base: dict) -> dict:
  """Every check, each record emitted through `emit`; returns the verdict record."""
  import jax
  import jax.numpy as jnp

  on_gpu = jax.default_backend() in ("gpu", "cuda")
  dtype = jnp.bfloat16 if on_gpu and not tiny else jnp.float32
  rng = np.random.default_rng(0)
  verdict = {}
  checks = [(impl, name) for impl in impls for name in LAYOUTS] + [("decode_pallas", None)]
  for impl, name in checks:
    record = {**base, "part": "kern", "impl": impl, "layout": name}
    if impl == "cudnn" and not on_gpu:
      record["skipped"] = f"cudnn runs only on an NVIDIA GPU (backend {jax.default_backend()})"
    else:
      try:
        record.update(train_case(impl, name, shapes(tiny)["train"], dtype, rng)
                      if name else decode_case(tiny, dtype, rng))
      except NotImplementedError as error:
        record["skipped"] = f"{impl} not built yet: {error}"
      except Exception as error:  # noqa: BLE001 (a kernel that fails is a verdict, not a crash)
        record.update(error=f"{type(error).__name__}: {error}"[:2000], ok=False)
    emit(record)
    if "skipped" not in record:
      verdict[impl] = verdict.get(impl, True) and bool(record.get("ok"))
  final = {**base, "part": "kern", "verdict": {k: verdict.get(k) for k in
                                               (*impls, "decode_pallas")}}
  emit(final)
  return final
