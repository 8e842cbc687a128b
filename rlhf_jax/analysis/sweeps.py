"""Ablation sweeps: arms × seeds of `launch/train.py` runs, summarised per arm.

An arm is a named set of config overrides ("symmetric: algorithm.policy_loss.clip_high=0.2");
every arm runs once per seed, each seed from its own SFT warm start. A statistic reduces
one run's metrics.jsonl to a number; `markdown_table` shows each arm's statistics per
seed and their mean, `plot_sweep` draws the curves (thin: seeds, thick: the seeds' mean).
Used by launch/sweep.py and the scripts/reproduce/*.sh rows of docs/reproductions.md.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from rlhf_jax.analysis.report import pyplot
from rlhf_jax.analysis.report import save_figure

_ARM_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# What a statistic computes from one run's series of a metric (values at the steps
# that logged it, in step order):
STATS = {
    "final": "the last value",
    "gain": "the last value minus the first",
    "mean": "the mean over all steps",
    "late_mean": "the mean over the second half of the steps",
    "steps_to": "the first step whose value is at least the first value + THRESHOLD",
    "seconds_to": "the training seconds (generation + update) up to that step",
}


@dataclasses.dataclass(frozen=True)
class Arm:
  """One setting of a sweep: its name and its `--config.<key>=<value>` overrides."""
  name: str
  overrides: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Stat:
  """A statistic `kind:metric` (`steps_to`/`seconds_to` add `:threshold`)."""
  kind: str
  metric: str
  threshold: float = 0.0

  @property
  def label(self) -> str:
    """The table's column header, e.g. "steps_to eval_accuracy +0.15"."""
    if self.kind in ("steps_to", "seconds_to"):
      return f"{self.kind} {self.metric} +{self.threshold:g}"
    return f"{self.kind} {self.metric}"


def parse_arm(text: str) -> Arm:
  """"name: key=value key=value" (values without spaces, e.g. data.levels=(1,2,3))."""
  name, sep, rest = text.partition(":")
  name = name.strip()
  if not sep or not _ARM_NAME.match(name):
    raise ValueError(f"arm {text!r}: expected 'name: key=value ...' with a lower-case name "
                     "of letters, digits, '-', '_' or '.'")
  overrides = []
  for item in rest.split():
    key, eq, value = item.partition("=")
    if not eq or not key or not value:
      raise ValueError(f"arm {name!r}: {item!r} is not key=value")
    overrides.append((key.removeprefix("--config.").removeprefix("config."), value))
  return Arm(name, tuple(overrides))


def parse_stat(text: str) -> Stat:
  """"kind:metric" or "kind:metric:threshold" with kind one of STATS."""
  parts = text.split(":")
  if len(parts) not in (2, 3) or parts[0] not in STATS or not parts[1]:
    raise ValueError(f"statistic {text!r}: expected kind:metric[:threshold] with kind one "
                     f"of {', '.join(STATS)}")
  needs_threshold = parts[0] in ("steps_to", "seconds_to")
  if needs_threshold != (len(parts) == 3):
    raise ValueError(f"statistic {text!r}: {parts[0]} " +
                     ("needs a threshold (kind:metric:threshold)" if needs_threshold
                      else "takes no threshold"))
  try:
    threshold = float(parts[2]) if needs_threshold else 0.0
  except ValueError:
    raise ValueError(f"statistic {text!r}: threshold {parts[2]!r} is not a number") from None
  return Stat(parts[0], parts[1], threshold)


def series(records: list[dict], metric: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
  """(x, value) at the records that logged `metric`, in step order. x is 'step' or
  'seconds': cumulative training seconds (time_generate + time_update) up to the step."""
  records = sorted(records, key=lambda r: r["step"])
  seconds, clock = {}, 0.0
  for r in records:
    clock += r.get("time_generate", 0.0) + r.get("time_update", 0.0)
    seconds[r["step"]] = clock
  xs, ys = [], []
  for r in records:
    if metric in r:
      xs.append(r["step"] if x == "step" else seconds[r["step"]])
      ys.append(float(r[metric]))
  return np.asarray(xs, float), np.asarray(ys, float)


def statistic(records: list[dict], stat: Stat) -> float:
  """`stat` of one run (NaN when the metric is missing or a threshold is never reached)."""
  steps, values = series(records, stat.metric)
  if not values.size:
    return math.nan
  if stat.kind == "final":
    return float(values[-1])
  if stat.kind == "gain":
    return float(values[-1] - values[0])
  if stat.kind == "mean":
    return float(values.mean())
  if stat.kind == "late_mean":
    return float(values[steps >= (steps[0] + steps[-1]) / 2].mean())
  reached = np.nonzero(values >= values[0] + stat.threshold)[0]
  if not reached.size:
    return math.nan
  if stat.kind == "steps_to":
    return float(steps[reached[0]])
  seconds_x, _ = series(records, stat.metric, x="seconds")
  return float(seconds_x[reached[0]])


def _fmt(value: float) -> str:
  if math.isnan(value):
    return "–"
  return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def markdown_table(results: dict[str, dict[int, list[dict]]], stats: list[Stat]) -> str:
  """One row per arm; per statistic the seeds' mean and, in brackets, each seed's value
  ('–': not reached, or the metric is missing). `results[arm][seed]` holds the records."""
  header = "| arm | " + " | ".join(s.label for s in stats) + " |"
  lines = [header, "| --- |" + " ---: |" * len(stats)]
  for arm, runs in results.items():
    cells = []
    for stat in stats:
      values = [statistic(runs[seed], stat) for seed in sorted(runs)]
      finite = [v for v in values if not math.isnan(v)]
      mean = _fmt(float(np.mean(finite))) if len(finite) == len(values) else "–"
      cells.append(f"{mean} ({' / '.join(_fmt(v) for v in values)})")
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_sweep(results: dict[str, dict[int, list[dict]]], metrics: list[str], path: str, *,
               x: str = "step", title: str = "") -> bool:
  """One panel per metric: each seed thin, the seeds' mean thick, a colour per arm.
  The mean is taken where every seed logged the metric at the same x (steps; for
  x='seconds' the seeds' curves are drawn without a mean). False without matplotlib."""
  plt = pyplot()
  if plt is None:
    return False
  figure, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4),
                              squeeze=False)
  for axis, metric in zip(axes[0], metrics):
    for i, (arm, runs) in enumerate(results.items()):
      curves = [series(runs[seed], metric, x=x) for seed in sorted(runs)]
      for xs, ys in curves:
        axis.plot(xs, ys, color=f"C{i}", alpha=0.35, linewidth=0.8)
      common = set.intersection(*(set(xs.tolist()) for xs, _ in curves)) if curves else set()
      if x == "step" and common:
        grid = np.asarray(sorted(common))
        mean = np.mean([[ys[xs.tolist().index(g)] for g in grid] for xs, ys in curves], 0)
        axis.plot(grid, mean, color=f"C{i}", linewidth=2.2, label=arm)
      else:
        axis.plot([], [], color=f"C{i}", linewidth=2.2, label=arm)
    axis.set_title(metric, fontsize=9)
    axis.set_xlabel("step" if x == "step" else "training seconds (generation + update)")
    axis.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  if title:
    figure.suptitle(title, fontsize=10)
  return save_figure(plt, figure, path)
