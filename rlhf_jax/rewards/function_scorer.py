"""`FunctionScorer`: the `Scorer` of `reward.function` (rewards/functions.py has the
conventions, the loading and the worker side).

Every configured function is called on the step's samples (a TRL function once, on all of
them in row order; a verl function on chunks of `VERL_SAMPLES_PER_CALL`), all functions'
calls at once on the worker pool. Per sample the reward is Σ weight × value over the
functions that scored it; `None` is "not scored by this function" (TRL's nansum), and a
sample no function scores gets 0 (`reward.unscored = "zero"`, TRL's) or the failure score
(`"failure"`).

Nothing fails silently: a failed call (exception, hang, wrong type or length, a value
that is not a finite number, a worker past its memory) fails its samples with a one-line
reason that reaches `Scores.failures` (so rollouts.jsonl and the step's
`reward_failures`), and once per step (`pop_metrics`) one console line per failing
function gives its name, the count and the first reason; another line counts the
samples no function scored, and what a function printed is shown, bounded.

Correctness (`Scores.correct`: accuracy metrics, `rollout.dynamic.signal = "accuracy"`) is
the rule verifier's verdict where the task has one (`monitor`), else the functions' own
verdict: verl's "acc" where its dict has one, otherwise full marks (every function that
scored the sample gave at least 1.0). Dynamic sampling filters on the reward's spread by
default (rollout/groups.py), not on this.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import numbers
from typing import Any, Callable, Sequence

from rlhf_jax.data import Example
from rlhf_jax.rewards import functions as functions_lib
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import guarded_score
from rlhf_jax.sandbox import worker_groups
from rlhf_jax.sandbox.reward_values import finite_in_float32
from rlhf_jax.sandbox.workers import GroupPool

LOG = logging.getLogger("rlhf_jax.rewards")
FULL_MARKS = 1.0  # a function's value that counts as a correct answer (TRL's, verl's 1.0)
# reward.unscored: a sample no function scored gets 0 / fails / leaves training
UNSCORED = ("zero", "failure", "drop")
_SHOWN_OUTPUT = 1000  # characters of a function's printed output shown on the console


class _Failed(str):
  """A per-sample failure reason (distinguishes a reason from a value)."""


class _Scored(float):
  """A reward that carries its function's own verdict (verl's "acc")."""

  def __new__(cls, value: float, *, acc: bool):
    out = super().__new__(cls, value)
    out.acc = acc
    return out


@dataclasses.dataclass
class _StepTally:
  """One function's record since the last `pop_metrics`."""
  samples: int = 0
  failures: int = 0
  unscored: int = 0
  total: float = 0.0
  first_failure: str = ""
  output: str = ""
  output_bytes: int = 0
  extras: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  extra_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)


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
  """A value as it came back from a worker (`functions.plain_value`) as a reward: a number
  finite in float32 (the batch's dtype: 1e39 is inf there), None, or a failure."""
  if value is None:
    return None
  if isinstance(value, dict) and isinstance(value.get("bad"), str):
    return _Failed(f"returned {value['bad']}, not a number")
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return _Failed(f"returned {type(value).__name__}, not a number")
  if finite_in_float32(value):
    return float(value)
  return _Failed(f"returned {type(value).__name__} {value!r}, not a number finite in float32")


