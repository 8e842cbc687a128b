"""A mixture-of-experts layer's forward and backward: ours (router + dropless grouped GEMMs,
`models.moe`, one run per expert kernel) against transformers' own Qwen3-MoE sparse block in
PyTorch, on the same weights and tokens; on CPU, or on a GPU with `--device gpu`
(scripts/gpu_check.sh's `moe_layer` step: ragged_dot, tiled and pallas).

Shapes: Qwen3-30B-A3B's routing (128 experts, 8 per token, renormalised) at a CPU-sized width
(hidden 512, expert width 256), 2,048 tokens. One step is the forward and the gradient of
sum(out · c) for a fixed random c, with respect to the tokens and every weight (router
included); ours is jitted (compile timed apart); the peer runs on `--threads` threads in
each experts implementation transformers offers: "grouped_mm" (what a
Qwen3MoeForCausalLM picks by default) and "eager" (its loop over the experts hit); one that
fails on the device is recorded with its error (`peer_<implementation>_error`). Every output
is checked equal to the first kernel's first. Prints one JSON line: median seconds per step,
each kernel's ratio to the peer, and the load average.

  python benchmarks/moe_layer.py [--repeats 5] [--threads 2] [--tokens 2048]
                                 [--kernels ragged_dot,tiled,dense] [--device cpu|gpu]
  python benchmarks/moe_layer.py --tiny   (CI: 64 tokens, 8 experts, one repeat)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

SHAPES = dict(hidden=512, expert_width=256, experts=128, top_k=8, tokens=2048)
TINY = dict(hidden=32, expert_width=16, experts=8, top_k=2, tokens=64)
# "pallas" runs in interpret mode off a GPU (far too slow here): GPU runs name it.
KERNELS = ("ragged_dot", "tiled", "dense")


def weights(shape: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """Tokens, cotangent, router [E, X] and experts' gate/up [X, E, F] and down [X, F, E]."""
  rng = np.random.default_rng(seed)
  e, f, x, n = shape["hidden"], shape["expert_width"], shape["experts"], shape["tokens"]
  draw = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-2] if len(s) > 1 else 1)).astype(
      np.float32)
  return {"tokens": rng.standard_normal((n, e)).astype(np.float32),
          "cotangent": rng.standard_normal((n, e)).astype(np.float32),
          "router": draw(e, x), "gate": draw(x, e, f), "up": draw(x, e, f),
          "down": draw(x, f, e)}


def timed(fn, repeats: int) -> tuple[object, list[float]]:
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return out, times


def ours(shape: dict, w: dict, kernel: str, repeats: int) -> dict:
  """Our forward and gradient, jitted: the compile, then `repeats` timed steps."""
  import jax
  import jax.numpy as jnp
  from rlhf_jax.models import moe

  def forward(tokens, router, gate, up, down):
    routes = moe.route(tokens @ router, shape["top_k"], normalize=True)
    return moe.expert_mlp(tokens, routes, gate, up, down, kernel=kernel,
                          precision=jax.lax.Precision.HIGHEST)

  def loss(params, cotangent):
    return jnp.sum(forward(*params) * cotangent)

  step = jax.jit(jax.value_and_grad(loss))
  params = tuple(jnp.asarray(w[k]) for k in ("tokens", "router", "gate", "up", "down"))
  cotangent = jnp.asarray(w["cotangent"])
  start = time.perf_counter()
  jax.block_until_ready(step(params, cotangent))
  compile_s = time.perf_counter() - start
  _, times = timed(lambda: jax.block_until_ready(step(params, cotangent)), repeats)
  out = np.asarray(jax.jit(forward)(*params))
  return {"compile_s": compile_s, "s": statistics.median(times), "runs_s": times, "out": out}


PEER_IMPLEMENTATIONS = ("grouped_mm", "eager")


