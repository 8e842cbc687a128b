r"""Trains a Bradley–Terry reward model on preference pairs and saves it as an HF checkpoint.

  python launch/train_rm.py --policy=runs/arith/sft --output=runs/arith/rm \
      [--train_pairs=pairs.jsonl --eval_pairs=held_out.parquet] [--steps=300]

The model is the policy checkpoint's backbone with a scalar head (started at 0),
trained with −log σ(s_chosen − s_rejected) (rlhf_jax/kernels, `bradley_terry_loss`) on
`prompt` / `chosen` / `rejected` records (JSONL or Parquet). Without --train_pairs the
arith task's pairs are generated (a correct worked solution over one that drops its
carries). Prints held-out pair accuracy before and after as JSON; the checkpoint is
what `load_hf_checkpoint(head="scalar")` and `reward.rm.checkpoint` read.
"""

from __future__ import annotations

import json

from absl import flags

_POLICY = flags.DEFINE_string("policy", None, "HF checkpoint to start from (backbone, tokenizer).")
_OUTPUT = flags.DEFINE_string("output", None, "Directory of the trained reward model.")
_TRAIN = flags.DEFINE_string("train_pairs", "", "Pairs file (.jsonl/.parquet); empty: arith.")
_EVAL = flags.DEFINE_string("eval_pairs", "", "Held-out pairs; empty: the last --eval_fraction.")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.1, "Held-out share without --eval_pairs.")
_NUM_PAIRS = flags.DEFINE_integer("num_pairs", 4000, "Generated arith pairs (no --train_pairs).")
_STEPS = flags.DEFINE_integer("steps", 300, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Pairs per step.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Peak AdamW learning rate.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 64, "P: prompt tokens (prefix included).")
_RESPONSE_LENGTH = flags.DEFINE_integer("response_length", 65, "R: response tokens + EOS.")
_SEED = flags.DEFINE_integer("seed", 0, "Data order and generated pairs.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["policy", "output"])


def check_flags() -> None:
  """Raises ConfigError naming the first impossible flag value."""
  from rlhf_jax.config_errors import ConfigError
  for name, flag in (("steps", _STEPS), ("batch_size", _BATCH), ("num_pairs", _NUM_PAIRS),
                     ("prompt_length", _PROMPT_LENGTH), ("response_length", _RESPONSE_LENGTH)):
    if flag.value < 1:
      raise ConfigError(f"--{name}={flag.value} must be >= 1")
  if not 0 < _EVAL_FRACTION.value < 1:
    raise ConfigError(f"--eval_fraction={_EVAL_FRACTION.value} must be in (0, 1)")
  if _LR.value <= 0:
    raise ConfigError(f"--learning_rate={_LR.value} must be > 0")


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  check_flags()
  if _VALIDATE_ONLY.value:  # the policy's files, the output directory, the pairs files
    from rlhf_jax.data import read_pairs
    from rlhf_jax.training.reward_fits import check_policy_and_output
    from rlhf_jax.training.reward_fits import read_flag_file
    check_policy_and_output(_POLICY.value, _OUTPUT.value)
    for name, flag in (("train_pairs", _TRAIN), ("eval_pairs", _EVAL)):
      if flag.value:
        read_flag_file(name, read_pairs, flag.value)
    print("config ok", flush=True)
    return
  from rlhf_jax.training import reward_fits
  result = reward_fits.train_reward_model(
      policy=_POLICY.value, output=_OUTPUT.value, train_pairs=_TRAIN.value,
      eval_pairs=_EVAL.value, eval_fraction=_EVAL_FRACTION.value, num_pairs=_NUM_PAIRS.value,
      steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
      prompt_length=_PROMPT_LENGTH.value, response_length=_RESPONSE_LENGTH.value,
      seed=_SEED.value)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
