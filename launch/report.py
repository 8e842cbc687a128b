r"""A run's held-out report: python launch/report.py --workdir=runs/demo-...

Reads <workdir>/metrics.jsonl and writes
  <workdir>/report.md   a table per level (or task): greedy and sampled accuracy at the
                        first and last evaluation, and their change;
  <workdir>/report.png  the held-out curves (needs matplotlib, the `plot` extra).
Prints the table.
"""

from __future__ import annotations

import os

from absl import flags

from rlhf_jax import cli
from rlhf_jax.config_errors import ConfigError

from rlhf_jax.analysis.report import evaluations
from rlhf_jax.analysis.report import plot_evaluations
from rlhf_jax.analysis.report import report_table

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding metrics.jsonl.")
flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
  del argv
  path = os.path.join(_WORKDIR.value, "metrics.jsonl")
  if not os.path.exists(path):
    raise ConfigError(f"{path} does not exist (is --workdir a training run?).")
  try:
    records = evaluations(path)
  except ValueError as error:  # not JSON lines (json's error names no file)
    raise ConfigError(f"{path}: {error}") from None
  if not records:
    raise ConfigError(f"{path} has no evaluation (eval_accuracy) records.")
  table = report_table(records[0], records[-1])
  with open(os.path.join(_WORKDIR.value, "report.md"), "w", encoding="utf-8") as f:
    f.write(table)
  print(table, end="")
  png = os.path.join(_WORKDIR.value, "report.png")
  print(f"curves: {png}" if plot_evaluations(records, png) else
        "no report.png: matplotlib is missing (pip install 'rlhf-jax[plot]')", flush=True)


if __name__ == "__main__":
  cli.run(main, compile_cache=False)
