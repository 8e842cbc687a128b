"""The program that runs inside the sandbox (rewards/sandbox.py starts it as
`python -I -S -c <this file> <report fd>`): standard library only.

It reads its job as JSON from stdin, lowers its own resource limits (they bind: it
runs as an unprivileged uid), runs the candidate, and writes its result, signed with
the job's nonce, to the inherited report pipe. A candidate that exits early, calls
`os._exit`, prints "passed" or kills processes produces no signed report, which the
parent counts as a failure. Only asserts that actually ran are counted.
"""

import ast
import io
import json
import os
import resource
import sys
import traceback

_COUNTER = "__rlhf_jax_asserts_passed__"


def _lower_limits(job):
  memory = job["memory_mb"] * 1024 * 1024
  cpu = max(1, int(job["cpu_s"]))
  for limit, soft, hard in (
      (resource.RLIMIT_AS, memory, memory),
      (resource.RLIMIT_CPU, cpu, cpu + 1),
      (resource.RLIMIT_NPROC, job["max_processes"], job["max_processes"]),
      (resource.RLIMIT_FSIZE, job["file_bytes"], job["file_bytes"]),
      (resource.RLIMIT_NOFILE, 64, 64),
      (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(limit, (soft, hard))


class _CountAsserts(ast.NodeTransformer):
  """Follows every `assert` with a call that counts it (it runs only if it passed)."""

  def visit_Assert(self, node):
    count = ast.Expr(ast.Call(ast.Name(_COUNTER, ast.Load()), [], []))
    return [node, ast.copy_location(count, node)]


def _describe(error, filename):
  """"AssertionError at tests line 3" / "ValueError: bad" for the report."""
  line = ""
  for frame in reversed(traceback.extract_tb(error.__traceback__)):
    if frame.filename == filename:
      line = f" at {filename.strip('<>')} line {frame.lineno}"
      break
  message = str(error)[:200]
  return f"{type(error).__name__}{line}" + (f": {message}" if message else "")


def _run_tests(job):
  passed = [0]

  def count():
    passed[0] += 1

  namespace = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    solution = compile(job["solution"], "<solution>", "exec")
    tree = ast.fix_missing_locations(_CountAsserts().visit(ast.parse(job["tests"], "<tests>")))
    tests = compile(tree, "<tests>", "exec")
  except SyntaxError as error:
    return {"passed": False, "reason": f"syntax error: {error}", "tests_run": 0}
  try:
    exec(solution, namespace)  # pylint: disable=exec-used
  except SystemExit:
    return {"passed": False, "reason": "the solution exited before the tests ran",
            "tests_run": 0}
  except BaseException as error:  # the candidate's failure is the verdict
    return {"passed": False, "reason": "solution raised " + _describe(error, "<solution>"),
            "tests_run": 0}
  namespace[_COUNTER] = count
  try:
    exec(tests, namespace)  # pylint: disable=exec-used
  except SystemExit:
    return {"passed": False, "reason": "exited during the tests", "tests_run": passed[0]}
  except BaseException as error:
    return {"passed": False, "reason": "test failed: " + _describe(error, "<tests>"),
            "tests_run": passed[0]}
  if passed[0] == 0:
    return {"passed": False, "reason": "no test ran (the tests executed no assert)",
            "tests_run": 0}
  return {"passed": True, "reason": "", "tests_run": passed[0]}


class _CappedBytes(io.BytesIO):
  """Captured stdout that refuses to grow past the cap."""

  def __init__(self, cap):
    super().__init__()
    self.cap = cap

  def write(self, data):
    if self.tell() + len(data) > self.cap:
      raise OSError("output limit exceeded")
    return super().write(data)


def _run_io(job):
  program = compile(job["program"], "<program>", "exec")
  outputs, errors = [], []
  real_stdin, real_stdout = sys.stdin, sys.stdout
  for text in job["inputs"]:
    sys.stdin = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8")
    captured = _CappedBytes(job["output_bytes"])
    sys.stdout = io.TextIOWrapper(captured, encoding="utf-8", write_through=True)
    wrapper = sys.stdout
    error = ""
    try:
      exec(program, {"__name__": "__main__", "__builtins__": __builtins__})  # pylint: disable=exec-used
    except SystemExit as exit_:
      if exit_.code not in (None, 0):
        error = f"exit status {exit_.code}"
    except BaseException as raised:
      error = _describe(raised, "<program>")
    sys.stdin, sys.stdout = real_stdin, real_stdout
    try:
      wrapper.flush()
      wrapper.detach()  # keeps `captured` open when the wrapper is collected
    except BaseException as raised:
      error = error or _describe(raised, "<program>")
    outputs.append(captured.getvalue().decode("utf-8", "replace"))
    errors.append(error)
  return {"outputs": outputs, "errors": errors}


def main():
  report_fd = int(sys.argv[1])
  job = json.loads(sys.stdin.buffer.read())
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  nonce = job.pop("nonce")
  _lower_limits(job)
  try:
    result = _run_tests(job) if job["mode"] == "tests" else _run_io(job)
  except MemoryError:
    result = {"passed": False, "reason": "memory limit exceeded", "tests_run": 0}
  result["nonce"] = nonce
  os.write(report_fd, json.dumps(result).encode())
  # No atexit hooks, no candidate threads: the report is the last thing that happens.
  os._exit(0)


if __name__ == "__main__":
  main()
