"""The trusted harness and its wire (sandbox/harness.py, sandbox_wire.py) on
ordinary programs, and the config check's memory note (hostile programs:
test_sandbox_adversarial.py)."""

import logging
import math

import pytest

from rlhf_jax.rewards import code
from rlhf_jax.rewards import config as reward_config
from rlhf_jax.sandbox import job_cgroup
from rlhf_jax.sandbox import jobs as sandbox
from rlhf_jax.sandbox import wire as wire
from rlhf_jax.training import config as training_config


def test_plain_data_round_trips_and_nothing_else_crosses():
  value = {"a": [1, 2.5, None, True], (1, "x"): {3, 4}, "f": frozenset({b"\x00\xff"}),
           "c": complex(1, -2), "t": (1, (2, [3]))}
  assert wire.decode(wire.encode(value)) == value
  assert math.isnan(wire.decode(wire.encode(float("nan"))))

  class AlwaysEqualInt(int):
    def __eq__(self, other):
      return True
    __hash__ = int.__hash__

  crossed = wire.decode(wire.encode(AlwaysEqualInt(3)))
  assert type(crossed) is int and crossed == 3 and crossed != 4
  with pytest.raises(TypeError, match="not plain data"):
    wire.encode(object())
  for forged in ({"x": 1}, {"t": "abc"}, {"d": [[1]]}, {"d": [[[1], 2]]}, {"b": "zz"}, {}):
    with pytest.raises(wire.WireError):
      wire.decode(forged)


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


def test_the_config_check_says_when_memory_is_bounded_per_process(monkeypatch, caplog):
  monkeypatch.setattr(reward_config, "memory_scope", lambda: ("process", "no cgroup here"))
  reward_config.memory_bound_note.cache_clear()
  note = reward_config.memory_bound_note(512)
  assert note == ("reward.sandbox.memory_mb=512 bounds each sandboxed process, not the job "
                  "(no cgroup here): a code job may use up to 512 MB × 8 processes "
                  "(docs/sandbox.md)")
  assert sandbox.Limits().max_processes == 8
  c = training_config.base_config("arith")
  with caplog.at_level(logging.WARNING):
    reward_config.validate_rule_rewards(c.reward)
  assert note in caplog.text
  monkeypatch.setattr(reward_config, "memory_scope", lambda: ("job", ""))
  reward_config.memory_bound_note.cache_clear()
  assert reward_config.memory_bound_note(512) == ""
  reward_config.memory_bound_note.cache_clear()


def test_a_v2_job_cgroup_sets_and_reads_its_files(tmp_path):
  """cgroup v2's files, on a directory that stands in for the cgroup tree (the machines
  that run the adversarial suite may have v1 only)."""
  cgroup = job_cgroup.JobCgroup({"v2": str(tmp_path)}, 512 << 20, 12)
  (directory,) = cgroup.dirs.values()
  read = lambda name: open(f"{directory}/{name}").read()  # pylint: disable=unnecessary-lambda-assignment
  assert (read("memory.max"), read("memory.swap.max"), read("pids.max")) == (
      str(512 << 20), "0", "12")
  assert cgroup.procs_files == [f"{directory}/cgroup.procs"]
  with open(f"{directory}/memory.events", "w") as f:
    f.write("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
  with open(f"{directory}/memory.peak", "w") as f:
    f.write("536870912\n")
  assert cgroup.oom_kills() == 2 and cgroup.peak_bytes() == 512 << 20
  cgroup.close(patience_s=0.0)
  assert read("cgroup.kill") == "1"


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
