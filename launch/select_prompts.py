r"""Pre-PPO prompt selection: keep the prompts the current policy finds hardest.

  python launch/select_prompts.py --config=configs/grpo.py:hf \
      --config.model.checkpoint=DIR --config.data.train_file=prompts.parquet \
      --output=hard.jsonl --fraction=0.1 --samples=4
  python launch/select_prompts.py --config=configs/pycalc.py --workdir=/tmp/pycalc \
      --output=/tmp/hard_pycalc.jsonl          # :arith preset: generated problems

The policy (`model.checkpoint`, or <workdir>/sft for a built-in task's run) samples
--samples responses per training prompt with the preset's rollout settings; the
`reward` section's scorer scores them. Mean scores are normalised per task and the
lowest --fraction is written (JSONL, or Parquet by extension) with `prepo_score` and
`prepo_normalised` in each example's metadata (rlhf_jax/data/selection.py).
"""

from __future__ import annotations

import dataclasses
import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the selection (.jsonl/.parquet).")
_FRACTION = flags.DEFINE_float("fraction", 0.1, "Fraction of the prompts to keep.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Policy samples per prompt.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Prompts per sampling call.")
_LIMIT = flags.DEFINE_integer("max_prompts", 0, "Score only the first N prompts (0: all).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config", "output"])


def main(argv) -> None:
  del argv
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  if not 0 < _FRACTION.value <= 1:
    raise ConfigError(f"--fraction={_FRACTION.value} must be in (0, 1]")
  if _SAMPLES.value < 1 or _BATCH.value < 1:
    raise ConfigError("--samples and --batch_size must be >= 1")
  import jax
  from tqdm import tqdm

  from rlhf_jax.data import selection
  from rlhf_jax.data import write_examples
  from rlhf_jax.rollout import GroupGenerator
  from rlhf_jax.rewards import build as reward_build
  from rlhf_jax.rollout import config as rollout_config_lib
  from rlhf_jax.training import build
  from rlhf_jax.training import inputs
  from rlhf_jax.training.config import validate_config

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  inputs.check_data(c, _WORKDIR.value)  # workdir, checkpoint, data files: before loading
  if c.data.task and not (c.model.checkpoint or _WORKDIR.value):
    raise ConfigError("--workdir (with the warm start in <workdir>/sft) or "
                      "--config.model.checkpoint is required")
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, _WORKDIR.value, mesh)
  examples, _ = inputs.load_examples(c)
  examples = examples[:_LIMIT.value] if _LIMIT.value else examples
  scorer = reward_build.training_scorer(c, sorted({e.task for e in examples}), mesh,
                                        policy.prompts)
  sampler = build.build_sampler(c, policy, mesh)
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  sampling = dataclasses.replace(rollout_config_lib.sampling_params(c.rollout, stop),
                                 n=_SAMPLES.value)
  generator = GroupGenerator(sampler, scorer, policy.prompts, sampling=sampling, seed=c.seed)
  bar = tqdm(total=len(examples), desc="scoring prompts", unit="prompt", dynamic_ncols=True)
  try:
    selected = selection.select_prompts(
        examples, lambda chunk: [g.scores for g in generator.generate_groups(chunk)],
        fraction=_FRACTION.value, batch_size=_BATCH.value, progress=bar.update)
  finally:
    bar.close()
  count = write_examples(_OUTPUT.value, selection.annotated(selected))
  tasks = sorted({s.example.task for s in selected})
  print(json.dumps({"event": "selected", "output": _OUTPUT.value, "candidates": len(examples),
                    "kept": count, "tasks": {t: sum(s.example.task == t for s in selected)
                                              for t in tasks},
                    "mean_score_kept": sum(s.score for s in selected) / count}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
