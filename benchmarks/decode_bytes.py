"""Bytes per decode step against the memory roofline, from XLA's cost analysis (CPU).

A decode step is the model's one-token cached forward, as the sampling engine
runs it: `DecoderLM.__call__(tokens [B, 1], cache=..., head_positions=0)` with
the cache donated (updated in place). It is lowered from abstract inputs
(`jax.ShapeDtypeStruct`: no weights are allocated), compiled for the host and
XLA's `cost_analysis()["bytes accessed"]` is compared with the ideal bytes
a step must move at least:

    ideal = weights (the embedding only for the B rows looked up, unless tied
            to the LM head, which reads all of it)
          + live KV cache: Σ_b used_b · 2 · K · D · L · bytes(cache dtype)

Rows' cache ends are compile-time constants (each row has used_b − 1 cached
tokens and writes its new one at slot used_b − 1), so XLA folds the decode
attention's `lax.switch` over read spans (`cached_attention`) down to the
branch this step takes: bytes accessed is that of the step at this used length
(a conditional left in would count as its costliest branch). Layers are
unrolled (`scan_layers` off: a while loop's body would be counted once).

This is XLA:CPU's program and cost model, not a GPU's: the in-place cache
write (a scatter) is counted as reading and writing the whole cache buffer,
and XLA:CPU has no bfloat16 scatter, so a bfloat16 cache is converted to
float32 and back around every write (real traffic on CPU, ~10× the cache per
step); `cache_write_bytes` and `without_writes_bytes` separate that part out,
`breakdown_mb` says roughly where the rest goes.

  python benchmarks/decode_bytes.py [--shapes tiny mid qwen2.5-0.5b] [--ragged] [--sampling]

Prints one JSON line per (shape, used length): shape, batch, cache_length, used
(the longest row), bytes_accessed, ideal_bytes, ratio, the ideal's parts, and
the write / breakdown fields of `measure`. `--sampling` adds one line per truncate
variant for the sampling step of each shape (`measure_sampling`): its bytes against
the float32 logits' [batch, V].
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlhf_jax.models import DecoderConfig  # noqa: E402
from rlhf_jax.models import KVCache  # noqa: E402
from rlhf_jax.models import init_model  # noqa: E402

# name → (DecoderConfig fields, batch, cache length, used lengths).
SHAPES = {
    "tiny": (dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, intermediate_size=128),
             8, 512, (64, 448)),
    "mid": (dict(vocab_size=32768, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2,
                 head_dim=64, intermediate_size=1408, tie_embeddings=True,
                 param_dtype="bfloat16", dtype="bfloat16"),
            64, 640, (128, 600)),
    "qwen2.5-0.5b": (dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                          num_kv_heads=2, head_dim=64, intermediate_size=4864,
                          tie_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
                          param_dtype="bfloat16", dtype="bfloat16"),
                     128, 640, (128, 600)),
}


def row_lengths(batch: int, used: int, ragged: bool) -> np.ndarray:
  """Used slots per row: all `used`, or (ragged) spread evenly over 1..used."""
  if not ragged:
    return np.full((batch,), used, np.int32)
  return np.linspace(1, used, batch).round().astype(np.int32)


def ideal_bytes(config: DecoderConfig, params, batch: int, lengths: np.ndarray) -> dict:
  """The least a step moves: its weights (see the module docstring) and the live cache."""
  size = lambda x: int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
  weights = sum(size(leaf) for leaf in jax.tree.leaves(params))
  if not config.tie_embeddings:  # the lookup reads B rows, not the whole table
    embed = params["embed"]
    weights -= size(embed) - batch * config.hidden_size * jnp.dtype(embed.dtype).itemsize
  kv = int(lengths.sum()) * token_kv_bytes(config)
  return {"weight_bytes": weights, "kv_bytes": kv, "ideal_bytes": weights + kv}


def token_kv_bytes(config: DecoderConfig) -> int:
  """Cache bytes of one token: keys and values of every layer, 2 · K · D · L · bytes."""
  return (2 * config.num_kv_heads * config.head_dim * config.num_layers
          * config.jnp_dtype.itemsize)


def compiled_step(config: DecoderConfig, batch: int, cache_length: int,
                  lengths: np.ndarray):
  """The decode step compiled for the host from abstract inputs, and its params' shapes."""
  model, params = init_model(config, abstract=True)
  cache = jax.eval_shape(lambda: KVCache.create(config, batch, cache_length))
  end = np.asarray(lengths - 1, np.int32)  # the new token's slot: row b reads lengths[b]

  def step(params, keys, values, valid, tokens):
    state = KVCache(keys=keys, values=values, valid=valid, end=jnp.asarray(end),
                    length=jnp.asarray(end))
    logits, new = model.apply(params, tokens, cache=state,
                              head_positions=jnp.zeros((batch,), jnp.int32))
    return logits, new.keys, new.values, new.valid

  tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  lowered = jax.jit(step, donate_argnums=(1, 2, 3)).lower(
      params, cache.keys, cache.values, cache.valid, tokens)
  return lowered.compile(), params


