"""Compile time of the training step and the cached forward, per-layer loop vs layer scan.

For the Qwen2.5-0.5B shape (V=151936, E=896, H=14, K=2, D=64, F=4864, tied
embeddings, q/k/v bias, bfloat16 compute, float32 parameters) and `--layers`
decoder layers, measures `jax.jit(f).lower(...)` and `.compile()` on CPU of

  train:   value_and_grad of the token-mean next-token NLL over a 16 × 1024 batch,
           then an optax AdamW update (parameters and optimizer state donated);
  prefill: 128 prompts × 128 tokens into an empty cache (as `Engine.prefill`), the
           logits after each prompt's last token;
  decode:  one token for each of 128 slots of a 640-slot cache (donated), the logits;

with `DecoderConfig.scan_layers` False / True and, for the training step, remat
off or on with each `--remat` policy (remat only changes a backward pass, so the
cached forward is measured without it). Inputs are `jax.ShapeDtypeStruct`s: no
weights are allocated. Each measurement runs in a fresh process (no tracing or
compilation cache shared) `--repeats` times; the fastest run is kept. `temp_gib`
is XLA's temporary buffer size for the program (the training step's activations).

  python benchmarks/compile_time.py [--layers 8,24] [--programs train,prefill,decode]
      [--remat off,nothing_saveable,dots_saveable] [--repeats 2] [--markdown]

Prints one JSON line per measurement; `--markdown` also prints a table.

  python benchmarks/compile_time.py --arith-run [--sft-steps 3] [--rl-steps 2]

  python benchmarks/compile_time.py --tiny   (CI: every program at a 1-layer, 64-wide
      shape and small batches, measured in this process)

counts instead the programs a whole run compiles: a GRPO arith run
(`configs/grpo.py:arith`, `--sft-steps` SFT steps then `--rl-steps` RL steps, the
persistent compilation cache off) under `JAX_LOG_COMPILES=1`, one JSON object with the
number of XLA compilations, their summed seconds, the run's wall time, and per program
name the count and seconds ("Finished XLA compilation of jit(NAME) in S sec" lines).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

TRAIN_BATCH, TRAIN_LENGTH = 16, 1024
SLOTS, CACHE_LENGTH = 128, 640
PREFILL_BATCH, PREFILL_LENGTH = 128, 128
PROGRAMS = ("train", "prefill", "decode")
SHAPE = dict(vocab_size=151936, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
             intermediate_size=4864)  # Qwen2.5-0.5B's


def shrink_to_tiny() -> None:
  """--tiny: a 64-wide model and batches of a few rows, so every program compiles in
  about a second on CPU."""
  global TRAIN_BATCH, TRAIN_LENGTH, SLOTS, CACHE_LENGTH, PREFILL_BATCH, PREFILL_LENGTH
  TRAIN_BATCH, TRAIN_LENGTH, SLOTS, CACHE_LENGTH = 2, 32, 4, 48
  PREFILL_BATCH, PREFILL_LENGTH = 2, 16
  SHAPE.update(vocab_size=512, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
               intermediate_size=128)


def qwen_config(layers: int, scan_layers: bool, remat: str):
  """The Qwen2.5-0.5B shape (`SHAPE`) with `layers` layers; remat "off" or a policy name."""
  from rlhf_jax import models

  return models.DecoderConfig(
      num_layers=layers, **SHAPE, rope_theta=1e6, max_position_embeddings=32768,
      tie_embeddings=True, qkv_bias=True, dtype="bfloat16", param_dtype="float32",
      remat=remat != "off", remat_policy="nothing_saveable" if remat == "off" else remat,
      scan_layers=scan_layers)


def train_program(model, params):
  """(jitted step, abstract arguments): loss + grads + AdamW on a 16 × 1024 batch."""
  import jax
  import jax.numpy as jnp
  import optax

  from rlhf_jax import kernels

  optimizer = optax.adamw(1e-6, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)

  def loss_fn(params, tokens, mask):
    logits, _ = model.apply(params, tokens, attention_mask=mask)
    logprobs = kernels.token_logprobs(logits[:, :-1], tokens[:, 1:])
    weights = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(logprobs * weights) / jnp.maximum(jnp.sum(weights), 1.0)

  def step(params, opt_state, tokens, mask):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, mask)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  batch = jax.ShapeDtypeStruct((TRAIN_BATCH, TRAIN_LENGTH), jnp.int32)
  mask = jax.ShapeDtypeStruct((TRAIN_BATCH, TRAIN_LENGTH), jnp.bool_)
  opt_state = jax.eval_shape(optimizer.init, params)
  return jax.jit(step, donate_argnums=(0, 1)), (params, opt_state, batch, mask)


def prefill_program(model, params):
  """(jitted prefill, abstract arguments), as `Engine.prefill` runs it."""
  import jax
  import jax.numpy as jnp

  from rlhf_jax import models

  def prefill(params, tokens, true_length):
    batch, length = tokens.shape
    cache = models.KVCache.create(model.config, batch, length)
    mask = jnp.arange(length)[None, :] < true_length[:, None]
    return model.apply(params, tokens, attention_mask=mask, cache=cache,
                       head_positions=true_length - 1)

  tokens = jax.ShapeDtypeStruct((PREFILL_BATCH, PREFILL_LENGTH), jnp.int32)
  lengths = jax.ShapeDtypeStruct((PREFILL_BATCH,), jnp.int32)
  return jax.jit(prefill), (params, tokens, lengths)


def decode_program(model, params):
  """(jitted decode step, abstract arguments): one token per slot, cache donated."""
  import jax
  import jax.numpy as jnp

  from rlhf_jax import models

  def decode(params, cache, tokens):
    return model.apply(params, tokens[:, None], cache=cache,
                       head_positions=jnp.zeros_like(tokens))

  cache = jax.eval_shape(lambda: models.KVCache.create(model.config, SLOTS, CACHE_LENGTH))
  tokens = jax.ShapeDtypeStruct((SLOTS,), jnp.int32)
  return jax.jit(decode, donate_argnums=(1,)), (params, cache, tokens)


def measure(program: str, layers: int, scan_layers: bool, remat: str) -> dict:
  """Lowers and compiles one program in this process; the timings as a dict."""
  from rlhf_jax import models

  build = {"train": train_program, "prefill": prefill_program, "decode": decode_program}
  model, params = models.init_model(qwen_config(layers, scan_layers, remat), abstract=True)
  jitted, args = build[program](model, params)
  start = time.perf_counter()
  lowered = jitted.lower(*args)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  done = time.perf_counter()
  record = dict(program=program, layers=layers, scan_layers=scan_layers, remat=remat,
                lower_s=round(lowered_at - start, 2), compile_s=round(done - lowered_at, 2),
                total_s=round(done - start, 2))
  memory = compiled.memory_analysis()
  if memory is not None:
    record["temp_gib"] = round(memory.temp_size_in_bytes / 2**30, 2)
  return record


def markdown(records: list[dict]) -> str:
  """The records as a markdown table, one row per (program, layers, remat)."""
  lines = ["| program | layers | remat | loop: lower + compile (s) | scan: lower + compile (s) "
           "| loop / scan | temp GiB loop / scan |", "|---|---|---|---|---|---|---|"]
  keyed = {(r["program"], r["layers"], r["remat"], r["scan_layers"]): r for r in records}
  cell = lambda r: f"{r['lower_s']:.1f} + {r['compile_s']:.1f} = {r['total_s']:.1f}"
  for (program, layers, remat, scan) in keyed:
    loop, scanned = keyed[(program, layers, remat, False)], keyed.get(
        (program, layers, remat, True))
    if scan or scanned is None:
      continue
    memory = f"{loop.get('temp_gib', '-')} / {scanned.get('temp_gib', '-')}"
    lines.append(f"| {program} | {layers} | {remat} | {cell(loop)} | {cell(scanned)} | "
                 f"{loop['total_s'] / scanned['total_s']:.1f}× | {memory} |")
  return "\n".join(lines)


def _run_one(program: str, layers: int, scan: bool, remat: str, repeats: int) -> dict:
  """The fastest of `repeats` measurements, each in a fresh process."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  best = None
  for _ in range(repeats):
    one = f"{program},{layers},{int(scan)},{remat}"
    out = subprocess.run([sys.executable, __file__, "--one", one], env=env, check=True,
                         capture_output=True, text=True).stdout
    record = json.loads(out.strip().splitlines()[-1])
    best = record if best is None or record["total_s"] < best["total_s"] else best
  return best


