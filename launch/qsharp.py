r"""Q♯ (Zhou et al. arXiv:2502.20548): fit a return-distribution guide for the reference
policy and decode with it; compare with π_ref and Best-of-N.

  python launch/qsharp.py --config=configs/ppo.py:arith --workdir=runs/arith \
      --config.sampler.prompt_buckets=64,128 --rounds=3 --eta=0.1 --top_k=8 \
      --output=runs/arith/qsharp_guide.npz
  # Best-of-N by a reward model beside it:
  ... --config.reward.route=rm --config.reward.rm.checkpoint=RM --bon_n=4

The reference is the policy of `model.checkpoint` (or <workdir>/sft). Each round rolls
in with the current guided policy (round 0: none), rolls out with π_ref, labels the
responses with the verifier (`reward` correct/wrong scores are the returns) and refits
the guide's head on everything so far. After each round the held-out prompts are
sampled (T = 1, --eval_samples each) by π_ref and by the guided policy: accuracy and
KL(π_guided ‖ π_ref) per response (Σ_t log π_guided − log π_ref of the sampled tokens).
With a model reward (`reward.route` other than verifier) and --bon_n, Best-of-N by
that reward is evaluated too (its KL is at most log N − (N−1)/N; Beirami et al.).
One JSON line per evaluation; the guide is saved with --output (.npz).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Data-collection rounds (round 0: π_ref only).")
_PROMPTS = flags.DEFINE_integer("prompts_per_round", 256, "Training prompts per round.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Roll-outs per prompt per round.")
_STEPS = flags.DEFINE_integer("steps", 300, "Head-fitting steps after each round.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per fitting step.")
_LR = flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate of the head.")
_BINS = flags.DEFINE_integer("num_bins", 2, "Return bins (from wrong_score to correct_score).")
_ETA = flags.DEFINE_float("eta", 0.1, "η, the KL coefficient of the guided policy.")
_TOP_K = flags.DEFINE_integer("top_k", 8, "π_ref's candidate tokens reweighted per step.")
_EVAL_SAMPLES = flags.DEFINE_integer("eval_samples", 4, "Samples per held-out prompt.")
_BON_N = flags.DEFINE_list("bon_n", [], "Best-of-N by the reward section's model scorer.")
_OUTPUT = flags.DEFINE_string("output", "", "Where to save the guide (.npz).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config"])


def _bon_sizes(values) -> list[int]:
  """--bon_n as positive integers; a ConfigError naming the flag otherwise."""
  from rlhf_jax.config_errors import ConfigError
  try:
    sizes = [int(n) for n in values]
  except ValueError:
    sizes = []
  if len(sizes) != len(values) or any(n < 1 for n in sizes):
    raise ConfigError(f"--bon_n={','.join(values)}: must be positive integers (e.g. 4,16)")
  return sizes


def main(argv) -> None:
  del argv
  bon_n = _bon_sizes(_BON_N.value)  # before anything loads
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  import jax

  from rlhf_jax.search.qsharp import QSharpOptions
  from rlhf_jax.search.qsharp import run_qsharp
  from rlhf_jax.training import inputs
  from rlhf_jax.training.config import validate_config

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  inputs.check_data(c, _WORKDIR.value)  # workdir, checkpoint, data files: before loading
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  options = QSharpOptions(
      rounds=_ROUNDS.value, prompts_per_round=_PROMPTS.value, samples=_SAMPLES.value,
      steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
      num_bins=_BINS.value, eta=_ETA.value, top_k=_TOP_K.value,
      eval_samples=_EVAL_SAMPLES.value, bon_n=bon_n,
      output=_OUTPUT.value)
  for row in run_qsharp(c, _WORKDIR.value, options, log=lambda line: print(line, flush=True)):
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
