"""Best-of-N and speculative rejection (Sun et al. arXiv:2410.20290) on held-out prompts.

`run_best_of_n` yields one row per method: the chosen responses' mean reward, their
verifier accuracy (when the tasks have one), generated tokens, wall and scoring time —
after an untimed pass over one prompt that compiles every program the timed runs use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import unfit
from rlhf_jax.models.hf import checks as checkpoint_checks
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rewards.router import has_verifier
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.search.speculative_rejection import SpeculativeRejection
from rlhf_jax.training import build
from rlhf_jax.training import inputs


@dataclasses.dataclass(frozen=True)
class BestOfNOptions:
  """What to run: N samples started per prompt, speculative rejection's decision
  lengths (none: plain Best-of-N) and rejection rate α, plain Best-of-N at the same N
  (`compare`) and at other N (`bon_n`), the first `prompts` held-out prompts (0: all),
  and a PRM checkpoint scoring partial and final responses instead of the reward
  section's scorer."""
  n: int = 16
  decision_tokens: Sequence[int] = ()
  rejection_rate: float = 0.5
  compare: bool = False
  bon_n: Sequence[int] = ()
  prompts: int = 0
  prm: str = ""

  def check(self, c) -> None:
    """Errors naming the option before anything loads."""
    if self.n < 1:
      raise ConfigError(f"--n={self.n} must be >= 1")
    if self.prompts < 0:
      raise ConfigError(f"--prompts={self.prompts} must be >= 0 (the first N held-out "
                        "prompts; 0: all)")
    for flag, values in (("decision_tokens", self.decision_tokens), ("bon_n", self.bon_n)):
      if any(value < 1 for value in values):
        raise ConfigError(f"--{flag}={','.join(str(v) for v in values)}: each must be >= 1")
    if not 0 <= self.rejection_rate < 1:
      raise ConfigError(f"--rejection_rate={self.rejection_rate} must be in [0, 1)")
    # The search steps and cancels samples in the scheduler itself.
    build.require_in_process_sampler(c, "best-of-n")

  def methods(self) -> list[tuple[str, int, list[int]]]:
    """(name, N, decision lengths) of every method to run."""
    decisions = list(self.decision_tokens)
    out = [("speculative_rejection" if decisions else "best_of_n", self.n, decisions)]
    if self.compare and decisions:
      out.append(("best_of_n", self.n, []))
    return out + [("best_of_n", int(n), []) for n in self.bon_n]


def run_method(name, scheduler, scorer, verifier, policy, examples, sampling, *, n: int,
               decisions: Sequence[int], rate: float) -> dict[str, Any]:
  """One method over every prompt of `examples`; its summary row."""
  search = SpeculativeRejection(scheduler, scorer, policy.tokenizer, n_init=n,
                                decision_tokens=decisions, rejection_rate=rate)
  ids = policy.prompts.encode_all(examples)
  result = search.run(examples, ids, sampling)
  out = {"method": name, "n": n, "decision_tokens": list(decisions), "rejection_rate": rate,
         "prompts": len(examples), "reward_mean": float(np.mean(result.scores)),
         "generated_tokens": result.generated_tokens, "seconds": result.seconds,
         "scoring_seconds": result.scoring_seconds, "scorer_calls": result.scorer_calls,
         "cancelled_samples": sum(len(d.cancelled) for d in result.decisions)}
  if verifier is not None:
    out["accuracy"] = float(np.mean(verifier.score(list(examples), result.texts).correct))
  return out


def run_best_of_n(c, workdir: str, options: BestOfNOptions) -> Iterator[dict[str, Any]]:
  """Runs every method of `options` with the policy of config `c` (`model.checkpoint`,
  or <workdir>/sft) on the held-out prompts; yields one row per method."""
  options.check(c)
  inputs.check_data(c, workdir)  # the checkpoint's files and the prompts, before loading
  if options.prm:
    checkpoint_checks.check_checkpoint_dir(options.prm, f"--prm={options.prm}", tokenizer=False)
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, workdir, mesh)
  examples = inputs.load_examples(c)[1]
  examples = examples[:options.prompts] if options.prompts else examples
  if not examples:
    unfit("data.eval_file", "best-of-n needs held-out prompts")
  tasks = sorted({e.task for e in examples})
  scorer = (reward_build.prefix_value_scorer(options.prm, c, mesh) if options.prm
            else reward_build.training_scorer(c, tasks, mesh, policy.prompts))
  verifier = (reward_build.verifiers(c, tasks) if all(has_verifier(t) for t in tasks)
              else None)
  scheduler = build.build_sampler(c, policy, mesh)
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  sampling = dataclasses.replace(rollout_config_lib.sampling_params(c.rollout, stop),
                                 seed=c.seed)
  run = lambda name, n, points, prompts: run_method(
      name, scheduler, scorer, verifier, policy, prompts, sampling, n=n, decisions=points,
      rate=options.rejection_rate)
  try:
    for name, n, points in options.methods():  # compiles every program the timed runs use
      run(name, n, points, examples[:1])
    for name, n, points in options.methods():
      yield run(name, n, points, examples)
  finally:
    scorer.close()
    if verifier is not None:
      verifier.close()