class FunctionScorer(ScorerBase):
  """Scores samples with the configured reward functions (module docstring).

  Args:
    functions: the parsed `reward.function` entries (`functions.parse_functions`).
    render_prompt: Example → the prompt text as the model saw it (the run's
      `PromptFormat.decoded`).
    encode: text → token ids (the policy tokenizer's), for `completion_ids`.
    monitor: the rule verifiers of the tasks that have one (true accuracy), or None.
    monitor_tasks: the tasks `monitor` scores.
    failure_score: the reward of a failed sample.
    unscored: the reward of a sample no function scored: "zero" (0, TRL's),
      "failure" (`failure_score`, counted as a failure) or "drop" (`Scores.scored`
      False: out of its group's statistics and the loss).
    timeout_s: the limit of one call (a TRL function's call holds the whole step).
    workers: worker processes.
    memory_mb: a worker's resident limit with the processes it starts (0: none).
  """

  def __init__(self, functions: Sequence[functions_lib.RewardFunction], *,
               render_prompt: Callable[[Example], str], encode: Callable[[str], list[int]],
               monitor: Scorer | None = None, monitor_tasks: Sequence[str] = (),
               failure_score: float = 0.0, unscored: str = "zero", timeout_s: float = 60.0,
               workers: int = 2, memory_mb: int = 0):
    if not functions:
      raise ValueError("FunctionScorer needs at least one reward function.")
    if unscored not in UNSCORED:
      raise ValueError(f"unscored={unscored!r}: must be one of {', '.join(UNSCORED)}.")
    self.functions = list(functions)
    self.render_prompt, self.encode = render_prompt, encode
    self.monitor, self.monitor_tasks = monitor, frozenset(monitor_tasks)
    self.failure_score, self.unscored = failure_score, unscored
    self.memory_mb = memory_mb
    self._pool = GroupPool(workers, timeout_s, memory_mb=memory_mb, plain_results=True,
                           initializer=(functions_lib.preload,
                                        (tuple(f.spec for f in self.functions),)))
    self._timeout_s = timeout_s
    self._tallies: dict[str, _StepTally] = {}
    self._unscored_samples = self._samples = 0

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Any task: the functions score every sample."""
    del tasks

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Each function's values, summed with the weights; see the module docstring."""
    if len(examples) != len(responses):
      raise ValueError(f"{len(examples)} examples for {len(responses)} responses.")
    per_function = self._values(examples, responses)
    verdicts = self._monitor(examples, responses)
    out = Scores([], [], [], reasons=[])
    self._samples += len(examples)
    for i in range(len(examples)):
      values = [(f, per_function[f.name][i]) for f in self.functions]
      failed = [f"reward.function {f.name}: {v}" for f, v in values if isinstance(v, _Failed)]
      scored = [(f, v) for f, v in values if v is not None and not isinstance(v, _Failed)]
      if failed:
        out.append(self.failure_score, False, failed[0], failed[0])
        continue
      if not scored:
        self._unscored_samples += 1
        if self.unscored == "failure":
          reason = ("no reward function scored it (every one returned None; "
                    "reward.unscored='failure')")
          out.append(self.failure_score, False, reason, reason)
        elif self.unscored == "drop":
          out.append(0.0, False, "", "no reward function scored it (dropped: "
                     "reward.unscored='drop')", scored=False)
        else:
          correct = bool(verdicts[i])
          out.append(0.0, correct, "", "" if correct else "no reward function scored it")
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

  # ------------------------------------------------------------------ calls

  def _values(self, examples, responses) -> dict[str, list[Any]]:
    """Per function, per sample its value (float or None) or a `_Failed` reason; every
    function's calls go to the pool together."""
    calls, owners = [], []
    for function in self.functions:
      for rows, call in self._calls(function, examples, responses):
        calls.append(call)
        owners.append((function, rows))
    out = {f.name: [None] * len(examples) for f in self.functions}
    for (function, rows), (status, result) in zip(owners, self._pool.map(calls)):
      try:
        values = self._unpack(function, len(rows), status, result)
      except Exception as error:  # pylint: disable=broad-except  # a worker's malformed reply
        values = [_Failed(f"malformed reply from its worker ({type(error).__name__})")] * len(rows)
      for i, value in zip(rows, values):
        out[function.name][i] = value
    for function in self.functions:
      self._count(function, out[function.name])
    return out

  def _calls(self, function, examples, responses) -> list[tuple[list[int], tuple]]:
    """(rows, pool call) pairs: the whole step for a TRL function, chunks for verl's."""
    if function.convention == "verl":
      chunk = functions_lib.VERL_SAMPLES_PER_CALL
      out = []
      for start in range(0, len(examples), chunk):
        rows = list(range(start, min(start + chunk, len(examples))))
        samples = [{"data_source": examples[i].metadata.get("data_source", examples[i].task),
                    "solution_str": str(responses[i]), "ground_truth": examples[i].answer,
                    "extra_info": examples[i].metadata.get("extra_info")} for i in rows]
        out.append((rows, (functions_lib.call_verl, (function.spec, samples))))
      return out
    kwargs = columns_of(examples)
    kwargs.update(prompts=[self.render_prompt(e) for e in examples],
                  completions=[str(r) for r in responses],
                  completion_ids=[list(getattr(r, "token_ids", None) or self.encode(str(r)))
                                  for r in responses])
    return [(list(range(len(examples))), (functions_lib.call_trl, (function.spec, kwargs)))]

  def _unpack(self, function, count: int, status: str, result: Any) -> list[Any]:
    """A call's reply (plain data) as per-sample values or failures."""
    if status == "timeout":
      return [_Failed(f"timeout after {self._timeout_s:g} s "
                      "(reward.function_timeout_s)")] * count
    if status != "ok":
      reason = str(result)
      if reason.startswith(f"worker died (exit code {worker_groups.MEMORY_EXIT_CODE})"):
        reason = (f"memory: its worker passed reward.worker_memory_mb={self.memory_mb} MB "
                  "(with the processes it started)")
      return [_Failed(reason)] * count
    tally = self._tally(function)
    if result["output_bytes"]:
      tally.output = tally.output or str(result["output"])
      tally.output_bytes += int(result["output_bytes"])
    if result["error"]:
      return [_Failed(str(result["error"]))] * count
    values = result["values"]
    if values is None:
      return [_Failed("returned no list of rewards")] * count
    if len(values) != count:
      return [_Failed(f"returned {len(values)} rewards for {count} samples")] * count
    if function.convention == "verl":
      return [self._verl_value(tally, value) for value in values]
    return [_number(v) for v in values]

  def _verl_value(self, tally: _StepTally, value: Any) -> Any:
    """verl's result: a number, or a dict whose "score" is the reward (other numeric
    entries are logged as reward/<name>/<key>)."""
    if isinstance(value, dict) and "error" in value:
      return _Failed(str(value["error"]))
    if isinstance(value, dict) and "dict" in value:
      entries = value["dict"]
      if "score" not in entries:
        return _Failed(f"returned a dict without 'score' (keys {value.get('keys')})")
      for key, extra in entries.items():
        if key != "score" and isinstance(extra, numbers.Real) and math.isfinite(extra):
          tally.extras[key] += float(extra)
          tally.extra_counts[key] += 1
      acc = entries.get("acc")
      score = _number(entries["score"])
      if isinstance(score, float) and isinstance(acc, (bool, numbers.Real)):
        return _Scored(score, acc=bool(acc))
      return score
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

  # ------------------------------------------------------------------ reporting

  def _tally(self, function) -> _StepTally:
    return self._tallies.setdefault(function.name, _StepTally())

  def _count(self, function, values: list[Any]) -> None:
    tally = self._tally(function)
    tally.samples += len(values)
    failures = [v for v in values if isinstance(v, _Failed)]
    tally.failures += len(failures)
    if failures and not tally.first_failure:
      tally.first_failure = str(failures[0])
    tally.unscored += sum(v is None for v in values)
    tally.total += sum(float(v) for v in values if v is not None and not isinstance(v, _Failed))

  def pop_metrics(self) -> dict[str, float]:
    """Per function since the last call: reward/<name>/mean (over the samples it scored),
    failures, failure_rate, unscored_rate, output_bytes and its logged extras;
    reward/unscored_samples (scored by no function); then the monitor's per-task accuracy
    (the true accuracy where a task has a verifier). Logs one line per failing function
    (its first reason), one for the unscored samples and what each function printed."""
    out = {}
    for name, t in sorted(self._tallies.items()):
      scored = t.samples - t.failures - t.unscored
      out[f"reward/{name}/mean"] = t.total / scored if scored else 0.0
      out[f"reward/{name}/failures"] = float(t.failures)
      out[f"reward/{name}/failure_rate"] = t.failures / max(1, t.samples)
      out[f"reward/{name}/unscored_rate"] = t.unscored / max(1, t.samples)
      out[f"reward/{name}/output_bytes"] = float(t.output_bytes)
      for key, count in t.extra_counts.items():
        out[f"reward/{name}/{key}"] = t.extras[key] / count
      if t.failures:
        LOG.warning("reward function %s failed on %d of %d samples: %s", name, t.failures,
                    t.samples, t.first_failure[:300])
      if t.output_bytes:
        shown = t.output[:_SHOWN_OUTPUT].rstrip()
        more = t.output_bytes - len(shown.encode())
        LOG.warning("reward function %s printed %d bytes%s:\n%s", name, t.output_bytes,
                    f" ({more} not shown)" if more > 0 else "", shown)
    if self._unscored_samples:
      what = {"zero": "they get 0",
              "drop": "they leave their groups' statistics and the loss"}.get(
                  self.unscored, f"they get reward.failure_score={self.failure_score:g}")
      LOG.warning("reward: %d of %d samples were scored by no reward function (every one "
                  "returned None): %s (reward.unscored=%r)", self._unscored_samples,
                  self._samples, what, self.unscored)
    out["reward/unscored_samples"] = float(self._unscored_samples)
    self._tallies.clear()
    self._unscored_samples = self._samples = 0
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
