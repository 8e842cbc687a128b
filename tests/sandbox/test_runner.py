"""The program that runs the candidate (sandbox/runner.py), its modes called in this process
on trusted programs (in a sandbox: test_jobs.py): the "tests" verdict with the asserts that
passed counted and the failing line named, and the "io" mode's outputs per input, exit
statuses and output cap."""

from __future__ import annotations

import pytest

from rlhf_jax.sandbox import runner

SOLUTION = "def add(a, b):\n  return a + b\n"


@pytest.mark.parametrize("solution, tests, passed, reason, tests_run", [
    (SOLUTION, "assert add(1, 2) == 3\nassert add('a', 'b') == 'ab'\n", True, "", 2),
    (SOLUTION, "assert add(1, 2) == 3\nassert add(1, 1) == 3\n", False,
     "test failed: AssertionError at tests line 2", 1),
    (SOLUTION, "x = add(1, 2)\n", False, "no test ran (the tests executed no assert)", 0),
    ("def add(a, b:\n", "assert True\n", False, "syntax error: ", 0),
    ("raise ValueError('bad input')\n", "assert True\n", False,
     "solution raised ValueError at solution line 1: bad input", 0),
    ("import sys\nsys.exit(0)\n", "assert True\n", False,
     "the solution exited before the tests ran", 0),
    (SOLUTION, "assert add(1, 2) == 3\nraise SystemExit\n", False, "exited during the tests", 1),
])
def test_the_tests_mode_verdicts(solution, tests, passed, reason, tests_run):
  result = runner._run_tests({"solution": solution, "tests": tests})  # pylint: disable=protected-access
  assert result["passed"] is passed and result["tests_run"] == tests_run
  assert result["reason"].startswith(reason) and (reason or result["reason"] == "")


def test_the_io_mode_runs_the_program_once_per_input():
  program = ("import sys\nn = int(input())\nprint(n * 2)\n"
             "if n < 0:\n  sys.exit(3)\nif n == 0:\n  raise KeyError('zero')\n")
  result = runner._run_io({"program": program, "inputs": ["2\n", "-1\n", "0\n", "x\n"],  # pylint: disable=protected-access
                           "output_bytes": 1000})
  assert result["outputs"][:3] == ["4\n", "-2\n", "0\n"] and result["outputs"][3] == ""
  assert result["errors"][:3] == ["", "exit status 3", "KeyError at program line 7: 'zero'"]
  assert result["errors"][3].startswith("ValueError at program line 2")


def test_the_io_mode_caps_what_a_program_prints():
  result = runner._run_io({"program": "print('x' * 100)\n", "inputs": [""],  # pylint: disable=protected-access
                           "output_bytes": 10})
  assert "output limit exceeded" in result["errors"][0]
  assert len(result["outputs"][0]) <= 10
