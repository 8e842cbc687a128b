r"""Best-of-N and Speculative Rejection (Sun et al. arXiv:2410.20290) with a reward model.

  python launch/best_of_n.py --config=configs/ppo.py:arith \
      --config.model.checkpoint=WARM --config.reward.route=rm \
      --config.reward.rm.checkpoint=RM --n=16 --decision_tokens=12,24 \
      --rejection_rate=0.5 --compare

The policy (`model.checkpoint`, or <workdir>/sft) samples --n responses to each held-out
prompt (`data.eval_file`, or the arith generator) at the rollout temperature; the
`reward` section's scorer (here a reward model, which also scores partial responses)
picks the best (or --prm: a PRM's value of the last token). With --decision_tokens, speculative rejection cancels the lowest
--rejection_rate of each prompt's unfinished samples whenever all of them have reached
the next decision length, freeing their slots for the next prompts' samples (all
prompts share the sampler's slots).
--compare also runs plain Best-of-N with the same N (and --bon_n, e.g. a smaller N of
about the same generated tokens). One JSON line per method: the chosen responses'
mean reward, their verifier accuracy (when the task has one), generated tokens and
wall time (after an untimed pass over one prompt that compiles every program).
The flags, the workdir, the policy's (and --prm's) checkpoint files and the held-out
prompts are checked before anything loads: an error is one line, exit status 2.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:arith or :hf[,cpu]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_N = flags.DEFINE_integer("n", 16, "N_init: samples started per prompt.")
_DECISIONS = flags.DEFINE_list("decision_tokens", [], "Response lengths at which to prune.")
_RATE = flags.DEFINE_float("rejection_rate", 0.5, "α: fraction cancelled per decision.")
_COMPARE = flags.DEFINE_bool("compare", False, "Also run plain Best-of-N with the same N.")
_BON_N = flags.DEFINE_list("bon_n", [], "Also run plain Best-of-N with these N.")
_PROMPTS = flags.DEFINE_integer("prompts", 0, "Only the first N held-out prompts (0: all).")
_PRM = flags.DEFINE_string("prm", "", "Score partial and final responses by this PRM's value "
                           "at the last token (launch/train_prm.py) instead of the reward "
                           "section's scorer.")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config and "
                                   "input files, print 'config ok' and exit (nothing loads, "
                                   "trains or is written; exit 2 on an error).")
flags.mark_flags_as_required(["config"])


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  from rlhf_jax.config_errors import ConfigError
  try:
    decisions = [int(t) for t in _DECISIONS.value]
    bon_n = [int(n) for n in _BON_N.value]
  except ValueError:
    raise ConfigError(f"--decision_tokens={','.join(_DECISIONS.value)} and --bon_n="
                      f"{','.join(_BON_N.value)}: must be integers") from None
  import jax

  from rlhf_jax.models.hf.checks import check_checkpoint_dir
  from rlhf_jax.search.best_of_n import BestOfNOptions
  from rlhf_jax.search.best_of_n import run_best_of_n
  from rlhf_jax.training.config import validate_config
  from rlhf_jax.training.run_control import check_workdir

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  if _WORKDIR.value:
    check_workdir(_WORKDIR.value)
  if _VALIDATE_ONLY.value:  # the workdir, checkpoints and data files too
    from rlhf_jax.training import inputs
    inputs.check_data(c, _WORKDIR.value)
    if _PRM.value:
      check_checkpoint_dir(_PRM.value, f"--prm={_PRM.value}")
    print("config ok", flush=True)
    return
  options = BestOfNOptions(n=_N.value, decision_tokens=decisions,
                           rejection_rate=_RATE.value, compare=_COMPARE.value, bon_n=bon_n,
                           prompts=_PROMPTS.value, prm=_PRM.value)
  for row in run_best_of_n(c, _WORKDIR.value, options):
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
