"""Code verification (rewards/code.py) on ordinary programs: calls compared in the harness,
the sandbox modes and the explicit unsafe one (hostile programs:
tests/sandbox/test_sandbox_adversarial.py)."""

from __future__ import annotations

import pytest

from rlhf_jax.rewards import code


def test_run_calls_compares_in_the_harness():
  solution = "def split(s):\n  return tuple(s.split())\n"
  assert code.run_calls(solution, "split", [(["a b"], ["a", "b"]), (["c"], [["c"]])],
                        timeout_s=5.0).passed
  wrong = code.run_calls(solution, "split", [(["a b"], ["a", "b"]), (["c d"], ["c"])],
                         timeout_s=5.0)
  assert not wrong.passed and wrong.tests_run == 1
  assert wrong.reason == 'case 2: wrong result: expected ["c"], got ["c", "d"]'
  missing = code.run_calls(solution, "join", [([], 1)], timeout_s=5.0)
  assert missing.reason.startswith("case 1: NameError") and "defines no 'join'" in \
      missing.reason
  with pytest.raises(ValueError, match="Python identifier"):
    code.run_calls(solution, "not a name", [([], 1)])
  with pytest.raises(ValueError, match="argument list"):
    code.run_calls(solution, "split", [("a b", 1)])


def test_modes_are_checked_and_the_unsafe_mode_is_explicit():
  with pytest.raises(ValueError, match="mode='fast'"):
    code.run_tests("x = 1", "assert x == 1", mode="fast")
  with pytest.raises(ValueError, match="unsafe_in_process"):
    code.CodeScorer(mode="in_process")
  assert code.run_tests("x = 1", "assert x == 1", mode="unsafe_in_process").passed
  assert code.CodeScorer().test_kind == "tests"  # the harness by default


def test_extract_program_takes_the_last_fenced_block():
  response = "First try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\nDone."
  assert code.extract_program(response) == "x = 2\n"
  assert code.extract_program("x=3+4") == "x=3+4"
