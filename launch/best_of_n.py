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
"""

from __future__ import annotations

import json

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:variant).",
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
flags.mark_flags_as_required(["config"])


def run_method(name, scheduler, scorer, verifier, policy, examples, sampling, *, n, decisions,
               rate):
  """One method over every prompt; its JSON summary."""
  import numpy as np

  from rlhf_jax.rollout.best_of_n import SpeculativeRejection
  search = SpeculativeRejection(scheduler, scorer, policy.tokenizer, n_init=n,
                                decision_tokens=decisions, rejection_rate=rate)
  ids = [policy.prefix + policy.tokenizer.encode(e.prompt) for e in examples]
  result = search.run(examples, ids, sampling)
  out = {"method": name, "n": n, "decision_tokens": list(decisions), "rejection_rate": rate,
         "prompts": len(examples), "reward_mean": float(np.mean(result.scores)),
         "generated_tokens": result.generated_tokens, "seconds": result.seconds,
         "scoring_seconds": result.scoring_seconds, "scorer_calls": result.scorer_calls,
         "cancelled_samples": sum(len(d.cancelled) for d in result.decisions)}
  if verifier is not None:
    out["accuracy"] = float(np.mean(verifier.score(list(examples), result.texts).correct))
  return out


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  try:
    decisions = [int(t) for t in _DECISIONS.value]
  except ValueError:
    raise app.UsageError(f"--decision_tokens={_DECISIONS.value} must be integers.") from None
  if _N.value < 1 or not 0 <= _RATE.value < 1:
    raise app.UsageError("--n must be >= 1 and --rejection_rate in [0, 1).")
  import dataclasses

  import jax

  from rlhf_jax.rewards.router import has_verifier
  from rlhf_jax.rollout import config as rollout_config_lib
  from rlhf_jax.training import build
  from rlhf_jax.training.config import validate_config

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  if c.sampler.address:  # the search steps and cancels samples in the scheduler itself
    raise app.UsageError(f"config.sampler.address={c.sampler.address!r}: this launcher runs "
                         "the in-process scheduler; leave the address empty.")
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, _WORKDIR.value, mesh)
  examples = build.load_examples(c)[1]
  examples = examples[:_PROMPTS.value] if _PROMPTS.value else examples
  if not examples:
    raise app.UsageError("no held-out prompts: set --config.data.eval_file.")
  tasks = sorted({e.task for e in examples})
  if _PRM.value:
    from rlhf_jax.rewards.prm import ProcessRewardModel, PrefixValueScorer
    from rlhf_jax.training import reward_models
    role, tokenizer, prefix = reward_models.load_frozen(_PRM.value, mesh, head="scalar",
                                                        dtype=c.model.dtype)
    scorer = PrefixValueScorer(ProcessRewardModel(
        role, reward_models.scoring_layout(c, tokenizer, prefix),
        reward_models.step_ends_of(c, tokenizer), mesh=mesh))
  else:
    scorer = build.build_scorer(c, tasks, mesh)
  verifier = (build.build_verifiers(c, tasks) if all(has_verifier(t) for t in tasks)
              else None)
  scheduler = build.build_sampler(c, policy, mesh)
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  sampling = dataclasses.replace(rollout_config_lib.sampling_params(c.rollout, stop),
                                 seed=c.seed)
  methods = [("speculative_rejection" if decisions else "best_of_n", _N.value, decisions)]
  if _COMPARE.value and decisions:
    methods.append(("best_of_n", _N.value, []))
  methods += [("best_of_n", int(n), []) for n in _BON_N.value]
  try:
    for name, n, points in methods:  # compiles every program the timed runs use
      run_method(name, scheduler, scorer, verifier, policy, examples[:1], sampling, n=n,
                 decisions=points, rate=_RATE.value)
    for name, n, points in methods:
      print(json.dumps(run_method(name, scheduler, scorer, verifier, policy, examples,
                                  sampling, n=n, decisions=points, rate=_RATE.value)),
            flush=True)
  finally:
    for closing in (scorer, verifier):
      getattr(closing, "close", lambda: None)()


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
