r"""Verifier-labelled samples of a policy: the offline data of DQO and DPO.

  python launch/label_samples.py --config=configs/dqo.py:arith --workdir=runs/arith \
      --output=labelled.jsonl
  python launch/label_samples.py --config=configs/dqo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=prompts.jsonl --output=labelled.parquet --pairs_output=pairs.jsonl

The policy (`model.checkpoint`, or <workdir>/sft for arith) samples
`data.offline_samples` responses to each of the first `data.offline_prompts` training
prompts at the rollout temperature; the `reward` section's verifiers score them. The
output (JSONL or Parquet by extension) has one record per prompt: prompt, answer, task,
responses, scores, correct. --pairs_output also writes, for every prompt with both a
correct and a wrong sample, the pair (first correct, first wrong).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_OUTPUT = flags.DEFINE_string("output", None, "Labelled samples (.jsonl/.parquet).")
_PAIRS = flags.DEFINE_string("pairs_output", "", "Also write preference pairs here.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config", "output"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  import jax

  from rlhf_jax.config_errors import invalid
  from rlhf_jax.data import PreferencePair
  from rlhf_jax.data import write_labelled
  from rlhf_jax.data import write_pairs
  from rlhf_jax.rewards import build as reward_build
  from rlhf_jax.training import build
  from rlhf_jax.training import inputs
  from rlhf_jax.training.config import validate_config
  from rlhf_jax.training.stages import label_samples

  c = _CONFIG.value
  c.data.offline_file = _OUTPUT.value  # the file this writes (the offline presets need one)
  # The whole config, first: before the policy loads or anything compiles.
  validate_config(c, num_devices=jax.device_count(), labelling=True)
  if not c.data.train_file and not c.data.task:
    invalid("data.train_file", c.data.train_file, "the prompts to sample (a .jsonl/.parquet "
            "file) are required without data.task (a built-in task's generated problems)")
  # The workdir, checkpoint and data files before loading (offline_file is the output).
  inputs.check_data(c, _WORKDIR.value, read_offline=False)
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, _WORKDIR.value, mesh)
  examples = inputs.load_examples(c)[0][:c.data.offline_prompts]
  scorer = reward_build.verifiers(c, sorted({e.task for e in examples}))
  sampler = build.build_sampler(c, policy, mesh)
  log = lambda line: print(line, flush=True)
  try:
    groups = label_samples(c, policy, sampler, scorer, examples, log=log)
  finally:
    scorer.close()
  write_labelled(_OUTPUT.value, groups)
  pairs = [PreferencePair(g.example.prompt, g.responses[g.correct.index(True)],
                          g.responses[g.correct.index(False)])
           for g in groups if True in g.correct and False in g.correct]
  if _PAIRS.value:
    write_pairs(_PAIRS.value, pairs)
  samples = [c for g in groups for c in g.correct]
  print(json.dumps({"output": _OUTPUT.value, "prompts": len(groups),
                    "samples": len(samples), "accuracy": sum(samples) / max(1, len(samples)),
                    "prompts_with_a_pair": len(pairs),
                    "pairs_output": _PAIRS.value or None}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
