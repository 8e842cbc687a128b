"""`FunctionScorer`: the `Scorer` of `reward.function` (rewards/functions.py has the
conventions and the loading).

Each configured function is called on chunks of the samples in killable worker
processes; per sample the reward is Σ weight × value over the functions that scored it.
A failed call (exception, hang, wrong type, wrong length) fails its chunk's samples with
a one-line reason. Correctness (`Scores.correct`: accuracy metrics, dynamic sampling) is
the rule verifier's verdict where the task has one (`monitor`), else full marks: every
function that scored the sample gave at least 1.0 (verl's "acc" entry where its dict has
one), so partial credit counts in the reward but not as a correct answer.
"""

from __future__ import annotations

import collections
import math
import numbers
from typing import Any, Callable, Sequence

from rlhf_jax.data import Example
from rlhf_jax.rewards import functions as functions_lib
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.reward_values import finite_in_float32
from rlhf_jax.rewards.scorer import guarded_score
from rlhf_jax.sandbox.workers import KillablePool

FULL_MARKS = 1.0  # a function's value that counts as a correct answer (TRL's, verl's 1.0)

# A call's outcome per sample: a number, None (not scored) or a failure reason (str
# behind `_Failed`).


class _Failed(str):
  """A per-sample failure reason (distinguishes a reason from a value)."""


class _Scored(float):
  """A reward that carries its function's own verdict (verl's "acc")."""

  def __new__(cls, value: float, *, acc: bool):
    out = super().__new__(cls, value)
    out.acc = acc
    return out


def columns_of(examples: Sequence[Example]) -> dict[str, list[Any]]:
  """Every column of the rows, each as a list: `answer`, `task`, and the file's own
  columns (the examples' metadata keys) under their own names (None where a row lacks
  one), as TRL hands dataset columns to a reward function."""
  keys = list(dict.fromkeys(k for e in examples for k in e.metadata))
  out: dict[str, list[Any]] = {k: [e.metadata.get(k) for e in examples] for k in keys}
  out["answer"] = [e.answer for e in examples]
  out["task"] = [e.task for e in examples]
  return out


def _number(value: Any) -> float | None | _Failed:
  """A returned value as a reward: a number finite in float32 (the batch's dtype: 1e39
  is inf there), None, or a failure."""
  if value is None:
    return None
  if finite_in_float32(value):
    return float(value)
  return _Failed(f"returned {type(value).__name__} {value!r}"[:120] +
                 ", not a number finite in float32")


