r"""Accuracy and pass@k of a checkpoint on a JSONL of prompts with answers (printed as JSON).

  python launch/eval.py --checkpoint=/tmp/dapo/policy --data=held_out.jsonl --samples=8
  python launch/eval.py --checkpoint=/tmp/dapo/policy --arith_levels=1,2,3   # generated

The JSONL schema is the training one (prompt, answer, task, metadata). Without
--data the built-in arith generator writes held-out problems (seed --arith_seed).
"""

from __future__ import annotations

import json

from absl import app
from absl import flags

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "HF checkpoint directory of the policy.")
_DATA = flags.DEFINE_string("data", "", "JSONL of prompts with answers (default: arith).")
_SAMPLES = flags.DEFINE_integer("samples", 1, "Samples per prompt (n of pass@k).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 96, "Response cap in tokens.")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 64, "Decode slots of the sampling engine.")
_ARITH_SEED = flags.DEFINE_integer("arith_seed", 2, "Seed of generated arith problems.")
_ARITH_COUNT = flags.DEFINE_integer("arith_count", 256, "Generated arith problems.")
_ARITH_LEVELS = flags.DEFINE_list("arith_levels", ["1", "2", "3"], "arith difficulty levels.")
flags.mark_flags_as_required(["checkpoint"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  import os

  from rlhf_jax import models
  from rlhf_jax.data import read_jsonl
  from rlhf_jax.rewards.router import router_for_tasks
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.tasks import arith
  from rlhf_jax.training.evaluation import evaluate_policy

  if not os.path.exists(os.path.join(_CHECKPOINT.value, "config.json")):
    raise app.UsageError(f"--checkpoint={_CHECKPOINT.value} has no config.json.")
  if _SAMPLES.value < 1:
    raise app.UsageError(f"--samples={_SAMPLES.value} must be >= 1.")
  if _DATA.value:
    examples = read_jsonl(_DATA.value)
  else:
    levels = tuple(int(level) for level in _ARITH_LEVELS.value)
    examples = arith.examples(_ARITH_SEED.value, _ARITH_COUNT.value, levels)
  model, params = models.load_hf_checkpoint(_CHECKPOINT.value)
  tokenizer = models.Tokenizer.from_directory(_CHECKPOINT.value)
  prefix = models.load_prompt_prefix(_CHECKPOINT.value, tokenizer)
  longest = max(len(prefix) + len(tokenizer.encode(e.prompt)) for e in examples)
  bucket = 1 << (longest - 1).bit_length()
  sampler_config = sampler_config_lib.sampler_config(
      num_slots=_NUM_SLOTS.value, cache_length=bucket + _MAX_NEW_TOKENS.value,
      prompt_buckets=(bucket,))
  sampler_config.warmup = False  # one pass over the data: compile on first use
  sampler = sampler_config_lib.build_scheduler(sampler_config, model, params,
                                               tokenizer=tokenizer)
  scorer = router_for_tasks(sorted({e.task for e in examples}))
  result = evaluate_policy(sampler, tokenizer, examples, scorer, prefix=prefix,
                           samples=_SAMPLES.value, temperature=_TEMPERATURE.value,
                           max_new_tokens=_MAX_NEW_TOKENS.value)
  print(json.dumps({"checkpoint": _CHECKPOINT.value, "data": _DATA.value or "arith",
                    "temperature": _TEMPERATURE.value, **result}))


if __name__ == "__main__":
  app.run(main)
