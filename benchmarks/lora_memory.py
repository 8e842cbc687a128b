"""Training memory by model size: full fine-tuning vs LoRA, computed from shapes alone.

For Qwen2.5 0.5B / 1.5B / 7B shapes (their HF config.json values) prints one JSON
line per (model, method) and, with --markdown, a table. Nothing is allocated:
parameter counts come from `jax.eval_shape` of our init (checked against the
closed-form `DecoderConfig.num_params` and L·r·Σ(in + out) for the adapters).

Conventions (bytes; N = model parameters, n = adapter parameters, N_t = the
parameters of the adapted kernels, L layers, B·T tokens per micro-batch):

  full fine-tuning (mixed precision, Adam):
    weights      2N    bf16 compute copy
    master       4N    float32 parameters the optimizer updates
    grads        4N    float32
    adam         8N    two float32 moments
  LoRA on q,k,v,o,gate,up,down (rank r, adapters float32):
    weights      2N    frozen bf16 base (no master, grads or moments)
    master       4n    the adapters are their own float32 master
    grads        4n
    adam         8n
    merged       2N_t  W + s·A@B per adapted kernel in bf16: `lora.LoraModel` merges
                       before the model runs and autodiff keeps W_eff for the backward
    merged_grad  2N_t  dL/dW_eff (bf16) of every adapted kernel: the merge's backward
                       (dA = s·G·Bᵀ, dB = s·Aᵀ·G) runs after the whole model's, so
                       all layers' G are live at once (measured with --compiled on
                       XLA:CPU: the LoRA step's temporaries grow by ≈ 4 bytes per
                       adapted parameter of each added layer, remat or not). An unmerged forward, x@W + s·(x@A)@B inside the
                       decoder's projections, would need neither `merged` column.

  activations (bf16), saved for the backward per layer and token, from the
  decoder's ops: 2·(4E + 2·H·D + 2·K·D + 4F) bytes (two norm inputs and outputs,
  q/k/v/attention output, gate/up/SwiGLU product) + 2·H·T (attention
  probabilities kept by the hand-written attention backward); without remat
  × L, with per-layer remat (nothing_saveable) L·2E (layer inputs) + one
  layer's worth (recomputed). Same for LoRA and full fine-tuning. An estimate
  in the spirit of Korthikanti et al. 2022 (arXiv:2205.05198, 34·E + 5·H·T per
  token-layer for GPT); XLA's fusion choices move it by tens of percent.
  logits       4·B·T·V  one float32 [B, T, V] (the LM head on every position).
  KV cache     slots · length · L · 2 · K · D · 2 (bf16 keys and values).
  sampler push per step: the whole model in bf16 (merged_full), only the
  merged adapted kernels (merged_targets), or the float32 adapters.

  --compiled MODEL cross-checks against XLA: it lowers and compiles one AdamW
  step (value_and_grad → update → apply_updates, a TrainedRole's step) from
  ShapeDtypeStructs (still nothing allocated) for full fine-tuning, LoRA with
  the base inside the trained tree (`LoraModel` + `adapter_optimizer`, what a
  TrainedRole holds) and LoRA with the base as a separate jit argument, and
  prints each program's argument / temporary bytes from `memory_analysis()`.
  Equal temporaries for the two LoRA programs show XLA drops the base's zero
  gradients. Compiling a real size takes minutes on CPU: use --batch 1 --seq 256.

  python benchmarks/lora_memory.py [--batch 8] [--seq 2048] [--slots 64]
      [--cache-length 4096] [--ranks 16 64] [--markdown] [--compiled qwen2.5-0.5b]
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import optax

from rlhf_jax.models import DecoderConfig
from rlhf_jax.models import init_model
from rlhf_jax.models import lora as lora_lib
from rlhf_jax.optim import TrainState

GIB = 1 << 30
# Qwen2.5 config.json values (Qwen/Qwen2.5-{0.5B,1.5B,7B}).
MODELS = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, intermediate_size=4864,
                         tie_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12,
                         num_kv_heads=2, head_dim=128, intermediate_size=8960,
                         tie_embeddings=True),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, intermediate_size=18944,
                       tie_embeddings=False),
}


def config_of(name: str) -> DecoderConfig:
  """The DecoderConfig of a MODELS entry (bf16 compute and parameters)."""
  return DecoderConfig(**MODELS[name], max_position_embeddings=32768, rope_theta=1e6,
                       dtype="bfloat16", param_dtype="bfloat16")


def adapter_count(c: DecoderConfig, rank: int) -> int:
  """n = L·r·Σ(in + out) over the seven projections (closed form)."""
  e, h, k, d, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
  sides = (e + h * d) * 2 + (e + k * d) * 2 + 3 * (e + f)
  return c.num_layers * rank * sides


def activation_bytes(c: DecoderConfig, batch: int, seq: int) -> dict[str, int]:
  """Saved-for-backward activations (module docstring), without and with remat."""
  e, h, k, d, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
  per_token_layer = 2 * (4 * e + 2 * h * d + 2 * k * d + 4 * f) + 2 * h * seq
  layer = batch * seq * per_token_layer
  return {"activations": c.num_layers * layer,
          "activations_remat": c.num_layers * batch * seq * 2 * e + layer,
          "logits": 4 * batch * seq * c.vocab_size}


def kv_cache_bytes(c: DecoderConfig, slots: int, length: int) -> int:
  """bf16 keys and values of every layer for `slots` rows of `length` positions."""
  return slots * length * c.num_layers * 2 * c.num_kv_heads * c.head_dim * 2


def rows_for(name: str, args) -> list[dict]:
  """The JSON records of one model: full fine-tuning and LoRA at each rank."""
  c = config_of(name)
  shared = {**activation_bytes(c, args.batch, args.seq),
            "kv_cache": kv_cache_bytes(c, args.slots, args.cache_length)}
  n_model = c.num_params()
  rows = [dict(model=name, method="full", params=n_model, trainable=n_model,
               weights=2 * n_model, master=4 * n_model, grads=4 * n_model,
               adam=8 * n_model, merged=0, merged_grad=0, **shared,
               sampler_push=2 * n_model)]
  for rank in args.ranks:
    lora = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank)
    sizes = lora_lib.lora_sizes(c, lora)  # jax.eval_shape of our init
    if sizes["model"] != n_model or sizes["adapters"] != adapter_count(c, rank):
      raise AssertionError(f"{name}: eval_shape counts {sizes} disagree with the closed "
                           f"forms ({n_model}, {adapter_count(c, rank)}).")
    n = sizes["adapters"]
    push = lora_lib.sampler_update_bytes(c, lora)
    rows.append(dict(model=name, method=f"lora_r{rank}", params=n_model, trainable=n,
                     weights=2 * n_model, master=4 * n, grads=4 * n, adam=8 * n,
                     merged=2 * sizes["targets"], merged_grad=2 * sizes["targets"], **shared,
                     sampler_push=push["merged_targets"], sampler_push_adapters=push["adapters"]))
  for row in rows:
    state = sum(row[key] for key in ("weights", "master", "grads", "adam", "merged",
                                     "merged_grad"))
    row["total"] = state + row["activations"] + row["logits"]
    row["total_remat"] = state + row["activations_remat"] + row["logits"]
  return rows


def gib(x: int) -> str:
  """Bytes as GiB with two decimals."""
  return f"{x / GIB:.2f}"


def markdown(rows: list[dict], args) -> str:
  """The table: GiB per component, one row per (model, method)."""
  head = ("| model | method | trainable | weights | master | grads | Adam | merged W | dW_eff | "
          f"act. B={args.batch} T={args.seq} | act. remat | logits fp32 | total | "
          f"total remat | KV {args.slots}×{args.cache_length} | sampler push (adapters) |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    push = gib(r["sampler_push"]) + (f" ({r['sampler_push_adapters'] / (1 << 20):.1f} MiB)"
                                     if "sampler_push_adapters" in r else "")
    lines.append(
        f"| {r['model']} | {r['method']} | {r['trainable'] / 1e6:,.1f}M | {gib(r['weights'])} | "
        f"{gib(r['master'])} | {gib(r['grads'])} | {gib(r['adam'])} | {gib(r['merged'])} | "
        f"{gib(r['merged_grad'])} | "
        f"{gib(r['activations'])} | {gib(r['activations_remat'])} | {gib(r['logits'])} | "
        f"{gib(r['total'])} | {gib(r['total_remat'])} | {gib(r['kv_cache'])} | {push} |")
  return "\n".join(lines)


def _step_memory(model, params, optimizer, batch: int, seq: int, frozen=None) -> dict:
  """memory_analysis() of one jitted, donated optimizer step (value_and_grad →
  update → apply_updates, as a TrainedRole's mini-batch step) of `model` on
  [batch, seq] tokens, lowered from ShapeDtypeStructs. With `frozen`, the LoRA base
  is a separate (non-donated) argument and `params` holds only the adapters."""

  def loss_fn(p, base, tokens):
    p = p if frozen is None else {lora_lib.ADAPTERS: p, lora_lib.BASE: base}
    logits, _ = model.apply(p, tokens[:, :-1])
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)),
                                 tokens[:, 1:, None], axis=-1)
    return -jnp.mean(picked)

  def step(state, base, tokens):
    grads = jax.grad(loss_fn)(state.params, base, tokens)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return TrainState(params=optax.apply_updates(state.params, updates), opt_state=opt_state)

  state = jax.eval_shape(lambda p: TrainState(params=p, opt_state=optimizer.init(p)), params)
  tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
  compiled = jax.jit(step, donate_argnums=(0,)).lower(state, frozen, tokens).compile()
  stats = compiled.memory_analysis()
  return {"argument": stats.argument_size_in_bytes, "temp": stats.temp_size_in_bytes,
          "output": stats.output_size_in_bytes, "alias": stats.alias_size_in_bytes}


def compiled_rows(name: str, args) -> list[dict]:
  """XLA's memory analysis of one step: full, LoRA (base in the tree), LoRA (base apart)."""
  c = config_of(name)
  model, params = init_model(c, abstract=True)
  adamw = optax.adamw(1e-5)
  lora = lora_lib.LoraConfig(rank=args.ranks[0], alpha=2.0 * args.ranks[0])
  lora_model = lora_lib.LoraModel(model, lora)
  tree = lora_model.abstract_params()
  runs = {"full": (model, params, adamw, None),
          f"lora_r{lora.rank}": (lora_model, tree, lora_lib.adapter_optimizer(adamw), None),
          f"lora_r{lora.rank}_base_apart": (lora_model, tree[lora_lib.ADAPTERS], adamw,
                                            tree[lora_lib.BASE])}
  return [dict(model=name, method=method, backend=jax.default_backend(), batch=args.batch,
               seq=args.seq, **_step_memory(*run[:3], args.batch, args.seq, frozen=run[3]))
          for method, run in runs.items()]


def main() -> None:
  """Prints the JSON lines (and the table with --markdown)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8, help="rows per micro-batch")
  parser.add_argument("--seq", type=int, default=2048, help="tokens per row")
  parser.add_argument("--slots", type=int, default=64, help="sampler KV-cache rows")
  parser.add_argument("--cache-length", type=int, default=4096, help="KV-cache positions")
  parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
  parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
  parser.add_argument("--compiled", choices=list(MODELS),
                      help="instead: XLA's memory analysis of one compiled step of MODEL")
  args = parser.parse_args()
  if args.compiled:
    for row in compiled_rows(args.compiled, args):
      print(json.dumps(row))
    return
  rows = [row for name in args.models for row in rows_for(name, args)]
  for row in rows:
    print(json.dumps(row))
  if args.markdown:
    print()
    print("GiB (2^30 bytes); see the module docstring for each column's formula.")
    print(markdown(rows, args))


if __name__ == "__main__":
  main()
