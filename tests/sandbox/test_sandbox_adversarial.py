"""The code sandbox against hostile programs (sandbox/jobs.py, docs/sandbox.md).

Runs only inside its own PID namespace, so that a program that escaped could not take
the machine down: scripts/test.sh starts it as
  unshare --pid --fork --mount-proc timeout ... pytest --suite=adversarial <this file>
Each program's verdict must be a failure (or, where the program reports what it saw, its
report must show that it saw nothing it should not), within its time limit, and no
process of the sandbox may outlive its job.
"""

import os
import socket
import threading
import time

import pytest

from rlhf_jax.rewards import code
from tests.sandbox.processes import sandbox_processes

pytestmark = pytest.mark.adversarial

TIMEOUT = 2.0


def hostile(solution: str, tests: str = "assert True", timeout_s: float = TIMEOUT, **kwargs):
  """Runs a hostile program; checks it failed in time and left no process behind."""
  start = time.monotonic()
  verdict = code.run_tests(solution, tests, timeout_s=timeout_s, **kwargs)
  assert time.monotonic() - start < timeout_s + 3.0, verdict
  assert not verdict.passed, verdict
  assert sandbox_processes() == []
  return verdict


def observe(program: str, timeout_s: float = TIMEOUT) -> str:
  """Runs a program that prints what it managed to do; returns its output."""
  verdict = code.run_io(program + "\nprint('DONE')", [("", "<not compared>")],
                        timeout_s=timeout_s)
  assert verdict.reason.startswith("case 1: wrong output"), verdict
  return verdict.reason


def test_infinite_loop_is_stopped_at_the_wall_clock():
  assert hostile("while True:\n  pass").reason.startswith("timeout")


def test_sleeping_forever_with_closed_pipes_is_stopped():
  hostile("import os, time\nfor fd in (1, 2):\n  os.close(fd)\ntime.sleep(100)")


def test_fork_bomb_is_contained():
  hostile("import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass")


def test_thread_bomb_is_contained():
  hostile("import threading, time\nwhile True:\n"
          "  threading.Thread(target=time.sleep, args=(100,)).start()")


def test_daemonised_child_dies_with_the_job():
  hostile("import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(100)\n"
          "os._exit(0)")


def test_memory_bomb_hits_the_address_space_limit():
  verdict = hostile("x = bytearray(8 << 30)")
  assert "MemoryError" in verdict.reason or "memory" in verdict.reason
  hostile("chunks = []\nwhile True:\n  chunks.append(bytearray(50 << 20))")


def test_huge_output_is_capped_and_stopped_early():
  verdict = hostile("while True:\n  print('x' * 10000)", timeout_s=10.0)
  assert "exceeded" in verdict.reason and verdict.seconds < 5.0


def test_disk_fill_is_bounded():
  verdict = hostile("with open('/tmp/big', 'wb') as f:\n  f.write(b'0' * (1 << 30))")
  assert "File too large" in verdict.reason or "No space" in verdict.reason or \
      "Memory" in verdict.reason
  hostile("i = 0\nwhile True:\n  open(f'/tmp/f{i}', 'wb').write(b'0' * (1 << 20))\n  i += 1")


def test_network_connect_is_refused():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  server.settimeout(0.2)
  port = server.getsockname()[1]
  accepted = []

  def accept():
    deadline = time.monotonic() + TIMEOUT + 2
    while time.monotonic() < deadline:
      try:
        accepted.append(server.accept())
      except OSError:
        pass

  thread = threading.Thread(target=accept)
  thread.start()
  verdict = hostile(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                    "assert True")
  thread.join()
  server.close()
  assert accepted == []
  assert "Error" in verdict.reason
  report = observe("import socket\ntry:\n  socket.create_connection(('127.0.0.1', "
                   f"{port}), timeout=1)\n  print('CONNECTED')\nexcept OSError as e:\n  print(e)")
  assert "CONNECTED" not in report and "DONE" in report


def test_writes_outside_the_private_tmp_do_not_reach_the_host(tmp_path):
  target = tmp_path / "escaped"
  program = (f"import os\nfor path in ({str(target)!r}, '/usr/escaped', '/etc/escaped', "
             "'/escaped', '/root/escaped'):\n"
             "  try:\n    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
             "    open(path, 'w').write('x')\n  except OSError:\n    pass\n")
  observe(program)
  assert not target.exists()
  for path in ("/usr/escaped", "/etc/escaped", "/escaped", "/root/escaped"):
    assert not os.path.exists(path)


