"""Evaluation figures as papers report them, from per-sample verdicts (pure NumPy).

    pass_at_k(n, c, k)                     unbiased pass@k of one problem (Codex, Eq. 1)
    per_problem_pass_at_k(correct, k)      [P] pass@k of each problem
    majority_vote(answers, correct)        the majority answer of one problem, its verdict
    per_problem_maj(answers, correct)      [P] 0/1: the majority answer is correct
    bootstrap_interval(values)             percentile interval of the mean over problems
    SampleTable                            what one evaluation sampled and how it was judged
    point_figures(table)                   the figures train.py logs (no intervals)
    report(table, greedy=)                 eval.py's figures, each with its interval
    paired_difference(a, b)                the paired difference of two evaluations

Every figure is a mean over problems of a per-problem value, so one bootstrap serves
them all: problems are resampled with replacement (Efron & Tibshirani 1993, ch. 13, the
percentile interval), `resamples` times with a fixed seed, and the interval is the
(1 − level)/2 and (1 + level)/2 quantiles of the resampled means. A paired difference
resamples the problems once for both evaluations (the same problems, Dror et al. 2018).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

RESAMPLES = 1000  # B of the bootstrap (verl's and lm-eval's default order of magnitude)
LEVEL = 0.95


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k)
  (Chen et al. 2021, Codex, Eq. 1)."""
  if k > num_samples:
    raise ValueError(f"k={k} exceeds the {num_samples} samples per prompt.")
  if num_samples - num_correct < k:
    return 1.0
  return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def ks_up_to(n: int) -> list[int]:
  """The k of pass@k reported for n samples: 1, 2, 4, ... below n, and n itself."""
  ks, k = [], 1
  while k < n:
    ks.append(k)
    k *= 2
  return ks + [n]


def per_problem_pass_at_k(correct: np.ndarray, k: int) -> np.ndarray:
  """[P] pass@k of each problem from `correct` [P, n] (`pass_at_k` row by row)."""
  correct = np.asarray(correct, bool)
  n = correct.shape[1]
  return np.asarray([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)], float)


def _normalised(answer: str | None) -> str | None:
  """The vote an answer casts: its text without whitespace (None, or an empty text, casts
  none). Equivalent forms ("1/2", "0.5") are different votes, as in self-consistency's
  exact-match vote (Wang et al. 2023)."""
  if answer is None:
    return None
  vote = "".join(str(answer).split())
  return vote or None


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]
                  ) -> tuple[str | None, bool]:
  """(the majority answer, whether it is correct) of one problem's samples: the answer
  (whitespace removed) given by the most samples; a tie goes to the answer whose first
  sample comes first (sample order is the sampler's, fixed by the seed). A sample without
  an answer does not vote; with no answer at all the vote is (None, False). The verdict is
  that of the first sample giving the answer (a verifier judges an answer, not a sample)."""
  counts: dict[str, int] = {}
  first: dict[str, int] = {}
  for i, answer in enumerate(answers):
    vote = _normalised(answer)
    if vote is None:
      continue
    counts[vote] = counts.get(vote, 0) + 1
    first.setdefault(vote, i)
  if not counts:
    return None, False
  winner = min(counts, key=lambda vote: (-counts[vote], first[vote]))
  return winner, bool(correct[first[winner]])


def per_problem_maj(answers: Sequence[Sequence[str | None]], correct: np.ndarray
                    ) -> np.ndarray:
  """[P] 1.0 where the majority vote of the problem's n samples is correct (maj@n)."""
  correct = np.asarray(correct, bool)
  return np.asarray([majority_vote(a, c)[1] for a, c in zip(answers, correct, strict=True)],
                    float)


def bootstrap_interval(values, *, resamples: int = RESAMPLES, seed: int = 0,
                       level: float = LEVEL) -> tuple[float, float]:
  """The percentile bootstrap interval of the mean of `values` [P] (one value per
  problem): `resamples` draws of P problems with replacement (numpy default_rng(seed)),
  the (1 − level)/2 and (1 + level)/2 quantiles of their means."""
  values = np.asarray(values, float)
  if values.ndim != 1 or not len(values):
    raise ValueError(f"bootstrap_interval needs one value per problem, got shape "
                     f"{values.shape}.")
  rng = np.random.default_rng(seed)
  means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
  low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return float(low), float(high)


@dataclasses.dataclass
class SampleTable:
  """One evaluation's samples: n per problem, row i of each [P, n] array is problem i.

  Attributes:
    correct: [P, n] the scorer's verdicts.
    answers: per problem, the final answers its n samples gave (the verifier's
      extraction), None where a sample gave none or the scorer reads none.
    lengths: [P, n] response tokens.
    truncated: [P, n] the response reached the token cap without ending.
    no_answer: [P, n] the verifier found no final answer ("no answer found"); None when
      the evaluation cannot tell (whole episodes: no rate is reported, rather than 0).
    failures: [P, n] scoring failed (a timeout, an error).
    groups: breakdowns, name ("task", "data_source", "level") → [P] label of each problem.
  """
  correct: np.ndarray
  answers: list[list[str | None]]
  lengths: np.ndarray
  truncated: np.ndarray
  no_answer: np.ndarray | None
  failures: np.ndarray
  groups: dict[str, list[str]] = dataclasses.field(default_factory=dict)

  @property
  def samples(self) -> int:
    """n, the samples per problem."""
    return int(np.shape(self.correct)[1])

  def has_answers(self) -> bool:
    """Whether the scorer read any final answer (maj@n needs them)."""
    return any(a is not None for row in self.answers for a in row)

  def subset(self, rows) -> SampleTable:
    """The problems at `rows` (a boolean mask or indices)."""
    rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
    return SampleTable(self.correct[rows], [self.answers[i] for i in rows],
                       self.lengths[rows], self.truncated[rows],
                       None if self.no_answer is None else self.no_answer[rows],
                       self.failures[rows],
                       {k: [v[i] for i in rows] for k, v in self.groups.items()})


