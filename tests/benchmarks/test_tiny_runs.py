"""Every script in benchmarks/ runs in a tiny form on CPU, so a benchmark cannot break
without a sound (W3, benchmarks/grpo_step.py, once stopped before its first step and no test
saw it). A tiny run goes through the script's own code at toy sizes; the peers it compares
against (TRL, transformers, PyTorch) are skipped and the record says so. gpu.py's tiny runs
are in test_gpu_tools.py."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# Script: its tiny form's arguments ("{tmp}": a fresh directory).
TINY = {
    "async_rl.py": ["--tiny", "--workdir", "{tmp}"],
    "async_sim.py": ["--steps", "20"],
    "compile_time.py": ["--tiny", "--markdown"],
    "decode_bytes.py": ["--shapes", "tiny"],
    "distill_arith.py": ["--tiny", "--workdir", "{tmp}"],
    "grpo_step.py": ["--tiny"],
    "kernels.py": ["--tiny"],
    "lora_memory.py": ["--models", "qwen2.5-0.5b", "--ranks", "16", "--markdown"],
    "memory_analysis.py": ["--tiny", "--markdown"],
    "moe_grpo.py": ["--tiny"],
    "moe_layer.py": ["--tiny"],
    "moe_replay.py": ["--tiny"],
    "packing.py": ["--tiny"],
    "sampling.py": ["--tiny"],
    "train_step.py": ["--tiny"],
}
ELSEWHERE = {"gpu.py": "test_gpu_tools.py: --tiny --parts g1,g2,g4 and kern,g1,g2",
             "gpu_kern.py": "test_gpu_kern_verdicts.py: one case per process, --choose"}


def test_every_benchmark_script_has_a_tiny_run():
  scripts = {path.name for path in BENCHMARKS.glob("*.py")
             if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")}
  assert scripts == set(TINY) | set(ELSEWHERE)


def records(text: str) -> list[dict]:
  return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY))
def test_the_tiny_form_runs(script, tmp_path):
  args = [arg.replace("{tmp}", str(tmp_path / "work")) for arg in TINY[script]]
  result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-3000:]
  out = records(result.stdout)
  assert out, result.stdout[-2000:]
  if script == "grpo_step.py":  # W3: our GRPO step after the data check took its scorer
    (w3,) = out
    assert w3["workload"] == "W3_grpo_step" and w3["peer"].startswith("skipped")
    assert w3["ours_s_per_step_median"] > 0 and len(w3["rewards_mean"]) == 1
  if script in ("sampling.py", "train_step.py"):
    assert out[0]["peer"].startswith("skipped") and "ratio" not in " ".join(out[0])
  if script == "train_step.py":
    assert math.isfinite(out[0]["ours_first_loss"])
  if script == "sampling.py":
    assert [r["workload"] for r in out] == ["W1_generate"] + ["long_tail_generate"] * 2
