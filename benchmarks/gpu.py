"""The GPU check's benchmarks (docs/gpu.md): our train step, decode and memory against
PyTorch / transformers / TRL on the same GPU, one JSON line per measurement.

Parts (--parts, comma-separated):
  g1   PPO actor step on the Qwen2.5-0.5B shape (V=151936, E=896, L=24, H=14, K=2, D=64,
       F=4864, tied, q/k/v bias, RoPE θ 1e6), float32 parameters, bfloat16 compute,
       16 × 1024 tokens (prompt 256 + response 768). Ours is the library's own path:
       `algorithms.batch.response_logprobs(..., with_entropy=True)` (LM head chunked by
       `DecoderConfig.logprob_chunk`) → `kernels.ppo_policy_loss` (token-mean) →
       `jax.value_and_grad` → optax clip 1.0 + AdamW, parameters and optimizer state
       donated. Median step time, tokens/s, MFU against the H100 SXM dense bf16 peak
       (989 TFLOP/s; FLOPs counted as shared/bench/gpu_probe.py counts them), compile and
       first-step time, XLA's memory analysis and the device's peak memory.
       Peers: `torch` (eager + autocast bf16, sdpa, fused AdamW) and `torch_compile`.
  g1b  the same at 32 × 1024 tokens: the peak memory, or the out-of-memory error.
  g2   generation, 128 slots × (prompt 128 + 512 new tokens), temperature 1, bf16 weights:
       `sampling.Engine` + `sampling.scheduler.Scheduler`; tokens/s, fraction of the HBM
       roofline (3.35 TB/s; bytes per step = weights + live KV cache at the mean context),
       first-call time (compiles, or loads from --compile-cache). Peers: `torch`
       (transformers `generate`, dynamic cache) and `torch_compile` (static cache, which
       transformers compiles).
  g3   g2 with 256 slots (32 decode steps per host sync unless --sync).
  g4   XLA's compiled memory analysis of the g1 step at 16 × 1024 and 32 × 1024 tokens with
       logprob_chunk 0 and 1024, from abstract inputs only (nothing allocated). Ours only.
  kern the fused attention kernels against the XLA path on small shapes, outputs and
       gradients (benchmarks/gpu_kern.py); its `verdict` record says which to trust.
  w3   shared/bench/workloads.md W3, one GRPO step (8 prompts × 8 samples, 128 new tokens):
       `who=ours` runs benchmarks/grpo_step.py's `run_ours`, `who=trl` runs TRL's
       GRPOTrainer (`run_trl_gpu.py` from --bench-dir, a copy of shared/bench/run_trl.py
       that leaves the GPU on). The checkpoint is made by make_model.py (--peer-python).

Each (part, side) runs in its own process when more than one is asked for (a torch peer
never shares a process with JAX's preallocated memory, and every peak-memory figure is one
program's). `--tiny` runs the same code paths on a 2-layer, 64-wide model with tiny shapes
(a smoke test; runs on CPU).

  python benchmarks/gpu.py --parts g1,g2,g4 --who ours [--tiny] [--logprob-chunk 1024]
      [--remat] [--scan-layers] [--decode-attention xla|pallas] [--compile-cache DIR]
      [--attention xla|cudnn|pallas|auto] [--profile DIR] [--xla-flag=--xla_...]
      [--autotune-dir benchmarks/autotune] [--autotune-dump DIR] [--autotune-level 0]
  python benchmarks/gpu.py --tiny --parts kern,g1,g2 --attention pallas --decode-attention pallas

--attention sets `DecoderConfig.attention_impl` of the train parts, --decode-attention
`decode_attention` of the generation parts. --profile DIR keeps one more timed train step, or
one short generate call (two dispatches), as DIR/profile_<part>.json.gz (Perfetto). The XLA
flags (--xla-flag, the autotune results: benchmarks/gpu_profile.py) are set before JAX starts.
A kernel that is not built yet (NotImplementedError), or cuDNN off a GPU, gives a record with
`skipped` instead of `error`.
  python benchmarks/gpu.py --parts g1 --who torch_compile
  python benchmarks/gpu.py --parts w3 --who ours,trl --bench-dir .gpu --model-dir /tmp/bm

Every record has `part`, `who`, `tiny`, `device`; a failed measurement has `error` (and
`oom: true` when the device ran out of memory) next to what it measured before failing.
For scripts/gpu_check.sh: `--mismatch LABEL=metrics.jsonl ...` prints the trainer–sampler
log-prob mismatch of arith runs, `--summarize OUT --status FILE` writes OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

import gpu_kern  # benchmarks/, beside this file
import gpu_profile
import gpu_summary_ab

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEAK_BF16 = 989e12  # H100 SXM, dense bf16
HBM_BW = 3.35e12  # H100 SXM HBM3, bytes/s

QWEN05 = dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
              head_dim=64, intermediate_size=4864, tie_embeddings=True, qkv_bias=True,
              rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6)
TINY = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, intermediate_size=128, tie_embeddings=True, qkv_bias=True,
            rope_theta=1000000.0, max_position_embeddings=512, rms_norm_eps=1e-6)

# part → (batch, seq, prompt) for the train parts; (slots, prompt, new, sync) for decode.
SHAPES = {
    False: {"g1": (16, 1024, 256), "g1b": (32, 1024, 256), "g4": ((16, 32), 1024, 256),
            "g2": (128, 128, 512, 16), "g3": (256, 128, 512, 32)},
    True: {"g1": (2, 64, 16), "g1b": (4, 64, 16), "g4": ((2,), 64, 16),
           "g2": (4, 8, 16, 4), "g3": (8, 8, 16, 8)},
}
SIDES = {"g1": ("ours", "torch", "torch_compile"), "g1b": ("ours", "torch", "torch_compile"),
         "g2": ("ours", "torch", "torch_compile"), "g3": ("ours", "torch", "torch_compile"),
         "g4": ("ours",), "w3": ("ours", "trl"), "kern": ("ours",)}

_STDOUT = sys.stdout  # the JSON lines; anything else printed goes to stderr (see main)


# ------------------------------------------------------------------------------ helpers


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


# ------------------------------------------------------------------------ ours: train


def decoder_config(args, *, param_dtype: str, dtype: str, **extra):
  """models.DecoderConfig for the run; scan_layers only when asked (an older library
  without the field says so clearly)."""
  from rlhf_jax import models
  fields = dict(architecture="qwen2", param_dtype=param_dtype, dtype=dtype, **model_shape(args),
                **extra)
  if args.scan_layers:
    fields["scan_layers"] = True
  try:
    return models.DecoderConfig(**fields)
  except TypeError as error:
    if args.scan_layers and "scan_layers" in str(error):
      raise RuntimeError("--scan-layers: this rlhf_jax's DecoderConfig has no scan_layers "
                         f"field ({error}); run without --scan-layers.") from None
    raise


def logprob_chunk(args) -> int:
  if args.logprob_chunk is not None:
    return args.logprob_chunk
  return 16 if args.tiny else 1024


def host_batch(batch: int, seq: int, prompt: int, vocab: int, seed: int = 0):
  """A RolloutBatch (NumPy) of full rows: random prompt and response ids, random old
  log-probs, one advantage per row broadcast over its response."""
  from rlhf_jax.algorithms import batch as batch_lib
  rng = np.random.default_rng(seed)
  response = seq - prompt
  prompts = rng.integers(3, vocab, (batch, prompt)).tolist()
  responses = rng.integers(3, vocab, (batch, response)).tolist()
  old = (-rng.random((batch, response)) * 5 - 8).astype(np.float32)
  out = batch_lib.build_rollout_batch(
      prompts, responses, old.tolist(), [0.0] * batch, [False] * batch, list(range(batch)),
      prompt_length=prompt, response_length=response, pad_id=0)
  advantages = np.broadcast_to(rng.standard_normal(batch).astype(np.float32)[:, None],
                               (batch, response)).copy()
  return out.replace(advantages=advantages)


def make_train_step(model):
  """The jitted actor step (params and optimizer state donated) and its optimizer."""
  import jax
  import jax.numpy as jnp
  import optax

  from rlhf_jax import kernels
  from rlhf_jax.algorithms import batch as batch_lib

  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.0))

  def loss_fn(params, batch):
    logprobs, entropy = batch_lib.response_logprobs(model, params, batch, with_entropy=True)
    loss, metrics = kernels.ppo_policy_loss(logprobs, batch.old_logprobs, batch.advantages,
                                            batch.response_mask, clip_low=0.2,
                                            agg="token-mean")
    mask = batch.response_mask
    entropy_mean = jnp.sum(jax.lax.stop_gradient(entropy) * mask) / jnp.maximum(
        jnp.sum(mask), 1.0)
    return loss, entropy_mean

  def step(params, opt_state, batch):
    (loss, entropy), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, (loss, entropy)

  return jax.jit(step, donate_argnums=(0, 1)), optimizer


def train_ours(part: str, args) -> dict:
  import jax

  from rlhf_jax import models
  from rlhf_jax.algorithms import batch as batch_lib

  batch_size, seq, prompt = SHAPES[args.tiny][part]
  chunk = logprob_chunk(args)
  record = {"part": part, "who": "ours", "tiny": args.tiny, "batch": batch_size, "seq": seq,
            "prompt": prompt, "tokens": batch_size * seq, "logprob_chunk": chunk,
            "remat": args.remat, "scan_layers": args.scan_layers, **jax_device_info(),
            **args.cache_info}
  args.partial = record  # what an error record keeps (compile time, memory analysis)
  record["attention_impl"] = args.attention
  if args.attention == "cudnn" and jax.default_backend() not in ("gpu", "cuda"):
    raise NotImplementedError(f"attention_impl='cudnn' runs only on an NVIDIA GPU "
                              f"(backend {jax.default_backend()})")
  config = decoder_config(args, param_dtype="float32", dtype="bfloat16", logprob_chunk=chunk,
                          remat=args.remat, attention_impl=args.attention)
  start = time.perf_counter()
  model, params = models.init_model(config, seed=0)
  params = jax.device_put(params)
  step, optimizer = make_train_step(model)
  opt_state = optimizer.init(params)
  batch = batch_lib.as_device(host_batch(batch_size, seq, prompt, config.vocab_size))
  jax.block_until_ready((params, opt_state, batch))
  record["init_s"] = time.perf_counter() - start
  start = time.perf_counter()
  compiled = step.lower(params, opt_state, batch).compile()
  record["compile_s"] = time.perf_counter() - start
  record["memory_analysis"] = memory_analysis_gib(compiled)
  params, opt_state, (loss, entropy) = compiled(params, opt_state, batch)
  record["loss_step0"] = float(loss)  # variants of one step compare equal here, not only fast
  record["first_step_s"] = time.perf_counter() - start  # compile + the first step
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    params, opt_state, (loss, entropy) = compiled(params, opt_state, batch)
    float(loss)  # the loss back on the host every step
    times.append(time.perf_counter() - start)
  with gpu_profile.profiled(args.profile, part, record):
    params, opt_state, (loss, entropy) = compiled(params, opt_state, batch)
    float(loss)
  median = statistics.median(times)
  flops = train_flops(model_shape(args), batch_size, seq, prompt)
  record.update(step_s=times, median_s=median, tokens_per_s=batch_size * seq / median,
                flops_per_step=flops, mfu=flops / median / PEAK_BF16, peak_flops=PEAK_BF16,
                peak_gib=jax_peak_gib(), loss=float(loss), entropy=float(entropy))
  return record


def memory_table(args) -> list[dict]:
  """g4: compiled memory analysis at each (rows, logprob_chunk), abstract inputs only."""
  import jax

  from rlhf_jax import models

  rows_list, seq, prompt = SHAPES[args.tiny]["g4"]
  chunks = (0, logprob_chunk(args))
  records = []
  for rows in rows_list:
    for chunk in chunks:
      record = {"part": "g4", "who": "ours", "tiny": args.tiny, "batch": rows, "seq": seq,
                "prompt": prompt, "tokens": rows * seq, "logprob_chunk": chunk,
                "remat": args.remat, "scan_layers": args.scan_layers, **jax_device_info(),
                **args.cache_info}
      try:
        config = decoder_config(args, param_dtype="float32", dtype="bfloat16",
                                logprob_chunk=chunk, remat=args.remat)
        model, params = models.init_model(config, abstract=True)
        step, optimizer = make_train_step(model)
        opt_state = jax.eval_shape(optimizer.init, params)
        spec = lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
        batch = jax.tree.map(spec, host_batch(rows, seq, prompt, config.vocab_size))
        start = time.perf_counter()
        compiled = step.lower(params, opt_state, batch).compile()
        record["compile_s"] = time.perf_counter() - start
        record["memory_analysis"] = memory_analysis_gib(compiled)
        record["logits_f32_gib"] = rows * (seq - prompt) * config.vocab_size * 4 / 2**30
        record["fits_80gib"] = (None if not record["memory_analysis"]
                                or "total_gib" not in record["memory_analysis"]
                                else record["memory_analysis"]["total_gib"] < 79.0)
      except Exception as error:  # noqa: BLE001
        record.update(error_record("g4", "ours", args, error))
      emit(record)
      records.append(record)
  return records


# ---------------------------------------------------------------------- torch: train


def hf_config(shape: dict):
  from transformers import Qwen2Config
  return Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                     num_hidden_layers=shape["num_layers"], num_attention_heads=shape["num_heads"],
                     num_key_value_heads=shape["num_kv_heads"],
                     intermediate_size=shape["intermediate_size"], tie_word_embeddings=True,
                     rope_theta=shape["rope_theta"], rms_norm_eps=shape["rms_norm_eps"],
                     max_position_embeddings=shape["max_position_embeddings"])


def torch_device():
  import torch
  return "cuda" if torch.cuda.is_available() else "cpu"


def torch_info() -> dict:
  import torch
  import transformers
  name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
  return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__}


def torch_sync():
  import torch
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def torch_peak_gib() -> float | None:
  import torch
  return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def train_torch(part: str, who: str, args) -> dict:
  """gpu_probe.py's peer: Qwen2ForCausalLM (sdpa) in float32 under bf16 autocast,
  log-softmax of the response logits, PPO-clip token mean, clip 1.0, fused AdamW."""
  import torch
  from transformers import Qwen2ForCausalLM

  batch, seq, prompt = SHAPES[args.tiny][part]
  shape = model_shape(args)
  device = torch_device()
  record = {"part": part, "who": who, "tiny": args.tiny, "batch": batch, "seq": seq,
            "prompt": prompt, "tokens": batch * seq, **torch_info()}
  args.partial = record
  torch.manual_seed(0)
  model = Qwen2ForCausalLM._from_config(hf_config(shape), attn_implementation="sdpa",
                                        dtype=torch.float32).to(device)
  model.train()
  forward = torch.compile(model) if who == "torch_compile" else model
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0,
                                fused=device == "cuda")
  response = seq - prompt
  generator = torch.Generator(device="cpu").manual_seed(0)
  ids = torch.randint(0, shape["vocab_size"], (batch, seq), generator=generator).to(device)
  advantages = torch.randn(batch, generator=generator).to(device)
  old = (-torch.rand(batch, response, generator=generator) * 5 - 8).to(device)

  def one() -> float:
    with torch.autocast(device, dtype=torch.bfloat16):
      out = forward(input_ids=ids, logits_to_keep=response + 1)
    logits = out.logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None]).squeeze(-1)
    ratio = torch.exp(logprobs - old)
    a = advantages[:, None]
    loss = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

  start = time.perf_counter()
  one()
  torch_sync()
  record["first_step_s"] = time.perf_counter() - start
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    loss = one()
    torch_sync()
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  flops = train_flops(shape, batch, seq, prompt)
  record.update(step_s=times, median_s=median, tokens_per_s=batch * seq / median,
                flops_per_step=flops, mfu=flops / median / PEAK_BF16, peak_flops=PEAK_BF16,
                peak_gib=torch_peak_gib(), loss=loss)
  return record


# ------------------------------------------------------------------------ generation


def roofline(shape: dict, slots: int, prompt: int, new: int, weight_bytes: float) -> dict:
  """Tokens/s at the HBM roofline: each decode step reads the bf16 weights and the live
  KV cache (mean context prompt + new / 2), gpu_probe.py's count."""
  kv_per_token = shape["num_layers"] * 2 * shape["num_kv_heads"] * shape["head_dim"] * 2
  bytes_per_step = weight_bytes + slots * (prompt + new / 2) * kv_per_token
  return {"bytes_per_step": bytes_per_step,
          "hbm_roofline_tokens_per_s": slots / (bytes_per_step / HBM_BW)}


