"""Running untrusted Python in a contained child process (sandbox/jobs.py) on ordinary
programs through the code verifier: verdicts, reasons, order, stdin/stdout cases, limits and
the rlimits isolation (hostile programs: test_sandbox_adversarial.py)."""

import os

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import code
from rlhf_jax.sandbox import jobs as sandbox

HUMANEVAL_TESTS = """
def check(candidate):
    assert candidate(2, 3) == 5
    assert candidate(-1, 1) == 0
    assert candidate(0, 0) == 0

check(add)
"""


def test_passing_and_failing_programs():
  good = code.run_tests("def add(a, b):\n    return a + b", HUMANEVAL_TESTS)
  assert good.passed and good.reason == "" and good.tests_run == 3 and good.seconds > 0
  bad = code.run_tests("def add(a, b):\n    return a - b", HUMANEVAL_TESTS)
  assert not bad.passed and bad.tests_run == 0
  assert bad.reason == "test failed: AssertionError at tests line 3"
  partly = code.run_tests("def add(a, b):\n    return abs(a) + b", HUMANEVAL_TESTS)
  assert not partly.passed and partly.tests_run == 1  # the second assert failed


def test_failures_carry_their_reason():
  assert code.run_tests("def f(:", "assert True").reason.startswith("syntax error")
  assert code.run_tests("raise ValueError('no')", "assert True").reason == (
      "solution raised ValueError at solution line 1: no")
  assert code.run_tests("def f():\n  return 1", "f(").reason.startswith("syntax error")
  assert code.run_tests("x = 1", "assert y == 1").reason.startswith("test failed: NameError")
  assert code.run_tests("x = 1", "x = 2").reason.startswith("no test ran")


def test_batch_keeps_order():
  cases = [(f"x = {i}", f"assert x == {i if i % 3 else -1}") for i in range(10)]
  verdicts = code.run_tests_batch(cases, max_workers=3, timeout_s=5.0)
  assert [v.passed for v in verdicts] == [i % 3 != 0 for i in range(10)]
  assert code.run_tests_batch([]) == []
  with pytest.raises(TypeError, match="case 0"):
    code.run_tests_batch([("x = 1",)])
  with pytest.raises(ValueError, match="max_workers=0"):
    code.run_tests_batch([("x = 1", "assert x")], max_workers=0)


def test_stdin_stdout_cases():
  program = "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)"
  assert code.run_io(program, [("1 2\n", "3\n"), ("5 5", "10")]).passed
  wrong = code.run_io("print(int(input()) * 2)", [("1", "2"), ("5", "11"), ("6", "12")])
  assert not wrong.passed and wrong.tests_run == 1
  assert wrong.reason == "case 2: wrong output: expected '11', got '10\\n'"
  assert code.run_io("import sys\nprint(7)\nsys.exit(0)", [("", "7   \n\n")]).passed
  crashed = code.run_io("raise SystemExit(3)", [("", "")])
  assert crashed.reason == "case 1: exit status 3"
  with pytest.raises(ValueError, match="at least one"):
    code.run_io("print(1)", [])


def test_limits_are_validated():
  with pytest.raises(ValueError, match="timeout_s=0"):
    sandbox.Limits(timeout_s=0)
  with pytest.raises(ValueError, match="isolation='chroot'"):
    sandbox.Limits(isolation="chroot")
  with pytest.raises(ValueError, match="memory_mb=8"):
    sandbox.Limits(memory_mb=8)


def test_rlimits_isolation_still_refuses_sockets_and_subprocesses(monkeypatch):
  monkeypatch.setenv("RLHF_JAX_SANDBOX_ISOLATION", "rlimits")
  try:
    sandbox.check_isolation("rlimits")
  except sandbox.SandboxUnavailable as error:
    # As root the job's uid must be able to run the interpreter (not one under /root).
    assert os.geteuid() == 0 and "readable by an unprivileged user" in str(error)
    return
  assert code.run_tests("x = 2", "assert x == 2").passed
  refused = code.run_tests("import socket\nsocket.socket()", "assert True")
  assert not refused.passed and "PermissionError" in refused.reason
  refused = code.run_tests("import subprocess\nsubprocess.run(['true'])", "assert True")
  assert not refused.passed and "PermissionError" in refused.reason


def test_verl_code_contest_answers_run_as_stdin_stdout_or_call_cases():
  """verl's and PRIME's code ground truth: JSON {"inputs", "outputs"} runs with run_io,
  with "fn_name" as calls through the harness (APPS's layout: argument lists, expected
  values; a one-item list also matches its item), beside unit-test answers."""
  import json
  io_answer = json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]})
  calls = json.dumps({"inputs": [[1, 2], [5, 5]], "outputs": [[3], 10], "fn_name": "add"})
  examples = [Example("add", io_answer, "code"), Example("add", io_answer, "code"),
              Example("add", calls, "code"), Example("add", calls, "code"),
              Example("add", calls, "code"),
              Example("add", json.dumps({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}),
                      "code"),
              Example("add", HUMANEVAL_TESTS, "code")]
  responses = ["```python\na, b = map(int, input().split())\nprint(a + b)\n```",
               "a, b = map(int, input().split())\nprint(a * b)",
               "def add(a, b):\n  return a + b",
               "class Solution:\n  def add(self, a, b):\n    return a + b",
               "def add(a, b):\n  return a * b",
               "def f(x):\n  return x", "def add(a, b):\n    return a + b"]
  scored = code.CodeScorer(("code",), correct_score=1.0, wrong_score=-1.0,
                           timeout_s=5.0).score(examples, responses)
  assert scored.correct == [True, False, True, True, False, False, True]
  assert scored.reason(1) == "case 1: wrong output: expected '3\\n', got '2\\n'"
  assert scored.reason(4) == "case 1: wrong result: expected [3], got 2"
  assert scored.failures[5] == ("answer: call-based cases must be a non-empty list of "
                                "(argument list, expected value).")
  assert code.io_cases("assert add(1, 2) == 3") is None and code.io_cases(calls) is None
  assert code.call_cases(calls) == ("add", [([1, 2], [3]), ([5, 5], 10)])
  with pytest.raises(ValueError, match="non-empty lists of strings of one length"):
    code.io_cases(json.dumps({"inputs": ["1"], "outputs": []}))
