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
flags.mark_flags_as_required(["policy", "output"])


def policy_sampler(policy: str):
  """(sampler, tokenizer, prefix) of the policy, with room for a prompt and a partial
  response as the prompt of a completion."""
  from rlhf_jax import models
  from rlhf_jax.sampling import config as sampler_config_lib
  model, params = models.load_hf_checkpoint(policy)
  tokenizer = models.Tokenizer.from_directory(policy)
  length = _PROMPT_LENGTH.value + _MAX_NEW.value
  sampler_config = sampler_config_lib.sampler_config(
      num_slots=64, cache_length=length + _MAX_NEW.value, prompt_buckets=(length,))
  sampler = sampler_config_lib.build_scheduler(sampler_config, model, params,
                                               tokenizer=tokenizer, seed=_SEED.value)
  return sampler, tokenizer, models.load_prompt_prefix(policy, tokenizer)


def sample_and_label(sampler, tokenizer, prefix, examples):
  """(examples, responses, labels) of --samples policy responses per example."""
  from rlhf_jax.rewards.prm import label_responses, step_end_token_ids
  from rlhf_jax.rewards.router import router_for_tasks
  from rlhf_jax.sampling import SamplingParams

  out = sampler.generate([prefix + tokenizer.encode(e.prompt) for e in examples],
                         SamplingParams(temperature=1.0, n=_SAMPLES.value,
                                        max_new_tokens=_MAX_NEW.value,
                                        stop_token_ids=(tokenizer.eos_id,), seed=_SEED.value))
  flat = [(e, tokenizer.decode(s.token_ids)) for e, group in zip(examples, out) for s in group]
  verifier = router_for_tasks(sorted({e.task for e in examples}))
  try:
    labels = label_responses(sampler, tokenizer, verifier, [e for e, _ in flat],
                             [r for _, r in flat], prefix=prefix,
                             completions=_COMPLETIONS.value, max_new_tokens=_MAX_NEW.value,
                             step_end_ids=step_end_token_ids(tokenizer, _DELIMITER.value),
                             seed=_SEED.value + 1)
  finally:
    verifier.close()
  return [e for e, _ in flat], [r for _, r in flat], labels


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
  import numpy as np

  from rlhf_jax.data import read_examples
  from rlhf_jax.launch_support import check_policy_and_output, read_flag_file
  from rlhf_jax.launch_support import progress_bar, split_held_out
  from rlhf_jax.rewards.prm import step_end_token_ids
  from rlhf_jax.tasks import arith
  from rlhf_jax.rewards import model_training as rt

  check_policy_and_output(_POLICY.value, _OUTPUT.value)
  examples = (read_flag_file("prompts", read_examples, _PROMPTS.value)[:_NUM_PROMPTS.value]
              if _PROMPTS.value
              else arith.examples(_SEED.value + 5, _NUM_PROMPTS.value, (1, 2)))
  train_prompts, held_prompts = split_held_out(examples, None, _EVAL_FRACTION.value)
  layout = rt.policy_layout(_POLICY.value, _PROMPT_LENGTH.value, _MAX_NEW.value + 1)
  step_ends = step_end_token_ids(layout.tokenizer, _DELIMITER.value)
  rows, stats = {}, {}
  sampler, tokenizer, prefix = policy_sampler(_POLICY.value)
  for name, part in (("train", train_prompts), ("held_out", held_prompts)):
    part_examples, responses, labels = sample_and_label(sampler, tokenizer, prefix, part)
    rows[name] = rt.step_targets(layout, [e.prompt for e in part_examples], responses, labels,
                                 step_ends)
    flat = np.concatenate([np.asarray(x) for x in labels])
    stats[f"{name}_responses"] = len(responses)
    stats[f"{name}_steps"] = int(flat.size)
    stats[f"{name}_unrecoverable_share"] = float(np.mean(flat == 0))
  model, params = rt.scalar_model_from_policy(_POLICY.value)
  with progress_bar(_STEPS.value, "PRM") as progress:
    result = rt.train_prm(model, params, rows["train"], rows["held_out"],
                          response_length=layout.response_length, steps=_STEPS.value,
                          batch_size=_BATCH.value, learning_rate=_LR.value, seed=_SEED.value,
                          progress=progress)
  rt.save_beside_policy(_OUTPUT.value, model, result.params, _POLICY.value)
  print(json.dumps({"checkpoint": _OUTPUT.value, **stats,
                    "step_label_mse_before": result.before["mse"],
                    "step_label_mse": result.after["mse"],
                    "constant_baseline_mse": rt.constant_baseline_mse(rows["train"],
                                                                      rows["held_out"]),
                    "step_label_accuracy": result.after["accuracy"],
                    "final_loss": result.losses[-1],
                    "seconds": round(result.seconds, 1)}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
