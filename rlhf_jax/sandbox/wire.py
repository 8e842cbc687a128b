"""Plain data across the pipe between the candidate's process and the trusted harness,
and the helpers both sandboxed programs share (limits, error text, counted asserts).

Standard library only: sandbox/jobs.py prepends this source to the candidate server's
(runner.py) and the harness's (harness.py) programs. Values travel as
one JSON line each. Lists are JSON arrays; every other container is a one-key object:
{"t": tuple}, {"s": set}, {"f": frozenset}, {"d": [[key, value], ...]}, {"b": hex bytes},
{"c": [real, imag]}. `decode` builds only builtin types, whatever the sender wrote, so
an object with its own `__eq__` (the "always-equal" hack) cannot reach the side that
compares: the candidate's encoder is untrusted, the harness's decoder is the boundary.
"""

import json
import os
import resource

_SCALARS = (str, int, float, bool, type(None))
_TAGS = {"t": tuple, "s": set, "f": frozenset}
MESSAGE_CAP = 8 << 20  # bytes per message, longer is an error


class WireError(Exception):
  """A message that is not plain data, too large, or a closed pipe."""


def encode(value, depth=0):
  """A JSON-ready form of `value`; TypeError when it is not plain data."""
  if depth > 100:
    raise TypeError("nested deeper than 100 levels")
  if isinstance(value, bool) or value is None:
    return value
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return int(value) if isinstance(value, int) else float(value)
  if isinstance(value, str):
    return str(value)
  if isinstance(value, list):
    return [encode(item, depth + 1) for item in value]
  for tag, kind in (("t", tuple), ("f", frozenset), ("s", set)):
    if isinstance(value, kind):
      return {tag: [encode(item, depth + 1) for item in value]}
  if isinstance(value, dict):
    return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
  if isinstance(value, (bytes, bytearray)):
    return {"b": bytes(value).hex()}
  if isinstance(value, complex):
    return {"c": [float(value.real), float(value.imag)]}
  raise TypeError(f"a {type(value).__name__} is not plain data")


def decode(data, depth=0):
  """The builtin value of an `encode`d form; WireError for anything else."""
  if depth > 100:
    raise WireError("nested deeper than 100 levels")
  kind = type(data)
  if kind in (str, int, float, bool) or data is None:
    return data
  if kind is list:
    return [decode(item, depth + 1) for item in data]
  if kind is not dict or len(data) != 1:
    raise WireError(f"not plain data: {kind.__name__}")
  (tag, body), = data.items()
  try:
    if tag in _TAGS and type(body) is list:
      return _TAGS[tag](decode(item, depth + 1) for item in body)
    if tag == "d" and type(body) is list:
      return {decode(pair[0], depth + 1): decode(pair[1], depth + 1) for pair in body
              if type(pair) is list and len(pair) == 2 or _bad_pair()}
    if tag == "b" and type(body) is str:
      return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
      return complex(float(body[0]), float(body[1]))
  except (TypeError, ValueError) as error:  # unhashable keys, bad hex, ...
    raise WireError(f"not plain data: {error}") from None
  raise WireError(f"not plain data: tag {tag!r}")


def _bad_pair():
  raise WireError("not plain data: a dict entry is not a [key, value] pair")


def send(fd, message):
  """Writes one message (a dict of JSON values) as a line."""
  data = json.dumps(message).encode() + b"\n"
  while data:
    data = data[os.write(fd, data):]


class Reader:
  """Reads line messages from an fd, each at most MESSAGE_CAP bytes."""

  def __init__(self, fd):
    self.fd, self.buffer = fd, b""

  def receive(self):
    """The next message as a dict; WireError at EOF, on a long line, or on bad JSON."""
    while b"\n" not in self.buffer:
      if len(self.buffer) > MESSAGE_CAP:
        raise WireError(f"a message longer than {MESSAGE_CAP} bytes")
      chunk = os.read(self.fd, 1 << 16)
      if not chunk:
        raise WireError("the solution's process ended")
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    try:
      message = json.loads(line)
    except (ValueError, RecursionError) as error:
      raise WireError(f"a malformed message ({type(error).__name__})") from None
    if type(message) is not dict:
      raise WireError("a malformed message (not an object)")
    return message


def lower_limits(job):
  """Lowers this process's rlimits to the job's (they bind: it runs as an unprivileged uid)."""
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


def describe(error, filename):
  """"AssertionError at tests line 3" / "ValueError: bad" for the report."""
  import traceback  # pylint: disable=import-outside-toplevel  # only on errors
  line = ""
  for frame in reversed(traceback.extract_tb(error.__traceback__)):
    if frame.filename == filename:
      line = f" at {filename.strip('<>')} line {frame.lineno}"
      break
  message = str(error)[:200]
  return f"{type(error).__name__}{line}" + (f": {message}" if message else "")


COUNTER = "__rlhf_jax_asserts_passed__"


def counted_tests(source):
  """`source` compiled as "<tests>" with every assert followed by a call that counts it
  (it runs only if the assert passed); SyntaxError if it is not Python."""
  import ast  # pylint: disable=import-outside-toplevel  # 10 ms a process: only for tests

  class CountAsserts(ast.NodeTransformer):

    def visit_Assert(self, node):
      count = ast.Expr(ast.Call(ast.Name(COUNTER, ast.Load()), [], []))
      return [node, ast.copy_location(count, node)]

  tree = ast.fix_missing_locations(CountAsserts().visit(ast.parse(source, "<tests>")))
  return compile(tree, "<tests>", "exec")
