r"""Labels policy samples step by step and trains a process reward model (Dai et al.).

  python launch/train_prm.py --policy=runs/arith/sft --output=runs/arith/prm \
      [--prompts=prompts.jsonl] [--num_prompts=256 --samples=4 --completions=4]

The policy samples --samples responses per prompt (T = 1); the rule verifier judges
them; for each wrong one, --completions policy completions per probed prefix decide
whether the prefix can still succeed, in a binary search for its first unrecoverable
step (rlhf_jax/rewards/prm.py). Steps end at --step_delimiter. The PRM (the policy's
backbone with a scalar head) is trained by regression on the 0/1 step labels at
step-end tokens; its held-out Brier score (beside a constant predictor's) and
step-label accuracy are printed as JSON.
The result is what `reward.process.checkpoint` and `critic.init_from` read.
"""

from __future__ import annotations

import json

from absl import flags

_POLICY = flags.DEFINE_string("policy", None, "HF checkpoint of the policy (sampler and init).")
_OUTPUT = flags.DEFINE_string("output", None, "Directory of the trained PRM.")
_PROMPTS = flags.DEFINE_string("prompts", "", "Prompts (.jsonl/.parquet); empty: arith.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 256, "Prompts used (generated or first N).")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Responses per prompt to label.")
_COMPLETIONS = flags.DEFINE_integer("completions", 4, "Completions per probed prefix.")
_DELIMITER = flags.DEFINE_string("step_delimiter", "\n", "A step ends at this text.")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.1, "Held-out share of the prompts.")
_STEPS = flags.DEFINE_integer("steps", 300, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Responses per step.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Peak AdamW learning rate.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 64, "P: prompt tokens (prefix included).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Response cap (R − 1).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling, data order, generated prompts.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["policy", "output"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax.config_errors import ConfigError
  for name, flag in (("num_prompts", _NUM_PROMPTS), ("samples", _SAMPLES), ("steps", _STEPS),
                     ("completions", _COMPLETIONS), ("batch_size", _BATCH)):
    if flag.value < 1:
      raise ConfigError(f"--{name}={flag.value} must be >= 1")
  if not _DELIMITER.value:
    raise ConfigError("--step_delimiter must not be empty")
  if _VALIDATE_ONLY.value:  # the policy's files, the output directory, the prompts file
    from rlhf_jax.data import read_examples
    from rlhf_jax.training.reward_fits import check_policy_and_output
    from rlhf_jax.training.reward_fits import read_flag_file
    check_policy_and_output(_POLICY.value, _OUTPUT.value)
    if _PROMPTS.value:
      read_flag_file("prompts", read_examples, _PROMPTS.value)
    print("config ok", flush=True)
    return
  from rlhf_jax.training import reward_fits
  result = reward_fits.train_prm(
      policy=_POLICY.value, output=_OUTPUT.value, prompts=_PROMPTS.value,
      num_prompts=_NUM_PROMPTS.value, samples=_SAMPLES.value, completions=_COMPLETIONS.value,
      step_delimiter=_DELIMITER.value, eval_fraction=_EVAL_FRACTION.value, steps=_STEPS.value,
      batch_size=_BATCH.value, learning_rate=_LR.value, prompt_length=_PROMPT_LENGTH.value,
      max_new_tokens=_MAX_NEW.value, seed=_SEED.value)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