def gen_ours(part: str, args) -> dict:
  import jax

  from rlhf_jax import models
  from rlhf_jax import sampling
  from rlhf_jax.sampling.scheduler import Scheduler

  slots, prompt, new, sync = SHAPES[args.tiny][part]
  sync = args.sync or sync
  record = {"part": part, "who": "ours", "tiny": args.tiny, "slots": slots, "prompt": prompt,
            "new": new, "reps": args.reps, "steps_per_sync": sync, "decode_attention": args.decode_attention,
            **jax_device_info(), **args.cache_info}
  args.partial = record
  config = decoder_config(args, param_dtype="bfloat16", dtype="bfloat16",
                          decode_attention=args.decode_attention, attention_impl="xla")
  model, params = models.init_model(config, seed=0)
  params = jax.device_put(params)
  engine = sampling.Engine(model, num_slots=slots, cache_length=prompt + new)
  rng = np.random.default_rng(1)
  prompts = [list(map(int, row)) for row in rng.integers(3, config.vocab_size, (slots, prompt))]
  times, first, tokens = [], None, 0
  for rep in range(args.reps + 1):
    scheduler = Scheduler(engine, params, prompt_buckets=(prompt,), steps_per_sync=sync,
                          max_prefill_batch=min(64, slots))
    requests = [sampling.SamplingParams(temperature=1.0, max_new_tokens=new,
                                        seed=rep * 10000 + i) for i in range(slots)]
    start = time.perf_counter()
    out = scheduler.generate(prompts, requests)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o[0].token_ids) for o in out)
    if rep == 0:
      first = elapsed
    else:
      times.append(elapsed)
  if args.profile:  # one short call: prefill and two dispatches
    scheduler = Scheduler(engine, params, prompt_buckets=(prompt,), steps_per_sync=sync,
                          max_prefill_batch=min(64, slots))
    requests = [sampling.SamplingParams(temperature=1.0, max_new_tokens=min(new, 2 * sync),
                                        seed=i) for i in range(slots)]
    with gpu_profile.profiled(args.profile, part, record):
      scheduler.generate(prompts, requests)
  record.update(first_s=first, first_tokens=tokens, compilations=engine.compilations(),
                peak_gib=jax_peak_gib(),
                **roofline(model_shape(args), slots, prompt, new, config.num_params() * 2))
  if times:
    median = statistics.median(times)
    record.update(wall_s=times, median_s=median, tokens=tokens, tokens_per_s=tokens / median,
                  frac_roofline=tokens / median / record["hbm_roofline_tokens_per_s"])
  return record