def cache_write_bytes(config: DecoderConfig, batch: int, cache_length: int) -> int:
  """XLA's count for the step's 2·L cache writes alone: the decoder's vmapped
  `dynamic_update_slice` of one token per row into a donated [B, K, D, S] / [B, K, S, D]
  buffer, compiled by itself. It runs in place (the buffer aliases the output), but the
  cost model counts the whole buffer read and written; a bfloat16 buffer is also
  converted to float32 and back around the scatter (XLA:CPU)."""
  cache = jax.eval_shape(lambda: KVCache.create(config.replace(num_layers=1), batch,
                                                cache_length))
  keys, values = cache.keys[0], cache.values[0]
  if keys.ndim == 5:  # stacked layers (scan_layers): one layer's slice
    keys, values = (jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in (keys, values))
  write = jax.vmap(lambda row, new, at, axis: jax.lax.dynamic_update_slice_in_dim(
      row, new, at, axis=axis), in_axes=(0, 0, 0, None))
  one = lambda x, axis: x.shape[:axis + 1] + (1,) + x.shape[axis + 2:]

  def step(keys, values, new_keys, new_values, end):
    return write(keys, new_keys, end, 2), write(values, new_values, end, 1)

  args = (keys, values, jax.ShapeDtypeStruct(one(keys, 2), keys.dtype),
          jax.ShapeDtypeStruct(one(values, 1), values.dtype),
          jax.ShapeDtypeStruct((batch,), jnp.int32))
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile()
  return config.num_layers * int(_cost(compiled)["bytes accessed"])


_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "u16": 2, "s16": 2, "f32": 4,
          "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_FREE = ("parameter", "constant", "bitcast", "get-tuple-element", "tuple")


def _shape_bytes(text: str) -> int:
  """Bytes of every array type (e.g. "bf16[8,64]") in an HLO type string."""
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", text):
    total += _BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
  return total


def breakdown(compiled) -> dict:
  """Approximate bytes by kind of op, from the compiled entry computation: each
  top-level instruction counts its operands and outputs in full (XLA's model for most
  fusions; it over-counts a slice, whose operand is read only in part). Kinds, from the
  op's name: cache_write (the in-place scatters), convert (whole-array dtype casts
  XLA:CPU inserts), attention (`cached_attention`'s switch), matmul, other. MB."""

  def kind_of(name, meta, moved):
    del moved
    return ("cache_write" if "scatter" in meta + name else
            "convert" if name.startswith("wrapped_convert") else
            "attention" if "cond" in meta else
            "matmul" if "dot_general" in meta else "other")

  return _kinds(compiled, kind_of)


