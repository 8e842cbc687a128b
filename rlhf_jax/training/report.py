"""A run's held-out report from its metrics.jsonl: a per-level table and curves.

Used by launch/report.py (and the demo) and colabs/run_curves.ipynb.
"""

from __future__ import annotations

import json


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl, in file order."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def evaluations(path: str) -> list[dict]:
  """The metrics records that hold an evaluation, in step order."""
  return sorted((r for r in read_metrics(path) if "eval_accuracy" in r),
                key=lambda r: r["step"])


def report_table(first: dict, last: dict) -> str:
  """Markdown: one row per group and one for all, greedy and sampled, start → end."""
  groups = sorted(k.split("/", 1)[1] for k in last if k.startswith("eval_accuracy/"))

  def cell(record, key):
    return f"{100 * record[key]:.1f}" if key in record else "–"

  def delta(key):
    if key not in first or key not in last:
      return "–"
    return f"{100 * (last[key] - first[key]):+.1f}"

  lines = [f"| held-out (step {first['step']} → {last['step']}) | greedy before | greedy after "
           "| change | sampled before | sampled after | change |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for label, suffix in [(g, f"/{g}") for g in groups] + [("all", "")]:
    greedy, sampled = f"eval_accuracy{suffix}", f"eval_sampled_accuracy{suffix}"
    lines.append(f"| {label} | {cell(first, greedy)} | {cell(last, greedy)} | "
                 f"{delta(greedy)} | {cell(first, sampled)} | {cell(last, sampled)} | "
                 f"{delta(sampled)} |")
  return "\n".join(lines) + "\n"


def plot_evaluations(records: list[dict], path: str) -> bool:
  """Greedy accuracy per group and sampled accuracy over steps; False without matplotlib."""
  try:
    import matplotlib
  except ImportError:
    return False
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps = [r["step"] for r in records]
  keys = sorted({k for r in records for k in r
                 if k.startswith(("eval_accuracy", "eval_sampled_accuracy"))})
  figure, axis = plt.subplots(figsize=(7, 4))
  groups = sorted({k.split("/", 1)[1] if "/" in k else "all" for k in keys})
  colors = {g: f"C{i}" for i, g in enumerate(groups)}
  for key in keys:
    group = key.split("/", 1)[1] if "/" in key else "all"
    sampled = "sampled" in key
    axis.plot(steps, [100 * r.get(key, float("nan")) for r in records],
              "--" if sampled else "-", color=colors[group],
              linewidth=2.5 if group == "all" else 1.2, marker="o", markersize=3,
              label=f"{group} {'sampled' if sampled else 'greedy'}")
  axis.set_xlabel("RL step")
  axis.set_ylabel("held-out accuracy (%)")
  axis.grid(alpha=0.3)
  axis.legend(fontsize=7, ncol=2)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return True
