r"""PNG curves of a run: python launch/plot.py --workdir=/tmp/dapo [--keys=reward_mean,...]

Reads <workdir>/metrics.jsonl and writes <workdir>/plots/<key>.png plus
<workdir>/plots/summary.png (needs matplotlib: `pip install matplotlib`).
"""

from __future__ import annotations

import json
import os

from absl import flags

from rlhf_jax import cli
from rlhf_jax.config_errors import ConfigError

DEFAULT_KEYS = ("reward_mean", "accuracy", "eval_accuracy", "entropy", "response_length_mean",
                "approx_kl", "clip_frac_upper", "value_loss", "explained_variance",
                "kept_groups_ratio", "grad_norm", "tokens_per_second")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding metrics.jsonl.")
_KEYS = flags.DEFINE_list("keys", list(DEFAULT_KEYS), "Metrics to plot (missing ones skipped).")
flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
  del argv
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  path = os.path.join(_WORKDIR.value, "metrics.jsonl")
  if not os.path.exists(path):
    raise ConfigError(f"{path} does not exist (is --workdir a training run?).")
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.endswith("\n"):  # a record still being written by a live run
        break
      try:
        if line.strip():
          records.append(json.loads(line))
      except ValueError as error:
        raise ConfigError(f"{path}:{number}: not JSON ({error})") from None
  series = {key: [(r["step"], r[key]) for r in records if key in r] for key in _KEYS.value}
  series = {key: points for key, points in series.items() if points}
  if not series:
    raise ConfigError(f"none of {_KEYS.value} is in {path}.")
  out = os.path.join(_WORKDIR.value, "plots")
  os.makedirs(out, exist_ok=True)
  columns = min(3, len(series))
  rows = -(-len(series) // columns)
  summary, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.2 * rows), squeeze=False)
  for axis, (key, points) in zip(axes.flat, series.items()):
    steps, values = zip(*points)
    axis.plot(steps, values, marker="." if len(points) < 30 else None)
    axis.set_title(key)
    axis.set_xlabel("step")
    figure, single = plt.subplots(figsize=(5, 3.2))
    single.plot(steps, values)
    single.set_title(key)
    single.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(os.path.join(out, f"{key}.png"), dpi=100)
    plt.close(figure)
  for axis in list(axes.flat)[len(series):]:
    axis.axis("off")
  summary.tight_layout()
  summary.savefig(os.path.join(out, "summary.png"), dpi=100)
  print(json.dumps({"plots": sorted(os.listdir(out)), "directory": out}))


if __name__ == "__main__":
  cli.run(main, compile_cache=False)
