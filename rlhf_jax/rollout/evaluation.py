"""Held-out evaluation of a policy on prompts with reference answers: the samples, their
verdicts and final answers (`eval_stats.SampleTable`), and the figures of
rollout/eval_stats.py — train.py's held-out metrics and launch/eval.py's report are the
same code."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import NO_ANSWER
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rollout import eval_stats
from rlhf_jax.rollout.eval_stats import pass_at_k  # pylint: disable=unused-import  (the API)
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams


def example_group(example: Example) -> str:
  """The group an example is reported in: its difficulty level ("L2") when the data
  gives one as a number (metadata "level"), a text level as it is ("Level 5", MATH's),
  else its task."""
  level = example.metadata.get("level") if example.metadata else None
  if isinstance(level, int) and not isinstance(level, bool):
    return f"L{level}"
  return level if isinstance(level, str) and level else example.task


def breakdown_labels(examples: Sequence[Example]) -> dict[str, list[str]]:
  """The labels eval.py breaks its figures down by: "task", and "data_source" and "level"
  where the rows carry them (a metadata key, the file's column of that name; "–" for a row
  without one)."""
  groups = {"task": [e.task for e in examples]}
  for key in ("data_source", "level"):
    values = [(e.metadata or {}).get(key) for e in examples]
    if any(v is not None for v in values):
      groups[key] = ["–" if v is None else str(v) for v in values]
  return groups


def evaluate_policy(sampler, prompts, examples: Sequence[Example], scorer, *,
                    samples: int, temperature: float, max_new_tokens: int, seed: int = 0,
                    fire: FireSchedule | None = None, details: bool = False):
  """avg@n accuracy (overall and per `example_group` as "accuracy/<group>"), pass@k for
  k = 1, 2, 4, ... ≤ n and n, maj@n, the response length and the truncation, no-answer
  and failure counts (`summarize`); with `details`, (those figures, the
  `eval_stats.SampleTable` they come from).

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
  table = sample_table(examples, scored, samples=samples,
                       lengths=[len(c.token_ids) for g in out for c in g],
                       truncated=[c.finish_reason == "length" for g in out for c in g])
  figures = summarize(examples, table)
  return (figures, table) if details else figures


def sample_table(examples: Sequence[Example], scored: Scores, *, samples: int, lengths,
                 truncated, no_answer: bool = True) -> eval_stats.SampleTable:
  """The `eval_stats.SampleTable` of `samples` scored responses per example (sample j of
  example i at i * samples + j): verdicts, the verifier's final answers, lengths,
  truncation, "no answer found" reasons (`no_answer` False: not told, e.g. episodes),
  scoring failures, the breakdown labels."""
  count = len(examples)

  def grid(values, dtype):
    return np.asarray(values, dtype).reshape(count, samples)

  answers = [scored.answer(i) for i in range(count * samples)]
  return eval_stats.SampleTable(
      correct=grid(scored.correct, bool),
      answers=[answers[i * samples:(i + 1) * samples] for i in range(count)],
      lengths=grid(lengths, float), truncated=grid(truncated, bool),
      no_answer=(grid([scored.reason(i) == NO_ANSWER for i in range(count * samples)], bool)
                 if no_answer else None),
      failures=grid([bool(f) for f in scored.failures], bool),
      groups=breakdown_labels(examples))


def summarize(examples: Sequence[Example], table: eval_stats.SampleTable
              ) -> dict[str, float]:
  """`eval_stats.point_figures` of the table, with "accuracy/<group>" (avg@n per
  `example_group`) when there are several groups."""
  result = eval_stats.point_figures(table)
  groups = np.asarray([example_group(e) for e in examples])
  if len(set(groups)) > 1:
    for group in sorted(set(groups)):
      result[f"accuracy/{group}"] = float(table.correct[groups == group].mean())
  return result


def evaluate_episodes(rollout, examples: Sequence[Example], scorer, *, samples: int,
                      temperature: float, seed: int = 0, details: bool = False):
  """`evaluate_policy` for multi-turn episodes (`rollout.multi_turn.MultiTurnRollout`):
  n episodes per prompt with the environment, judged as in training (the verifier of the
  last model turn, or a positive env reward without one) but by `scorer`; the response
  length counts model tokens; "turns" is the mean number of model turns, "env_failures" the
  episodes whose environment failed. An episode's final answer is not read (no maj@n, no
  no-answer rate: not reported rather than 0).

  Args:
    rollout: the run's MultiTurnRollout (its sampler, environments, limits).
    examples: held-out prompts with answers and tasks.
    scorer: the verifier.
    samples: n episodes per prompt.
    temperature: sampling temperature (0 = greedy).
    seed: sampling seed (the training seeds are left alone).
    details: also return the `eval_stats.SampleTable`.
  """
  base = rollout.generator.sampling
  params = SamplingParams(temperature=temperature, max_new_tokens=base.max_new_tokens)
  episodes = rollout.run_episodes(examples, group_size=samples, sampling=params, seed=seed)
  _, correct, failures = rollout.score(episodes, scorer)
  env_failures = sum(bool(e.failure) for e in episodes)  # one reason each in `failures`
  count = len(episodes)
  # `score` lists reasons, not one per episode: the verifier failures are counted from it.
  scored = Scores([0.0] * count, list(correct), [""] * count)
  table = sample_table(examples, scored, samples=samples,
                       lengths=[sum(e.loss_mask) for e in episodes],
                       truncated=[e.truncated for e in episodes], no_answer=False)
  result = summarize(examples, table)
  result["verifier_failures"] = float(len(failures) - env_failures)
  result["env_failures"] = float(env_failures)
  result["turns"] = float(np.mean([sum(t["role"] == "assistant" for t in e.turns)
                                   for e in episodes]))
  return (result, table) if details else result