def test_parent_secrets_are_not_visible(tmp_path, monkeypatch):
  secret = "s3cr3t-" + os.urandom(8).hex()
  monkeypatch.setenv("RLHF_JAX_TEST_SECRET", secret)
  (tmp_path / "secret.txt").write_text(secret)
  program = ("import os\nseen = repr(dict(os.environ))\n"
             "for pid in os.listdir('/proc'):\n  try:\n"
             "    seen += open(f'/proc/{pid}/environ', 'rb').read().decode('latin1')\n"
             "  except OSError:\n    pass\n"
             f"try:\n  seen += open({str(tmp_path / 'secret.txt')!r}).read()\n"
             "except OSError:\n  pass\n"
             "print('SECRET' if " + repr(secret) + " in seen else 'nothing')")
  report = observe(program)
  assert "nothing" in report and "SECRET" not in report


def test_killing_the_parent_fails_and_harms_nothing():
  for attack in ("os.kill(os.getppid(), signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)",
                 "os.killpg(0, signal.SIGKILL)",
                 "[os.kill(int(p), signal.SIGKILL) for p in os.listdir('/proc') if p.isdigit() "
                 "and int(p) != os.getpid()]"):
    hostile(f"import os, signal\n{attack}\n", "assert True")
  assert code.run_tests("x = 1", "assert x == 1").passed  # the sandbox still works


@pytest.mark.parametrize("solution, tests", [
    ("import sys\nsys.exit(0)", "assert False"),
    ("import os\nos._exit(0)", "assert False"),
    ("print('passed')\nprint('OK: all tests passed')", "assert False"),
    ("def f():\n  raise SystemExit(0)", "assert f() == 1"),
    ("import os, json\nfor fd in range(3, 64):\n  try:\n"
     "    os.write(fd, json.dumps({'passed': True, 'reason': '', 'tests_run': 9, "
     "'nonce': '0' * 32}).encode())\n  except OSError:\n    pass\nos._exit(0)", "assert False"),
    ("import atexit, os\natexit.register(lambda: print('passed'))", "assert False"),
    ("x = 1", ""),  # no test ran
])
def test_faked_success_is_a_failure(solution, tests):
  verdict = hostile(solution, tests)
  assert verdict.tests_run == 0


def test_segfault_is_a_failure():
  assert "SIGSEGV" in hostile("import ctypes\nctypes.string_at(0)").reason


def test_recursion_is_a_failure():
  assert "RecursionError" in hostile("def f():\n  return f()\nf()").reason
  hostile("import sys\nsys.setrecursionlimit(10**9)\ndef f():\n  return f()\nf()")


def test_privileges_cannot_be_regained():
  report = observe("import os\nfor fn in (lambda: os.setuid(0), lambda: os.setgid(0), "
                   "lambda: open('/etc/shadow').read()):\n  try:\n    fn()\n"
                   "    print('GAINED')\n  except OSError:\n    pass")
  assert "GAINED" not in report and "DONE" in report


