r"""Trains a policy with an RL preset.

  python launch/train.py --config=configs/dapo.py:arith --workdir=/tmp/dapo
  python launch/train.py --config=configs/dpo.py:arith --workdir=/tmp/dpo
  python launch/train.py --config=configs/grpo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=train.jsonl --config.data.eval_file=eval.jsonl --workdir=DIR

The config is validated before anything loads or compiles; a bad field is reported
in one line naming its full path (exit status 2). For a built-in task's run (the
:arith presets) the SFT warm start runs first when <workdir>/sft (or
--config.model.checkpoint) does not exist, and for rollout.mode 'offline' (DPO, DQO) the labelled samples of the warm
start are written to <workdir>/offline.jsonl when data.offline_file is empty. Metrics go
to <workdir>/metrics.jsonl; a progress bar goes to the console; the last line is a JSON
summary. All of it is `rlhf_jax.training.run(config, workdir)`, callable from Python.
--validate_only checks the config (and the overrides), the workdir, the policy checkpoint's
files, and the data files (every row's JSON, schema, task and prompt length, with the
policy's tokenizer, or the arith task's before its warm start) and exits: "config ok", or
the one-line error with exit status 2.

A workdir with checkpoints resumes; one whose checkpoints were made with another config
is refused in one line listing the fields (exit status 2), but for train.steps and the
evaluation and logging fields (training/checkpoint.RESUMABLE_FIELDS, docs/training.md).
--overwrite starts over instead: it removes what a run wrote in the workdir.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the config and exit "
                                   "(nothing loads, trains or compiles; exit 2 on an error).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Start over: remove the workdir's "
                               "checkpoints, records and exported policy (and the arith warm "
                               "start) once its lock is held, instead of resuming.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax import training
  training.run(_CONFIG.value, _WORKDIR.value, validate_only=_VALIDATE_ONLY.value,
               overwrite=_OVERWRITE.value)


if __name__ == "__main__":
  from rlhf_jax import cli
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  cli.run(main)
