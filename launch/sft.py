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
All of it is `rlhf_jax.training.stages.warm_start(config, workdir)`. --validate_only checks
the config, the workdir, the checkpoint's files and the data files and exits ("config ok",
or the one-line error with exit status 2).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; the model goes to <workdir>/sft.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Retrain even if the checkpoint exists.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax.training import stages
  result = stages.warm_start(_CONFIG.value, _WORKDIR.value, overwrite=_OVERWRITE.value,
                             log=lambda line: print(line, flush=True),
                             validate_only=_VALIDATE_ONLY.value)
  print("config ok" if result is None else json.dumps(result), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  cli.run(main)
