"""Q♯-guided decoding (Zhou et al. arXiv:2502.20548) fitted and evaluated end to end.

`run_qsharp` fits the guide over DAgger-style rounds (algorithms/qsharp_fit.py) and
yields rows: π_ref's held-out accuracy and KL (0), Best-of-N by the reward section's
scorer with its KL bound log N − (N−1)/N, then after each round the guided policy's
accuracy and mean KL(π_guided ‖ π_ref) per response.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator, Sequence

import jax
import numpy as np

from rlhf_jax.algorithms import qsharp
from rlhf_jax.algorithms import qsharp_fit
from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.batch import response_logprobs
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import invalid
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.search.speculative_rejection import SpeculativeRejection
from rlhf_jax.sampling import GuidedParams
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.training import build
from rlhf_jax.training import inputs


@dataclasses.dataclass(frozen=True)
class QSharpOptions:
  """Data rounds (round 0: π_ref only), prompts and roll-outs per prompt per round, head
  fitting (steps, batch, Adam rate, return bins), the guided policy (η, π_ref's top-k),
  evaluation samples per held-out prompt, Best-of-N baselines and where to save the
  guide (.npz; empty: not saved)."""
  rounds: int = 3
  prompts_per_round: int = 256
  samples: int = 4
  steps: int = 300
  batch_size: int = 64
  learning_rate: float = 3e-3
  num_bins: int = 2
  eta: float = 0.1
  top_k: int = 8
  eval_samples: int = 4
  bon_n: Sequence[int] = ()
  output: str = ""

  def check(self, c) -> None:
    """Errors naming the option or config field before anything loads."""
    for name in ("rounds", "prompts_per_round", "samples", "steps", "top_k"):
      if getattr(self, name) < 1:
        raise ConfigError(f"--{name}={getattr(self, name)} must be >= 1")
    if self.eta <= 0:
      raise ConfigError(f"--eta={self.eta} must be > 0")
    if c.rollout.max_new_tokens < 2:
      invalid("rollout.max_new_tokens", c.rollout.max_new_tokens, "must be >= 2 (a roll-in "
              "and a roll-out)")
    # The search steps and cancels samples in the scheduler itself.
    build.require_in_process_sampler(c, "Q♯")
    longest = c.data.prompt_length + c.rollout.max_new_tokens - 1  # prompt + roll-in
    if max(c.sampler.prompt_buckets) < longest:
      invalid("sampler.prompt_buckets", tuple(c.sampler.prompt_buckets),
              f"must reach {longest} tokens (a roll-out starts from the prompt and the "
              f"roll-in), e.g. --config.sampler.prompt_buckets="
              f"{c.data.prompt_length},{longest + 1}")


def evaluate(name, sampler, reference, policy, examples, verifier, c, *, samples: int,
             seed: int) -> dict[str, Any]:
  """Accuracy and mean KL to π_ref (Σ_t log π/π_ref of the sampled tokens, per response)
  of `samples` T=1 samples per held-out prompt."""
  tok = policy.tokenizer
  prompts = policy.prompts.encode_all(examples)
  out = sampler.generate(prompts, SamplingParams(
      n=samples, max_new_tokens=c.rollout.max_new_tokens, stop_token_ids=(tok.eos_id,),
      seed=seed))
  flat = [(e, p, s) for e, p, group in zip(examples, prompts, out) for s in group]
  correct = verifier.score([e for e, _, _ in flat],
                           [tok.decode(s.token_ids) for _, _, s in flat]).correct
  batch = build_rollout_batch([p for _, p, _ in flat], [s.token_ids for _, _, s in flat],
                              [s.model_logprobs for _, _, s in flat], [0.0] * len(flat),
                              [False] * len(flat), list(range(len(flat))),
                              prompt_length=c.data.prompt_length,
                              response_length=c.rollout.max_new_tokens, pad_id=tok.pad_id)
  ref = np.asarray(reference(batch))
  kl = np.sum((np.asarray(batch.sampler_logprobs) - ref) * np.asarray(batch.response_mask),
              axis=1)
  return {"policy": name, "accuracy": float(np.mean(correct)), "kl_to_ref": float(np.mean(kl)),
          "samples": len(flat),
          "response_length": float(np.mean([len(s.token_ids) for _, _, s in flat]))}


def best_of_n_rows(c, options: QSharpOptions, sampler, policy, held_out, verifier, tasks,
                   mesh) -> Iterator[dict[str, Any]]:
  """Held-out accuracy of Best-of-N by the reward section's scorer, for each N."""
  if not options.bon_n:
    return
  scorer = reward_build.training_scorer(c, tasks, mesh, policy.prompts)
  sampling = dataclasses.replace(
      rollout_config_lib.sampling_params(c.rollout, (policy.tokenizer.eos_id,)), seed=c.seed)
  prompts = policy.prompts.encode_all(held_out)
  try:
    for n in map(int, options.bon_n):
      result = SpeculativeRejection(sampler, scorer, policy.tokenizer, n_init=n).run(
          held_out, prompts, sampling)
      yield {"round": None, "policy": f"best_of_{n}",
             "accuracy": float(np.mean(verifier.score(held_out, result.texts).correct)),
             "kl_to_ref_bound": math.log(n) - (n - 1) / n}
  finally:
    scorer.close()


def run_qsharp(c, workdir: str, options: QSharpOptions,
               log=print) -> Iterator[dict[str, Any]]:
  """Fits and evaluates the Q♯ guide for the policy of config `c` (`model.checkpoint`,
  or <workdir>/sft); yields one row per evaluation (see the module docstring)."""
  options.check(c)
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, workdir, mesh)
  train, held_out = inputs.load_examples(c)
  tasks = sorted({e.task for e in train + held_out})
  verifier = reward_build.verifiers(c, tasks)
  values = qsharp.bin_values(options.num_bins, c.reward.wrong_score, c.reward.correct_score)
  model_params = build.generation_params(c, policy, policy.params, mesh)
  guide = qsharp.init_guide(policy.model.config.hidden_size, policy.model.config.vocab_size,
                            options.num_bins)
  ref_sampler = build.build_sampler(c, policy, mesh)
  guided = sampler_config_lib.build_scheduler(
      c.sampler, policy.model, GuidedParams(model_params, guide), tokenizer=policy.tokenizer,
      seed=c.seed + 1, logits_hook=functools.partial(
          qsharp.guided_logits, values=values, eta=options.eta, top_k=options.top_k))
  forward = jax.jit(lambda params, batch: response_logprobs(policy.model, params, batch))
  run_eval = functools.partial(evaluate, reference=lambda b: forward(policy.params, b),
                               policy=policy, examples=held_out, verifier=verifier, c=c,
                               samples=options.eval_samples, seed=c.seed + 99)
  try:
    yield {"round": None, **run_eval("reference", ref_sampler)}
    yield from best_of_n_rows(c, options, ref_sampler, policy, held_out, verifier, tasks, mesh)
    data = None
    for index in range(options.rounds):
      examples = train[index * options.prompts_per_round:(index + 1) * options.prompts_per_round]
      data, labelled = _collect_round(c, options, policy, ref_sampler, guided if index else None,
                                      verifier, examples, data, seed=c.seed + index)
      guide, _ = qsharp_fit.fit_guide(
          guide, data, values=values, steps=options.steps, batch_size=options.batch_size,
          learning_rate=options.learning_rate, seed=c.seed + index, log=log)
      guided.update_params(GuidedParams(model_params, guide), version=index + 1)
      yield {"round": index, "rows": int(len(data.returns)),
             "rollout_accuracy": float(np.mean(labelled.correct)),
             **run_eval(f"qsharp_eta{options.eta}", guided)}
    if options.output:
      np.savez(options.output, **{k: np.asarray(v) for k, v in guide.items()}, values=values,
               eta=options.eta, top_k=options.top_k)
  finally:
    verifier.close()


def _collect_round(c, options, policy, ref_sampler, guided, verifier, examples, data, *,
                   seed):
  """One DAgger round: roll in (guided, after round 0) and out (π_ref), label by the
  verifier, and add the rows to `data`; returns (data, the round's labels)."""
  rows, responses, switches = qsharp_fit.rollouts(
      ref_sampler, guided, policy.prompts.encode_all(examples),
      samples=options.samples, max_new_tokens=c.rollout.max_new_tokens,
      stop=(policy.tokenizer.eos_id,), seed=seed)
  labelled = verifier.score([e for e in examples for _ in range(options.samples)],
                            [policy.tokenizer.decode(r) for r in responses])
  new = qsharp_fit.guide_data(
      policy.model, policy.params, rows, responses, switches, labelled.scores,
      prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
      pad_id=policy.tokenizer.pad_id)
  return new.extend(data), labelled