def peer(shape: dict, w: dict, threads: int, repeats: int, implementation: str,
         device: str = "cpu") -> dict:
  """transformers' Qwen3MoeSparseMoeBlock with our weights, its experts run by
  `implementation`: forward and backward, on `device` ("cpu" or "gpu": CUDA)."""
  import torch
  import transformers
  from transformers.models.qwen3_moe import modeling_qwen3_moe

  torch.set_num_threads(threads)
  where = torch.device("cuda" if device == "gpu" else "cpu")
  config = transformers.Qwen3MoeConfig(
      hidden_size=shape["hidden"], moe_intermediate_size=shape["expert_width"],
      num_experts=shape["experts"], num_experts_per_tok=shape["top_k"], norm_topk_prob=True)
  # As a whole Qwen3MoeForCausalLM sets it (a block built alone has none); "eager": None.
  config._experts_implementation = None if implementation == "eager" else implementation
  block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config)
  with torch.no_grad():
    block.gate.weight.copy_(torch.from_numpy(w["router"].T.copy()))
    block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate(
        [w["gate"], w["up"]], axis=2).transpose(0, 2, 1).copy()))
    block.experts.down_proj.copy_(torch.from_numpy(w["down"].transpose(0, 2, 1).copy()))
  block.to(where)
  tokens = torch.from_numpy(w["tokens"]).to(where).requires_grad_(True)
  cotangent = torch.from_numpy(w["cotangent"]).to(where)

  def step():
    block.zero_grad(set_to_none=True)
    tokens.grad = None
    out = block(tokens[None])[0]
    (out * cotangent).sum().backward()
    if device == "gpu":
      torch.cuda.synchronize()
    return out

  step()  # untimed warm-up: first ops allocate and load kernels
  out, times = timed(step, repeats)
  return {"s": statistics.median(times), "runs_s": times, "out": out.detach().cpu().numpy(),
          "torch": torch.__version__, "transformers": transformers.__version__}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--tokens", type=int, default=SHAPES["tokens"])
  parser.add_argument("--kernels", default=",".join(KERNELS),
                      help="our expert kernels to time, comma-separated")
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--tiny", action="store_true", help="toy shapes, one repeat (CI)")
  args = parser.parse_args()
  shape = dict(TINY) if args.tiny else dict(SHAPES, tokens=args.tokens)
  repeats = 1 if args.tiny else args.repeats
  if args.device == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import rlhf_jax
  from rlhf_jax.models.moe import EXPERT_KERNELS

  kernels = tuple(args.kernels.split(","))
  unknown = [k for k in kernels if k not in EXPERT_KERNELS]
  if unknown:
    parser.error(f"--kernels: {', '.join(unknown)} not among {', '.join(EXPERT_KERNELS)}")
  if args.device == "gpu" and jax.default_backend() != "gpu":
    parser.error(f"--device gpu: jax's backend is {jax.default_backend()}")

  w = weights(shape)
  result = {"workload": "moe_layer", "shape": shape, "repeats": repeats,
            "threads": args.threads, "device": args.device, "kernels": kernels,
            "loadavg_start": os.getloadavg()[0],
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "rlhf_jax": rlhf_jax.__version__}}
  outs = {}
  for kernel in kernels:
    try:
      measured = ours(shape, w, kernel, repeats)
    except Exception as error:  # pylint: disable=broad-except
      # A kernel that does not compile on this device (a first run of the Pallas one on a
      # new GPU) is recorded, the others still timed; the exit status says it failed.
      result[f"ours_{kernel}_error"] = f"{type(error).__name__}: {error}"[:2000]
      continue
    outs[kernel] = measured.pop("out")
    result.update({f"ours_{kernel}_{k}": v for k, v in measured.items()})
    print(f"ours {kernel}: {measured['s']:.3f} s per step", file=sys.stderr, flush=True)
    first = next(iter(outs))
    np.testing.assert_allclose(outs[kernel], outs[first], rtol=1e-4, atol=1e-4,
                               err_msg=f"{kernel} against {first}")
  timed_kernels = tuple(outs)
  try:
    import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as error:
    result["peer"] = f"skipped: {error}"
  else:
    result["peer"] = "transformers Qwen3MoeSparseMoeBlock"
    for implementation in PEER_IMPLEMENTATIONS:
      try:
        measured = peer(shape, w, args.threads, repeats, implementation, args.device)
      except (RuntimeError, NotImplementedError) as error:  # e.g. no grouped_mm on this GPU
        result[f"peer_{implementation}_error"] = f"{type(error).__name__}: {error}"[:500]
        continue
      out = measured.pop("out")
      if outs:
        np.testing.assert_allclose(next(iter(outs.values())), out, rtol=1e-3, atol=1e-3)
      result["versions"].update(torch=measured.pop("torch"),
                                transformers=measured.pop("transformers"))
      result.update({f"peer_{implementation}_{k}": v for k, v in measured.items()})
      print(f"peer {implementation}: {measured['s']:.3f} s per step", file=sys.stderr,
            flush=True)
      for kernel in timed_kernels:
        result[f"ratio_peer_{implementation}_over_{kernel}"] = (
            result[f"peer_{implementation}_s"] / result[f"ours_{kernel}_s"])
  result["loadavg_end"] = os.getloadavg()[0]
  print(json.dumps(result))
  return 0 if len(timed_kernels) == len(kernels) else 1


if __name__ == "__main__":
  sys.exit(main())