def per_problem(table: SampleTable) -> dict[str, np.ndarray]:
  """name → [P] per-problem value whose mean is the figure: "avg@n" (the mean verdict of
  the n samples), "pass@k" for `ks_up_to(n)`, "maj@n" when the scorer reads answers."""
  correct = np.asarray(table.correct, bool)
  out = {f"avg@{table.samples}": correct.mean(axis=1)}
  for k in ks_up_to(table.samples):
    out[f"pass@{k}"] = per_problem_pass_at_k(correct, k)
  if table.has_answers():
    out[f"maj@{table.samples}"] = per_problem_maj(table.answers, correct)
  return out


def point_figures(table: SampleTable) -> dict[str, float]:
  """The figures without intervals (train.py's held-out metrics): `per_problem`'s means
  ("accuracy" is avg@n, the name train.py logs it under), the mean response length, the
  truncation and no-answer rates (shares of samples), the count of scoring failures, the
  problems and samples per problem."""
  out = {"prompts": float(len(table.correct)), "samples_per_prompt": float(table.samples)}
  out.update({name: float(values.mean()) for name, values in per_problem(table).items()})
  out["accuracy"] = out[f"avg@{table.samples}"]
  out.update(response_length=float(np.mean(table.lengths)),
             truncation_rate=float(np.mean(table.truncated)),
             verifier_failures=float(np.sum(table.failures)))
  if table.no_answer is not None:
    out["no_answer_rate"] = float(np.mean(table.no_answer))
  return out


def _with_interval(values: np.ndarray, resamples: int, seed: int, level: float) -> dict:
  low, high = bootstrap_interval(values, resamples=resamples, seed=seed, level=level)
  return {"value": float(np.mean(values)), "low": low, "high": high}


def report(table: SampleTable, *, greedy: SampleTable | None = None,
           resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> dict:
  """eval.py's figures of one checkpoint: `point_figures` (the sampled ones; of `greedy`
  "greedy_accuracy" and the greedy response length, truncation and no-answer rates),
  and under "interval" each figure's {"value", "low", "high"} (`bootstrap_interval`);
  under "breakdown" the same per label of each of `table.groups` that has several."""
  out = point_figures(table)
  values = per_problem(table)
  if greedy is not None:
    greedy_figures = point_figures(greedy)
    for name in ("accuracy", "response_length", "truncation_rate", "no_answer_rate"):
      if name in greedy_figures:
        out[f"greedy_{name}"] = greedy_figures[name]
    values["greedy_accuracy"] = np.asarray(greedy.correct, float).mean(axis=1)
  out["interval"] = {name: _with_interval(v, resamples, seed, level)
                     for name, v in values.items()}
  breakdown = {}
  for name, labels in table.groups.items():
    labels = np.asarray(labels, object)
    if len(set(labels)) < 2:
      continue
    breakdown[name] = {}
    for label in sorted(set(labels), key=str):
      rows = labels == label
      part = report(table.subset(rows), greedy=None if greedy is None else greedy.subset(rows),
                    resamples=resamples, seed=seed, level=level)
      part.pop("breakdown", None)
      breakdown[name][str(label)] = part
  if breakdown:
    out["breakdown"] = breakdown
  return out


def paired_difference(first: SampleTable, second: SampleTable, *,
                      greedy: tuple[SampleTable, SampleTable] | None = None,
                      resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
                      ) -> dict[str, dict]:
  """second − first of every figure both have, per problem (the same problems, the same
  n), with its bootstrap interval: {name: {"value", "low", "high"}}. ValueError when the
  two evaluations cover different numbers of problems or samples."""
  if np.shape(first.correct) != np.shape(second.correct):
    raise ValueError(f"paired difference of evaluations of shapes {np.shape(first.correct)} "
                     f"and {np.shape(second.correct)}: the same problems and samples needed.")
  a, b = per_problem(first), per_problem(second)
  if greedy is not None:
    a["greedy_accuracy"] = np.asarray(greedy[0].correct, float).mean(axis=1)
    b["greedy_accuracy"] = np.asarray(greedy[1].correct, float).mean(axis=1)
  return {name: _with_interval(b[name] - a[name], resamples, seed, level)
          for name in a if name in b}


def markdown_table(reports: dict[str, dict], level: float = LEVEL) -> str:
  """Markdown: a row per evaluation (name → `report` or `paired_difference` figures), a
  column per figure with an interval: "value [low, high]" in percent."""
  names: list[str] = []
  for figures in reports.values():
    for name in figures.get("interval", figures):
      if name not in names:
        names.append(name)
  order = {"greedy_accuracy": 0}
  names.sort(key=lambda n: (order.get(n, 1), n.split("@")[0], int(n.split("@")[1])
                            if "@" in n else 0))
  lines = [f"| {100 * level:.0f} % intervals | " + " | ".join(names) + " |",
           "| --- |" + " ---: |" * len(names)]
  for row, figures in reports.items():
    intervals = figures.get("interval", figures)
    cells = [f"{100 * intervals[n]['value']:.1f} [{100 * intervals[n]['low']:.1f}, "
             f"{100 * intervals[n]['high']:.1f}]" if n in intervals else "–" for n in names]
    lines.append(f"| {row} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
