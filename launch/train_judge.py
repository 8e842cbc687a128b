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
flags.mark_flags_as_required(["kind", "policy", "output"])


def read_judged(path: str):
  """(Example, response, correct) triples of a JSONL file; errors name line and field."""
  from rlhf_jax.data import Example
  from rlhf_jax.data.jsonl import json_lines
  out = []
  for number, record in json_lines(path):
    for field, kind in (("prompt", str), ("answer", str), ("response", str), ("correct", bool)):
      if not isinstance(record.get(field), kind):
        raise ValueError(f"{path}:{number}: field {field!r} must be {kind.__name__}.")
    out.append((Example(record["prompt"], record["answer"], record.get("task", ""),
                        record.get("metadata") or {}), record["response"], record["correct"]))
  return out


def questions() -> tuple[list[tuple[str, str]], tuple[str, str]]:
  """The (question, verdict) texts of --kind, and its two verdict texts."""
  from rlhf_jax.data import read_pairs
  from rlhf_jax.launch_support import read_flag_file
  from rlhf_jax.rewards import genrm, pairwise
  from rlhf_jax.tasks import arith_rewards
  from rlhf_jax.rewards import model_training as rt
  if _KIND.value in ("genrm", "genrm_reference"):
    with_reference = _KIND.value == "genrm_reference"
    generate = (arith_rewards.judged_with_references if with_reference
                else arith_rewards.judged_responses)
    judged = (read_flag_file("judged", read_judged, _JUDGED.value) if _JUDGED.value
              else generate(_SEED.value, _NUM.value))
    template = genrm.REFERENCE_TEMPLATE if with_reference else genrm.GT_TEMPLATE
    return rt.genrm_sft_pairs(judged, template=template, yes="Y", no="N",
                              reference_key=_REFERENCE_KEY.value), ("Y", "N")
  pairs = (read_flag_file("pairs", read_pairs, _PAIRS.value) if _PAIRS.value
           else arith_rewards.preference_pairs(_SEED.value, _NUM.value // 2))
  return rt.pairwise_sft_pairs(pairs, template=pairwise.PAIR_TEMPLATE, first="A",
                               second="B"), ("A", "B")


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax.config_errors import ConfigError
  for name, flag in (("steps", _STEPS), ("batch_size", _BATCH), ("num_examples", _NUM),
                     ("question_length", _LENGTH)):
    if flag.value < 1:
      raise ConfigError(f"--{name}={flag.value} must be >= 1")
  import numpy as np

  from rlhf_jax import models
  from rlhf_jax.launch_support import check_policy_and_output
  from rlhf_jax.launch_support import progress_bar, split_held_out
  from rlhf_jax.rewards import model_training as rt
  from rlhf_jax.algorithms.sft import run_sft

  check_policy_and_output(_POLICY.value, _OUTPUT.value)
  examples, verdicts = questions()
  rng = np.random.default_rng(_SEED.value)
  examples = [examples[i] for i in rng.permutation(len(examples))]
  train, held_out = split_held_out(examples, None, _EVAL_FRACTION.value)
  model, params = models.load_hf_checkpoint(_POLICY.value)
  tokenizer = models.Tokenizer.from_directory(_POLICY.value)
  prefix = models.load_prompt_prefix(_POLICY.value, tokenizer)
  rows = rt.sft_rows(tokenizer, prefix, train, prompt_length=_LENGTH.value)
  accuracy = lambda p: rt.verdict_accuracy(model, p, tokenizer, prefix, held_out, verdicts,
                                           length=_LENGTH.value)
  before = accuracy(params)
  make_batch = lambda step: _take(rows, rng.integers(0, len(train), _BATCH.value))
  with progress_bar(_STEPS.value, f"{_KIND.value} judge") as progress:
    result = run_sft(model, params, make_batch, steps=_STEPS.value,
                     learning_rate=_LR.value, progress=progress)
  rt.save_beside_policy(_OUTPUT.value, model, result.params, _POLICY.value)
  print(json.dumps({"checkpoint": _OUTPUT.value, "kind": _KIND.value,
                    "train_questions": len(train), "held_out_questions": len(held_out),
                    "verdict_accuracy_before": before, "verdict_accuracy": accuracy(
                        result.params), "final_loss": result.losses[-1],
                    "seconds": round(result.seconds, 1)}), flush=True)


def _take(batch, rows):
  """The rows `rows` of every field of a RolloutBatch of NumPy arrays."""
  import jax
  return jax.tree.map(lambda x: x[rows], batch)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