def gen_torch(part: str, who: str, args) -> dict:
  """transformers `generate` (sdpa, bf16): dynamic cache (`torch`) or static cache, which
  transformers compiles (`torch_compile`); exactly `new` tokens, EOS never stops."""
  import torch
  from transformers import Qwen2ForCausalLM

  slots, prompt, new, _ = SHAPES[args.tiny][part]
  shape = model_shape(args)
  device = torch_device()
  static = who == "torch_compile"
  record = {"part": part, "who": who, "tiny": args.tiny, "slots": slots, "prompt": prompt,
            "new": new, "cache": "static" if static else "dynamic", **torch_info()}
  args.partial = record
  torch.manual_seed(0)
  model = Qwen2ForCausalLM._from_config(hf_config(shape), attn_implementation="sdpa",
                                        dtype=torch.bfloat16).to(device).eval()
  model.generation_config.eos_token_id = None
  generator = torch.Generator(device="cpu").manual_seed(1)
  ids = torch.randint(3, shape["vocab_size"], (slots, prompt), generator=generator).to(device)
  times, first, tokens = [], None, 0
  for rep in range(args.reps + 1):
    torch_sync()
    start = time.perf_counter()
    with torch.no_grad():
      out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                           min_new_tokens=new, pad_token_id=0, eos_token_id=None,
                           **({"cache_implementation": "static"} if static else {}))
    torch_sync()
    elapsed = time.perf_counter() - start
    tokens = int((out.shape[1] - prompt) * slots)
    if rep == 0:
      first = elapsed
    else:
      times.append(elapsed)
  n_params = sum(p.numel() for p in model.parameters())
  record.update(first_s=first, first_tokens=tokens, peak_gib=torch_peak_gib(),
                **roofline(shape, slots, prompt, new, n_params * 2))
  if times:
    median = statistics.median(times)
    record.update(wall_s=times, median_s=median, tokens=tokens, tokens_per_s=tokens / median,
                  frac_roofline=tokens / median / record["hbm_roofline_tokens_per_s"])
  return record


