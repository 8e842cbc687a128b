"""A run's held-out report from its metrics.jsonl: a per-level table and curves.

Used by launch/report.py (and the demo) and colabs/run_curves.ipynb.
"""

from __future__ import annotations

import json


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl, in file order."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def pyplot():
  """matplotlib.pyplot on the Agg backend (files, no display), or None without
  matplotlib (the `plot` extra)."""
  try:
    import matplotlib
  except ImportError:
    return None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(plt, figure, path: str) -> bool:
  """Lays out, writes (PNG at 110 dpi) and closes `figure`; True."""
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return True


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
  plt = pyplot()
  if plt is None:
    return False
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
  return save_figure(plt, figure, path)


def passk_table(results: dict[str, list[dict]]) -> str:
  """Markdown: per sampling mode the mean over checkpoints of accuracy and each pass@k,
  each checkpoint's value in brackets. `results[mode]` holds evaluate_policy's dicts."""
  ks = sorted({int(k.split("@")[1]) for rows in results.values() for r in rows
               for k in r if k.startswith("pass@")})
  keys = ["accuracy"] + [f"pass@{k}" for k in ks]
  lines = ["| sampling | " + " | ".join(keys) + " |", "| --- |" + " ---: |" * len(keys)]
  for mode, rows in results.items():
    cells = []
    for key in keys:
      values = [100 * r[key] for r in rows]
      cells.append(f"{sum(values) / len(values):.1f} ({' / '.join(f'{v:.1f}' for v in values)})")
    lines.append(f"| {mode} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_passk(results: dict[str, list[dict]], path: str, title: str = "") -> bool:
  """pass@k against k (log scale), a colour per sampling mode: each checkpoint thin,
  their mean thick. False without matplotlib."""
  plt = pyplot()
  if plt is None:
    return False
  figure, axis = plt.subplots(figsize=(5.5, 3.8))
  for i, (mode, rows) in enumerate(results.items()):
    ks = sorted(int(k.split("@")[1]) for k in rows[0] if k.startswith("pass@"))
    curves = [[100 * r[f"pass@{k}"] for k in ks] for r in rows]
    for curve in curves:
      axis.plot(ks, curve, color=f"C{i}", alpha=0.35, linewidth=0.8)
    axis.plot(ks, [sum(c) / len(c) for c in zip(*curves)], color=f"C{i}", linewidth=2.2,
              marker="o", markersize=3, label=mode)
  axis.set_xscale("log", base=2)
  axis.set_xlabel("k")
  axis.set_ylabel("pass@k (%)")
  axis.grid(alpha=0.3)
  axis.legend(fontsize=8)
  if title:
    axis.set_title(title, fontsize=10)
  return save_figure(plt, figure, path)
