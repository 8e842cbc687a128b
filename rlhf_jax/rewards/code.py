"""Code verification: run a candidate Python program against tests, contained.

    run_tests(solution, tests, *, timeout_s=10.0, memory_mb=512, mode="harness") -> Verdict
    run_tests_batch(cases, *, max_workers=None, ..., mode="harness") -> list[Verdict]
    run_calls(solution, fn_name, cases, *, timeout_s=10.0, memory_mb=512) -> Verdict
    run_io(program, cases, *, timeout_s=10.0, memory_mb=512) -> Verdict    # stdin → stdout

No verdict is decided in the interpreter that runs the candidate:

- `run_tests`: `tests` is Python (asserts, or HumanEval's `check(candidate)` and its
  call) run by a trusted harness in a sandbox of its own; the solution runs in another
  and serves calls to its top-level functions, returning plain data (tuples, lists,
  dicts, numbers, strings, ...; an object with its own `__eq__` cannot cross). Its small
  plain-data values (pycalc's `x`) are copied to the harness. A verdict passes only if
  the tests ran to the end with at least one assert; `tests_run` counts those that passed.
- `run_calls`: call-based cases as data (APPS / verl `fn_name`): the harness calls
  `fn_name(*args)` for each case and compares the result with the expected value.
- `run_io` (competitive programming): the program's output for each input comes back
  and is compared here, line by line with trailing whitespace ignored.

The expected values never enter the candidate's sandbox. `mode="unsafe_in_process"`
runs the solution and the tests in one interpreter instead (one sandbox, faster), where
a program can forge its verdict (docs/sandbox.md): never for RL rewards.

`CodeScorer` is the `Scorer` of code tasks: the program is the response's last
```python fenced block (or the whole response), the example's answer holds the tests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
from typing import Any, Sequence

from rlhf_jax.data import Example
from rlhf_jax.sandbox import jobs as sandbox
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase

MODES = ("harness", "unsafe_in_process")
_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The outcome of running a program against its tests.

  Attributes:
    passed: every test ran and passed (decided and signed by the trusted harness, or
      compared here for stdin/stdout cases).
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


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"mode={mode!r}; allowed: {', '.join(MODES)}.")


def run_tests(solution: str, tests: str, *, timeout_s: float = 10.0, memory_mb: int = 512,
              mode: str = "harness") -> Verdict:
  """Runs `tests` against `solution`, each in a fresh sandbox; see the module docstring.
  mode "unsafe_in_process": both in one interpreter, where the verdict can be forged."""
  _check_mode(mode)
  return _run_tests_batch([(solution, tests)], _limits(timeout_s, memory_mb), 1, mode)[0]


def default_workers() -> int:
  """Concurrent sandboxes of a batch: 4 per core (jobs mostly wait on their limits)."""
  return min(64, 4 * (os.cpu_count() or 1))


def run_tests_batch(cases: Sequence[tuple[str, str]], *, max_workers: int | None = None,
                    timeout_s: float = 10.0, memory_mb: int = 512,
                    mode: str = "harness") -> list[Verdict]:
  """`run_tests` over (solution, tests) pairs on a bounded pool, in input order (`mode`
  as in `run_tests`).

  Every job has its own wall clock, so a batch of hostile programs takes about
  ceil(len(cases) / max_workers) × timeout_s at worst.
  """
  _check_mode(mode)
  return _run_tests_batch(cases, _limits(timeout_s, memory_mb), max_workers, mode)


def _run_tests_batch(cases, limits: sandbox.Limits, max_workers: int | None,
                     mode: str) -> list[Verdict]:
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
  kind = "tests" if mode == "harness" else "unsafe"
  return _run_jobs([(kind, solution, tests) for solution, tests in cases], limits,
                   max_workers)


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


def run_calls(solution: str, fn_name: str, cases: Sequence[tuple[list, Any]], *,
              timeout_s: float = 10.0, memory_mb: int = 512) -> Verdict:
  """Calls `fn_name(*args)` of `solution` for each (args, expected) case through the
  trusted harness (APPS's comparison: equal, or equal to the expected list's only item;
  tuples compare as lists). `timeout_s` bounds all cases together."""
  cases = _checked_calls(fn_name, cases)
  limits = _limits(timeout_s, memory_mb)
  sandbox.check_isolation(limits.isolation)
  return _run_jobs([("calls", solution, (fn_name, cases))], limits, 1)[0]


def _checked_calls(fn_name, cases) -> list[tuple[list, Any]]:
  cases = [tuple(case) for case in cases]
  if not isinstance(fn_name, str) or not fn_name.isidentifier():
    raise ValueError(f"fn_name={fn_name!r} must be a Python identifier.")
  if not cases or not all(len(case) == 2 and isinstance(case[0], list) for case in cases):
    raise ValueError("call-based cases must be a non-empty list of (argument list, "
                     "expected value).")
  try:
    json.dumps(cases, allow_nan=False)
  except (TypeError, ValueError) as error:
    raise ValueError(f"call-based cases must be JSON data: {error}") from None
  return cases


def _answer_json(answer: str) -> dict | None:
  text = answer.lstrip()
  if not text.startswith("{"):
    return None
  try:
    data = json.loads(text)
  except ValueError:
    return None
  if not isinstance(data, dict) or "inputs" not in data or "outputs" not in data:
    return None
  return data


def io_cases(answer: str) -> list[tuple[str, str]] | None:
  """The (stdin, expected stdout) cases of a competitive-programming answer in verl's and
  PRIME's layout, JSON {"inputs": [...], "outputs": [...]}; None for a unit-test or a
  call-based (`fn_name`, see `call_cases`) answer.

  Raises:
    ValueError: JSON of that layout that cannot be run (lists of other lengths or
      non-strings).
  """
  data = _answer_json(answer)
  if data is None or data.get("fn_name"):
    return None
  inputs, outputs = data["inputs"], data["outputs"]
  if (not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs
      or len(inputs) != len(outputs)
      or not all(isinstance(x, str) for x in inputs + outputs)):
    raise ValueError("'inputs' and 'outputs' must be non-empty lists of strings of one length.")
  return list(zip(inputs, outputs))


def call_cases(answer: str) -> tuple[str, list[tuple[list, Any]]] | None:
  """(fn_name, [(args, expected), ...]) of a call-based answer, JSON {"fn_name": ...,
  "inputs": [argument lists], "outputs": [expected values]} (APPS, verl); None otherwise.

  Raises:
    ValueError: such JSON that cannot be run (inputs not argument lists, other lengths).
  """
  data = _answer_json(answer)
  if data is None or not data.get("fn_name"):
    return None
  inputs, outputs = data["inputs"], data["outputs"]
  if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(
      outputs):
    raise ValueError("'inputs' and 'outputs' must be lists of one length.")
  return data["fn_name"], _checked_calls(data["fn_name"], list(zip(inputs, outputs)))


def extract_program(response: str) -> str:
  """The last ```python fenced block of a response, or the whole response."""
  blocks = _FENCE.findall(response)
  return blocks[-1] if blocks else response


class CodeScorer(ScorerBase):
  """A `Scorer` for code tasks: `example.answer` holds the tests (run_tests style),
  call-based cases (`call_cases`: run_calls style) or stdin/stdout cases in verl's and
  PRIME's JSON layout (`io_cases`: run_io style). The expected values never enter the
  candidate's sandbox.

  Args:
    tasks: the task names it scores (e.g. ("code",)).
    correct_score: reward of a passing program.
    wrong_score: reward of a failing program.
    timeout_s: the sandbox's wall-clock limit per program.
    memory_mb: the sandbox's memory limit (sandbox.Limits).
    max_workers: concurrent jobs.
    isolation: "namespaces" or "rlimits" (docs/sandbox.md).
    mode: "harness", or "unsafe_in_process" for test code (forgeable: not for RL).
  """

  def __init__(self, tasks: Sequence[str] = ("code",), *, correct_score: float = 1.0,
               wrong_score: float = 0.0, timeout_s: float = 10.0, memory_mb: int = 512,
               max_workers: int | None = None, isolation: str | None = None,
               mode: str = "harness"):
    _check_mode(mode)
    self.tasks = tuple(tasks)
    self.correct_score, self.wrong_score = correct_score, wrong_score
    self.limits = _limits(timeout_s, memory_mb, isolation)
    self.max_workers = max_workers
    self.test_kind = "tests" if mode == "harness" else "unsafe"

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """Raises ValueError naming a task this scorer does not know."""
    unknown = sorted(set(tasks) - set(self.tasks))
    if unknown:
      raise ValueError(f"CodeScorer scores {list(self.tasks)}, not {unknown}.")

  def _job(self, answer: str, program: str):
    """(kind, program, tests) of one sample; ValueError for an answer that cannot run."""
    calls = call_cases(answer)
    if calls is not None:
      return ("calls", program, calls)
    cases = io_cases(answer)
    return (self.test_kind, program, answer) if cases is None else ("io", program, cases)

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Runs each response's program against its example's tests or cases, in parallel;
    an answer whose cases cannot be run scores as wrong, its reason a failure."""
    jobs, failures = [], [""] * len(examples)
    for i, (example, response) in enumerate(zip(examples, responses, strict=True)):
      try:
        jobs.append(self._job(example.answer, extract_program(response)))
      except ValueError as error:
        failures[i] = f"answer: {error}"
        jobs.append(None)
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


def _run_job(job, limits: sandbox.Limits) -> Verdict:
  """One (kind, program, tests) job: kind "tests" / "calls" (the harness), "io", or
  "unsafe" (test code in the candidate's interpreter)."""
  kind, program, tests = job
  if kind == "io":
    return _io_verdict(program, tests, limits)
  if kind == "unsafe":
    return _verdict(sandbox.run_job({"mode": "tests", "solution": program, "tests": tests},
                                    limits))
  harness_job = ({"kind": "tests", "tests": tests} if kind == "tests" else
                 {"kind": "calls", "fn_name": tests[0], "cases": tests[1]})
  return _verdict(sandbox.run_harnessed(harness_job, program, limits))


def _run_jobs(jobs, limits: sandbox.Limits, max_workers: int | None) -> list[Verdict]:
  """Jobs (see `_run_job`) on a bounded pool, in order."""
  if len(jobs) <= 1:
    return [_run_job(job, limits) for job in jobs]
  workers = min(max_workers or default_workers(), len(jobs))
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
    return list(pool.map(lambda job: _run_job(job, limits), jobs))
