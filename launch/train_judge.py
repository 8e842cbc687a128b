r"""Trains a generative judge (GenRM w/ GT, or a pairwise judge) by SFT on its verdict token.

  python launch/train_judge.py --kind=genrm --policy=runs/arith/sft --output=runs/arith/genrm
  python launch/train_judge.py --kind=pairwise --policy=runs/arith/sft \
      --output=runs/arith/judge [--pairs=pairs.jsonl]

genrm: questions `reward.genrm.template_gt` (problem, reference answer, response) with
the verdict Y / N; data from --judged (JSONL of `prompt`, `answer`, `response`,
`correct`, optional `metadata`) or, without it, the arith task's careless-teacher
solutions judged by the verifier. genrm_reference: the same with
`reward.genrm.template_reference` and the reference response in
`metadata[--reference_key]` (arith: another careless-teacher solution). pairwise: questions `reward.pairwise.template` with the verdict A / B, every
pair of --pairs (`prompt`, `chosen`, `rejected`; default: arith pairs) asked in both
orders. Prints held-out verdict accuracy (the likelier verdict token) before and after.
"""

from __future__ import annotations

import json

from absl import flags

_KIND = flags.DEFINE_enum("kind", None, ["genrm", "genrm_reference", "pairwise"],
                          "Which judge: GenRM w/ GT, GenRM w/ reference, pairwise.")
_POLICY = flags.DEFINE_string("policy", None, "HF checkpoint to start from.")
_OUTPUT = flags.DEFINE_string("output", None, "Directory of the trained judge.")
_JUDGED = flags.DEFINE_string("judged", "", "genrm data (.jsonl); empty: arith.")
_REFERENCE_KEY = flags.DEFINE_string("reference_key", "reference",
                                     "genrm_reference: the metadata key of the reference.")
_PAIRS = flags.DEFINE_string("pairs", "", "pairwise data (.jsonl/.parquet); empty: arith.")
_NUM = flags.DEFINE_integer("num_examples", 4000, "Generated arith examples (pairs).")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.1, "Held-out share.")
_STEPS = flags.DEFINE_integer("steps", 400, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Questions per step.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Peak AdamW learning rate.")
_LENGTH = flags.DEFINE_integer("question_length", 256, "Longest question in tokens.")
_SEED = flags.DEFINE_integer("seed", 0, "Data order and generated data.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["kind", "policy", "output"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax.config_errors import ConfigError
  for name, flag in (("steps", _STEPS), ("batch_size", _BATCH), ("num_examples", _NUM),
                     ("question_length", _LENGTH)):
    if flag.value < 1:
      raise ConfigError(f"--{name}={flag.value} must be >= 1")
  from rlhf_jax.training import reward_fits
  if _VALIDATE_ONLY.value:  # the policy's files, the output directory, the data files
    from rlhf_jax.training.reward_fits import check_policy_and_output
    check_policy_and_output(_POLICY.value, _OUTPUT.value)
    reward_fits.judge_questions(_KIND.value, judged=_JUDGED.value, pairs=_PAIRS.value,
                                reference_key=_REFERENCE_KEY.value, num_examples=_NUM.value,
                                seed=_SEED.value)
    print("config ok", flush=True)
    return
  result = reward_fits.train_judge(
      kind=_KIND.value, policy=_POLICY.value, output=_OUTPUT.value, judged=_JUDGED.value,
      pairs=_PAIRS.value, reference_key=_REFERENCE_KEY.value, num_examples=_NUM.value,
      eval_fraction=_EVAL_FRACTION.value, steps=_STEPS.value, batch_size=_BATCH.value,
      learning_rate=_LR.value, question_length=_LENGTH.value, seed=_SEED.value)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