# ------------------------------------------------------------------------------- W3


def bench_dir(args) -> pathlib.Path:
  """Where make_model.py / run_trl*.py are: --bench-dir, else .gpu/ (what the check's
  prepare step copies), else ../shared/bench."""
  for candidate in filter(None, (args.bench_dir, ROOT / ".gpu", ROOT.parent / "shared" / "bench")):
    path = pathlib.Path(candidate)
    if (path / "make_model.py").exists():
      return path
  raise FileNotFoundError("no make_model.py in --bench-dir, .gpu/ or ../shared/bench "
                          "(bash scripts/gpu_check.sh prepare copies it into .gpu/)")


def peer_environment(args) -> dict:
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
         "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
  if args.peer_site:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.peer_site,
                                                      os.environ.get("PYTHONPATH", "")]))
  return env


def ensure_w3_model(args) -> None:
  if os.path.exists(os.path.join(args.model_dir, "w3_prompts.jsonl")):
    return
  result = subprocess.run([args.peer_python, str(bench_dir(args) / "make_model.py"),
                           args.model_dir], capture_output=True, text=True,
                          env=peer_environment(args), timeout=900)
  if result.returncode:
    raise RuntimeError(f"make_model.py failed (rc {result.returncode}):\n{result.stderr[-3000:]}")


