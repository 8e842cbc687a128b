"""benchmarks/gpu.py's PyTorch peers: the G1 train step (eager + autocast, torch.compile) and
G2 generation (transformers `generate`, dynamic or static cache) on the same shapes."""

from __future__ import annotations

import statistics
import time

from gpu_common import PEAK_BF16, SHAPES, model_shape, progress, train_flops
from gpu_ours import roofline


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

  progress(f"{part} {who}: first step started"
           + (" (torch.compile compiles in it)" if who == "torch_compile" else ""))
  start = time.perf_counter()
  one()
  torch_sync()
  record["first_step_s"] = time.perf_counter() - start
  progress(f"{part} {who}: first step done in {record['first_step_s']:.1f} s")
  times = []
  for index in range(args.steps):
    start = time.perf_counter()
    loss = one()
    torch_sync()
    times.append(time.perf_counter() - start)
    progress(f"{part} {who}: timed step {index + 1}/{args.steps}: {times[-1]:.3f} s")
  median = statistics.median(times)
  flops = train_flops(shape, batch, seq, prompt)
  record.update(step_s=times, median_s=median, tokens_per_s=batch * seq / median,
                flops_per_step=flops, mfu=flops / median / PEAK_BF16, peak_flops=PEAK_BF16,
                peak_gib=torch_peak_gib(), loss=loss)
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
    progress(f"{part} {who}: generate call {rep}/{args.reps} started")
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
    progress(f"{part} {who}: generate call {rep}/{args.reps}: {elapsed:.2f} s, {tokens} tokens")
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
