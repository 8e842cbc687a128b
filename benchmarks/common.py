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