def w3_ours(args) -> dict:
  ensure_w3_model(args)
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import grpo_step  # noqa: E402 (benchmarks/, W3's definition of our side)
  record = {"part": "w3", "who": "ours", "tiny": args.tiny, **jax_device_info()}
  steps = grpo_step.run_ours(args.model_dir)["steps"]
  timed = steps[1:]
  median = statistics.median(s["step_s"] for s in timed)
  phases = {key: statistics.median(s[key] for s in timed)
            for key in ("time_generate", "time_update") if all(key in s for s in timed)}
  record.update(s_per_step_median=median, s_per_step_timed=[s["step_s"] for s in timed],
                warmup_s=steps[0]["step_s"], phases_s=phases,
                completion_tokens_per_s=grpo_step.GROUPS * grpo_step.GROUP_SIZE
                * grpo_step.NEW_TOKENS / median,
                reward_mean=[s.get("reward_mean") for s in timed], peak_gib=jax_peak_gib())
  return record


def w3_trl(args) -> dict:
  ensure_w3_model(args)
  directory = bench_dir(args)
  script = directory / "run_trl_gpu.py"
  if not script.exists():
    script = directory / "run_trl.py"  # the CPU original: TRL then trains on the CPU
  result = subprocess.run([args.peer_python, str(script), "--model-dir", args.model_dir,
                           "--threads", str(os.cpu_count() or 2)], capture_output=True,
                          text=True, env=peer_environment(args), timeout=3600)
  if result.returncode:
    raise RuntimeError(f"{script.name} failed (rc {result.returncode}):\n{result.stderr[-3000:]}")
  rows = []
  for line in result.stdout.splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict) and row.get("workload") == "W3_grpo_step":
      rows.append(row)
  if not rows:
    raise RuntimeError(f"{script.name} printed no W3 line; stderr:\n{result.stderr[-3000:]}")
  row = rows[-1]
  probe = subprocess.run([args.peer_python, "-c", "import torch; print("
                          "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"],
                         capture_output=True, text=True, env=peer_environment(args), timeout=300)
  on_gpu = script.name == "run_trl_gpu.py" and probe.stdout.strip() not in ("", "cpu")
  return {"part": "w3", "who": "trl", "tiny": args.tiny, "script": script.name,
          "device": probe.stdout.strip() if on_gpu else "cpu",
          "s_per_step_median": row["s_per_step_median"],
          "s_per_step_timed": row["s_per_step_timed"], "warmup_s": row["warmup_s"],
          "rollout_generate_s": row.get("rollout_generate_s"), "trl": row.get("trl"),
          "torch": row.get("torch"), "transformers": row.get("transformers")}


