"""Sweep arms, statistics and tables (rlhf_jax/analysis/sweeps.py) on hand-made records."""

import math

import pytest

from rlhf_jax.analysis import sweeps
from rlhf_jax.analysis.report import passk_table

# Steps 0..4; eval every 2 steps; 1 s of generation and 2 s of update per step.
RUN = [{"step": 0, "eval_accuracy": 0.40},
       {"step": 1, "entropy": 0.5, "time_generate": 1.0, "time_update": 2.0},
       {"step": 2, "entropy": 0.3, "time_generate": 1.0, "time_update": 2.0,
        "eval_accuracy": 0.48},
       {"step": 3, "entropy": 0.2, "time_generate": 1.0, "time_update": 2.0},
       {"step": 4, "entropy": 0.1, "time_generate": 1.0, "time_update": 2.0,
        "eval_accuracy": 0.61}]


def test_parse_arm_reads_name_and_overrides():
  arm = sweeps.parse_arm("sym: algorithm.policy_loss.clip_high=0.2 --config.data.levels=(1,2)")
  assert arm == sweeps.Arm("sym", (("algorithm.policy_loss.clip_high", "0.2"),
                                   ("data.levels", "(1,2)")))
  assert sweeps.parse_arm("base:") == sweeps.Arm("base", ())
  for bad, message in (("no colon", "expected 'name: key=value"),
                       ("Bad Name: a=1", "expected 'name: key=value"),
                       ("x: a", "'a' is not key=value"), ("x: a=", "'a=' is not key=value")):
    with pytest.raises(ValueError, match=message):
      sweeps.parse_arm(bad)


def test_parse_stat_checks_kind_and_threshold():
  assert sweeps.parse_stat("steps_to:eval_accuracy:0.15") == sweeps.Stat(
      "steps_to", "eval_accuracy", 0.15)
  assert sweeps.parse_stat("late_mean:entropy").label == "late_mean entropy"
  for bad, message in (("median:entropy", "kind one of"), ("final:x:1", "takes no threshold"),
                       ("steps_to:x", "needs a threshold"), ("steps_to:x:high", "not a number")):
    with pytest.raises(ValueError, match=message):
      sweeps.parse_stat(bad)


@pytest.mark.parametrize("text, expected", [
    ("final:eval_accuracy", 0.61),
    ("gain:eval_accuracy", 0.61 - 0.40),
    ("mean:entropy", (0.5 + 0.3 + 0.2 + 0.1) / 4),
    ("late_mean:entropy", (0.2 + 0.1) / 2),  # the second half: steps ≥ (1 + 4) / 2
    ("steps_to:eval_accuracy:0.05", 2.0),  # 0.48 ≥ 0.40 + 0.05
    ("steps_to:eval_accuracy:0.1", 4.0),
    ("seconds_to:eval_accuracy:0.1", 12.0),  # 4 steps of 1 + 2 s
    ("steps_to:eval_accuracy:0.3", math.nan),  # never reached
    ("final:missing_metric", math.nan),
])
def test_statistics_against_hand_computed_values(text, expected):
  value = sweeps.statistic(RUN, sweeps.parse_stat(text))
  if math.isnan(expected):
    assert math.isnan(value)
  else:
    assert value == pytest.approx(expected)


def test_series_in_seconds_accumulates_generation_and_update_time():
  xs, ys = sweeps.series(list(reversed(RUN)), "eval_accuracy", x="seconds")
  assert xs.tolist() == [0.0, 6.0, 12.0] and ys.tolist() == [0.40, 0.48, 0.61]


def test_markdown_table_gives_the_mean_and_each_seed():
  other = [dict(r, eval_accuracy=r["eval_accuracy"] - 0.1) if "eval_accuracy" in r else r
           for r in RUN]
  table = sweeps.markdown_table({"a": {0: RUN, 1: other}},
                                [sweeps.parse_stat("final:eval_accuracy"),
                                 sweeps.parse_stat("steps_to:eval_accuracy:0.2")])
  lines = table.splitlines()
  assert lines[0] == "| arm | final eval_accuracy | steps_to eval_accuracy +0.2 |"
  # final: 0.61 and 0.51, mean 0.56; +0.2 reached at step 4 by both seeds.
  assert lines[2] == "| a | 0.56 (0.61 / 0.51) | 4 (4 / 4) |"
  table = sweeps.markdown_table({"a": {0: RUN, 1: RUN[:3]}},
                                [sweeps.parse_stat("steps_to:eval_accuracy:0.2")])
  assert table.splitlines()[2] == "| a | – (4 / –) |"  # no mean when a seed never got there


def test_plot_sweep_writes_a_png(tmp_path):
  pytest.importorskip("matplotlib")
  path = tmp_path / "sweep.png"
  assert sweeps.plot_sweep({"a": {0: RUN, 1: RUN}, "b": {0: RUN}}, ["entropy", "eval_accuracy"],
                           str(path), title="t")
  assert path.stat().st_size > 1000
  assert sweeps.plot_sweep({"a": {0: RUN}}, ["eval_accuracy"], str(path), x="seconds")


def test_passk_table_averages_checkpoints_per_mode():
  rows = {"none": [{"accuracy": 0.5, "pass@1": 0.5, "pass@2": 0.6},
                   {"accuracy": 0.3, "pass@1": 0.3, "pass@2": 0.5}],
          "first_token": [{"accuracy": 0.4, "pass@1": 0.4, "pass@2": 0.7},
                          {"accuracy": 0.2, "pass@1": 0.2, "pass@2": 0.5}]}
  lines = passk_table(rows).splitlines()
  assert lines[0] == "| sampling | accuracy | pass@1 | pass@2 |"
  assert lines[2] == "| none | 40.0 (50.0 / 30.0) | 40.0 (50.0 / 30.0) | 55.0 (60.0 / 50.0) |"
  assert lines[3].startswith("| first_token | 30.0 (40.0 / 20.0) |")