def _kinds(compiled, kind_of) -> dict:
  """MB moved per kind of the entry computation's top-level instructions, each counting
  its operands and output in full; `kind_of(name, op_name_metadata, moved_bytes)` names
  the kind of each."""
  text = compiled.as_text()
  entry = text[text.index("ENTRY"):].split("\n}\n")[0].splitlines()[1:]
  sizes, kinds = {}, {}
  for line in entry:
    match = re.match(r"\s*(?:ROOT )?%(\S+) = (\(.*?\)|\S+) ([\w-]+)\((.*?)\)(.*)", line)
    if not match:
      continue
    name, shape, op, operands, rest = match.groups()
    sizes[name] = _shape_bytes(shape)
    if op in _FREE:
      continue
    meta = re.search(r'op_name="([^"]*)"', rest)
    moved = sizes[name] + sum(sizes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", operands))
    kind = kind_of(name, meta.group(1) if meta else name, moved)
    kinds[kind] = kinds.get(kind, 0) + moved
  return {kind: round(value / 1e6, 1) for kind, value in sorted(kinds.items())}


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def measure(name: str, used: int, *, ragged: bool = False, shapes=None) -> dict:
  """One JSON record: bytes accessed by the compiled step against the ideal, for shape
  `name` of `shapes` (default `SHAPES`) with rows using `used` slots (`row_lengths`).

  Also `cache_write_bytes` (XLA's count for the cache writes compiled alone, see
  `cache_write_bytes`), `without_writes_bytes` = bytes_accessed − cache_write_bytes +
  the new entries read and written once (what the rest of the step moves, with the
  writes at their ideal cost) and `breakdown_mb` (`breakdown`)."""
  fields, batch, cache_length, _ = (shapes or SHAPES)[name]
  config = DecoderConfig(**fields)
  lengths = row_lengths(batch, used, ragged)
  start = time.perf_counter()
  compiled, params = compiled_step(config, batch, cache_length, lengths)
  compile_s = time.perf_counter() - start
  accessed = int(_cost(compiled)["bytes accessed"])
  ideal = ideal_bytes(config, params, batch, lengths)
  written = cache_write_bytes(config, batch, cache_length)
  rest = accessed - written + 2 * batch * token_kv_bytes(config)
  return {"shape": name, "batch": batch, "cache_length": cache_length, "used": used,
          "ragged": ragged, "mean_used": float(lengths.mean()), "bytes_accessed": accessed,
          **ideal, "ratio": round(accessed / ideal["ideal_bytes"], 3),
          "cache_write_bytes": written, "without_writes_bytes": rest,
          "without_writes_ratio": round(rest / ideal["ideal_bytes"], 3),
          "breakdown_mb": breakdown(compiled), "compile_s": round(compile_s, 1)}


def measure_sampling(name: str, truncate: bool, *, shapes=None) -> dict:
  """One JSON record: XLA:CPU's bytes accessed by `sample_tokens` on float32 [batch, V]
  logits (per-row keys and parameters as the engine passes them), against the logits'
  bytes. `breakdown_mb`: "logits_pass" (fusions that reduce over the logits), "gather"
  (taking one vocabulary block and the drawn logit per row: the cost model charges a
  gather its whole operand, though it reads batch × block), "other" (block-sized work)."""
  from rlhf_jax.sampling.engine.token_sampling import sample_tokens  # noqa: PLC0415 (env first)
  fields, batch, _, _ = (shapes or SHAPES)[name]
  vocab = fields["vocab_size"]

  def draw(logits, key_data, temperature, top_k, top_p, min_p):
    keys = jax.vmap(jax.random.wrap_key_data)(key_data)
    return sample_tokens(logits, keys, temperature=temperature, top_k=top_k, top_p=top_p,
                         min_p=min_p, truncate=truncate)

  row = lambda dtype: jax.ShapeDtypeStruct((batch,), dtype)
  compiled = jax.jit(draw).lower(
      jax.ShapeDtypeStruct((batch, vocab), jnp.float32),
      jax.ShapeDtypeStruct((batch, 2), jnp.uint32), row(jnp.float32), row(jnp.int32),
      row(jnp.float32), row(jnp.float32)).compile()
  accessed = int(_cost(compiled)["bytes accessed"])
  logits_bytes = batch * vocab * 4
  kinds = _kinds(compiled, lambda name, meta, moved: (
      "gather" if "gather" in name else
      "logits_pass" if "reduce" in name and moved >= logits_bytes else "other"))
  return {"shape": name, "sampling": True, "truncate": truncate, "batch": batch,
          "vocab": vocab, "bytes_accessed": accessed, "logits_bytes": logits_bytes,
          "ratio": round(accessed / logits_bytes, 3), "breakdown_mb": kinds}


def main():
  """Measures the chosen shapes at their used lengths; one JSON line each."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", nargs="+", default=["tiny", "qwen2.5-0.5b"],
                      choices=sorted(SHAPES))
  parser.add_argument("--ragged", action="store_true",
                      help="also measure rows whose used lengths spread over 1..used")
  parser.add_argument("--sampling", action="store_true",
                      help="also measure the sampling step (truncate off and on)")
  args = parser.parse_args()
  for name in args.shapes:
    for truncate in (False, True) if args.sampling else ():
      print(json.dumps(measure_sampling(name, truncate)), flush=True)
    for used in SHAPES[name][3]:
      for ragged in (False, True) if args.ragged else (False,):
        print(json.dumps(measure(name, used, ragged=ragged)), flush=True)


if __name__ == "__main__":
  main()