COMPILE_LINE = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.eE+-]+) sec")


def parse_compile_log(text: str) -> dict:
  """The XLA compilations of a JAX_LOG_COMPILES=1 log: {"programs": n, "compile_s": s,
  "by_name": {name: {"count", "seconds"}}}, names as jax logs them (`jit(f)`), the
  largest total first."""
  by_name = collections.defaultdict(lambda: {"count": 0, "seconds": 0.0})
  for name, seconds in COMPILE_LINE.findall(text):
    by_name[name]["count"] += 1
    by_name[name]["seconds"] += float(seconds)
  ordered = sorted(by_name.items(), key=lambda item: -item[1]["seconds"])
  return {"programs": sum(v["count"] for _, v in ordered),
          "compile_s": round(sum(v["seconds"] for _, v in ordered), 2),
          "by_name": {k: {"count": v["count"], "seconds": round(v["seconds"], 3)}
                      for k, v in ordered}}


def arith_run(sft_steps: int, rl_steps: int, config: str = "configs/grpo.py:arith",
              extra: tuple[str, ...] = ()) -> dict:
  """Runs launch/train.py on `config` for `sft_steps` SFT + `rl_steps` RL steps on CPU with
  JAX_LOG_COMPILES=1 and the compile cache off; its compilations (`parse_compile_log`)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
         "JAX_LOG_COMPILES": "1", "RLHF_JAX_COMPILE_CACHE": "",
         "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
  with tempfile.TemporaryDirectory(prefix="compile_count_") as workdir:
    command = [sys.executable, os.path.join(root, "launch", "train.py"), f"--config={config}",
               f"--workdir={workdir}/run", f"--config.sft.steps={sft_steps}",
               f"--config.train.steps={rl_steps}", "--config.compile_cache=", *extra]
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - start
  if result.returncode:
    raise RuntimeError(f"{' '.join(command)} failed (rc {result.returncode}):\n"
                       f"{result.stderr[-3000:]}")
  counts = parse_compile_log(result.stdout + result.stderr)
  return {"run": config, "sft_steps": sft_steps, "rl_steps": rl_steps,
          "backend": env["JAX_PLATFORMS"], "wall_s": round(wall, 1), **counts}


def main():
  """Runs the measurements (or, with --one, a single one in this process)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--layers", default="24", help="comma-separated layer counts")
  parser.add_argument("--programs", default=",".join(PROGRAMS))
  parser.add_argument("--remat", default="off,nothing_saveable",
                      help="training step: off and/or jax.checkpoint_policies names")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--markdown", action="store_true")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # program,layers,scan,remat (child)
  parser.add_argument("--arith-run", action="store_true",
                      help="count the compilations of a GRPO arith run instead")
  parser.add_argument("--sft-steps", type=int, default=3)
  parser.add_argument("--rl-steps", type=int, default=2)
  parser.add_argument("--tiny", action="store_true",
                      help="tiny shapes, 1 layer, remat off, in this process (CI)")
  args = parser.parse_args()
  if args.tiny:
    shrink_to_tiny()
    args.layers, args.remat = "1", "off"
  if args.arith_run:
    print(json.dumps(arith_run(args.sft_steps, args.rl_steps), indent=1), flush=True)
    return
  if args.one:
    program, layers, scan, remat = args.one.split(",")
    print(json.dumps(measure(program, int(layers), scan == "1", remat)), flush=True)
    return
  records = []
  for layers in (int(n) for n in args.layers.split(",")):
    for program in args.programs.split(","):
      for remat in args.remat.split(",") if program == "train" else ["off"]:
        for scan in (False, True):
          records.append(measure(program, layers, scan, remat) if args.tiny else
                         _run_one(program, layers, scan, remat, args.repeats))
          print(json.dumps(records[-1]), flush=True)
  if args.markdown:
    print(markdown(records))


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
