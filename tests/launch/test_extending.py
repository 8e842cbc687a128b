"""An estimator and a policy loss of one's own module, named on launch/train.py's command
line as "package.module:name" (docs/extending.md), train a shrunken arith run."""

import json
import os
import subprocess
import sys

import pytest

from tests.algorithms import registry_plugins
from tests.launch.runs import ROOT
from tests.launch.runs import SMALL

PLUGINS = "tests.algorithms.registry_plugins"


@pytest.mark.slow
def test_module_estimator_and_policy_loss_train_from_the_launcher(tmp_path):
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/grpo.py:arith",
       f"--workdir={workdir}", *SMALL,
       f"--config.algorithm.advantage.estimator={PLUGINS}:constant_advantage",
       f"--config.algorithm.policy_loss.kind={PLUGINS}:unclipped"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])["steps"] == 1
  logged = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  step = next(r for r in logged if r["step"] == 1)
  # Only `unclipped` logs this metric, and it is the mean advantage it was given: the
  # constant estimator's, where GRPO's group-normalised ones would average near 0.
  assert step["plugin/advantage_mean"] == pytest.approx(registry_plugins.CONSTANT, rel=1e-6)
  assert "pg_loss" in step
