"""The trusted harness (sandbox/harness.py) on ordinary programs: HumanEval-style tests through
remote calls, the solution's standard modules, a big integer crossing to the harness."""

from __future__ import annotations

from rlhf_jax.rewards import code


def test_harness_runs_humaneval_tests_through_remote_calls():
  solution = ("def add(a, b):\n  return a + b\n"
              "def pair(a):\n  return (a, [a])\n"
              "def check_positive(n):\n  if n < 0:\n    raise ValueError('negative')\n"
              "  return True\n"
              "class Counter:\n  def __init__(self):\n    self.n = 0\n"
              "  def bump(self, by=1):\n    self.n += by\n    return self.n\n"
              "TABLE = {'k': (1, 2)}\n")
  tests = ("def check(candidate):\n  assert candidate(2, 3) == 5\n"
           "  assert candidate('a', 'b') == 'ab'\n"
           "check(add)\n"
           "assert pair(1) == (1, [1])\n"
           "assert TABLE == {'k': (1, 2)}\n"
           "try:\n  check_positive(-1)\n  assert False\nexcept ValueError:\n  pass\n"
           "counter = Counter()\nassert counter.bump() == 1\nassert counter.bump(by=2) == 3\n")
  verdict = code.run_tests(solution, tests, timeout_s=5.0)
  assert verdict.passed and verdict.tests_run == 6, verdict
  wrong = code.run_tests(solution.replace("a + b", "a - b"), tests, timeout_s=5.0)
  assert wrong.reason == "test failed: AssertionError at tests line 2" and \
      wrong.tests_run == 0


def test_the_tests_see_the_standard_modules_the_solution_imported():
  """MBPP-style tests use the solution's `import math`: the harness imports it again."""
  solution = "import math\ndef area(r):\n  return math.pi * r * r\n"
  verdict = code.run_tests(solution, "assert math.isclose(area(1.0), 3.141592653589793)",
                           timeout_s=5.0)
  assert verdict.passed, verdict
  wrong = code.run_tests(solution.replace("r * r", "r"),
                         "assert math.isclose(area(2.0), 12.566370614359172)", timeout_s=5.0)
  assert not wrong.passed


def test_a_big_integer_result_crosses_to_the_harness():
  """Past Python's 4300-digit default for int <-> str (factorial(2000) has 5736 digits)."""
  solution = "import math\ndef fact(n):\n  return math.factorial(n)\n"
  tests = "assert fact(2000) == math.factorial(2000)\nassert fact(2000) != fact(1999)"
  verdict = code.run_tests(solution, tests, timeout_s=5.0)
  assert verdict.passed and verdict.tests_run == 2, verdict
