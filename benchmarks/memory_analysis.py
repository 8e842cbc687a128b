"""XLA's memory analysis of the PPO actor's training step at the Qwen2.5-0.5B shape:
unchunked log-probs against `model.logprob_chunk` (models/lm_head.py), with and without
remat, at 16 × 1024 and 32 × 1024 tokens (prompt 256 + response 768).

The step is the actor's own: `batch.response_logprobs` with entropy, PPO-clip with
token-mean aggregation, value_and_grad, AdamW (parameters and optimizer state donated).
It is compiled on this machine's backend from `jax.ShapeDtypeStruct`s only (no weights
are allocated; on CPU the figures are XLA:CPU's buffer assignment, which follows the
same liveness as a GPU's). Each configuration compiles in a fresh process.

  python benchmarks/memory_analysis.py [--rows 16,32] [--chunks 0,1024] [--layers 24]
      [--remat 0,1] [--scan 0,1] [--markdown]
  python benchmarks/memory_analysis.py --tiny   (CI: a tiny shape, measured in this process)

Prints one JSON line per configuration: temp (the step's temporaries: activations,
logits, gradients in flight), arguments, outputs, and the [B, R, V] float32 logits a
step without chunking materialises, for scale.

Attention, XLA against flash, per layer:

  python benchmarks/memory_analysis.py --attention xla,flash --layer-pair 2,4 \
      --rows 16,32 --chunks 1024 --remat 0

compiles each configuration at two layer counts and prints, per attention, the
temporaries per layer (the difference over the layers added) as JSON. "flash" is a
flash-shaped stub (`flash_stub`): a custom VJP keeping what FlashAttention's
backward keeps (q, k, v, out and the float32 log-sum-exp) and writing nothing of
[B, heads, T, S]; XLA:CPU cannot compile the cuDNN or Triton kernels themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPT, RESPONSE, VOCAB = 256, 768, 151936
SHAPE = dict(hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
             intermediate_size=4864)  # Qwen2.5-0.5B's


def shrink_to_tiny() -> None:
  """--tiny: a 64-wide model on 2 rows of 16 + 32 tokens, so a step compiles in seconds."""
  global PROMPT, RESPONSE, VOCAB
  PROMPT, RESPONSE, VOCAB = 16, 32, 512
  SHAPE.update(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
               intermediate_size=128)


def flash_stub(q, k, v, mask, **_):
  """A stand-in for flash attention with its memory shape: out [B, T, N, D] from q
  [B, T, N, D], k, v [B, S, K, D] with no [T, S] array, residuals q, k, v, out and a
  float32 [B, T, N] log-sum-exp, a backward of the same elementwise size (FlashAttention,
  Dao et al. 2022/2023, keeps exactly these). Not attention: for memory analysis only."""
  import jax
  import jax.numpy as jnp
  del mask
  group = q.shape[2] // k.shape[2]

  def widen(x):
    return jnp.repeat(x, group, axis=2)

  def narrow(x):
    return x.reshape(*x.shape[:2], k.shape[2], group, x.shape[-1]).sum(3)

  def forward(q, k, v):
    lse = jnp.sum(q.astype(jnp.float32) * widen(k).astype(jnp.float32), axis=-1)
    out = (q + widen(v) * lse[..., None].astype(q.dtype)).astype(q.dtype)
    return out, (q, k, v, out, lse)

  def backward(residuals, d_out):
    q, k, v, out, lse = residuals
    scaled = (d_out.astype(jnp.float32) * lse[..., None]).astype(q.dtype)
    return (d_out + out * scaled, narrow(d_out * q).astype(k.dtype),
            narrow(scaled * out).astype(v.dtype))

  attend = jax.custom_vjp(lambda q, k, v: forward(q, k, v)[0])
  attend.defvjp(forward, backward)
  return attend(q, k, v)


def measure(rows: int, chunk: int, layers: int, remat: bool, scan: bool = False,
            attention: str = "xla") -> dict:
  """Compiles the step for one configuration; its memory analysis as a dict.
  `attention`: "xla" (models/attention/xla.py) or "flash" (`flash_stub` in its place)."""
  import jax
  import jax.numpy as jnp
  import optax

  from rlhf_jax import kernels
  from rlhf_jax import models
  from rlhf_jax import batch as batch_lib
  from rlhf_jax.models import blocks

  if attention == "flash":  # this process only: each configuration runs in its own
    blocks.grouped_query_attention = flash_stub

  config = models.DecoderConfig(
      vocab_size=VOCAB, num_layers=layers, **SHAPE, rope_theta=1e6, max_position_embeddings=32768,
      tie_embeddings=True, dtype="bfloat16", param_dtype="float32", remat=remat,
      logprob_chunk=chunk, scan_layers=scan, attention_impl="xla")
  model, params = models.init_model(config, abstract=True)
  optimizer = optax.adamw(1e-6)
  opt_state = jax.eval_shape(optimizer.init, params)
  width = PROMPT + RESPONSE
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
  tokens = spec((rows, width), jnp.int32)
  per_token = spec((rows, RESPONSE), jnp.float32)

  def step(params, opt_state, tokens, mask, old, advantages):
    batch = batch_lib.TrainBatch(
        tokens=tokens, attention_mask=jnp.ones_like(tokens), response_mask=mask,
        old_logprobs=old, ref_logprobs=old, values=old, scores=old[:, 0],
        lengths=jnp.sum(mask, 1).astype(jnp.int32), truncated=old[:, 0] > 0,
        group_ids=jnp.zeros(rows, jnp.int32), window_starts=jnp.zeros(rows, jnp.int32),
        finished=old[:, 0] < 1, scored=old[:, 0] < 1, sampler_logprobs=old,
        is_weights=jnp.ones_like(old),
        correction_mask=mask, step_rewards=old, step_mask=old,
        token_versions=jnp.zeros_like(tokens[:, PROMPT:]), advantages=advantages,
        returns=old)

    def loss_fn(params):
      logprobs, entropy = batch_lib.response_logprobs(model, params, batch, with_entropy=True)
      loss, _ = kernels.ppo_policy_loss(logprobs, batch.old_logprobs, advantages, mask,
                                        clip_low=0.2, agg="token-mean")
      return loss - 0.001 * jnp.sum(entropy * mask) / jnp.sum(mask)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(
      params, opt_state, tokens, per_token, per_token, per_token).compile()
  memory = compiled.memory_analysis()
  gib = lambda n: round(n / 2**30, 3)
  return {"rows": rows, "tokens": rows * width, "logprob_chunk": chunk, "layers": layers,
          "attention": attention,
          "remat": remat, "scan_layers": scan, "backend": jax.default_backend(),
          "temp_gib": gib(memory.temp_size_in_bytes),
          "argument_gib": gib(memory.argument_size_in_bytes),
          "output_gib": gib(memory.output_size_in_bytes),
          "logits_f32_gib": gib(rows * RESPONSE * VOCAB * 4),
          "compile_s": round(time.perf_counter() - start, 1)}


def _run_one(rows, chunk, layers, remat, scan, attention) -> dict:
  """`measure` in a fresh process (compile caches and the flash stub stay there)."""
  result = subprocess.run(
      [sys.executable, __file__, "--one", f"{rows},{chunk},{remat},{scan}",
       "--layers", str(layers), "--attention", attention], capture_output=True, text=True,
      env={**os.environ, "PYTHONPATH": str(ROOT)})
  if result.returncode:
    raise RuntimeError(result.stderr[-3000:])
  return json.loads(result.stdout.strip().splitlines()[-1])


def per_layer(low: dict, high: dict) -> dict:
  """The temporaries each layer adds: the difference of two layer counts' figures."""
  layers = high["layers"] - low["layers"]
  return {key: low[key] for key in ("rows", "tokens", "logprob_chunk", "remat", "attention")} | {
      "layers": [low["layers"], high["layers"]],
      "temp_gib": [low["temp_gib"], high["temp_gib"]],
      "temp_gib_per_layer": round((high["temp_gib"] - low["temp_gib"]) / layers, 3)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="16,32")
  parser.add_argument("--chunks", default="0,1024")
  parser.add_argument("--layers", type=int, default=24)
  parser.add_argument("--remat", default="0,1")
  parser.add_argument("--scan", default="0", help="scan_layers values, e.g. 0,1")
  parser.add_argument("--attention", default="xla", help="xla, flash (flash_stub), or both")
  parser.add_argument("--layer-pair", help="two layer counts, e.g. 2,4: per-layer figures")
  parser.add_argument("--markdown", action="store_true")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # rows,chunk,remat,scan here
  parser.add_argument("--tiny", action="store_true",
                      help="a 64-wide 1-layer model, 2 rows, chunks 0 and 16, in this process (CI)")
  args = parser.parse_args()
  if args.tiny:
    shrink_to_tiny()
    args.rows, args.chunks, args.layers, args.remat, args.attention = "2", "0,16", 1, "0", "xla"
  if args.one:
    rows, chunk, remat, scan = (int(x) for x in args.one.split(","))
    print(json.dumps(measure(rows, chunk, args.layers, bool(remat), bool(scan),
                             args.attention)), flush=True)
    return 0
  pair = [int(x) for x in args.layer_pair.split(",")] if args.layer_pair else None
  records = []
  for rows in (int(x) for x in args.rows.split(",")):
    for remat, scan in ((int(r), int(s)) for r in args.remat.split(",")
                        for s in args.scan.split(",")):
      for chunk in (int(x) for x in args.chunks.split(",")):
        for attention in args.attention.split(","):
          if pair:
            low, high = (_run_one(rows, chunk, n, remat, scan, attention) for n in pair)
            print(json.dumps(per_layer(low, high)), flush=True)
            continue
          records.append(measure(rows, chunk, args.layers, bool(remat), bool(scan), attention)
                         if args.tiny else
                         _run_one(rows, chunk, args.layers, remat, scan, attention))
          print(json.dumps(records[-1]), flush=True)
  if args.markdown:
    print("| tokens | remat | scan | logprob_chunk | attention | temporaries (GiB) | "
          "[B,R,V] f32 logits (GiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
      print(f"| {r['rows']} × {PROMPT + RESPONSE} | {'on' if r['remat'] else 'off'} | "
            f"{'on' if r['scan_layers'] else 'off'} | {r['logprob_chunk'] or 'off'} | "
            f"{r['attention']} | {r['temp_gib']} | {r['logits_f32_gib']} |")
  return 0


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main())
