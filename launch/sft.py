r"""The warm start on its own.

  python launch/sft.py --config=configs/dapo.py:arith --workdir=/tmp/dapo [--config.sft.steps=450]
  python launch/sft.py --config=configs/sft.py:hf --workdir=/tmp/mine \
      --config.model.checkpoint=DIR --config.sft.train_file=conversations.jsonl

arith: the built-in task's warm start into <workdir>/sft (or --config.model.checkpoint);
train.py runs this itself when the SFT checkpoint is missing. Prints the held-out greedy
accuracy of the result as JSON (with rollout.mode 'multi_turn', configs/toolcalc.py: of
whole episodes with the environment).

hf: supervised fine-tuning of --config.model.checkpoint (empty: a model and a byte-level
BPE tokenizer from scratch) on one's own conversations ("messages") or prompt/completion
pairs, loss on the assistant's tokens, into <workdir>/sft: the checkpoint that
`launch/train.py --config.model.checkpoint=<workdir>/sft` starts RL from.
"""

from __future__ import annotations

import json
import os
import shutil

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; the model goes to <workdir>/sft.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Retrain even if the checkpoint exists.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  import jax

  from rlhf_jax import models
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.training import build
  from rlhf_jax.rewards import build as reward_build
  from rlhf_jax.training import stages
  from rlhf_jax.config_errors import invalid
  from rlhf_jax.training.config import validate_config
  from rlhf_jax.rollout import modes as rollout_modes
  from rlhf_jax.rollout.evaluation import evaluate_policy

  config = _CONFIG.value
  # The whole config, first: before the warm start trains anything.
  validate_config(config, num_devices=jax.device_count(), supervised=config.variant == "hf")
  from rlhf_jax import file_checks
  file_checks.check_workdir(_WORKDIR.value)
  if config.variant == "hf":  # one's own data: model.checkpoint (or from scratch) → sft/
    if _OVERWRITE.value is False and os.path.exists(os.path.join(_WORKDIR.value, "sft")):
      from rlhf_jax.config_errors import ConfigError
      raise ConfigError(f"--workdir: {_WORKDIR.value}/sft exists; pass --overwrite to "
                        "train it again")
    directory = stages.supervised_warm_start(config, _WORKDIR.value,
                                             log=lambda line: print(line, flush=True))
    print(json.dumps({"checkpoint": directory}), flush=True)
    return
  directory = build.policy_checkpoint_dir(config, _WORKDIR.value)
  if _OVERWRITE.value and os.path.exists(directory):
    shutil.rmtree(directory)
  build.check_data(config, _WORKDIR.value)  # the data files before the warm start trains
  directory = stages.ensure_arith_warm_start(config, _WORKDIR.value,
                                             log=lambda line: print(line, flush=True))
  _, held_out = build.load_examples(config)
  scorer = reward_build.verifiers(config, sorted({e.task for e in held_out}))
  if rollout_modes.rollout_mode(config).needs_environment:  # whole greedy episodes
    mesh = build.trainer_mesh(config)
    policy = build.load_policy(config, _WORKDIR.value, mesh)
    sampler = build.build_sampler(config, policy, mesh)
    parts = build.rollout_parts(config, policy, sampler, scorer)
    try:
      result = build.build_evaluator(config, parts, held_out, scorer)(samples=1,
                                                                      temperature=0.0)
    finally:
      parts.close()
  else:
    model, params = models.load_hf_checkpoint(directory)
    tokenizer = models.Tokenizer.from_directory(directory)
    sampler = sampler_config_lib.build_scheduler(config.sampler, model, params,
                                                 tokenizer=tokenizer, seed=config.seed)
    prompts = build.prompt_format(config, tokenizer,
                                  models.load_prompt_prefix(directory, tokenizer))
    result = evaluate_policy(sampler, prompts, held_out, scorer, samples=1, temperature=0.0,
                             max_new_tokens=config.rollout.max_new_tokens)
  print(json.dumps({"checkpoint": directory, **result}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  cli.run(main)