# ------------------------------------------------------------ the check's summaries


MISMATCH_KEYS = ("logprob_mismatch_mean", "logprob_mismatch_max", "is_ratio_min", "is_ratio_max",
                 "is_ratio_mean")


def read_jsonl(path) -> list[dict]:
  rows = []
  if not path or not os.path.exists(path):
    return rows
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(row, dict):
        rows.append(row)
  return rows


def mismatch_records(specs: list[str]) -> None:
  """--mismatch LABEL=metrics.jsonl ...: the trainer–sampler log-prob mismatch of an arith
  run (rlhf_jax.kernels.rollout_correction's metrics over fresh tokens), one line per run."""
  for spec in specs:
    label, _, path = spec.partition("=")
    rows = [r for r in read_jsonl(path) if any(k in r for k in MISMATCH_KEYS)]
    record = {"part": "mismatch", "who": "ours", "sampler_dtype": label, "metrics_file": path,
              "steps": len(rows)}
    if not rows:
      record["error"] = f"no mismatch metrics in {path} (missing or the run failed)"
      emit(record)
      continue
    for key in MISMATCH_KEYS:
      values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
      if values:
        record[key] = {"median": statistics.median(values), "max": max(values),
                       "min": min(values), "first": values[0], "last": values[-1]}
    for key in ("reward_mean", "accuracy", "eval_accuracy"):
      values = [r[key] for r in read_jsonl(path) if isinstance(r.get(key), (int, float))]
      if values:
        record[f"{key}_last"] = values[-1]
    emit(record)


def _ok(records, part, who, pred=lambda r: True):
  """The last error-free record of (part, who) that satisfies `pred`."""
  found = [r for r in records if r.get("part") == part and r.get("who") == who
           and "error" not in r and pred(r)]
  return found[-1] if found else None


def _err(records, part, who):
  found = [r for r in records if r.get("part") == part and r.get("who") == who and "error" in r]
  return found[-1]["error"][:500] if found else None


def _pick(record, *keys):
  return {k: record.get(k) for k in keys} if record else None


def junit_counts(path) -> dict | None:
  if not os.path.exists(path):
    return None
  import xml.etree.ElementTree as ET
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as error:
    return {"error": str(error)}
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  return {key: sum(int(s.get(key, 0)) for s in suites)
          for key in ("tests", "failures", "errors", "skipped")}


