"""The launchers run as a user runs them: in a fresh process, with --config flags."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_demo(*overrides: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "launch/demo.py", "--config=configs/kernel_demo.py", *overrides],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin",
           # where the packages live when they are not installed (the GPU check's image)
           **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}})


@pytest.mark.slow
def test_demo_prints_every_estimator():
  result = run_demo("--config.group_size=2", "--config.num_prompts=3")
  assert result.returncode == 0, result.stderr
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert set(summary) == {"grpo", "dr_grpo", "rloo", "vcppo_gae", "vapo_gae", "extras"}
  for name in ("vcppo_gae", "vapo_gae"):  # whitened advantages
    assert abs(summary[name]["adv_mean"]) < 1e-5
    assert abs(summary[name]["adv_std"] - 1.0) < 1e-4


def test_demo_rejects_bad_config_by_name():
  result = run_demo("--config.clip_high=0.1")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: config.clip_high: invalid value 0.1: must be >= clip_low=0.2"]
