"""Proxy reward vs true accuracy of the reward-model runs (docs/reward_models.md).

  python scripts/reproduce/reward_hacking_plot.py ROOT OUT_PREFIX arm [arm ...]

Reads ROOT/<arm>/seed0/metrics.jsonl. Per step: what the reward model says (`reward_mean`:
the RM's score or the judge's P(yes); with a PRM its last-step score, the PRM's verdict on
the whole response), the true accuracy of the same
training samples (the monitor's `reward/<route>/true_accuracy`, or the verifier's
`accuracy` when the verifier is the reward), and held-out greedy accuracy by the
verifier (`eval_accuracy`). Writes OUT_PREFIX.md (a table) and OUT_PREFIX.png.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from rlhf_jax.analysis.report import pyplot, save_figure  # noqa: E402


def true_training_accuracy(record):
  for key, value in record.items():
    if key.endswith("/true_accuracy"):
      return value
  return record.get("accuracy") if not any(k.endswith("/share") for k in record) else None


def proxy(record):
  """What the run's reward model says: the PRM's last-step score when a PRM is in the
  reward, else the training reward (RM score, judge's P(yes), or the verifier's)."""
  return record.get("process/last_step_score_mean", record["reward_mean"])


def series(root, arm):
  rows = [json.loads(line) for line in open(os.path.join(root, arm, "seed0", "metrics.jsonl"))]
  steps = [r for r in rows if "reward_mean" in r]
  evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
  return ([(r["step"], proxy(r)) for r in steps],
          [(r["step"], true_training_accuracy(r)) for r in steps], evals)


def mean(values):
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else float("nan")


def main(root, prefix, arms):
  lines = ["| reward | proxy (model's verdict), steps 1–5 → last 5 | true accuracy of training samples, "
           "steps 1–5 → last 5 | held-out greedy accuracy, start → end |",
           "| --- | --- | --- | --- |"]
  data = {arm: series(root, arm) for arm in arms}
  for arm, (proxy, truth, evals) in data.items():
    p, t = [v for _, v in proxy], [v for _, v in truth]
    lines.append(f"| {arm} | {mean(p[:5]):+.3f} → {mean(p[-5:]):+.3f} | "
                 f"{100 * mean(t[:5]):.1f} % → {100 * mean(t[-5:]):.1f} % | "
                 f"{100 * evals[0][1]:.1f} % → {100 * evals[-1][1]:.1f} % |")
  with open(prefix + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  plt = pyplot()
  if plt is None:
    return
  figure, axes = plt.subplots(1, 3, figsize=(15, 4))
  titles = ("reward model's verdict (proxy)", "true accuracy, training samples",
            "held-out greedy accuracy (verifier)")
  for arm, curves in data.items():
    for axis, curve in zip(axes, curves):
      points = [(s, v) for s, v in curve if v is not None]
      axis.plot([s for s, _ in points], [v for _, v in points], label=arm, marker=".")
  for axis, title in zip(axes, titles):
    axis.set_title(title)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
  axes[0].legend()
  save_figure(plt, figure, prefix + ".png")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3:])
