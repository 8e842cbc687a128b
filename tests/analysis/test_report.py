"""The held-out report: the per-group table from the first and last evaluation."""

import json

from rlhf_jax.analysis import report


def test_table_gives_each_group_before_after_and_change(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [
      {"step": 2, "reward_mean": 0.1},  # a training record: not an evaluation
      {"step": 10, "eval_accuracy": 0.5, "eval_accuracy/L1": 0.75, "eval_accuracy/L2": 0.25,
       "eval_sampled_accuracy": 0.625},
      {"step": 0, "eval_accuracy": 0.25, "eval_accuracy/L1": 0.5, "eval_accuracy/L2": 0.0,
       "eval_sampled_accuracy": 0.375},
  ]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  evaluations = report.evaluations(str(path))
  assert [r["step"] for r in evaluations] == [0, 10]
  lines = report.report_table(evaluations[0], evaluations[-1]).splitlines()
  assert lines[0].startswith("| held-out (step 0 → 10) |")
  cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
  assert cells == [
      ["L1", "50.0", "75.0", "+25.0", "–", "–", "–"],
      ["L2", "0.0", "25.0", "+25.0", "–", "–", "–"],
      ["all", "25.0", "50.0", "+25.0", "37.5", "62.5", "+25.0"],
  ]
