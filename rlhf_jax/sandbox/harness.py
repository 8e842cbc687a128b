"""The trusted test harness (sandbox/jobs.py starts it in a sandbox of its own, as
`python -I -S -c <wire.py + this file> <report fd>`): standard library only.

The candidate's program runs in another sandbox (another uid, PID namespace and file
system) as a server (runner.py, mode "serve"). This process holds the tests and
the expected values; it reaches the candidate only through two pipes: it sends calls
(function name, arguments) and receives results as plain data (wire.py), then
compares them here and writes the verdict, signed with the job's nonce, to the report
pipe. Two kinds of job:

- "tests": Python test code (asserts, or HumanEval's `check(candidate)`), run here with
  the solution's top-level functions bound to remote callers and its small plain-data
  values (e.g. `x` of the pycalc task) bound to copies of them;
- "calls": call-based cases as data (APPS / verl `fn_name`): `fn_name(*args)` must equal
  the expected value (or its only element, APPS's convention; tuples compare as lists).
"""

import builtins
import importlib
import json
import os
import sys

try:  # run as a module (tests); in the sandbox wire.py's source comes first
  from rlhf_jax.sandbox.wire import (COUNTER, Reader, WireError, counted_tests,
                                     decode, describe, encode, lower_limits, send)
except ImportError:
  pass


# Python's default (4300 digits) refuses e.g. factorial(2000); parsing stays fast at this
# size, and the job's CPU limit bounds the rest.
_INT_DIGITS = 100_000


class SolutionError(Exception):
  """The solution's call raised (the type is named in the message)."""


class _Link:
  """Calls into the candidate's process, one at a time."""

  def __init__(self, call_fd, result_fd):
    self.call_fd, self.reader = call_fd, Reader(result_fd)

  def call(self, target, args, kwargs):
    try:
      send(self.call_fd, dict(target, args=encode(list(args)), kwargs=encode(dict(kwargs))))
    except OSError:
      raise WireError("the solution's process ended") from None
    reply = self.reader.receive()
    if "error" in reply:
      kind = getattr(builtins, str(reply.get("type")), None)
      if isinstance(kind, type) and issubclass(kind, (StopIteration, StopAsyncIteration)):
        # Re-raised in the tests it would end their map/filter/all early: an empty
        # `all(map(f, xs))` is True. As in PEP 479, it becomes a RuntimeError.
        raise RuntimeError(f"in the solution: {kind.__name__}: {str(reply['error'])[:300]}")
      if isinstance(kind, type) and issubclass(kind, Exception):
        raise kind(f"in the solution: {str(reply['error'])[:300]}")
      raise SolutionError(str(reply["error"])[:300])
    if "handle" in reply and type(reply["handle"]) is int:
      return _RemoteObject(self, reply["handle"], str(reply.get("type"))[:100])
    if "value" not in reply:
      raise WireError("a malformed reply")
    return decode(reply["value"])


class _Remote:
  """A function of the solution: calling it calls it in the candidate's process."""

  def __init__(self, link, target, name):
    self._link, self._target, self.__name__ = link, target, name

  def __call__(self, *args, **kwargs):
    return self._link.call(self._target, args, kwargs)

  def __repr__(self):
    return f"<the solution's {self.__name__}>"


class _RemoteObject:
  """An object the solution returned that is not plain data: its methods can be called
  (LeetCode's `Solution()`), but it cannot be compared, hashed or tested for truth."""

  def __init__(self, link, handle, kind):
    self._link, self._handle, self._kind = link, handle, kind

  def __getattr__(self, attr):
    if attr.startswith("_"):
      raise AttributeError(attr)
    return _Remote(self._link, {"handle": self._handle, "attr": attr}, attr)

  def _refuse(self, *_):
    raise TypeError(f"the solution returned a {self._kind}, not plain data")

  __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse
  __len__ = __iter__ = __contains__ = __int__ = __float__ = __index__ = _refuse


def _fail(reason, tests_run=0):
  return {"passed": False, "reason": reason, "tests_run": tests_run}


def _standard_module(name, module):
  """Whether the solution's name `name` for `module` (its `import math`) is a module of
  the standard library under its own name, which the harness imports again for the tests:
  never a path, a module of the solution's own, or a stand-in (`import cmath as math`)."""
  if not (isinstance(module, str) and len(module) < 100
          and all(part.isidentifier() for part in module.split("."))):
    return False
  top = module.split(".")[0]
  return (top in sys.stdlib_module_names and name in (top, module.split(".")[-1])
          and top not in ("antigravity", "this", "idlelib", "turtle"))


