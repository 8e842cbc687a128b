r"""Reference responses for GenRM w/ SFT-BoN: best-of-N SFT samples by the BT reward model.

  python launch/make_references.py --config=configs/grpo.py:arith --workdir=runs/arith \
      --rm=runs/arith/rm --output=refs.jsonl [--n=8 --max_prompts=1000]

The policy (`model.checkpoint`, or <workdir>/sft) samples --n responses per training
prompt at the rollout temperature; the reward model (--rm, launch/train_rm.py) scores
them and the best is written into each example's metadata under
`reward.genrm.reference_key` (with its score as `<key>_rm_score`), JSONL or Parquet by
extension. Shen et al. (arXiv:2503.22230) judge general prompts against it.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_RM = flags.DEFINE_string("rm", None, "The Bradley–Terry reward model's HF directory.")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the examples (.jsonl/.parquet).")
_N = flags.DEFINE_integer("n", 8, "Samples per prompt.")
_LIMIT = flags.DEFINE_integer("max_prompts", 0, "Only the first N prompts (0: all).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config", "rm", "output"])


def main(argv) -> None:
  del argv
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  if _N.value < 1:
    raise ConfigError(f"--n={_N.value} must be >= 1")
  import dataclasses

  import jax
  import numpy as np

  from rlhf_jax.data import write_examples
  from rlhf_jax.models.hf import checks as checkpoint_checks
  from rlhf_jax.rewards.reward_model import RewardModelScorer
  from rlhf_jax.sampling import SamplingParams
  from rlhf_jax.training import build
  from rlhf_jax.training import inputs
  from rlhf_jax.rewards import build as reward_build
  from rlhf_jax.training.config import validate_config

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  inputs.check_data(c, _WORKDIR.value)  # workdir, checkpoint, data files: before loading
  checkpoint_checks.check_checkpoint_dir(_RM.value, f"--rm={_RM.value}")
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, _WORKDIR.value, mesh)
  examples = inputs.load_examples(c)[0]
  examples = examples[:_LIMIT.value] if _LIMIT.value else examples
  role, tokenizer, prefix = reward_build.load_frozen(_RM.value, mesh, head="scalar")
  rm = RewardModelScorer(role, reward_build.scoring_layout(c, tokenizer, prefix), mesh=mesh)
  sampler = build.build_sampler(c, policy, mesh)
  out = sampler.generate(policy.prompts.encode_all(examples),
                         SamplingParams(temperature=c.rollout.temperature, n=_N.value,
                                        max_new_tokens=c.rollout.max_new_tokens,
                                        stop_token_ids=(policy.tokenizer.eos_id,), seed=c.seed))
  texts = [[policy.tokenizer.decode(s.token_ids) for s in group] for group in out]
  scores, failures = rm.raw_scores([e for e, g in zip(examples, texts) for _ in g],
                                   [t for g in texts for t in g])
  scores = np.where([bool(f) for f in failures], -np.inf, scores).reshape(len(examples), _N.value)
  key = c.reward.genrm.reference_key
  written, unscored = [], 0
  for example, group, row in zip(examples, texts, scores):
    best = int(np.argmax(row))
    metadata = dict(example.metadata or {})
    if np.isfinite(row[best]):
      metadata.update({key: group[best], f"{key}_rm_score": float(row[best])})
    else:  # no sample the RM could score: no reference (hybrid routing falls through)
      unscored += 1
    written.append(dataclasses.replace(example, metadata=metadata))
  write_examples(_OUTPUT.value, written)
  best_scores = scores.max(axis=1)
  print(json.dumps({"output": _OUTPUT.value, "prompts": len(written), "n": _N.value,
                    "without_reference": unscored,
                    "mean_best_rm_score": float(np.mean(best_scores[np.isfinite(best_scores)]))
                    if unscored < len(written) else None}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
