"""benchmarks/gpu.py's own side: the G1 / G1b train step, the G4 memory table and G2 / G3
generation of rlhf_jax (see gpu.py's docstring for what each part runs)."""

from __future__ import annotations

import statistics
import time

import numpy as np

from gpu_common import HBM_BW, PEAK_BF16, SHAPES, emit, error_record, jax_device_info, jax_peak_gib, memory_analysis_gib, model_shape, progress, train_flops
import gpu_profile


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
  """A TrainBatch of full rows: random prompt and response ids, random old
  log-probs, one advantage per row broadcast over its response."""
  from rlhf_jax import batch as batch_lib
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
  return batch_lib.TrainBatch.from_rollout(out, advantages=advantages)


def make_train_step(model):
  """The jitted actor step (params and optimizer state donated) and its optimizer."""
  import jax
  import jax.numpy as jnp
  import optax

  from rlhf_jax import kernels
  from rlhf_jax import batch as batch_lib

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
  from rlhf_jax import batch as batch_lib

  batch_size, seq, prompt = SHAPES[args.tiny][part]
  chunk = logprob_chunk(args)
  progress(f"{part}: starting the backend")
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
  progress(f"{part}: backend {record['backend']} ({record['device']}); building the model, "
           f"optimizer state and a {batch_size} x {seq} batch (attention {args.attention})")
  start = time.perf_counter()
  model, params = models.init_model(config, seed=0)
  params = jax.device_put(params)
  step, optimizer = make_train_step(model)
  opt_state = optimizer.init(params)
  batch = batch_lib.as_device(host_batch(batch_size, seq, prompt, config.vocab_size))
  jax.block_until_ready((params, opt_state, batch))
  record["init_s"] = time.perf_counter() - start
  progress(f"{part}: built in {record['init_s']:.1f} s; compiling the step")
  start = time.perf_counter()
  compiled = step.lower(params, opt_state, batch).compile()
  record["compile_s"] = time.perf_counter() - start
  progress(f"{part}: compiled in {record['compile_s']:.1f} s; running the first step")
  record["memory_analysis"] = memory_analysis_gib(compiled)
  params, opt_state, (loss, entropy) = compiled(params, opt_state, batch)
  record["loss_step0"] = float(loss)  # variants of one step compare equal here, not only fast
  record["first_step_s"] = time.perf_counter() - start  # compile + the first step
  progress(f"{part}: first step done ({record['first_step_s']:.1f} s with the compile), "
           f"loss {record['loss_step0']:.4f}")
  times = []
  for index in range(args.steps):
    start = time.perf_counter()
    params, opt_state, (loss, entropy) = compiled(params, opt_state, batch)
    float(loss)  # the loss back on the host every step
    times.append(time.perf_counter() - start)
    progress(f"{part}: timed step {index + 1}/{args.steps}: {times[-1]:.3f} s")
  if args.profile:
    progress(f"{part}: one more step under the profiler")
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
        progress(f"g4: compiling {rows} x {seq}, logprob_chunk {chunk} (abstract inputs)")
        start = time.perf_counter()
        compiled = step.lower(params, opt_state, batch).compile()
        record["compile_s"] = time.perf_counter() - start
        progress(f"g4: compiled in {record['compile_s']:.1f} s")
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
  from rlhf_jax.sampling.scheduler.scheduler import Scheduler

  slots, prompt, new, sync = SHAPES[args.tiny][part]
  sync = args.sync or sync
  progress(f"{part}: starting the backend")
  record = {"part": part, "who": "ours", "tiny": args.tiny, "slots": slots, "prompt": prompt,
            "new": new, "reps": args.reps, "steps_per_sync": sync, "decode_attention": args.decode_attention,
            **jax_device_info(), **args.cache_info}
  args.partial = record
  config = decoder_config(args, param_dtype="bfloat16", dtype="bfloat16",
                          decode_attention=args.decode_attention, attention_impl="xla")
  progress(f"{part}: backend {record['backend']} ({record['device']}); building the engine, "
           f"{slots} slots x {prompt + new} (decode attention {args.decode_attention})")
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
    progress(f"{part}: generate call {rep}/{args.reps} started"
             + (" (the first: compiles, or loads from the cache)" if rep == 0 else ""))
    start = time.perf_counter()
    out = scheduler.generate(prompts, requests)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o[0].token_ids) for o in out)
    progress(f"{part}: generate call {rep}/{args.reps}: {elapsed:.2f} s, {tokens} tokens")
    if rep == 0:
      first = elapsed
    else:
      times.append(elapsed)
  if args.profile:  # one short call: prefill and two dispatches
    progress(f"{part}: one short call under the profiler")
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
