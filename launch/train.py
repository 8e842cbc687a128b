r"""Trains a policy with an RL preset.

  python launch/train.py --config=configs/dapo.py:arith --workdir=/tmp/dapo
  python launch/train.py --config=configs/dpo.py:arith --workdir=/tmp/dpo
  python launch/train.py --config=configs/grpo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=train.jsonl --config.data.eval_file=eval.jsonl --workdir=DIR

The config is validated before anything loads or compiles; a bad field is reported
in one line naming its full path (exit status 2). For the arith variant the SFT
warm start runs first when <workdir>/sft (or --config.model.checkpoint) does not
exist, and for rollout.mode 'offline' (DPO, DQO) the labelled samples of the warm
start are written to <workdir>/offline.jsonl when data.offline_file is empty. Metrics go to <workdir>/metrics.jsonl; a progress bar goes to the console;
the last line is a JSON summary. --validate_only checks the config (and the overrides),
the workdir, the policy checkpoint's files, and the data files (every row's JSON, schema,
task and prompt length, with the policy's tokenizer, or the arith task's before its warm
start) and exits: "config ok", or the one-line error with exit status 2.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:variant).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the config and exit "
                                   "(nothing loads, trains or compiles; exit 2 on an error).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
  del argv
  from rlhf_jax import cli
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  config = _CONFIG.value
  if config.train.deterministic:
    cli.enable_deterministic_gpu_ops()  # before JAX initialises its backends
  import jax

  from rlhf_jax import file_checks
  from rlhf_jax import parallel
  from rlhf_jax.training.config import validate_config

  # The whole config, first: before joining a job, the warm start, labelling, loading or
  # compiling; then the mesh against the job's devices.
  validate_config(config)
  file_checks.check_workdir(_WORKDIR.value)
  parallel.initialize(config.distributed)
  validate_config(config, num_devices=jax.device_count())
  from rlhf_jax.training import build
  build.check_data(config, _WORKDIR.value)  # the data files, every row, before any work
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  from rlhf_jax.training.loop import Trainer
  from rlhf_jax.training.stages import prepare_run

  from rlhf_jax.rollout.modes import rollout_mode
  offline_to_label = rollout_mode(config).fixed_data and not config.data.offline_file
  if jax.process_count() > 1 and offline_to_label:
    from rlhf_jax.config_errors import ConfigError
    raise ConfigError("config.data.offline_file: must be given in a job of several processes "
                      "(label the samples first with launch/label_samples.py)")
  main_process = parallel.is_main_process()
  log = lambda line: print(line, flush=True) if main_process else None
  from rlhf_jax import run_control
  lock = run_control.WorkdirLock(_WORKDIR.value)
  if main_process:  # warm start, DPO / DQO offline data: once, in the shared workdir
    lock.acquire()  # before the warm start: a second launch must not train it as well
    prepare_run(config, _WORKDIR.value, log=log)
  parallel.barrier("prepared")
  trainer = Trainer(config, _WORKDIR.value, log=log, progress=True, lock=lock)
  summary = trainer.run()
  if not main_process:
    return
  if "eval_accuracy_start" in summary and "eval_accuracy_end" in summary:
    before, after = summary["eval_accuracy_start"], summary["eval_accuracy_end"]
    print(f"held-out accuracy ({len(trainer.held_out)} problems, greedy): {100 * before:.1f}% "
          f"→ {100 * after:.1f}% ({100 * (after - before):+.1f} points) in "
          f"{summary['seconds']:.0f} s of RL; policy in {summary['policy']}", flush=True)
  print(json.dumps({"event": "done", **summary}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  cli.run(main)