class FunctionScorer(ScorerBase):
  """Scores samples with the configured reward functions.

  Args:
    functions: the parsed `reward.function` entries (`functions.parse_functions`).
    render_prompt: Example → the prompt text as the model saw it (the run's
      `PromptFormat.decoded`).
    encode: text → token ids (the policy tokenizer's), for `completion_ids`.
    monitor: the rule verifiers of the tasks that have one (true accuracy), or None.
    monitor_tasks: the tasks `monitor` scores.
    failure_score: the reward of a failed sample.
    timeout_s: the limit of one call (a chunk of at most `SAMPLES_PER_CALL` samples).
    workers: worker processes.
  """

  def __init__(self, functions: Sequence[functions_lib.RewardFunction], *,
               render_prompt: Callable[[Example], str], encode: Callable[[str], list[int]],
               monitor: Scorer | None = None, monitor_tasks: Sequence[str] = (),
               failure_score: float = 0.0, timeout_s: float = 5.0, workers: int = 2):
    if not functions:
      raise ValueError("FunctionScorer needs at least one reward function.")
    self.functions = list(functions)
    self.render_prompt, self.encode = render_prompt, encode
    self.monitor, self.monitor_tasks = monitor, frozenset(monitor_tasks)
    self.failure_score = failure_score
    self._pool = KillablePool(workers, timeout_s, initializer=(
        functions_lib.preload, (tuple(f.spec for f in self.functions),)))
    self._timeout_s = timeout_s
    self._totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Any task: the functions score every sample."""
    del tasks

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Each function's values, summed with the weights; see the module docstring."""
    if len(examples) != len(responses):
      raise ValueError(f"{len(examples)} examples for {len(responses)} responses.")
    per_function = [self._values(f, examples, responses) for f in self.functions]
    verdicts = self._monitor(examples, responses)
    out = Scores([], [], [], reasons=[])
    for i in range(len(examples)):
      values = [(f, v[i]) for f, v in zip(self.functions, per_function)]
      failed = [f"reward.function {f.name}: {v}" for f, v in values if isinstance(v, _Failed)]
      scored = [(f, v) for f, v in values if v is not None and not isinstance(v, _Failed)]
      if not failed and not scored:
        failed = ["no reward function scored it (every one returned None)"]
      if failed:
        out.append(self.failure_score, False, failed[0], failed[0])
        continue
      reward = sum(f.weight * float(v) for f, v in scored)
      if not finite_in_float32(reward):
        failed = f"the weighted sum {reward!r} is not finite in float32"
        out.append(self.failure_score, False, failed, failed)
        continue
      full = all(getattr(v, "acc", float(v) >= FULL_MARKS) for _, v in scored)
      correct = verdicts[i] if verdicts[i] is not None else full
      out.append(reward, correct, "", "" if correct else "not full marks")
    return out

  def _values(self, function, examples, responses) -> list[Any]:
    """Per sample the function's value (float or None) or a `_Failed` reason."""
    chunks = [range(s, min(s + functions_lib.SAMPLES_PER_CALL, len(examples)))
              for s in range(0, len(examples), functions_lib.SAMPLES_PER_CALL)]
    calls = [self._call(function, [examples[i] for i in rows], [responses[i] for i in rows])
             for rows in chunks]
    out: list[Any] = []
    for rows, (status, result) in zip(chunks, self._pool.map(calls)):
      out.extend(self._unpack(function, len(rows), status, result))
    self._count(function, out)
    return out

  def _call(self, function, examples, responses) -> tuple[Callable, tuple]:
    if function.convention == "verl":
      samples = [{"data_source": e.metadata.get("data_source", e.task), "solution_str": str(r),
                  "ground_truth": e.answer, "extra_info": e.metadata.get("extra_info")}
                 for e, r in zip(examples, responses)]
      return functions_lib.call_verl, (function.spec, samples)
    kwargs = columns_of(examples)
    kwargs.update(prompts=[self.render_prompt(e) for e in examples],
                  completions=[str(r) for r in responses],
                  completion_ids=[list(getattr(r, "token_ids", None) or self.encode(str(r)))
                                  for r in responses])
    return functions_lib.call_trl, (function.spec, kwargs)

  def _unpack(self, function, count: int, status: str, result: Any) -> list[Any]:
    if status == "timeout":
      return [_Failed(f"timeout after {self._timeout_s:g} s")] * count
    if status != "ok":
      return [_Failed(f"raised {result}")] * count
    if function.convention == "verl":
      return [self._verl_value(function, value) for value in result]
    if not isinstance(result, (list, tuple)):
      return [_Failed(f"returned {type(result).__name__}, not a list of rewards")] * count
    if len(result) != count:
      return [_Failed(f"returned {len(result)} rewards for {count} samples")] * count
    return [_number(v) for v in result]

  def _verl_value(self, function, value: Any) -> Any:
    """verl's result: a number, or a dict whose "score" is the reward (other numeric
    entries are logged as reward/<name>/<key>)."""
    if isinstance(value, dict):
      if "score" not in value:
        return _Failed(f"returned a dict without 'score' (keys {sorted(value)[:8]})")
      for key, extra in value.items():
        if key != "score" and isinstance(extra, numbers.Real) and math.isfinite(extra):
          self._totals[function.name][f"extra/{key}"] += float(extra)
          self._totals[function.name][f"extra_count/{key}"] += 1
      acc = value.get("acc")
      value = _number(value["score"])
      if isinstance(value, float) and isinstance(acc, (bool, numbers.Real)):
        return _Scored(value, acc=bool(acc))
    return _number(value)

  def _monitor(self, examples, responses) -> list[bool | None]:
    """The rule verifiers' verdict per sample whose task has one (else None)."""
    rows = [i for i, e in enumerate(examples) if e.task in self.monitor_tasks]
    verdicts: list[bool | None] = [None] * len(examples)
    if self.monitor is None or not rows:
      return verdicts
    scored = guarded_score(self.monitor, [examples[i] for i in rows],
                           [str(responses[i]) for i in rows], failure_score=0.0,
                           what="monitor")
    for position, i in enumerate(rows):
      verdicts[i] = None if scored.failures[position] else scored.correct[position]
    return verdicts

  def _count(self, function, values: list[Any]) -> None:
    totals = self._totals[function.name]
    totals["samples"] += len(values)
    totals["failures"] += sum(isinstance(v, _Failed) for v in values)
    totals["unscored"] += sum(v is None for v in values)
    totals["sum"] += sum(v for v in values if isinstance(v, float))

  def pop_metrics(self) -> dict[str, float]:
    """Per function since the last call: reward/<name>/mean (over the samples it scored),
    failure_rate, unscored_rate and its logged extras; then the monitor's per-task
    accuracy (the true accuracy where a task has a verifier)."""
    out = {}
    for name, t in sorted(self._totals.items()):
      scored = t["samples"] - t["failures"] - t["unscored"]
      out[f"reward/{name}/mean"] = t["sum"] / scored if scored else 0.0
      out[f"reward/{name}/failure_rate"] = t["failures"] / max(1, t["samples"])
      out[f"reward/{name}/unscored_rate"] = t["unscored"] / max(1, t["samples"])
      for key in [k for k in t if k.startswith("extra/")]:
        out[f"reward/{name}/{key[6:]}"] = t[key] / t[f"extra_count/{key[6:]}"]
    self._totals.clear()
    if self.monitor is not None:
      out.update(self.monitor.pop_metrics())
    return out

  def __enter__(self) -> "FunctionScorer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the worker processes (and the monitor's)."""
    self._pool.close()
    if self.monitor is not None:
      self.monitor.close()