def _bindable(name):
  """A name of the solution the tests may see: an identifier, not private, and not a
  builtin (a solution's own `abs` or `len` must not answer for the tests' one)."""
  return (isinstance(name, str) and name.isidentifier() and not name.startswith("__")
          and not hasattr(builtins, name))


def _run_tests(job, link, names):
  passed = [0]

  def count():
    passed[0] += 1

  try:
    tests = counted_tests(job["tests"])
  except SyntaxError as error:
    return _fail(f"syntax error: {error}")
  namespace = {}
  for name, entry in names.items():
    if not _bindable(name):
      continue
    if entry.get("callable") is True:
      namespace[name] = _Remote(link, {"name": name}, name)
    elif _standard_module(name, entry.get("module")):  # `import math` for `math.isclose`
      namespace[name] = importlib.import_module(entry["module"])
    elif "value" in entry:
      namespace[name] = decode(entry["value"])
  namespace.update({"__name__": "__main__", "__builtins__": builtins, COUNTER: count})
  try:
    exec(tests, namespace)  # pylint: disable=exec-used
  except SystemExit:
    return _fail("exited during the tests", passed[0])
  except BaseException as error:  # a failed assert, a solution's error, a broken pipe
    opaque = names.get(getattr(error, "name", None), {}).get("opaque") if isinstance(
        error, NameError) else None
    note = f" (the solution's {error.name} is {str(opaque)[:100]})" if opaque else ""
    return _fail("test failed: " + describe(error, "<tests>") + note, passed[0])
  if passed[0] == 0:
    return _fail("no test ran (the tests executed no assert)")
  return {"passed": True, "reason": "", "tests_run": passed[0]}


def _listed(value):
  if isinstance(value, (list, tuple)):
    return [_listed(item) for item in value]
  return value


def _run_calls(job, link):
  for number, (args, expected) in enumerate(job["cases"], 1):
    try:
      got = _listed(link.call({"name": job["fn_name"]}, args, {}))
      same = got == expected or (isinstance(expected, list) and len(expected) == 1
                                 and got == expected[0])
    except BaseException as error:  # the solution's error, or an object (not data)
      return _fail(f"case {number}: {type(error).__name__}: {str(error)[:300]}", number - 1)
    if not same:
      shown = json.dumps(got, default=repr)
      return _fail(f"case {number}: wrong result: expected {json.dumps(expected)[:60]}, "
                   f"got {shown[:60]}", number - 1)
  return {"passed": True, "reason": "", "tests_run": len(job["cases"])}


def _judge(job):
  link = _Link(job["call_fd"], job["result_fd"])
  try:
    first = link.reader.receive()
  except WireError as error:
    return _fail(str(error))
  if "error" in first:
    return _fail(str(first["error"])[:400])
  names = first.get("names")
  if type(names) is not dict or not all(type(v) is dict for v in names.values()):
    return _fail("a malformed message from the solution's process")
  try:
    return _run_tests(job, link, names) if job["kind"] == "tests" else _run_calls(job, link)
  except WireError as error:
    return _fail(str(error))


def _undumpable():
  """PR_SET_DUMPABLE 0: another process of this uid (rlimits mode without root, where the
  candidate shares it) cannot ptrace this one or open its /proc files (mem, fd, environ)."""
  import ctypes  # pylint: disable=import-outside-toplevel  # rlimits mode only
  try:
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
  except (OSError, AttributeError):  # not Linux / no libc: the namespaces still separate
    pass


def main():
  if sys.argv[2:] == ["undumpable"]:  # rlimits mode: no PID namespace between us
    _undumpable()  # before the tests are read
  report_fd = int(sys.argv[1])
  sys.set_int_max_str_digits(_INT_DIGITS)  # a correct answer may be a big integer
  job = json.loads(sys.stdin.buffer.read())
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
  nonce = job.pop("nonce")
  lower_limits(job)
  try:
    result = _judge(job)
  except MemoryError:
    result = _fail("the harness ran out of memory")
  result["nonce"] = nonce
  os.write(report_fd, json.dumps(result).encode())
  os._exit(0)


if __name__ == "__main__":
  main()
