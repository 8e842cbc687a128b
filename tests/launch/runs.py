"""Running the launchers as a user does: a fresh process, flags only, and the flags that
shrink a run to CPU test size."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = ["--config.model.hidden_size=32", "--config.model.num_layers=1",
         "--config.model.num_heads=2", "--config.sft.steps=2", "--config.sft.batch_size=8",
         "--config.data.num_train=32", "--config.data.num_eval=4",
         "--config.rollout.prompts_per_step=2", "--config.rollout.group_size=2",
         "--config.sampler.num_slots=8", "--config.sampler.warmup=False",
         "--config.train.steps=1", "--config.train.minibatches=1"]


def run(script, *args, timeout=600):
  """launch/<script> with `args` in a fresh process on CPU (its output captured)."""
  return subprocess.run([sys.executable, f"launch/{script}", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
