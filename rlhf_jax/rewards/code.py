"""Code verification: run a candidate Python program against unit tests, contained.

    run_tests(solution, tests, *, timeout_s=10.0, memory_mb=512) -> Verdict
    run_tests_batch(cases, *, max_workers=None, timeout_s=10.0, memory_mb=512) -> list[Verdict]
    run_io(program, cases, *, timeout_s=10.0, memory_mb=512) -> Verdict    # stdin → stdout

`tests` is Python run after `solution` in the same namespace: asserts, or a
`check(candidate)` function and its call (HumanEval / MBPP style). A verdict passes only
if the tests ran to the end with at least one assert, as reported over the sandbox's
signed channel (rewards/sandbox.py); `tests_run` counts the asserts that passed.
In `run_io` (competitive programming) the expected outputs never enter the sandbox:
the program's output for each input comes back and is compared here, line by line
with trailing whitespace ignored.

`CodeScorer` is the `Scorer` of code tasks: the program is the response's last
```python fenced block (or the whole response), the example's answer holds the tests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
from typing import Sequence

from rlhf_jax.data import Example
from rlhf_jax.rewards import sandbox
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The outcome of running a program against its tests.

  Attributes:
    passed: every test ran and passed (signed by the sandboxed runner).
    reason: "" when passed, else why not ("test failed: AssertionError at tests line 3",
      "timeout after 10s", "killed by SIGSEGV", "no test ran ...").
    tests_run: asserts that ran and passed (stdin/stdout: cases that ran).
    seconds: wall time, sandbox start-up included.
  """
  passed: bool
  reason: str
  tests_run: int
  seconds: float


def _limits(timeout_s: float, memory_mb: int, isolation: str | None = None) -> sandbox.Limits:
  """The sandbox limits of one call; the isolation defaults to $RLHF_JAX_SANDBOX_ISOLATION
  or "namespaces" (docs/sandbox.md)."""
  isolation = isolation or os.environ.get("RLHF_JAX_SANDBOX_ISOLATION", "namespaces")
  return sandbox.Limits(timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)


def _verdict(outcome: sandbox.Outcome) -> Verdict:
  if outcome.report is None:
    return Verdict(False, outcome.failure, 0, outcome.seconds)
  report = outcome.report
  return Verdict(report.get("passed") is True, str(report.get("reason", "")),
                 int(report.get("tests_run", 0)), outcome.seconds)


def run_tests(solution: str, tests: str, *, timeout_s: float = 10.0,
              memory_mb: int = 512) -> Verdict:
  """Runs `solution` then `tests` in a fresh sandbox; see the module docstring."""
  return _run_tests_batch([(solution, tests)], _limits(timeout_s, memory_mb), 1)[0]


def default_workers() -> int:
  """Concurrent sandboxes of a batch: 4 per core (jobs mostly wait on their limits)."""
  return min(64, 4 * (os.cpu_count() or 1))


def run_tests_batch(cases: Sequence[tuple[str, str]], *, max_workers: int | None = None,
                    timeout_s: float = 10.0, memory_mb: int = 512) -> list[Verdict]:
  """`run_tests` over (solution, tests) pairs on a bounded pool, in input order.

  Every job has its own wall clock, so a batch of hostile programs takes about
  ceil(len(cases) / max_workers) × timeout_s at worst.
  """
  return _run_tests_batch(cases, _limits(timeout_s, memory_mb), max_workers)


def _run_tests_batch(cases, limits: sandbox.Limits, max_workers: int | None) -> list[Verdict]:
  cases = list(cases)
  for number, case in enumerate(cases):
    if (not isinstance(case, (tuple, list)) or len(case) != 2
        or not all(isinstance(part, str) for part in case)):
      raise TypeError(f"case {number}: expected (solution: str, tests: str).")
  if max_workers is not None and max_workers < 1:
    raise ValueError(f"max_workers={max_workers} must be >= 1.")
  if not cases:
    return []
  sandbox.check_isolation(limits.isolation)
  return _run_jobs(cases, limits, max_workers)


def _normalise(text: str) -> list[str]:
  lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
  while lines and not lines[-1]:
    lines.pop()
  return lines


def _preview(text: str) -> str:
  return repr(text if len(text) <= 60 else text[:57] + "...")


def run_io(program: str, cases: Sequence[tuple[str, str]], *, timeout_s: float = 10.0,
           memory_mb: int = 512) -> Verdict:
  """Runs `program` once per (stdin, expected stdout) case in one sandbox.

  Passes when every case's output equals the expected one (trailing whitespace and
  trailing blank lines ignored) and no case raised. `timeout_s` bounds all cases together.
  """
  cases = list(cases)
  if not cases:
    raise ValueError("run_io needs at least one (stdin, expected stdout) case.")
  if not isinstance(program, str) or not all(
      isinstance(stdin, str) and isinstance(expected, str) for stdin, expected in cases):
    raise TypeError("program and every (stdin, expected stdout) case must be strings.")
  limits = _limits(timeout_s, memory_mb)
  sandbox.check_isolation(limits.isolation)
  return _io_verdict(program, cases, limits)


