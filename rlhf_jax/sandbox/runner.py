"""The program that runs the candidate inside the sandbox (sandbox/jobs.py starts it
as `python -I -S -c <wire.py + this file> <report fd>`): standard library only.

It reads its job as JSON from stdin, lowers its own resource limits (they bind: it
runs as an unprivileged uid), and runs the candidate in one of three modes:

- "serve" (the default of code.run_tests): runs the solution, then serves calls from the
  trusted harness (harness.py, another sandbox) over two pipes, answering with
  plain data (wire.py). This process never holds a test, an expected value or a
  verdict, so nothing the candidate does here can forge one.
- "io": runs the program once per stdin text and reports what it printed; the parent
  compares it with the expected output.
- "tests" (code.run_tests(mode="unsafe_in_process"), UNSAFE): runs the solution and the
  tests in this one interpreter and reports the verdict, signed with the job's nonce.
  The candidate shares the interpreter with the report and the expected values, so it
  can forge the verdict (docs/sandbox.md, "What is not contained").
"""

import io
import json
import os
import sys
import types

try:  # run as a module (tests); in the sandbox wire.py's source comes first
  from rlhf_jax.sandbox.wire import (COUNTER, Reader, WireError, counted_tests,
                                     decode, describe, encode, lower_limits, send)
except ImportError:
  pass

def _run_tests(job):
  passed = [0]

  def count():
    passed[0] += 1

  namespace = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    solution = compile(job["solution"], "<solution>", "exec")
    tests = counted_tests(job["tests"])
  except SyntaxError as error:
    return {"passed": False, "reason": f"syntax error: {error}", "tests_run": 0}
  try:
    exec(solution, namespace)  # pylint: disable=exec-used
  except SystemExit:
    return {"passed": False, "reason": "the solution exited before the tests ran",
            "tests_run": 0}
  except BaseException as error:  # the candidate's failure is the verdict
    return {"passed": False, "reason": "solution raised " + describe(error, "<solution>"),
            "tests_run": 0}
  namespace[COUNTER] = count
  try:
    exec(tests, namespace)  # pylint: disable=exec-used
  except SystemExit:
    return {"passed": False, "reason": "exited during the tests", "tests_run": passed[0]}
  except BaseException as error:
    return {"passed": False, "reason": "test failed: " + describe(error, "<tests>"),
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
      error = describe(raised, "<program>")
    sys.stdin, sys.stdout = real_stdin, real_stdout
    try:
      wrapper.flush()
      wrapper.detach()  # keeps `captured` open when the wrapper is collected
    except BaseException as raised:
      error = error or describe(raised, "<program>")
    outputs.append(captured.getvalue().decode("utf-8", "replace"))
    errors.append(error)
  return {"outputs": outputs, "errors": errors}


_VALUE_CAP = 1 << 16  # a module-level value larger than this, encoded, is not sent


def _exported(namespace):
  """The solution's top-level names as the harness sees them: callables are called over
  the pipe, plain data is sent (small values only), anything else stays here."""
  names = {}
  for name, value in list(namespace.items()):
    if name.startswith("__"):
      continue
    if isinstance(value, types.ModuleType):  # the harness imports it again, if standard
      names[name] = {"module": str(value.__name__)}
      continue
    if callable(value):
      names[name] = {"callable": True}
      continue
    try:
      data = encode(value)
      small = len(json.dumps(data)) <= _VALUE_CAP
      names[name] = {"value": data} if small else {"opaque": "value too large to send"}
    except (TypeError, ValueError, RecursionError):
      names[name] = {"opaque": f"a {type(value).__name__}, not plain data"}
  return names


def _serve(job):
  """Runs the solution, then answers the harness's calls until the pipe closes."""
  out = job["result_fd"]
  namespace = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    exec(compile(job["solution"], "<solution>", "exec"), namespace)  # pylint: disable=exec-used
    send(out, {"names": _exported(namespace)})
  except SyntaxError as error:
    send(out, {"error": f"syntax error: {error}"})
    return
  except SystemExit:
    send(out, {"error": "the solution exited before the tests ran"})
    return
  except BaseException as error:  # the candidate's failure is the verdict
    send(out, {"error": "solution raised " + describe(error, "<solution>")})
    return
  reader, handles = Reader(job["call_fd"]), {}
  while True:
    try:
      request = reader.receive()
    except WireError:
      return
    try:
      target = (handles[request["handle"]] if "handle" in request
                else _resolve(namespace, request["name"]))
      if "attr" in request:
        target = getattr(target, request["attr"])
      result = target(*decode(request["args"]), **decode(request["kwargs"]))
      try:
        reply = {"value": encode(result)}
        json.dumps(reply)  # what send() will write: an int past the digit limit fails here
      except (TypeError, ValueError, RecursionError):
        handles[len(handles)] = result  # an object: the harness may call its methods
        reply = {"handle": len(handles) - 1, "type": type(result).__name__}
    except SystemExit:
      reply = {"error": "SystemExit", "type": "SystemExit"}
    except BaseException as error:
      reply = {"error": describe(error, "<solution>"), "type": type(error).__name__}
    send(out, reply)


def _resolve(namespace, name):
  """A top-level function, or a method of `Solution()` (LeetCode-style answers)."""
  if name in namespace:
    return namespace[name]
  if "Solution" not in namespace:
    raise NameError(f"the solution defines no {name!r}")
  return getattr(namespace["Solution"](), name)


def main():
  report_fd = int(sys.argv[1])
  sys.set_int_max_str_digits(100_000)  # as the harness: a big integer result must cross
  job = json.loads(sys.stdin.buffer.read())
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  nonce = job.pop("nonce", None)  # "serve" jobs have none: they report nothing
  lower_limits(job)
  if job["mode"] == "serve":
    try:
      _serve(job)
    finally:
      os._exit(0)
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