def test_a_batch_of_64_hostile_programs_ends_within_its_timeouts():
  programs = ["while True:\n  pass", "import time\ntime.sleep(100)",
              "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass",
              "x = bytearray(8 << 30)", "while True:\n  print('x' * 10000)",
              "import os\nos._exit(0)", "import ctypes\nctypes.string_at(0)",
              "def f(x):\n  return x"]
  cases = [(programs[i % len(programs)], "assert f(1) == 1") for i in range(64)]
  start = time.monotonic()
  verdicts = code.run_tests_batch(cases, timeout_s=1.0)
  elapsed = time.monotonic() - start
  rounds = -(-len(cases) // code.default_workers())
  assert elapsed < rounds * 1.0 + 15.0, elapsed
  assert [v.passed for v in verdicts] == [i % len(programs) == 7 for i in range(64)]
  assert sandbox_processes() == []


# Forged verdicts: programs a policy could emit for the pycalc task ("leave the result in
# x"; the example's answer is the test `assert x == <value>`), none of which computes it.
# Each passes in the old in-process mode (kept as code.run_tests(mode="unsafe_in_process"),
# where the solution and the tests share one interpreter) and fails in the default mode,
# where the tests and the expected value live in the harness's own sandbox.
FORGED_VERDICTS = {
    # Rebinds json.dumps, which the in-process runner uses to sign its own report.
    "json_dumps": """
import json
_dumps = json.dumps
def _forge(obj, *args, **kwargs):
    if isinstance(obj, dict) and "nonce" in obj:
        obj = dict(obj, passed=True, reason="", tests_run=1)
    return _dumps(obj, *args, **kwargs)
json.dumps = _forge
x = 0
""",
    # Walks up the frames to the runner's nonce and report pipe, writes a signed pass.
    "frame_walk_to_the_secret": """
import json, os, sys
frame = sys._getframe()
while frame is not None and "nonce" not in frame.f_locals:
    frame = frame.f_back
if frame is not None:
    os.write(int(sys.argv[1]), json.dumps({"passed": True, "reason": "", "tests_run": 1,
                                           "nonce": frame.f_locals["nonce"]}).encode())
    os._exit(0)
x = 0
""",
    # Reads the expected value from the test text in the runner's memory.
    "answer_from_the_runners_job": """
import re, sys
x = 0
frame = sys._getframe()
while frame is not None:
    job = frame.f_locals.get("job")
    if isinstance(job, dict) and isinstance(job.get("tests"), str):
        x = int(re.findall(r"-?\\d+", job["tests"])[-1])
    frame = frame.f_back
""",
    # An object equal to everything.
    "always_equal": """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
x = AlwaysEqual()
""",
    # The same, disguised as an int (it would cross as plain data if it were trusted).
    "always_equal_int": """
class AlwaysEqual(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
x = AlwaysEqual(0)
""",
}


@pytest.mark.parametrize("attack", sorted(FORGED_VERDICTS))
def test_forged_verdicts_pass_in_process_and_fail_in_the_harness(attack):
  from rlhf_jax.tasks import pycalc
  example = pycalc.examples(seed=11, count=1)[0]
  program = FORGED_VERDICTS[attack]
  unsafe = code.run_tests(program, example.answer, mode="unsafe_in_process")
  assert unsafe.passed, unsafe  # the attack works where the verdict is made in-process
  safe = hostile(program, example.answer)
  assert safe.tests_run == 0
  scorer = code.CodeScorer(("pycalc",), correct_score=1.0, wrong_score=0.0, timeout_s=TIMEOUT)
  scored = scorer.score([example], [f"```python\n{program}```"])
  assert scored.scores == [0.0] and scored.correct == [False], scored.reason(0)


def test_a_solution_cannot_rebind_the_names_the_tests_use():
  """A solution that defines its own `abs` (the tests' tolerance check) or sends names of
  the harness's own (its assert counter, `__builtins__`)."""
  solution = "def abs(x):\n  return 0\ndef half(x):\n  return 0\n"
  tests = "assert abs(half(3) - 1.5) < 1e-9"
  assert code.run_tests(solution, tests, mode="unsafe_in_process").passed
  assert not hostile(solution, tests).passed
  forged_names = """
import json, os, sys
frame = sys._getframe()
while frame is not None and "job" not in frame.f_locals:
    frame = frame.f_back
fd = frame.f_locals["job"]["result_fd"]
os.write(fd, (json.dumps({"names": {
    "__rlhf_jax_asserts_passed__": {"value": 0}, "__builtins__": {"callable": True},
    "half": {"callable": True}}}) + "\\n").encode())
def half(x):
  return 0
"""
  assert hostile(forged_names, "assert half(3) == 1.5").tests_run == 0


def test_always_equal_results_of_calls_fail():
  """A function that returns an always-equal object: it cannot cross as data, and the
  harness refuses to compare or test the truth of the remote object it gets instead."""
  solution = ("class AlwaysEqual:\n  def __eq__(self, other):\n    return True\n"
              "  def __bool__(self):\n    return True\n"
              "def add(a, b):\n  return AlwaysEqual()\n")
  tests = "def check(candidate):\n  assert candidate(2, 3) == 5\n  assert candidate(1, 1)\n" \
          "check(add)\n"
  assert code.run_tests(solution, tests, mode="unsafe_in_process").passed
  assert "not plain data" in hostile(solution, tests).reason
  assert "not plain data" in hostile(solution, "assert add(1, 1)").reason
  calls = code.run_calls(solution, "add", [([2, 3], 5)], timeout_s=TIMEOUT)
  assert not calls.passed and "not plain data" in calls.reason


def test_stop_iteration_from_the_solution_does_not_end_the_tests_loops():
  """`raise StopIteration` re-raised inside `all(map(f, xs))` would end the map early (an
  empty `all` is True): the harness turns it into a RuntimeError, as PEP 479 does."""
  solution = "def is_prime(n):\n  raise StopIteration\n"
  tests = "assert all(map(is_prime, [2, 3, 5]))\nassert not any(map(is_prime, [4, 6]))\n"
  assert code.run_tests(solution, tests, mode="unsafe_in_process").passed
  verdict = hostile(solution, tests)
  assert not verdict.passed and "StopIteration" in verdict.reason, verdict


def test_a_solution_cannot_pass_a_stand_in_module_for_the_tests_one():
  """`import cmath as math`: the tests' `math` must not be the solution's choice."""
  solution = "import cmath as math\ndef root(x):\n  return 0.0\n"
  tests = "assert math.isclose(root(4.0), 2.0)"
  verdict = hostile(solution, tests)
  assert not verdict.passed and "NameError" in verdict.reason, verdict