def _io_verdict(program: str, cases: Sequence[tuple[str, str]],
                limits: sandbox.Limits) -> Verdict:
  """run_io's sandbox job and comparison (the expected outputs stay out of the sandbox)."""
  outcome = sandbox.run_job({"mode": "io", "program": program,
                             "inputs": [stdin for stdin, _ in cases]}, limits)
  if outcome.report is None:
    return Verdict(False, outcome.failure, 0, outcome.seconds)
  outputs, errors = outcome.report.get("outputs"), outcome.report.get("errors")
  if (not isinstance(outputs, list) or not isinstance(errors, list)
      or len(outputs) != len(cases) or len(errors) != len(cases)):
    return Verdict(False, "malformed report", 0, outcome.seconds)
  for number, ((_, expected), got, error) in enumerate(zip(cases, outputs, errors), 1):
    if error:
      return Verdict(False, f"case {number}: {error}", number - 1, outcome.seconds)
    if _normalise(str(got)) != _normalise(expected):
      return Verdict(False, f"case {number}: wrong output: expected {_preview(expected)}, "
                     f"got {_preview(str(got))}", number - 1, outcome.seconds)
  return Verdict(True, "", len(cases), outcome.seconds)


def io_cases(answer: str) -> list[tuple[str, str]] | None:
  """The (stdin, expected stdout) cases of a competitive-programming answer in verl's and
  PRIME's layout, JSON {"inputs": [...], "outputs": [...]}; None for a unit-test answer.

  Raises:
    ValueError: JSON of that layout that cannot be run (call-based `fn_name` tests,
      lists of other lengths or non-strings).
  """
  text = answer.lstrip()
  if not text.startswith("{"):
    return None
  try:
    data = json.loads(text)
  except ValueError:
    return None
  if not isinstance(data, dict) or "inputs" not in data or "outputs" not in data:
    return None
  if data.get("fn_name"):
    raise ValueError("call-based tests (fn_name) are not supported; stdin/stdout only.")
  inputs, outputs = data["inputs"], data["outputs"]
  if (not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs
      or len(inputs) != len(outputs)
      or not all(isinstance(x, str) for x in inputs + outputs)):
    raise ValueError("'inputs' and 'outputs' must be non-empty lists of strings of one length.")
  return list(zip(inputs, outputs))


def extract_program(response: str) -> str:
  """The last ```python fenced block of a response, or the whole response."""
  blocks = _FENCE.findall(response)
  return blocks[-1] if blocks else response


class CodeScorer(ScorerBase):
  """A `Scorer` for code tasks: `example.answer` holds the tests (run_tests style), or
  stdin/stdout cases in verl's and PRIME's JSON layout (`io_cases`: run_io style, the
  expected outputs never enter the sandbox).

  Args:
    tasks: the task names it scores (e.g. ("code",)).
    correct_score: reward of a passing program.
    wrong_score: reward of a failing program.
    timeout_s: the sandbox's wall-clock limit per program.
    memory_mb: the sandbox's address-space limit.
    max_workers: concurrent sandboxes.
    isolation: "namespaces" or "rlimits" (docs/sandbox.md).
  """

  def __init__(self, tasks: Sequence[str] = ("code",), *, correct_score: float = 1.0,
               wrong_score: float = 0.0, timeout_s: float = 10.0, memory_mb: int = 512,
               max_workers: int | None = None, isolation: str | None = None):
    self.tasks = tuple(tasks)
    self.correct_score, self.wrong_score = correct_score, wrong_score
    self.limits = _limits(timeout_s, memory_mb, isolation)
    self.max_workers = max_workers

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task this scorer does not know."""
    unknown = sorted(set(tasks) - set(self.tasks))
    if unknown:
      raise ValueError(f"CodeScorer scores {list(self.tasks)}, not {unknown}.")

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Runs each response's program against its example's tests or cases, in parallel;
    an answer whose cases cannot be run scores as wrong, its reason a failure."""
    jobs, failures = [], [""] * len(examples)
    for i, (example, response) in enumerate(zip(examples, responses, strict=True)):
      program = extract_program(response)
      try:
        cases = io_cases(example.answer)
      except ValueError as error:
        failures[i] = f"answer: {error}"
        jobs.append(None)
        continue
      jobs.append((program, example.answer) if cases is None else (program, cases))
    sandbox.check_isolation(self.limits.isolation)
    verdicts = _run_jobs([job for job in jobs if job is not None], self.limits,
                         self.max_workers)
    out = Scores([], [], [], reasons=[])
    for job, failure in zip(jobs, failures):
      if job is None:
        out.append(self.wrong_score, False, failure, failure)
        continue
      verdict = verdicts.pop(0)
      out.append(self.correct_score if verdict.passed else self.wrong_score, verdict.passed,
                 "", verdict.reason)
    return out


def _run_jobs(jobs, limits: sandbox.Limits, max_workers: int | None) -> list[Verdict]:
  """(program, tests text) or (program, io cases) jobs on a bounded pool, in order."""
  def run(job):
    program, tests = job
    if isinstance(tests, str):
      return _verdict(sandbox.run_job({"mode": "tests", "solution": program,
                                       "tests": tests}, limits))
    return _io_verdict(program, tests, limits)

  if len(jobs) <= 1:
    return [run(job) for job in jobs]
  workers = min(max_workers or default_workers(), len(jobs))
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
    return list(pool.map(run, jobs))