def summarize(out_dir: str, status_path: str | None, budget: float | None) -> dict:
  """--summarize OUT: summary.json from the check's status table and bench.jsonl."""
  steps = []
  if status_path and os.path.exists(status_path):
    for line in open(status_path, encoding="utf-8"):
      fields = line.rstrip("\n").split("\t")
      if len(fields) >= 5:
        name, status, rc, seconds, cap = fields[:5]
        steps.append({"name": name, "status": status, "rc": rc,
                      "seconds": float(seconds) if seconds.replace(".", "").isdigit() else None,
                      "cap_s": cap, "note": fields[5] if len(fields) > 5 else ""})
  every_record = read_jsonl(os.path.join(out_dir, "bench.jsonl"))
  headline, targets = {}, {}
  ab_head, ab_targets = gpu_summary_ab.ab_headline(every_record)
  if ab_head:  # `run env ab` (its own figures; the rest below reads the other steps)
    headline["ab"], targets = ab_head, dict(ab_targets)
  records = [r for r in every_record if r.get("step") not in gpu_summary_ab.AB_STEPS]
  g1 = {who: _ok(records, "g1", who) for who in ("ours", "torch", "torch_compile")}
  if any(g1.values()):
    headline["g1"] = {who: _pick(r, "median_s", "tokens_per_s", "mfu", "first_step_s", "peak_gib")
                      for who, r in g1.items()}
    if g1["ours"]:
      targets["g1_mfu_ge_45pct"] = g1["ours"]["mfu"] >= 0.45
      if g1["torch_compile"]:
        speed = g1["torch_compile"]["median_s"] / g1["ours"]["median_s"]
        headline["g1"]["ours_speed_over_torch_compile"] = speed
        targets["g1_ahead_of_torch_compile"] = speed > 1.0
  g1b = _ok(records, "g1b", "ours")
  g1b_error = _err(records, "g1b", "ours")
  if g1b or g1b_error:
    headline["g1b"] = {"fits": g1b is not None, "error": None if g1b else g1b_error,
                       **(_pick(g1b, "median_s", "mfu", "peak_gib") or {})}
    targets["g1b_32x1024_fits"] = g1b is not None
  cold = _ok(records, "g2", "ours", lambda r: "median_s" in r)
  warm = _ok(records, "g2", "ours",  # gpu_check.sh's g2_warm: a new process, first call only
             lambda r: r.get("reps") == 0 and r.get("compile_cache_entries_at_start", 0) > 0)
  g2_peers = {who: _ok(records, "g2", who) for who in ("torch", "torch_compile")}
  if cold or warm or any(g2_peers.values()):
    headline["g2"] = {"ours": _pick(cold, "tokens_per_s", "frac_roofline", "first_s"),
                      "ours_first_s_warm_cache": warm and warm["first_s"],
                      **{who: _pick(r, "tokens_per_s", "frac_roofline", "first_s")
                         for who, r in g2_peers.items()}}
    if cold:
      targets["g2_roofline_ge_50pct"] = cold["frac_roofline"] >= 0.5
      if g2_peers["torch_compile"]:
        headline["g2"]["ours_over_static_cache"] = (cold["tokens_per_s"]
                                                    / g2_peers["torch_compile"]["tokens_per_s"])
    if warm:
      targets["g2_first_call_warm_cache_le_15s"] = warm["first_s"] <= 15.0
  g3 = _ok(records, "g3", "ours", lambda r: "median_s" in r)
  if g3:
    headline["g3"] = _pick(g3, "tokens_per_s", "frac_roofline", "first_s")
  g4 = [r for r in records if r.get("part") == "g4"]
  if g4:
    headline["g4"] = [{"batch": r.get("batch"), "logprob_chunk": r.get("logprob_chunk"),
                       **({"error": r["error"][:200]} if "error" in r else
                          (r.get("memory_analysis") or {}))} for r in g4]
  mismatch = [r for r in records if r.get("part") == "mismatch"]
  if mismatch:
    headline["mismatch"] = {r.get("sampler_dtype"): r.get("error") or {
        k: (r.get(k) or {}).get("median") for k in ("logprob_mismatch_mean",
                                                    "logprob_mismatch_max")} for r in mismatch}
  w3 = {who: _ok(records, "w3", who) for who in ("ours", "trl")}
  if any(w3.values()) or _err(records, "w3", "ours") or _err(records, "w3", "trl"):
    headline["w3"] = {who: (_pick(r, "s_per_step_median", "warmup_s") if r
                            else {"error": _err(records, "w3", who)}) for who, r in w3.items()}
    if w3["ours"] and w3["trl"]:
      headline["w3"]["trl_over_ours"] = (w3["trl"]["s_per_step_median"]
                                         / w3["ours"]["s_per_step_median"])
  tests = junit_counts(os.path.join(out_dir, "junit.xml"))
  if tests:
    headline["tests_fast"] = tests
  summary = {"budget_s": budget, "elapsed_s": sum(s["seconds"] or 0 for s in steps),
             "steps": steps, "headline": headline, "targets": targets,
             "errors": [{"part": r.get("part"), "who": r.get("who"), "oom": r.get("oom"),
                         "error": str(r["error"])[:300]} for r in every_record if "error" in r]}
  path = os.path.join(out_dir, "summary.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(_finite(summary), f, indent=1)
  os.replace(path + ".tmp", path)
  return summary


# ------------------------------------------------------------------------------ driver


def run_one(part: str, who: str, args) -> None:
  """One (part, side) in this process; every failure becomes an error record."""
  args.cache_info, args.partial = {}, {}
  try:
    if who == "ours" and part != "w3":
      args.cache_info = {**gpu_profile.apply_xla_flags(args),
                         **enable_compile_cache(args.compile_cache)}
    if part == "g4":
      memory_table(args)
      return
    if part == "kern":
      base = {"who": "ours", "tiny": args.tiny, **jax_device_info(), **args.cache_info}
      gpu_kern.run_kern(args.tiny, [i for i in args.kern_impls.split(",") if i], emit, base)
      return
    if part in ("g1", "g1b"):
      record = train_ours(part, args) if who == "ours" else train_torch(part, who, args)
    elif part in ("g2", "g3"):
      record = gen_ours(part, args) if who == "ours" else gen_torch(part, who, args)
    elif part == "w3":
      record = w3_ours(args) if who == "ours" else w3_trl(args)
    else:
      raise ValueError(f"unknown part {part!r}")
    emit(record)
  except NotImplementedError as error:  # a kernel not built yet, or GPU-only: said, not failed
    emit({**args.partial, "part": part, "who": who, "tiny": args.tiny,
          "skipped": f"{type(error).__name__}: {error}"[:2000]})
  except Exception as error:  # noqa: BLE001 (the figures measured so far stay)
    emit({**args.partial, **error_record(part, who, args, error)})


def child_command(part: str, who: str) -> list[str]:
  """This program's own arguments with --parts / --who narrowed to one pair."""
  argv, skip = [], False
  for arg in sys.argv[1:]:
    if skip:
      skip = False
      continue
    if arg in ("--parts", "--who"):
      skip = True
      continue
    if arg.startswith(("--parts=", "--who=")):
      continue
    argv.append(arg)
  return [sys.executable, os.path.abspath(__file__), *argv, "--parts", part, "--who", who]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--parts", default="g1,g1b,g2,g3,g4")
  parser.add_argument("--who", default="ours",
                      help="ours, torch, torch_compile (g1/g1b/g2/g3), trl (w3); "
                           "comma-separated: one process each")
  parser.add_argument("--tiny", action="store_true", help="2-layer 64-wide model, tiny shapes")
  parser.add_argument("--steps", type=int, default=None, help="timed train steps (5; tiny 2)")
  parser.add_argument("--reps", type=int, default=None,
                      help="timed generate calls after the first (2; tiny 1); 0: first only")
  parser.add_argument("--sync", type=int, default=None,
                      help="decode steps per host sync (g2 16, g3 32)")
  parser.add_argument("--logprob-chunk", type=int, default=None,
                      help="DecoderConfig.logprob_chunk (1024; tiny 16; 0 = unchunked)")
  parser.add_argument("--remat", action="store_true", help="DecoderConfig.remat")
  parser.add_argument("--scan-layers", action="store_true", help="DecoderConfig.scan_layers")
  parser.add_argument("--decode-attention", default="xla", choices=("auto", "xla", "pallas"))
  parser.add_argument("--attention", default="xla", choices=("auto", "xla", "cudnn", "pallas"),
                      help="DecoderConfig.attention_impl of the train parts")
  parser.add_argument("--kern-impls", default="cudnn,pallas",
                      help="kern: the fused training kernels to check against xla")
  parser.add_argument("--profile", metavar="DIR", default=None,
                      help="one more step (or a short generate) traced: DIR/profile_<part>.json.gz")
  parser.add_argument("--xla-flag", action="append", default=None,
                      help="an XLA flag for our parts (repeatable; the user's XLA_FLAGS win)")
  parser.add_argument("--autotune-dir", default=None,
                      help="load the carried autotune results for this GPU and XLA from here")
  parser.add_argument("--autotune-dump", default=None,
                      help="write this run's autotune results here (named by GPU and XLA)")
  parser.add_argument("--autotune-level", type=int, default=None,
                      help="--xla_gpu_autotune_level (0: off)")
  parser.add_argument("--compile-cache", default=None,
                      help="JAX persistent compilation cache directory (our g1-g4); every "
                           "record says how many entries it held at the start")
  parser.add_argument("--model-dir", default="/tmp/bench_model", help="W3 checkpoint")
  parser.add_argument("--bench-dir", default=None,
                      help="make_model.py / run_trl_gpu.py (default .gpu, ../shared/bench)")
  parser.add_argument("--peer-python", default=sys.executable,
                      help="python with torch (+ TRL for w3 trl)")
  parser.add_argument("--peer-site", default=None,
                      help="extra PYTHONPATH for the TRL peer (its carried wheels)")
  parser.add_argument("--child-timeout", type=float, default=None,
                      help="seconds per (part, side) process when several are run")
  parser.add_argument("--summarize", metavar="OUT", help=argparse.SUPPRESS)  # gpu_check.sh
  parser.add_argument("--status", help=argparse.SUPPRESS)
  parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
  parser.add_argument("--mismatch", nargs="+", metavar="LABEL=METRICS_JSONL",
                      help="summarise the log-prob mismatch metrics of arith runs and exit")
  args = parser.parse_args()
  if args.summarize:
    summarize(args.summarize, args.status, args.budget)
    return 0
  if args.mismatch:
    mismatch_records(args.mismatch)
    return 0
  if args.steps is None:
    args.steps = 2 if args.tiny else 5
  if args.reps is None:
    args.reps = 1 if args.tiny else 2
  parts = [p for p in args.parts.split(",") if p]
  sides = [w for w in args.who.split(",") if w]
  unknown = [p for p in parts if p not in SIDES]
  if unknown:
    parser.error(f"unknown parts {unknown}; known: {', '.join(SIDES)}")
  pairs = [(p, w) for p in parts for w in sides if w in SIDES[p]]
  if not pairs:
    parser.error(f"no part of {parts} has a side in {sides}")
  if len(pairs) == 1:
    sys.stdout = sys.stderr  # library prints stay off the JSON stream
    run_one(*pairs[0], args)
    return 0
  for part, who in pairs:  # one process each
    try:
      result = subprocess.run(child_command(part, who), stdout=_STDOUT, timeout=args.child_timeout)
      if result.returncode:
        emit({"part": part, "who": who, "tiny": args.tiny,
              "error": f"process exited with status {result.returncode}"})
    except subprocess.TimeoutExpired:
      emit({"part": part, "who": who, "tiny": args.tiny,
            "error": f"timed out after {args.child_timeout} s"})
  return 0


if __name__ == "__main__":
  sys.exit(main())
