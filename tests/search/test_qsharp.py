"""launch/qsharp.py (search/qsharp.py) end to end on a tiny policy: the reference, then the
guided policy of each round, the guide saved, and a prompt bucket too small refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlhf_jax.tasks import arith
from tests.launch.runs import SMALL
from tests.launch.runs import run


@pytest.mark.slow
def test_the_launcher_fits_and_evaluates_the_guide(policy_workdir, tmp_path):
  common = ["--config=configs/ppo.py:arith", f"--workdir={policy_workdir}", *SMALL,
            "--config.train.loggers=", "--config.data.num_eval=3"]
  result = run("qsharp.py", *common, "--config.sampler.prompt_buckets=64,127", "--rounds=2",
               "--prompts_per_round=3", "--samples=2", "--steps=2", "--eval_samples=1",
               f"--output={tmp_path}/guide.npz")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert [r["policy"] for r in lines] == ["reference", "qsharp_eta0.1", "qsharp_eta0.1"]
  assert abs(lines[0]["kl_to_ref"]) < 1e-4 and lines[2]["rows"] == 12
  guide = np.load(f"{tmp_path}/guide.npz")
  assert guide["w"].shape[1] == guide["b"].shape[0] == 2 * arith.tokenizer().vocab_size
  result = run("qsharp.py", *common, "--rounds=1")
  assert result.returncode != 0 and "sampler.prompt_buckets" in result.stderr
