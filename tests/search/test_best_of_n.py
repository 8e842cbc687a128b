"""launch/best_of_n.py (search/best_of_n.py) end to end on a tiny policy: speculative rejection
beside plain best-of-N at two sizes, cancelling samples and generating fewer tokens."""

from __future__ import annotations

import json

import pytest

from tests.launch.runs import SMALL
from tests.launch.runs import run


@pytest.mark.slow
def test_the_launcher_compares_speculative_rejection_with_best_of_n(policy_workdir):
  result = run("best_of_n.py", "--config=configs/ppo.py:arith", f"--workdir={policy_workdir}",
               *SMALL, "--config.train.loggers=", "--config.data.num_eval=3", "--n=4",
               "--decision_tokens=2,4", "--rejection_rate=0.5", "--compare", "--bon_n=2")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert [(r["method"], r["n"]) for r in lines] == [
      ("speculative_rejection", 4), ("best_of_n", 4), ("best_of_n", 2)]
  # At most ⌊4/2⌋ then ⌊2/2⌋ per prompt (fewer when samples end before a decision).
  assert 0 < lines[0]["cancelled_samples"] <= 3 * (2 + 1)
  assert lines[0]["generated_tokens"] < lines[1]["generated_tokens"]
  assert all(0 <= r["accuracy"] <= 1 for r in lines)
