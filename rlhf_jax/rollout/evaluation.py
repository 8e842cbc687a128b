"""Accuracy and pass@k of a policy on prompts with reference answers."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k)
  (Chen et al. 2021, Codex, Eq. 1)."""
  if k > num_samples:
    raise ValueError(f"k={k} exceeds the {num_samples} samples per prompt.")
  if num_samples - num_correct < k:
    return 1.0
  return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def example_group(example: Example) -> str:
  """The group an example is reported in: its difficulty level ("L2") when the data
  gives one as a number (metadata "level"), a text level as it is ("Level 5", MATH's),
  else its task."""
  level = example.metadata.get("level") if example.metadata else None
  if isinstance(level, int) and not isinstance(level, bool):
    return f"L{level}"
  return level if isinstance(level, str) and level else example.task


def evaluate_policy(sampler, prompts, examples: Sequence[Example], scorer, *,
                    samples: int, temperature: float, max_new_tokens: int, seed: int = 0,
                    fire: FireSchedule | None = None) -> dict[str, float]:
  """avg@n accuracy (overall and per `example_group` as "accuracy/<group>"), pass@k for
  k = 1, 2, 4, ... ≤ n, mean response length (`summarize_accuracy`).

  Args:
    sampler: a `Sampler` (the in-process Scheduler or a SamplerClient).
    prompts: the run's `data.prompts.PromptFormat` (the policy's tokenizer, prefix and
      chat template).
    examples: prompts with answers and tasks.
    scorer: a `Scorer` (e.g. the RewardRouter of the training verifiers).
    samples: n samples per prompt (1 with temperature 0 = greedy accuracy).
    temperature: sampling temperature (0 = greedy).
    max_new_tokens: response cap.
    seed: sampling seed.
    fire: FIRE's hot first token (and, with `every_line`, hot line starts; Chen et al.
      arXiv:2410.21236), or None for regular sampling.
  """
  tokenizer = prompts.tokenizer
  prompt_ids = prompts.encode_all(examples)
  params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                          stop_token_ids=(tokenizer.eos_id,), n=samples, seed=seed, fire=fire)
  out = sampler.generate(prompt_ids, params)
  pairs = [(example, Completion(tokenizer.decode(c.token_ids), c.token_ids))
           for example, group in zip(examples, out) for c in group]
  scored = scorer.score([e for e, _ in pairs], [text for _, text in pairs])
  return summarize_accuracy(examples, scored.correct, samples=samples,
                            lengths=[len(c.token_ids) for g in out for c in g],
                            failures=sum(bool(f) for f in scored.failures))


def evaluate_episodes(rollout, examples: Sequence[Example], scorer, *, samples: int,
                      temperature: float, seed: int = 0) -> dict[str, float]:
  """`evaluate_policy` for multi-turn episodes (`rollout.multi_turn.MultiTurnRollout`):
  n episodes per prompt with the environment, judged as in training (the verifier of the
  last model turn, or a positive env reward without one) but by `scorer`; the response
  length counts model tokens; "turns" is the mean number of model turns, "env_failures" the
  episodes whose environment failed.

  Args:
    rollout: the run's MultiTurnRollout (its sampler, environments, limits).
    examples: held-out prompts with answers and tasks.
    scorer: the verifier.
    samples: n episodes per prompt.
    temperature: sampling temperature (0 = greedy).
    seed: sampling seed (the training seeds are left alone).
  """
  base = rollout.generator.sampling
  params = SamplingParams(temperature=temperature, max_new_tokens=base.max_new_tokens)
  episodes = rollout.run_episodes(examples, group_size=samples, sampling=params, seed=seed)
  _, correct, failures = rollout.score(episodes, scorer)
  env_failures = sum(bool(e.failure) for e in episodes)  # one reason each in `failures`
  result = summarize_accuracy(examples, correct, samples=samples,
                              lengths=[sum(e.loss_mask) for e in episodes],
                              failures=len(failures) - env_failures)
  result["env_failures"] = float(env_failures)
  result["turns"] = float(np.mean([sum(t["role"] == "assistant" for t in e.turns)
                                   for e in episodes]))
  return result


def summarize_accuracy(examples: Sequence[Example], correct: Sequence[bool], *, samples: int,
                       lengths: Sequence[int], failures: int) -> dict[str, float]:
  """The evaluation's figures from per-sample verdicts (`correct[i * samples + j]`: sample
  j of example i): "accuracy" (avg@n), "accuracy/<group>" when there are several groups,
  "pass@k" for k = 1, 2, 4, ... ≤ n (Chen et al. 2021, Eq. 1), the mean response length
  and the verifier's failures."""
  correct = np.asarray(correct, bool).reshape(len(examples), samples)
  result = {"prompts": float(len(examples)), "samples_per_prompt": float(samples),
            "accuracy": float(correct.mean()),
            "response_length": float(np.mean(lengths)),
            "verifier_failures": float(failures)}
  groups = np.asarray([example_group(e) for e in examples])
  if len(set(groups)) > 1:
    for group in sorted(set(groups)):
      result[f"accuracy/{group}"] = float(correct[groups == group].mean())
  k = 1
  while k <= samples:
    result[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k)
                                         for c in correct.sum(axis=1)]))
    k *= 2
  return result
