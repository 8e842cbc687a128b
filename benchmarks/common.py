"""Helpers shared by the benchmark scripts (run as `python benchmarks/<name>.py`)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "bench"


def default_peer_python() -> str:
  """The peers' interpreter: /tmp/venv_peers (shared/bench/setup.sh) if present, else ours."""
  peers = pathlib.Path("/tmp/venv_peers/bin/python")
  return str(peers) if peers.exists() else sys.executable


def run_json(command: list[str], env: dict[str, str], timeout_s: int = 3600) -> list[dict]:
  """Runs a peer program and returns the JSON objects it printed, one per stdout line.

  Lines that are not JSON (TRL prints Python dicts such as "{'loss': ...}") are skipped.
  Raises RuntimeError with the end of stderr if the program fails.
  """
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
  if result.returncode:
    raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
  records = []
  for line in result.stdout.splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return [r for r in records if isinstance(r, dict)]


def peer_env(threads: int, *, original_malloc: bool = True) -> dict[str, str]:
  """The peers' environment: `threads` OpenMP threads, hub access off, and (by default)
  the GLIBC_TUNABLES this process started with, not the ones our runtime re-exec set."""
  env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
         "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
  if original_malloc:
    env["GLIBC_TUNABLES"] = os.environ.get("RLHF_JAX_ORIGINAL_GLIBC_TUNABLES", "")
  return env


def ensure_bench_model(peer_python: str, model_dir: str, marker: str,
                       env: dict[str, str]) -> None:
  """Builds the shared checkpoint (shared/bench/make_model.py) unless `marker` exists in it."""
  if not os.path.exists(os.path.join(model_dir, marker)):
    subprocess.run([peer_python, str(BENCH / "make_model.py"), model_dir], check=True, env=env,
                   capture_output=True)


def tiny_bench_model(directory: str, *, w1_shape: tuple[int, int] = (4, 8),
                     w2_shape: tuple[int, int, int] = (4, 8, 16), w3_prompts: int = 4) -> str:
  """A tiny stand-in for shared/bench/make_model.py's checkpoint, for `--tiny` runs (CI):
  a 1-layer, 32-wide Qwen2-style decoder with a byte-level BPE tokenizer of 300 tokens,
  written by our own `models.save_policy` (no torch), and the workload files the
  scripts read in the same layout: workload_inputs.npz (W1 prompt ids [B, P]; W2 ids
  [B, S] with prompt P, advantages, old log-probs, loss mask) and w3_prompts.jsonl
  (prompt text, its ids, the answer). Shapes: w1 (B, P), w2 (B, P, S). Returns
  `directory`; a directory already holding w3_prompts.jsonl is reused."""
  import numpy as np

  from rlhf_jax import models

  if os.path.exists(os.path.join(directory, "w3_prompts.jsonl")):
    return directory
  os.makedirs(directory, exist_ok=True)
  problems = [(f"What is {a} plus {a + 3}? Answer:", str(2 * a + 3)) for a in range(w3_prompts)]
  tokenizer = models.train_bpe_tokenizer(
      [text + " " + answer for text, answer in problems] * 10, vocab_size=300)
  vocab = tokenizer.vocab_size
  model, params = models.init_model(models.DecoderConfig(
      architecture="qwen2", vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2,
      num_kv_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=512,
      tie_embeddings=True, qkv_bias=True), seed=0)
  models.save_policy(directory, model, params, tokenizer, [])
  rng = np.random.default_rng(0)
  batch, prompt, seq = w2_shape
  mask = np.zeros((batch, seq), np.int32)
  mask[:, prompt:] = 1
  np.savez(os.path.join(directory, "workload_inputs.npz"),
           w1_prompt_ids=rng.integers(3, vocab, w1_shape).astype(np.int32),
           w2_input_ids=rng.integers(3, vocab, (batch, seq)).astype(np.int32),
           w2_advantages=rng.standard_normal(batch).astype(np.float32),
           w2_old_logprobs=np.full((batch, seq - prompt), -np.log(vocab), np.float32),
           w2_loss_mask=mask)
  with open(os.path.join(directory, "w3_prompts.jsonl"), "w", encoding="utf-8") as f:
    for text, answer in problems:
      f.write(json.dumps({"prompt": text, "prompt_ids": tokenizer.encode(text),
                          "answer": answer}) + "\n")
  return directory


def tiny_model_dir(given: str, default: str) -> str:
  """--tiny's checkpoint directory: `given` when the user named one (built there if
  missing), else a fresh temporary one removed at exit."""
  import atexit
  import shutil
  import tempfile

  if given != default:
    return tiny_bench_model(given)
  directory = tempfile.mkdtemp(prefix="rlhf_jax_tiny_bench_")
  atexit.register(shutil.rmtree, directory, ignore_errors=True)
  return tiny_bench_model(directory)


def peer_skipped(reason: str) -> dict[str, str]:
  """The record's note that the peer side did not run, and why (a --tiny run, or the
  peer's packages are not installed)."""
  return {"peer": f"skipped: {reason}"}
