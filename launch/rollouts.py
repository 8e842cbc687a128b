r"""The samples a run trained on: python launch/rollouts.py --workdir=runs/... [--step=N]

Reads <workdir>/rollouts.jsonl (written with --config.train.log_rollouts=N) and prints a
table: per sample its step, reward, trained / total tokens and turns (▶ the model's,
◀ the environment's).
"""

from __future__ import annotations

import os

from absl import flags

from rlhf_jax import cli
from rlhf_jax.config_errors import ConfigError

from rlhf_jax.analysis.rollouts import read_rollouts
from rlhf_jax.analysis.rollouts import rollouts_table

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding rollouts.jsonl.")
_STEP = flags.DEFINE_integer("step", None, "Only this training step's samples.")
_WIDTH = flags.DEFINE_integer("width", 120, "Characters of the turns column.")
flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
  del argv
  path = os.path.join(_WORKDIR.value, "rollouts.jsonl")
  if not os.path.exists(path):
    raise ConfigError(f"{path} does not exist (train with "
                         "--config.train.log_rollouts=N to write it).")
  try:
    records = read_rollouts(path, step=_STEP.value)
  except ValueError as error:  # not JSON lines (json's error names no file)
    raise ConfigError(f"{path}: {error}") from None
  if not records:
    raise ConfigError(f"{path} has no samples" + (
        f" of step {_STEP.value}." if _STEP.value is not None else "."))
  print(rollouts_table(records, width=_WIDTH.value), end="", flush=True)


if __name__ == "__main__":
  cli.run(main, compile_cache=False)
